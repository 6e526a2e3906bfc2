#include "kernels/cuda/staging.cuh"

#include <cstring>

#include "kernels/cuda/common.cuh"
#include "src/core/error.h"
#include "src/core/format.h"

namespace grass::cuda {

StagingRing::StagingRing(size_t capacity) : capacity_(capacity) {
  if (cudaHostAlloc(reinterpret_cast<void**>(&ring_), capacity, cudaHostAllocDefault) !=
      cudaSuccess) {
    cudaGetLastError();  // answered here
    throw UserError("cannot allocate " + format_bytes(int64_t(capacity)) +
                    " of pinned host memory for the CUDA backend's staging ring (its uploads "
                    "from the host): the machine cannot pin that much memory");
  }
}

StagingRing::~StagingRing() {
  for (const InFlight& f : in_flight_) cudaEventDestroy(f.done);
  for (cudaEvent_t e : idle_events_) cudaEventDestroy(e);
  cudaFreeHost(ring_);
}

void StagingRing::reclaim(size_t begin, size_t end, int64_t* waits) {
  for (size_t i = 0; i < in_flight_.size();) {
    const InFlight& f = in_flight_[i];
    const bool overlaps = f.begin < end && begin < f.end;
    cudaError_t state = cudaEventQuery(f.done);
    // "not ready" is an answer, not a failure, but the runtime may keep it as the last error,
    // which the next launch check would report: clear it (as PyTorch's CUDAEvent::query does).
    if (state == cudaErrorNotReady) (void)cudaGetLastError();
    if (state == cudaErrorNotReady && overlaps) {
      GRASS_CUDA_CHECK(cudaEventSynchronize(f.done));
      ++*waits;
      state = cudaSuccess;
    }
    if (state == cudaErrorNotReady) {
      i++;
      continue;
    }
    GRASS_CUDA_CHECK(state);
    idle_events_.push_back(f.done);
    in_flight_[i] = in_flight_.back();
    in_flight_.pop_back();
  }
}

bool StagingRing::upload(void* dst, const void* host, size_t bytes, cudaStream_t stream,
                         int64_t* waits) {
  if (bytes > capacity_) return false;
  if (bytes == 0) return true;
  // 256-byte aligned regions (the DMA engines' preference); wrap when the rest is too short
  size_t begin = (head_ + 255) / 256 * 256;
  if (begin + bytes > capacity_) begin = 0;
  reclaim(begin, begin + bytes, waits);
  std::memcpy(ring_ + begin, host, bytes);
  GRASS_CUDA_CHECK(
      cudaMemcpyAsync(dst, ring_ + begin, bytes, cudaMemcpyHostToDevice, stream));
  cudaEvent_t done;
  if (idle_events_.empty()) {
    GRASS_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  } else {
    done = idle_events_.back();
    idle_events_.pop_back();
  }
  GRASS_CUDA_CHECK(cudaEventRecord(done, stream));
  in_flight_.push_back({begin, begin + bytes, done});
  head_ = begin + bytes;
  return true;
}

}  // namespace grass::cuda
