// The CPU backend's copy queues (Backend::copy_async): two threads, one each way, that run their
// queued copies in order while the caller computes, as a GPU's two copy engines run beside its
// compute stream. The CPU computes on the calling thread, so a copy queued now already follows the
// compute before it; wait() blocks the caller until the copies before a mark are done. A queue
// runs after the other only where after() says so (Backend::order_copy_after).
// Lazy (GRASS_LAZY_COPIES=1, for tests): no threads; a queued copy runs only when a wait or a
// drain reaches it (an after() entry then runs the other queue up to its mark), and its
// destination holds NaN bytes until then. A missing wait or cross-queue order, or a buffer reused
// before its copy ran, then changes the numbers instead of hiding behind fast threads.
#pragma once
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace grass {

class CopyQueues {
 public:
  static constexpr int kQueues = 2;  // Backend::Copy's order: to the device, to the host
  explicit CopyQueues(bool lazy);
  ~CopyQueues();  // drains
  CopyQueues(const CopyQueues&) = delete;
  CopyQueues& operator=(const CopyQueues&) = delete;

  void copy(int queue, void* dst, const void* src, size_t bytes);
  // Runs `work` in `queue`'s order, on its thread; it reads [reads, reads + read_bytes).
  void task(int queue, std::function<void()> work, const void* reads, size_t read_bytes);
  // What `queue` runs from now on waits for the first `mark` entries of `other`.
  void after(int queue, int other, int64_t mark);
  int64_t mark(int queue) const;      // the entries queued so far
  void wait(int queue, int64_t mark);  // until the first `mark` entries are done
  void drain();                        // both queues
  bool lazy() const { return lazy_; }
  // The copies done so far, both queues: their bytes, and the seconds spent in them.
  int64_t bytes_done() const;
  double seconds_busy() const;

 private:
  struct Entry {
    void* dst = nullptr;
    const void* src = nullptr;  // a task's reads
    size_t bytes = 0;
    std::function<void()> task = nullptr;  // instead of a copy, when set
    int after_queue = -1;        // instead of a copy: wait for after_mark entries of that queue
    int64_t after_mark = 0;
  };
  struct Lane {
    std::deque<Entry> pending;
    int64_t issued = 0, done = 0;
    std::condition_variable queued, done_cv;
    std::thread thread;
  };
  void push(int queue, Entry e);
  void run(int queue);  // a lane's thread
  // Lazy: on the caller's thread, with `lock` held except while an entry runs (an after() entry
  // runs the other lane: the entries it needs were queued before it, so none waits for this one).
  void run_until(int queue, int64_t mark, std::unique_lock<std::mutex>& lock);
  void run_entry(const Entry& e, std::unique_lock<std::mutex>& lock);

  const bool lazy_;
  mutable std::mutex mutex_;
  std::array<Lane, kQueues> lanes_;
  std::atomic<int64_t> bytes_done_{0}, nanoseconds_{0};
  bool stopping_ = false;
};

}  // namespace grass
