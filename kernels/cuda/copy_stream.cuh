// The CUDA backend's copy queue (Backend::copy_async) and host tier: a second stream for copies
// between device memory and pinned host memory, ordered against the compute stream by events, so
// the copy engine moves offloaded bytes while the SMs compute. Include only from .cu files.
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

class CopyStream {
 public:
  explicit CopyStream(cudaStream_t compute);
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  // dst <- src after the compute queued so far on `compute` (an event it records) and the copies
  // before, between device and pinned host memory.
  void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
  // `work` on a host thread when the copy stream reaches it (cudaLaunchHostFunc); it must not
  // throw or call CUDA.
  void task(std::function<void()> work);
  // An event after the copies queued so far. Marks share a ring of events: waiting for a mark
  // whose event was recorded again since waits for a later mark, which is only stricter.
  int64_t mark();
  void wait(int64_t mark);  // the compute stream waits; the host does not
  // The compute stream waits for every copy queued so far (before it reads or writes what they
  // touch: uploads, downloads); nothing when none was queued.
  void order_compute_after_copies();
  void synchronize();       // the host waits for the copy stream (at the end of the run, frees)
  // Bytes and seconds of the copies that have finished (timed by an event before and after each:
  // read when both are reached, so without a wait).
  Backend::CopyTotals totals();
  MemoryResource& host_tier() { return host_tier_; }
  bool in_host_tier(const void* p) const;

 private:
  class PinnedHost final : public MemoryResource {
   public:
    explicit PinnedHost(CopyStream& copies) : copies_(copies) {}
    void* allocate_zeroed(size_t bytes) override;
    void deallocate(void* ptr) override;
    const char* memory_name() const override { return "pinned host memory"; }
    bool contains(const void* p) const;

   private:
    CopyStream& copies_;
    std::map<const char*, size_t> buffers_;  // start -> bytes
  };
  static constexpr int kEvents = 16;
  struct Timed {
    cudaEvent_t start, end;
    size_t bytes;
  };
  cudaEvent_t timing_event();  // from the pool, or new

  cudaStream_t compute_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_done_ = nullptr;  // recorded on compute_ before each copy
  std::array<cudaEvent_t, kEvents> events_{};
  int64_t marks_ = 0, copies_ = 0, copies_at_last_mark_ = 0;
  std::vector<Timed> timed_;            // copies not yet read back
  std::vector<cudaEvent_t> idle_timing_;
  Backend::CopyTotals totals_;
  PinnedHost host_tier_{*this};
};

}  // namespace grass::cuda
