// cuda_emu's streams and events, shared by its runtime, cuBLAS and NCCL (streams.cpp). By default
// every call runs to completion when it is made. Under CUDA_EMU_STREAMS=deferred[:seed] work is
// queued per stream, as a GPU queues it, and runs only when something forces it, in an
// adversarial order: a host synchronisation, a synchronous copy, an event's synchronisation, a
// wait edge a forced stream reaches, NCCL (which runs its sum at once, after its stream), and
// random points at each enqueue; between streams the order is the seeded generator's. So a
// missing stream wait, a host buffer reused before its copy ran, or a read of a download before
// its stream was synchronised shows here, where the run-to-completion emulator hides it.
// CUDA_EMU_STREAMS=late is deferred without the random points, and a forced stream runs its own
// work first, other streams' only while it waits on them, and then only the stream holding the
// record it waits for: every copy runs as late as it may, so a compute that reads a copy's
// destination without waiting reads what was there before, and a copy on one stream that needs
// another's without an event wait runs before it.
#pragma once
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>

#include "cuda_runtime.h"

namespace cuda_emu {

// One queued piece of a stream's work.
struct Op {
  enum Kind { Work, Record, Wait } kind = Work;
  std::function<void()> work;       // Work
  cudaEvent_t event = nullptr;      // Record, Wait
  uint64_t ticket = 0;              // Record: this record's number; Wait: the record waited for
};

}  // namespace cuda_emu

struct CUevent_st {  // the type CUDA leaves opaque
  int device;
  std::thread::id owner;
  std::atomic<uint64_t> recorded{0};   // the latest cudaEventRecord's number
  std::atomic<uint64_t> completed{0};  // the latest one the stream has reached
  std::atomic<int64_t> reached_ns{0};  // steady-clock time it was reached (cudaEventElapsedTime)
  bool timing = true;                  // made without cudaEventDisableTiming
};
struct CUstream_st {  // the type CUDA leaves opaque
  int device;
  std::deque<cuda_emu::Op> queue;  // deferred mode: queued, not yet run
};

namespace cuda_emu {

bool deferred_streams();
void register_stream(cudaStream_t stream);
void unregister_stream(cudaStream_t stream);  // drains it first
// `work` in `stream`'s order: now, or queued (deferred; the null stream drains every stream first
// and runs at once, as the legacy default stream waits for all others).
void enqueue(cudaStream_t stream, std::function<void()> work);
void record(cudaEvent_t event, cudaStream_t stream);
void wait(cudaStream_t stream, cudaEvent_t event);
bool reached(cudaEvent_t event);  // any thread: no work runs
void drain_stream(cudaStream_t stream);
void drain_event(cudaEvent_t event);
void drain_all();

}  // namespace cuda_emu
