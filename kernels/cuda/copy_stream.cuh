// The CUDA backend's copy queues (Backend::copy_async) and host tier: two streams, one each way
// (a GPU with two copy engines moves both at once: PCIe is full duplex), for copies between device
// memory and pinned host memory, ordered against the compute stream and each other by events, so
// the copy engines move offloaded bytes while the SMs compute. Include only from .cu files.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "kernels/backend.h"
#include "src/core/arena.h"

namespace grass::cuda {

class CopyStreams {
 public:
  static constexpr int kQueues = 2;  // Backend::Copy's order: to the device, to the host
  explicit CopyStreams(cudaStream_t compute);
  ~CopyStreams();
  CopyStreams(const CopyStreams&) = delete;
  CopyStreams& operator=(const CopyStreams&) = delete;

  // dst <- src on `queue`'s stream, after the compute queued so far on `compute` (an event it
  // records) and the copies before on that stream, between device and pinned host memory.
  void copy(int queue, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
  // `work` on a host thread when `queue`'s stream reaches it (cudaLaunchHostFunc); it must not
  // throw or call CUDA.
  void task(int queue, std::function<void()> work);
  // An event after the copies queued so far on `queue`. Marks share a ring of events per stream:
  // waiting for a mark whose event was recorded again since waits for a later mark, which is only
  // stricter.
  int64_t mark(int queue);
  void wait(int queue, int64_t mark);  // the compute stream waits; the host does not
  // `queue`'s stream waits for `other`'s mark (Backend::order_copy_after); the host does not.
  void order_after(int queue, int other, int64_t mark);
  // The compute stream waits for every copy queued so far on both streams (before it reads or
  // writes what they touch: uploads, downloads); nothing for a stream with none queued.
  void order_compute_after_copies();
  void synchronize();       // the host waits for both streams (at the end of the run, frees)
  // Bytes and seconds of the copies that have finished, both streams (timed by an event before
  // and after each: read when both are reached, so without a wait).
  Backend::CopyTotals totals();
  MemoryResource& host_tier() { return host_tier_; }
  bool in_host_tier(const void* p) const;

 private:
  // The host tier: pinned in chunks of at most kChunkBytes (GRASS_PINNED_CHUNK overrides
  // it: a positive multiple of the page size). A buffer up to a chunk is one cudaHostAlloc; a
  // larger one is pages from the kernel registered a chunk at a time, since one huge pinning call
  // can fail or stall where chunks do not (../shared/WEIGHT_STREAMING.md §7.4). A copy is async
  // only within one pinned region, so copy() splits a copy at the regions' ends.
  class PinnedHost final : public MemoryResource {
   public:
    static constexpr size_t kChunkBytes = size_t(4) << 30;
    explicit PinnedHost(CopyStreams& copies);
    void* allocate_zeroed(size_t bytes) override;
    void deallocate(void* ptr) override;
    const char* memory_name() const override { return "pinned host memory"; }
    bool contains(const void* p) const;
    // The bytes from p (in the host tier) to the end of its pinned region.
    size_t region_left(const void* p) const;

   private:
    struct Buffer {
      size_t bytes;
      size_t mapped;  // registered chunks: the pages mapped (bytes rounded up); 0: a cudaHostAlloc
    };
    void unregister(const char* start, size_t mapped);
    CopyStreams& copies_;
    size_t chunk_;
    std::map<const char*, Buffer> buffers_;  // start -> buffer
    std::map<const char*, size_t> regions_;  // each pinned region: start -> bytes
  };
  static constexpr int kEvents = 16;
  struct Timed {
    cudaEvent_t start, end;
    size_t bytes;
  };
  cudaEvent_t timing_event();  // from the pool, or new

  struct Lane {
    cudaStream_t stream = nullptr;
    std::array<cudaEvent_t, kEvents> events{};
    int64_t marks = 0, queued = 0, queued_at_last_mark = 0;  // queued: copies, tasks, waits
  };
  Lane& lane(int queue) { return lanes_[size_t(queue)]; }

  cudaStream_t compute_;
  cudaEvent_t compute_done_ = nullptr;  // recorded on compute_ before each copy
  std::array<Lane, kQueues> lanes_;
  std::vector<Timed> timed_;            // copies not yet read back
  std::vector<cudaEvent_t> idle_timing_;
  Backend::CopyTotals totals_;
  PinnedHost host_tier_{*this};
};

}  // namespace grass::cuda
