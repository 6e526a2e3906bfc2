// cuda_emu's streams and events (streams.h): run at once, or deferred and adversarial.
#include "streams.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace cuda_emu {

namespace {

struct Mode {
  bool deferred = false;
  bool late = false;  // "late": work runs only when forced, the forcing stream's first
  uint64_t seed = 1;
};
const Mode& mode() {
  static const Mode m = [] {
    Mode parsed;
    const char* text = std::getenv("CUDA_EMU_STREAMS");
    const std::string v = text ? text : "";
    const auto fail = [&] {
      std::fprintf(stderr, "cuda_emu: CUDA_EMU_STREAMS=%s: not \"deferred\", \"deferred:N\" or "
                           "\"late\"\n", v.c_str());
      std::abort();
    };
    if (v == "late") {
      parsed.deferred = parsed.late = true;
    } else if (v.rfind("deferred", 0) == 0) {
      parsed.deferred = true;
      if (v.size() > 8) {
        if (v[8] != ':' || v.size() == 9 || v.find_first_not_of("0123456789", 9) != std::string::npos)
          fail();
        parsed.seed = std::stoull(v.substr(9));
      }
    } else if (!v.empty()) {
      fail();
    }
    return parsed;
  }();
  return m;
}

// Every queue and the scheduler's generator. Recursive: an op that runs may be a cuBLAS call
// whose own checks take it again.
std::recursive_mutex queues;
std::vector<cudaStream_t> streams;
std::atomic<uint64_t> tickets{0};
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::mt19937_64& rng() {
  static std::mt19937_64 g(mode().seed * 0x9E3779B97F4A7C15ull + 1);
  return g;
}

bool runnable(const Op& op) {
  return op.kind != Op::Wait || op.event->completed.load() >= op.ticket;
}

void run(Op& op) {
  switch (op.kind) {
    case Op::Work: op.work(); break;
    case Op::Record: {
      op.event->reached_ns.store(now_ns());
      uint64_t was = op.event->completed.load();
      while (was < op.ticket && !op.event->completed.compare_exchange_weak(was, op.ticket)) {
      }
      break;
    }
    case Op::Wait: break;  // runnable: its event is reached
  }
}

// Late: the stream whose work `forced` needs next. `forced` itself when its head can run; else
// the stream holding the record its head waits for, followed on, so that nothing runs that the
// forced stream does not need (two copy streams: neither runs ahead while the other is drained).
cudaStream_t needed_by(cudaStream_t forced) {
  cudaStream_t s = forced;
  for (size_t hops = 0; hops <= streams.size(); hops++) {
    if (s->queue.empty() || runnable(s->queue.front())) return s;
    const Op& head = s->queue.front();
    cudaStream_t holder = nullptr;
    for (cudaStream_t st : streams)
      for (const Op& op : st->queue)
        if (op.kind == Op::Record && op.event == head.event && op.ticket == head.ticket) holder = st;
    if (!holder) return s;
    s = holder;
  }
  return s;
}

// Runs one runnable head: `first`'s when it has one (late: the stream it waits on), else the
// generator's pick among them; false when none is.
bool step(cudaStream_t first = nullptr) {
  if (first && mode().late) first = needed_by(first);
  if (first && !first->queue.empty() && runnable(first->queue.front())) {
    Op op = std::move(first->queue.front());
    first->queue.pop_front();
    run(op);
    return true;
  }
  std::vector<cudaStream_t> ready;
  for (cudaStream_t s : streams)
    if (!s->queue.empty() && runnable(s->queue.front())) ready.push_back(s);
  if (ready.empty()) return false;
  cudaStream_t s = ready[size_t(rng()() % ready.size())];
  Op op = std::move(s->queue.front());
  s->queue.pop_front();
  run(op);
  return true;
}

// Runs queued work until done(); late, `first`'s before any other stream's.
template <typename Done>
void run_until(Done done, const char* what, cudaStream_t first = nullptr) {
  const std::lock_guard<std::recursive_mutex> lock(queues);
  if (!mode().late) first = nullptr;
  while (!done())
    if (!step(first)) {
      std::fprintf(stderr, "cuda_emu: %s can never complete: every queued stream waits on an "
                           "event no stream will reach\n", what);
      std::abort();
    }
}

bool all_empty() {
  for (cudaStream_t s : streams)
    if (!s->queue.empty()) return false;
  return true;
}

// A random point: some queued work runs now, as a GPU runs it whenever it gets to it.
void random_progress() {
  if (mode().late || rng()() % 4 != 0) return;
  for (int i = int(rng()() % 4); i > 0 && step(); i--) {
  }
}

}  // namespace

bool deferred_streams() { return mode().deferred; }

void register_stream(cudaStream_t stream) {
  const std::lock_guard<std::recursive_mutex> lock(queues);
  streams.push_back(stream);
}

void unregister_stream(cudaStream_t stream) {
  drain_stream(stream);
  const std::lock_guard<std::recursive_mutex> lock(queues);
  streams.erase(std::remove(streams.begin(), streams.end(), stream), streams.end());
}

void enqueue(cudaStream_t stream, std::function<void()> work) {
  if (!mode().deferred) {
    work();
    return;
  }
  const std::lock_guard<std::recursive_mutex> lock(queues);
  if (!stream) {  // the legacy default stream: after everything queued, before anything later
    drain_all();
    work();
    return;
  }
  stream->queue.push_back({Op::Work, std::move(work), nullptr, 0});
  random_progress();
}

void record(cudaEvent_t event, cudaStream_t stream) {
  const uint64_t ticket = ++tickets;
  event->recorded.store(ticket);
  if (!mode().deferred || !stream) {
    if (mode().deferred) drain_all();
    event->reached_ns.store(now_ns());
    event->completed.store(ticket);
    return;
  }
  const std::lock_guard<std::recursive_mutex> lock(queues);
  stream->queue.push_back({Op::Record, {}, event, ticket});
  random_progress();
}

void wait(cudaStream_t stream, cudaEvent_t event) {
  if (!mode().deferred) return;
  const uint64_t ticket = event->recorded.load();  // the latest record at the time of the call
  const std::lock_guard<std::recursive_mutex> lock(queues);
  if (!stream) {
    run_until([&] { return event->completed.load() >= ticket; }, "a wait on the default stream");
    return;
  }
  stream->queue.push_back({Op::Wait, {}, event, ticket});
}

bool reached(cudaEvent_t event) { return event->completed.load() >= event->recorded.load(); }

void drain_stream(cudaStream_t stream) {
  if (!mode().deferred) return;
  if (!stream) return drain_all();
  run_until([&] { return stream->queue.empty(); }, "cudaStreamSynchronize", stream);
}

void drain_event(cudaEvent_t event) {
  if (!mode().deferred) return;
  const uint64_t ticket = event->recorded.load();
  cudaStream_t recorder = nullptr;  // the stream whose queue holds the record
  {
    const std::lock_guard<std::recursive_mutex> lock(queues);
    for (cudaStream_t st : streams)
      for (const Op& op : st->queue)
        if (op.kind == Op::Record && op.event == event && op.ticket == ticket) recorder = st;
  }
  run_until([&] { return event->completed.load() >= ticket; }, "cudaEventSynchronize", recorder);
}

void drain_all() {
  if (!mode().deferred) return;
  run_until(all_empty, "a device synchronisation");
}

}  // namespace cuda_emu
