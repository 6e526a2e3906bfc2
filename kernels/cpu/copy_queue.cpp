#include "kernels/cpu/copy_queue.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace grass {

CopyQueue::CopyQueue(bool lazy) : lazy_(lazy) {
  if (!lazy_) thread_ = std::thread([this] { run(); });
}

CopyQueue::~CopyQueue() {
  drain();
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    queued_.notify_one();
    thread_.join();
  }
}

void CopyQueue::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // NaN in every float type until the copy runs; but a queued copy that reads dst runs first
    // (the queue is in order), so its source keeps its bytes until then
    const auto reads_dst = [&](const Copy& c) {
      const char *d = static_cast<const char*>(dst), *s = static_cast<const char*>(c.src);
      return s < d + bytes && d < s + c.bytes;
    };
    if (lazy_ && std::none_of(pending_.begin(), pending_.end(), reads_dst))
      std::memset(dst, 0xFF, bytes);
    pending_.push_back({dst, src, bytes});
    issued_++;
  }
  if (!lazy_) queued_.notify_one();
}

void CopyQueue::task(std::function<void()> work, const void* reads, size_t read_bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back({nullptr, reads, read_bytes, std::move(work)});
    issued_++;
  }
  if (!lazy_) queued_.notify_one();
}

int64_t CopyQueue::mark() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return issued_;
}

void CopyQueue::wait(int64_t mark) {
  if (lazy_) return run_until(mark);
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return done_ >= mark; });
}

int64_t CopyQueue::bytes_done() const { return bytes_done_.load(); }
double CopyQueue::seconds_busy() const { return double(nanoseconds_.load()) / 1e9; }

void CopyQueue::timed_copy(const Copy& c) {
  if (c.task) return c.task();
  const auto start = std::chrono::steady_clock::now();
  std::memmove(c.dst, c.src, c.bytes);
  nanoseconds_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
  bytes_done_ += int64_t(c.bytes);
}

void CopyQueue::run_until(int64_t mark) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (; done_ < mark && !pending_.empty(); done_++) {
    const Copy c = pending_.front();
    pending_.pop_front();
    timed_copy(c);
  }
}

void CopyQueue::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    queued_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (pending_.empty()) return;  // stopping, and drained
    const Copy c = pending_.front();
    lock.unlock();
    timed_copy(c);
    lock.lock();
    pending_.pop_front();
    done_++;
    done_cv_.notify_all();
  }
}

}  // namespace grass
