// Host-to-device transfers that never make the host wait for the device: the bytes are copied
// into pinned host memory (a ring) and the transfer is queued on the stream. A region of the ring
// is written again only once the event recorded after its transfer has completed, so the host
// waits only when it has run a whole ring ahead of the device. Include only from .cu files.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace grass::cuda {

class StagingRing {
 public:
  explicit StagingRing(size_t capacity);
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // Queues dst (device) <- host on `stream`; false when bytes exceed the ring (then the caller
  // transfers another way). Adds to *waits each time the host had to wait for a region.
  bool upload(void* dst, const void* host, size_t bytes, cudaStream_t stream, int64_t* waits);

 private:
  struct InFlight {
    size_t begin, end;  // the region [begin, end) of the ring
    cudaEvent_t done;   // recorded after the region's transfer
  };
  // Waits for every transfer that still reads [begin, end) and retires every completed one.
  void reclaim(size_t begin, size_t end, int64_t* waits);

  char* ring_ = nullptr;
  size_t capacity_ = 0, head_ = 0;
  std::vector<InFlight> in_flight_;
  std::vector<cudaEvent_t> idle_events_;
};

}  // namespace grass::cuda
