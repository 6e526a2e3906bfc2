#include "kernels/cuda/copy_stream.cuh"

#include <cstring>
#include <memory>

#include "kernels/cuda/common.cuh"

namespace grass::cuda {

CopyStream::CopyStream(cudaStream_t compute) : compute_(compute) {
  GRASS_CUDA_CHECK(cudaStreamCreate(&stream_));
  GRASS_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
  for (cudaEvent_t& e : events_) GRASS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

CopyStream::~CopyStream() {
  cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (const Timed& t : timed_) {
    cudaEventDestroy(t.start);
    cudaEventDestroy(t.end);
  }
  for (cudaEvent_t e : idle_timing_) cudaEventDestroy(e);
  cudaEventDestroy(compute_done_);
  cudaStreamDestroy(stream_);
}

void CopyStream::copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return;
  GRASS_CUDA_CHECK(cudaEventRecord(compute_done_, compute_));
  GRASS_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_done_, 0));
  const Timed t{timing_event(), timing_event(), bytes};
  GRASS_CUDA_CHECK(cudaEventRecord(t.start, stream_));
  GRASS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream_));
  GRASS_CUDA_CHECK(cudaEventRecord(t.end, stream_));
  timed_.push_back(t);
  copies_++;
}

void CopyStream::task(std::function<void()> work) {
  auto* queued = new std::function<void()>(std::move(work));
  GRASS_CUDA_CHECK(cudaLaunchHostFunc(
      stream_,
      [](void* p) {
        const std::unique_ptr<std::function<void()>> run(static_cast<std::function<void()>*>(p));
        (*run)();
      },
      queued));
  copies_++;  // a mark after it waits for it
}

cudaEvent_t CopyStream::timing_event() {
  if (!idle_timing_.empty()) {
    const cudaEvent_t e = idle_timing_.back();
    idle_timing_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  GRASS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
  return e;
}

Backend::CopyTotals CopyStream::totals() {
  size_t kept = 0;
  for (const Timed& t : timed_) {
    float ms = 0;
    if (cudaEventQuery(t.end) != cudaSuccess || cudaEventElapsedTime(&ms, t.start, t.end) != cudaSuccess) {
      cudaGetLastError();  // not reached yet: read at a later call
      timed_[kept++] = t;
      continue;
    }
    totals_.bytes += int64_t(t.bytes);
    totals_.seconds += double(ms) / 1e3;
    idle_timing_.push_back(t.start);
    idle_timing_.push_back(t.end);
  }
  timed_.resize(kept);
  return totals_;
}

int64_t CopyStream::mark() {
  marks_++;
  copies_at_last_mark_ = copies_;
  GRASS_CUDA_CHECK(cudaEventRecord(events_[size_t(marks_ % kEvents)], stream_));
  return marks_;
}

void CopyStream::wait(int64_t mark) {
  if (mark <= 0) return;
  GRASS_CUDA_CHECK(cudaStreamWaitEvent(compute_, events_[size_t(mark % kEvents)], 0));
}

void CopyStream::order_compute_after_copies() {
  if (copies_ == 0) return;
  wait(copies_ == copies_at_last_mark_ ? marks_ : mark());
}

void CopyStream::synchronize() {
  if (copies_ > 0) GRASS_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void* CopyStream::PinnedHost::allocate_zeroed(size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
    cudaGetLastError();  // answered: the arena names the buffer
    return nullptr;
  }
  std::memset(p, 0, bytes);
  buffers_[static_cast<const char*>(p)] = bytes;
  return p;
}

void CopyStream::PinnedHost::deallocate(void* ptr) {
  copies_.synchronize();  // no copy may still touch it
  buffers_.erase(static_cast<const char*>(ptr));
  GRASS_CUDA_CHECK(cudaFreeHost(ptr));
}

bool CopyStream::PinnedHost::contains(const void* p) const {
  const char* c = static_cast<const char*>(p);
  auto it = buffers_.upper_bound(c);
  if (it == buffers_.begin()) return false;
  --it;
  return c < it->first + it->second;
}

bool CopyStream::in_host_tier(const void* p) const { return host_tier_.contains(p); }

}  // namespace grass::cuda
