// The data-parallel watchdog's contract with the communicators that register waits on it
// (src/dist/watchdog.h): its polls run outside its lock, so a done() that blocks in the driver
// never holds up another wait's begin() or end(); and once end(id) returns, that wait's done() is
// not running and never runs again, so the caller may reuse the event it queried. Its timeout
// (one line, exit 1) is tested across real ranks in tests/data_parallel.sh.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "src/dist/watchdog.h"

using namespace grass;
using namespace std::chrono_literals;

namespace {

// Waits up to `limit` for `flag`; true if it was set.
bool eventually(const std::atomic<bool>& flag, std::chrono::milliseconds limit = 10s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!flag && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  return flag;
}

}  // namespace

TEST_CASE("watchdog: a done() that blocks holds up no other wait's begin or end") {
  // 60 s timeout: polls every second, and nothing here waits long enough to end the process.
  Watchdog dog(0, 2, 60);
  std::atomic<bool> entered{false}, release{false};
  const uint64_t blocked = dog.begin("a query the driver holds", [&] {
    entered = true;
    while (!release) std::this_thread::sleep_for(1ms);
    return true;
  });
  REQUIRE(eventually(entered));
  // An MPI wait (no done()) starts and ends while the watchdog's thread is inside that query.
  auto other = std::async(std::launch::async, [&] {
    const uint64_t id = dog.begin("a sum over MPI");
    dog.end(id);
  });
  const bool unblocked = other.wait_for(5s) == std::future_status::ready;
  release = true;
  other.wait();
  CHECK(unblocked);
  dog.end(blocked);
}

TEST_CASE("watchdog: after end() returns, the wait's done() is not running and is never polled again") {
  Watchdog dog(0, 2, 60);
  std::atomic<int> polls{0};
  std::atomic<bool> inside{false}, entered{false};
  const uint64_t id = dog.begin("a sum of gradients over NCCL", [&] {
    inside = true;
    entered = true;
    polls++;
    std::this_thread::sleep_for(300ms);  // end() arrives while this runs
    inside = false;
    return false;
  });
  REQUIRE(eventually(entered));
  dog.end(id);
  CHECK_FALSE(inside);
  const int after_end = polls;
  std::this_thread::sleep_for(2500ms);  // more than two poll periods
  CHECK(polls == after_end);
}

TEST_CASE("watchdog: a wait whose done() says so ends by itself, and a health check is replaced cleanly") {
  Watchdog dog(0, 2, 60);
  std::atomic<bool> finished{false}, checked{false};
  std::atomic<int> polls{0};
  dog.begin("a sum that completes", [&] {
    polls++;
    finished = true;
    return true;
  });
  REQUIRE(eventually(finished));
  dog.set_health_check([&] {
    checked = true;
    std::this_thread::sleep_for(200ms);
    return std::string();
  });
  REQUIRE(eventually(checked));
  dog.set_health_check({});  // returns once the old check is not running
  checked = false;
  std::this_thread::sleep_for(2500ms);
  CHECK_FALSE(checked);
  CHECK(polls == 1);  // erased after its first true answer
}
