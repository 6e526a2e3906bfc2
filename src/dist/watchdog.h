// Ends a data-parallel job that has stopped moving (docs/distributed.md, "Faults"). MPI and NCCL
// wait for every rank without a timeout of their own: a rank that hangs (stopped, deadlocked, a GPU
// stuck) would leave the others waiting forever. Each rank's communicator registers every wait on
// the others here; a wait longer than the timeout makes this rank print one line naming itself and
// the wait, and exit with code 1, and mpirun then ends the other ranks. A rank that dies outright
// needs no timeout: mpirun ends the job as soon as it sees the exit.
// The waiting rank cannot tell which other rank stopped (a collective only completes or does not);
// the others' lines, or the launcher's, name the rank that died.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace grass {

class Watchdog {
 public:
  // The seconds a wait may last: GRASS_TIMEOUT_S when set (UserError unless a positive number),
  // else 1800. It must exceed the longest the others wait for rank 0's evaluation or checkpoint.
  static double timeout_from_environment();

  Watchdog(int rank, int world, double timeout_s);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // A wait on the other ranks starts; `what` names it ("a sum of 1024 fp32 over MPI"). With
  // `done`, the wait lasts until done() returns true or end(id), whichever is first (done() is
  // polled from the watchdog's thread, so it must be safe there: a cudaEventQuery after
  // cudaSetDevice); without it, until end(id).
  uint64_t begin(std::string what, std::function<bool()> done = {});
  // Once end(id) returns, that wait's done() is not running and never runs again, so the caller
  // may reuse or destroy what it reads. For a wait with a done(), end() waits for a poll round in
  // progress to finish.
  void end(uint64_t id);
  // Polled with the waits: a non-empty answer is an error that ends the job at once (NCCL's
  // asynchronous errors: a peer's connection lost). Once set_health_check returns, the previous
  // check is not running and never runs again.
  void set_health_check(std::function<std::string()> check);

 private:
  struct Wait {
    std::string what;
    std::function<bool()> done;
    double start_s;
  };
  void watch();
  // The polls of one round, outside the lock: done() and the health check call CUDA and NCCL,
  // which can block, and begin()/end() for the other waits (MPI's) must never queue behind them.
  void poll(double now, const std::vector<std::pair<uint64_t, Wait>>& waits,
            const std::function<std::string()>& health, std::vector<uint64_t>& finished);
  // Blocks the caller (holding `lock`) until no poll round is running.
  void wait_for_round(std::unique_lock<std::mutex>& lock);
  [[noreturn]] void stop(const std::string& why);

  const int rank_, world_;
  const double timeout_s_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable round_over_;
  bool polling_ = false;  // a round's polls are running outside the lock
  std::map<uint64_t, Wait> waits_;
  std::function<std::string()> health_;
  uint64_t next_id_ = 0;
  bool quit_ = false;
  std::thread thread_;
};

// A wait for the length of a scope (a blocking MPI call); nothing when the watchdog is null.
class WatchedWait {
 public:
  WatchedWait(Watchdog* dog, std::string what) : dog_(dog), id_(dog ? dog->begin(std::move(what)) : 0) {}
  ~WatchedWait() {
    if (dog_) dog_->end(id_);
  }
  WatchedWait(const WatchedWait&) = delete;
  WatchedWait& operator=(const WatchedWait&) = delete;

 private:
  Watchdog* dog_;
  uint64_t id_;
};

}  // namespace grass
