#include "kernels/cpu/copy_queue.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace grass {

CopyQueues::CopyQueues(bool lazy) : lazy_(lazy) {
  if (lazy_) return;
  for (int q = 0; q < kQueues; q++) lanes_[size_t(q)].thread = std::thread([this, q] { run(q); });
}

CopyQueues::~CopyQueues() {
  drain();
  if (lazy_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  for (Lane& lane : lanes_) lane.queued.notify_one();
  for (Lane& lane : lanes_) lane.thread.join();
}

void CopyQueues::push(int queue, Entry e) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Lane& lane = lanes_[size_t(queue)];
    lane.pending.push_back(std::move(e));
    lane.issued++;
  }
  if (!lazy_) lanes_[size_t(queue)].queued.notify_one();
}

void CopyQueues::copy(int queue, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (lazy_) {
    // NaN in every float type until the copy runs; but a queued copy or task that reads dst (on
    // either queue: a write-back its fetch is ordered after) keeps its source's bytes
    std::lock_guard<std::mutex> lock(mutex_);
    const auto reads_dst = [&](const Entry& e) {
      const char *d = static_cast<const char*>(dst), *s = static_cast<const char*>(e.src);
      return e.after_queue < 0 && s < d + bytes && d < s + e.bytes;
    };
    if (std::none_of(lanes_.begin(), lanes_.end(), [&](const Lane& lane) {
          return std::any_of(lane.pending.begin(), lane.pending.end(), reads_dst);
        }))
      std::memset(dst, 0xFF, bytes);
  }
  push(queue, {.dst = dst, .src = src, .bytes = bytes});
}

void CopyQueues::task(int queue, std::function<void()> work, const void* reads,
                      size_t read_bytes) {
  push(queue, {.src = reads, .bytes = read_bytes, .task = std::move(work)});
}

void CopyQueues::after(int queue, int other, int64_t mark) {
  if (mark <= 0) return;
  push(queue, {.after_queue = other, .after_mark = mark});
}

int64_t CopyQueues::mark(int queue) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lanes_[size_t(queue)].issued;
}

void CopyQueues::wait(int queue, int64_t mark) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (lazy_) return run_until(queue, mark, lock);
  Lane& lane = lanes_[size_t(queue)];
  lane.done_cv.wait(lock, [&] { return lane.done >= mark; });
}

void CopyQueues::drain() {
  for (int q = 0; q < kQueues; q++) wait(q, mark(q));
}

int64_t CopyQueues::bytes_done() const { return bytes_done_.load(); }
double CopyQueues::seconds_busy() const { return double(nanoseconds_.load()) / 1e9; }

void CopyQueues::run_entry(const Entry& e, std::unique_lock<std::mutex>& lock) {
  if (e.after_queue >= 0) {
    if (lazy_) return run_until(e.after_queue, e.after_mark, lock);
    Lane& other = lanes_[size_t(e.after_queue)];
    other.done_cv.wait(lock, [&] { return other.done >= e.after_mark; });
    return;
  }
  if (!lazy_) lock.unlock();  // the other lane and the caller queue meanwhile
  if (e.task) {
    e.task();
  } else {
    const auto start = std::chrono::steady_clock::now();
    std::memmove(e.dst, e.src, e.bytes);
    nanoseconds_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    bytes_done_ += int64_t(e.bytes);
  }
  if (!lazy_) lock.lock();
}

void CopyQueues::run_until(int queue, int64_t mark, std::unique_lock<std::mutex>& lock) {
  Lane& lane = lanes_[size_t(queue)];
  while (lane.done < mark && !lane.pending.empty()) {
    const Entry e = std::move(lane.pending.front());
    lane.pending.pop_front();
    run_entry(e, lock);
    lane.done++;
  }
}

void CopyQueues::run(int queue) {
  Lane& lane = lanes_[size_t(queue)];
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    lane.queued.wait(lock, [&] { return stopping_ || !lane.pending.empty(); });
    if (lane.pending.empty()) return;  // stopping, and drained
    const Entry e = lane.pending.front();
    run_entry(e, lock);
    lane.pending.pop_front();
    lane.done++;
    lane.done_cv.notify_all();
  }
}

}  // namespace grass
