#include "src/dist/watchdog.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "src/core/error.h"

namespace grass {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

double Watchdog::timeout_from_environment() {
  const char* text = std::getenv("GRASS_TIMEOUT_S");
  if (!text || !*text) return 1800;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (*end != '\0' || !(seconds > 0))
    throw UserError(std::string("GRASS_TIMEOUT_S: '") + text + "' is not a positive number of seconds");
  return seconds;
}

Watchdog::Watchdog(int rank, int world, double timeout_s)
    : rank_(rank), world_(world), timeout_s_(timeout_s), thread_([this] { watch(); }) {}

Watchdog::~Watchdog() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    quit_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

uint64_t Watchdog::begin(std::string what, std::function<bool()> done) {
  const std::lock_guard<std::mutex> lock(mutex_);
  waits_.emplace(next_id_, Wait{std::move(what), std::move(done), now_s()});
  return next_id_++;
}

void Watchdog::end(uint64_t id) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto it = waits_.find(id);
  if (it == waits_.end()) return;  // its done() said so in an earlier round
  const bool polled = bool(it->second.done);
  waits_.erase(it);
  if (polled) wait_for_round(lock);
}

void Watchdog::set_health_check(std::function<std::string()> check) {
  std::unique_lock<std::mutex> lock(mutex_);
  health_ = std::move(check);
  wait_for_round(lock);
}

void Watchdog::wait_for_round(std::unique_lock<std::mutex>& lock) {
  // The watchdog's own thread never ends a wait, so this cannot wait on itself.
  round_over_.wait(lock, [this] { return !polling_; });
}

void Watchdog::stop(const std::string& why) {
  std::fprintf(stderr, "error (rank %d of %d): %s; ending the job\n", rank_, world_, why.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  // Not MPI_Abort: the main thread may be inside MPI, which only it may call. mpirun ends the
  // other ranks when it sees this one exit.
  std::_Exit(1);
}

void Watchdog::poll(double now, const std::vector<std::pair<uint64_t, Wait>>& waits,
                    const std::function<std::string()>& health, std::vector<uint64_t>& finished) {
  if (health) {
    const std::string error = health();
    if (!error.empty()) stop(error);
  }
  for (const auto& [id, wait] : waits) {
    if (wait.done && wait.done()) {
      finished.push_back(id);
      continue;
    }
    if (now - wait.start_s > timeout_s_) {
      char line[160];
      std::snprintf(line, sizeof line, " has waited %.0f s for the other ranks (GRASS_TIMEOUT_S = %g): "
                    "another rank has stopped or died", now - wait.start_s, timeout_s_);
      stop(wait.what + line);
    }
  }
}

void Watchdog::watch() {
  // Poll often enough to stop within a few percent of the timeout, at most once a second.
  const auto period = std::chrono::duration<double>(std::min(1.0, timeout_s_ / 20));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period, [this] { return quit_; })) {
    // Copies: the functions' captures stay alive for the round even if end() erases the wait.
    std::vector<std::pair<uint64_t, Wait>> waits(waits_.begin(), waits_.end());
    std::function<std::string()> health = health_;
    std::vector<uint64_t> finished;
    polling_ = true;
    lock.unlock();
    poll(now_s(), waits, health, finished);
    waits.clear();  // the copies go before end() may return to a caller that frees their captures
    health = nullptr;
    lock.lock();
    for (uint64_t id : finished) waits_.erase(id);
    polling_ = false;
    round_over_.notify_all();
  }
}

}  // namespace grass
