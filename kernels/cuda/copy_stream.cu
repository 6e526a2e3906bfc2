#include "kernels/cuda/copy_stream.cuh"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "kernels/cuda/common.cuh"
#include "src/core/error.h"

namespace grass::cuda {

CopyStreams::CopyStreams(cudaStream_t compute) : compute_(compute) {
  GRASS_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
  for (Lane& l : lanes_) {
    GRASS_CUDA_CHECK(cudaStreamCreate(&l.stream));
    for (cudaEvent_t& e : l.events)
      GRASS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
}

CopyStreams::~CopyStreams() {
  for (Lane& l : lanes_) cudaStreamSynchronize(l.stream);
  for (const Timed& t : timed_) {
    cudaEventDestroy(t.start);
    cudaEventDestroy(t.end);
  }
  for (cudaEvent_t e : idle_timing_) cudaEventDestroy(e);
  cudaEventDestroy(compute_done_);
  for (Lane& l : lanes_) {
    for (cudaEvent_t e : l.events) cudaEventDestroy(e);
    cudaStreamDestroy(l.stream);
  }
}

void CopyStreams::copy(int queue, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return;
  Lane& l = lane(queue);
  GRASS_CUDA_CHECK(cudaEventRecord(compute_done_, compute_));
  GRASS_CUDA_CHECK(cudaStreamWaitEvent(l.stream, compute_done_, 0));
  const Timed t{timing_event(), timing_event(), bytes};
  GRASS_CUDA_CHECK(cudaEventRecord(t.start, l.stream));
  // one copy per pinned region the host side crosses (a buffer over a chunk has several)
  const char* host = static_cast<const char*>(kind == cudaMemcpyDeviceToHost ? dst : src);
  for (size_t at = 0; at < bytes;) {
    const size_t piece = host_tier_.contains(host + at)
                             ? std::min(bytes - at, host_tier_.region_left(host + at))
                             : bytes - at;
    GRASS_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + at,
                                     static_cast<const char*>(src) + at, piece, kind, l.stream));
    at += piece;
  }
  GRASS_CUDA_CHECK(cudaEventRecord(t.end, l.stream));
  timed_.push_back(t);
  l.queued++;
}

void CopyStreams::task(int queue, std::function<void()> work) {
  auto* queued = new std::function<void()>(std::move(work));
  Lane& l = lane(queue);
  GRASS_CUDA_CHECK(cudaLaunchHostFunc(
      l.stream,
      [](void* p) {
        const std::unique_ptr<std::function<void()>> run(static_cast<std::function<void()>*>(p));
        (*run)();
      },
      queued));
  l.queued++;  // a mark after it waits for it
}

cudaEvent_t CopyStreams::timing_event() {
  if (!idle_timing_.empty()) {
    const cudaEvent_t e = idle_timing_.back();
    idle_timing_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  GRASS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
  return e;
}

Backend::CopyTotals CopyStreams::totals() {
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

int64_t CopyStreams::mark(int queue) {
  Lane& l = lane(queue);
  l.marks++;
  l.queued_at_last_mark = l.queued;
  GRASS_CUDA_CHECK(cudaEventRecord(l.events[size_t(l.marks % kEvents)], l.stream));
  return l.marks;
}

void CopyStreams::wait(int queue, int64_t mark) {
  if (mark <= 0) return;
  GRASS_CUDA_CHECK(cudaStreamWaitEvent(compute_, lane(queue).events[size_t(mark % kEvents)], 0));
}

void CopyStreams::order_after(int queue, int other, int64_t mark) {
  if (mark <= 0) return;
  Lane& l = lane(queue);
  GRASS_CUDA_CHECK(cudaStreamWaitEvent(l.stream, lane(other).events[size_t(mark % kEvents)], 0));
  l.queued++;  // a mark after it waits for the other stream too
}

void CopyStreams::order_compute_after_copies() {
  for (int q = 0; q < kQueues; q++) {
    const Lane& l = lane(q);
    if (l.queued == 0) continue;
    wait(q, l.queued == l.queued_at_last_mark ? l.marks : mark(q));
  }
}

void CopyStreams::synchronize() {
  for (const Lane& l : lanes_)
    if (l.queued > 0) GRASS_CUDA_CHECK(cudaStreamSynchronize(l.stream));
}

CopyStreams::PinnedHost::PinnedHost(CopyStreams& copies)
    : copies_(copies), chunk_(kChunkBytes) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  if (const char* text = std::getenv("GRASS_PINNED_CHUNK")) {
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text, &end, 10);
    if (end == text || *end || value == 0 || value % page)
      throw UserError(std::string("GRASS_PINNED_CHUNK: \"") + text +
                      "\" is not a positive multiple of the page size (" + std::to_string(page) +
                      " bytes)");
    chunk_ = size_t(value);
  }
}

void* CopyStreams::PinnedHost::allocate_zeroed(size_t bytes) {
  if (bytes <= chunk_) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocDefault) != cudaSuccess) {
      cudaGetLastError();  // answered: the arena names the buffer
      return nullptr;
    }
    std::memset(p, 0, bytes);
    const char* start = static_cast<const char*>(p);
    buffers_[start] = {bytes, 0};
    regions_[start] = bytes;
    return p;
  }
  // Zeroed pages from the kernel, pinned a chunk at a time (chunk_ is a multiple of the page).
  const size_t page = size_t(sysconf(_SC_PAGESIZE)), mapped = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  char* start = static_cast<char*>(p);
  for (size_t at = 0; at < mapped; at += chunk_) {
    const size_t n = std::min(chunk_, mapped - at);
    if (cudaHostRegister(start + at, n, cudaHostRegisterDefault) != cudaSuccess) {
      cudaGetLastError();  // answered: the arena names the buffer
      unregister(start, at);
      munmap(p, mapped);
      return nullptr;
    }
    regions_[start + at] = n;
  }
  buffers_[start] = {bytes, mapped};
  return p;
}

void CopyStreams::PinnedHost::unregister(const char* start, size_t mapped) {
  for (size_t at = 0; at < mapped; at += chunk_) {
    GRASS_CUDA_CHECK(cudaHostUnregister(const_cast<char*>(start + at)));
    regions_.erase(start + at);
  }
}

void CopyStreams::PinnedHost::deallocate(void* ptr) {
  copies_.synchronize();  // no copy may still touch it
  const char* start = static_cast<const char*>(ptr);
  const auto it = buffers_.find(start);
  GRASS_CHECK(it != buffers_.end(), "a host-tier free of a pointer it does not hold");
  const Buffer buffer = it->second;
  buffers_.erase(it);
  if (buffer.mapped == 0) {
    regions_.erase(start);
    GRASS_CUDA_CHECK(cudaFreeHost(ptr));
    return;
  }
  unregister(start, buffer.mapped);
  munmap(ptr, buffer.mapped);
}

bool CopyStreams::PinnedHost::contains(const void* p) const {
  const char* c = static_cast<const char*>(p);
  auto it = buffers_.upper_bound(c);
  if (it == buffers_.begin()) return false;
  --it;
  return c < it->first + it->second.bytes;
}

size_t CopyStreams::PinnedHost::region_left(const void* p) const {
  const char* c = static_cast<const char*>(p);
  auto it = regions_.upper_bound(c);
  GRASS_CHECK(it != regions_.begin(), "a pointer in no pinned region of the host tier");
  --it;
  GRASS_CHECK(c < it->first + it->second, "a pointer in no pinned region of the host tier");
  return size_t(it->first + it->second - c);
}

bool CopyStreams::in_host_tier(const void* p) const { return host_tier_.contains(p); }

}  // namespace grass::cuda
