// The CPU backend's copy queue (Backend::copy_async): a thread that runs the queued copies in
// order while the caller computes, as a GPU's copy engine runs beside its compute stream. The
// CPU computes on the calling thread, so a copy queued now already follows the compute before it;
// wait() blocks the caller until the copies before a mark are done.
// Lazy (GRASS_LAZY_COPIES=1, for tests): no thread; a queued copy runs only when a wait or a
// drain reaches it, and its destination holds NaN bytes until then. A missing wait, or a buffer
// reused before its copy ran, then changes the numbers instead of hiding behind a fast thread.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace grass {

class CopyQueue {
 public:
  explicit CopyQueue(bool lazy);
  ~CopyQueue();  // drains
  CopyQueue(const CopyQueue&) = delete;
  CopyQueue& operator=(const CopyQueue&) = delete;

  void copy(void* dst, const void* src, size_t bytes);
  // Runs `work` in the queue's order, on its thread; it reads [reads, reads + read_bytes).
  void task(std::function<void()> work, const void* reads, size_t read_bytes);
  int64_t mark() const;          // the copies queued so far
  void wait(int64_t mark);       // until the first `mark` copies are done
  void drain() { wait(mark()); }
  bool lazy() const { return lazy_; }
  // The copies done so far: their bytes, and the seconds spent in them.
  int64_t bytes_done() const;
  double seconds_busy() const;

 private:
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
    std::function<void()> task;  // instead of a copy, when set
  };
  void run();             // the thread
  void run_until(int64_t mark);  // lazy: on the caller's thread
  void timed_copy(const Copy& c);  // the copy itself, counted (without the lock); or the task

  const bool lazy_;
  mutable std::mutex mutex_;
  std::condition_variable queued_, done_cv_;
  std::deque<Copy> pending_;
  int64_t issued_ = 0, done_ = 0;
  std::atomic<int64_t> bytes_done_{0}, nanoseconds_{0};
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace grass
