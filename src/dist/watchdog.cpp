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
  const std::lock_guard<std::mutex> lock(mutex_);
  waits_.erase(id);
}

void Watchdog::set_health_check(std::function<std::string()> check) {
  const std::lock_guard<std::mutex> lock(mutex_);
  health_ = std::move(check);
}

void Watchdog::stop(const std::string& why) {
  std::fprintf(stderr, "error (rank %d of %d): %s; ending the job\n", rank_, world_, why.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  // Not MPI_Abort: the main thread may be inside MPI, which only it may call. mpirun ends the
  // other ranks when it sees this one exit.
  std::_Exit(1);
}

void Watchdog::watch() {
  // Poll often enough to stop within a few percent of the timeout, at most once a second.
  const auto period = std::chrono::duration<double>(std::min(1.0, timeout_s_ / 20));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period, [this] { return quit_; })) {
    if (health_) {
      const std::string error = health_();
      if (!error.empty()) stop(error);
    }
    const double now = now_s();
    for (auto it = waits_.begin(); it != waits_.end();) {
      if (it->second.done && it->second.done()) {
        it = waits_.erase(it);
        continue;
      }
      if (now - it->second.start_s > timeout_s_) {
        char line[160];
        std::snprintf(line, sizeof line, " has waited %.0f s for the other ranks (GRASS_TIMEOUT_S = %g): "
                      "another rank has stopped or died", now - it->second.start_s, timeout_s_);
        stop(it->second.what + line);
      }
      ++it;
    }
  }
}

}  // namespace grass
