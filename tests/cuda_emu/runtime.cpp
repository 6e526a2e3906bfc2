// cuda_emu's runtime: device memory fenced by guard pages, one device, synchronous streams, and
// kernels run block by block with each thread a fiber (see include/cuda_runtime.h).
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <deque>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_emu.h"
#include "cuda_runtime.h"
#include "streams.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kTotalMemory = size_t(16) << 30;  // what cudaMemGetInfo reports as the card
// A node of 8 emulated GPUs, all in the host's memory: each data-parallel rank under mpirun takes
// the one at its index on the node, as on a real node.
constexpr int kDevices = 8;
constexpr int kMaxSharedOptin = 232448;             // sm_90: 227 KiB of shared memory per block
constexpr int kMultiProcessors = 132;                // an H100 SXM's
constexpr int kDefaultMaxShared = 48 << 10;
constexpr uint64_t kRegistersPerBlock = 65536;        // sm_90: a block's share of the register file

// The current device is the calling thread's, as CUDA's: a new thread starts on device 0. Events,
// streams and allocations belong to the device current when they were made; a call that uses one
// from a thread whose current device is another stops the program naming both: on a GPU such a
// call from a helper thread that never called cudaSetDevice opens a context on device 0 (half a
// GiB per process on a multi-GPU node) and works on the wrong device.
thread_local int current_device = 0;
[[noreturn]] void wrong_device(const char* call, const char* what, int device) {
  std::fprintf(stderr,
               "cuda_emu: %s on %s of device %d from a thread whose current device is %d (a thread "
               "starts on device 0: call cudaSetDevice in it first)\n",
               call, what, device, current_device);
  std::abort();
}

cudaError_t last_error = cudaSuccess;
void set_error(cudaError_t err) {
  if (last_error == cudaSuccess) last_error = err;
}
// A fault of a kernel that ran: reported by the next synchronising call, as a GPU does.
// Atomic: a data-parallel run's watchdog queries events from its own thread (dist/watchdog.h).
std::atomic<cudaError_t> pending_fault{cudaSuccess};
std::mutex fault_message_mutex;
std::string fault_message;  // the last kernel fault's line (cuda_emu.h's last_kernel_fault)
cudaError_t take_fault() { return pending_fault.exchange(cudaSuccess); }

// Module loading, as the process's first CUDA call found CUDA_MODULE_LOADING (cuda_runtime.h).
bool lazy_module_loading() {
  static const bool lazy = [] {
    const char* mode = std::getenv("CUDA_MODULE_LOADING");
    return !(mode && std::string(mode) == "EAGER");
  }();
  return lazy;
}

// ---- device memory ---------------------------------------------------------------------------
// Each allocation ends (rounded up to 256 bytes, cudaMalloc's alignment) right before a
// PROT_NONE page, so a kernel that runs past the end of a buffer faults at once. New memory is
// 0xFF everywhere (NaN as fp32 and bf16), as GPU memory is never zero-initialised by promise.
struct Allocation {
  char* base;  // the mapping
  size_t mapped;
  size_t bytes;  // as asked
  int device;    // current when it was made
};
std::mutex memory_mutex;
std::map<uintptr_t, Allocation> allocations;  // keyed by the pointer handed out
size_t allocated_bytes = 0;
uint64_t allocation_count = 0;  // cuda_emu.h's device_allocations()
// Lazy loading puts a kernel's code on the device at its first launch; a stand-in size.
constexpr size_t kKernelCodeBytes = size_t(64) << 10;
std::set<std::string> loaded_kernels;  // by the launch's kernel name

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

const Allocation* find_allocation(const void* p, uintptr_t* start) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  auto it = allocations.upper_bound(addr);
  if (it == allocations.begin()) return nullptr;
  --it;
  *start = it->first;
  return &it->second;
}

// The allocation whose usable bytes (rounded to 256) hold address p, and their end; null if none.
// The caller holds memory_mutex.
const Allocation* allocation_holding(const void* p, uintptr_t* end) {
  uintptr_t start = 0;
  const Allocation* a = find_allocation(p, &start);
  if (!a) return nullptr;
  *end = start + round_up(std::max<size_t>(a->bytes, 1), 256);
  return reinterpret_cast<uintptr_t>(p) < *end ? a : nullptr;
}

}  // namespace

namespace cuda_emu {

uint64_t device_allocations() {
  std::lock_guard<std::mutex> lock(memory_mutex);
  return allocation_count;
}

bool is_device_range(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(memory_mutex);
  uintptr_t end = 0;
  return allocation_holding(p, &end) && reinterpret_cast<uintptr_t>(p) + bytes <= end;
}

}  // namespace cuda_emu

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  lazy_module_loading();  // a first CUDA call reads the loading mode
  const size_t used = round_up(std::max<size_t>(bytes, 1), 256);
  const size_t body = round_up(used, kPage);
  std::lock_guard<std::mutex> lock(memory_mutex);
  allocation_count++;
  if (allocated_bytes + body > kTotalMemory) {
    *ptr = nullptr;
    set_error(cudaErrorMemoryAllocation);
    return cudaErrorMemoryAllocation;
  }
  void* map = mmap(nullptr, body + kPage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (map == MAP_FAILED) {
    *ptr = nullptr;
    set_error(cudaErrorMemoryAllocation);
    return cudaErrorMemoryAllocation;
  }
  char* base = static_cast<char*>(map);
  mprotect(base + body, kPage, PROT_NONE);
  char* p = base + (body - used);
  std::memset(p, 0xFF, used);
  allocations[reinterpret_cast<uintptr_t>(p)] = {base, body + kPage, bytes, current_device};
  allocated_bytes += body;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  cuda_emu::drain_all();  // cudaFree waits for the device: queued work may still use the memory
  std::lock_guard<std::mutex> lock(memory_mutex);
  auto it = allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations.end()) {
    std::fprintf(stderr, "cuda_emu: cudaFree of a pointer cudaMalloc did not return\n");
    set_error(cudaErrorInvalidValue);
    return cudaErrorInvalidValue;
  }
  allocated_bytes -= it->second.mapped - kPage;
  munmap(it->second.base, it->second.mapped);
  allocations.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  std::lock_guard<std::mutex> lock(memory_mutex);
  *total_bytes = kTotalMemory;
  *free_bytes = kTotalMemory - allocated_bytes;
  return cudaSuccess;
}

namespace {
uint64_t checksum(const void* p, size_t bytes) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; i++) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 0x100000001b3ull;
  return h;
}
// The device side of a copy or memset must lie inside one allocation, of the current device.
cudaError_t check_device(const void* p, size_t bytes, const char* what) {
  if (bytes == 0) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(memory_mutex);
    uintptr_t end = 0;
    const Allocation* a = allocation_holding(p, &end);
    if (a && a->device != current_device) wrong_device(what, "memory", a->device);
    if (a && reinterpret_cast<uintptr_t>(p) + bytes <= end) return cudaSuccess;
  }
  std::fprintf(stderr, "cuda_emu: %s of %zu bytes outside any device allocation\n", what, bytes);
  set_error(cudaErrorInvalidValue);
  return cudaErrorInvalidValue;
}
// Host sources of queued copies that have not run: a host destination that one of them still
// reads is not poisoned (a stream runs in order, so that read comes first).
std::mutex pending_mutex;
std::multimap<const char*, size_t> pending_host_sources;
// Host destinations of queued copies that have not run: a copy queued after one of them reads
// what it will write (pinned memory is read when the stream reaches the copy), so its source is
// not checksummed at the call.
std::multimap<const char*, size_t> pending_host_destinations;
bool written_by_pending_copy(const void* src, size_t bytes) {
  const char* p = static_cast<const char*>(src);
  std::lock_guard<std::mutex> lock(pending_mutex);
  for (const auto& [dst, n] : pending_host_destinations)
    if (dst < p + bytes && p < dst + n) return true;
  return false;
}
// Host functions queued and not yet run (cudaLaunchHostFunc): they may read or write any host
// memory, so while one waits no host buffer is poisoned or checksummed.
std::atomic<int> pending_host_functions{0};
bool read_by_pending_copy(const void* dst, size_t bytes) {
  if (pending_host_functions > 0) return true;
  const char* d = static_cast<const char*>(dst);
  std::lock_guard<std::mutex> lock(pending_mutex);
  for (const auto& [src, n] : pending_host_sources)
    if (src < d + bytes && d < src + n) return true;
  return false;
}
}  // namespace

namespace {
void check_pinned_span(const void* host, size_t bytes);  // below, with the pinned regions
}  // namespace
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  cuda_emu::check_stream_device(stream, "cudaMemcpyAsync");
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (dst_device)
    if (cudaError_t e = check_device(dst, bytes, "cudaMemcpy destination")) return e;
  if (src_device)
    if (cudaError_t e = check_device(src, bytes, "cudaMemcpy source")) return e;
  if (bytes == 0) return cudaSuccess;
  if (!src_device) check_pinned_span(src, bytes);
  if (!dst_device) check_pinned_span(dst, bytes);
  if (!cuda_emu::deferred_streams() || !stream) {
    cuda_emu::enqueue(stream, [=] { std::memmove(dst, src, bytes); });
    return cudaSuccess;
  }
  // Deferred: the host side of the copy is the caller's until the stream reaches it. A host source
  // must not change before then (checked when the copy runs); a host destination holds NaN bytes
  // until then, so a read before the stream is synchronised shows.
  // a host function or a copy queued before may write the source
  const bool source_pending = !src_device && (pending_host_functions > 0 ||
                                              written_by_pending_copy(src, bytes));
  const uint64_t sum = src_device || source_pending ? 0 : checksum(src, bytes);
  if (!dst_device && !read_by_pending_copy(dst, bytes)) std::memset(dst, 0xFF, bytes);
  std::multimap<const char*, size_t>::iterator pending, pending_dst;
  {
    std::lock_guard<std::mutex> lock(pending_mutex);
    if (!src_device) pending = pending_host_sources.emplace(static_cast<const char*>(src), bytes);
    if (!dst_device)
      pending_dst = pending_host_destinations.emplace(static_cast<const char*>(dst), bytes);
  }
  cuda_emu::enqueue(stream, [=] {
    if (!src_device && !source_pending && checksum(src, bytes) != sum) {
      std::fprintf(stderr, "cuda_emu: the host source of a cudaMemcpyAsync of %zu bytes changed "
                           "before the copy ran (wait for the stream before reusing it)\n", bytes);
      std::abort();
    }
    std::memmove(dst, src, bytes);
    std::lock_guard<std::mutex> lock(pending_mutex);
    if (!src_device) pending_host_sources.erase(pending);
    if (!dst_device) pending_host_destinations.erase(pending_dst);
  });
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  cuda_emu::check_stream_device(stream, "cudaLaunchHostFunc");
  pending_host_functions++;
  cuda_emu::enqueue(stream, [=] {
    fn(user_data);
    pending_host_functions--;
  });
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  cuda_emu::drain_all();  // synchronous: waits for the work before it
  if (cudaError_t e = take_fault()) return e;
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  cuda_emu::check_stream_device(stream, "cudaMemcpy2DAsync");
  if (kind != cudaMemcpyDeviceToDevice) return cudaErrorInvalidValue;
  if (height == 0 || width == 0) return cudaSuccess;
  if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
  if (cudaError_t e = check_device(dst, dpitch * (height - 1) + width, "cudaMemcpy2D destination"))
    return e;
  if (cudaError_t e = check_device(src, spitch * (height - 1) + width, "cudaMemcpy2D source"))
    return e;
  cuda_emu::enqueue(stream, [=] {
    for (size_t r = 0; r < height; r++)
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                   width);
  });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  cuda_emu::check_stream_device(stream, "cudaMemsetAsync");
  if (cudaError_t e = check_device(dst, bytes, "cudaMemset")) return e;
  if (bytes) cuda_emu::enqueue(stream, [=] { std::memset(dst, value, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  cuda_emu::drain_all();
  if (cudaError_t e = take_fault()) return e;
  return cudaMemsetAsync(dst, value, bytes, nullptr);
}
cudaError_t cudaMemset2DAsync(void* dst, size_t pitch, int value, size_t width, size_t height,
                              cudaStream_t stream) {
  cuda_emu::check_stream_device(stream, "cudaMemset2DAsync");
  if (height == 0 || width == 0) return cudaSuccess;
  if (width > pitch) return cudaErrorInvalidValue;
  if (cudaError_t e = check_device(dst, pitch * (height - 1) + width, "cudaMemset2D")) return e;
  cuda_emu::enqueue(stream, [=] {
    for (size_t r = 0; r < height; r++) std::memset(static_cast<char*>(dst) + r * pitch, value, width);
  });
  return cudaSuccess;
}

// ---- errors, device, streams -----------------------------------------------------------------
cudaError_t cudaGetLastError() {
  const cudaError_t err = last_error;
  last_error = cudaSuccess;
  return err;
}
cudaError_t cudaPeekAtLastError() { return last_error; }
const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotReady: return "device not ready";
  }
  return "unknown error";
}
cudaError_t cudaGetDeviceCount(int* count) {
  lazy_module_loading();  // a first CUDA call reads the loading mode
  *count = kDevices;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= kDevices) return cudaErrorInvalidValue;
  current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= kDevices) return cudaErrorInvalidValue;
  *prop = {};
  std::snprintf(prop->name, sizeof prop->name, "cuda_emu (CPU emulation)");
  prop->totalGlobalMem = kTotalMemory;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = kMultiProcessors;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= kDevices) return cudaErrorInvalidValue;
  if (attr == cudaDevAttrMultiProcessorCount) {
    *value = kMultiProcessors;
    return cudaSuccess;
  }
  if (attr == cudaDevAttrAsyncEngineCount) {  // a copy engine each way, as a datacenter GPU's
    *value = 2;
    return cudaSuccess;
  }
  if (attr != cudaDevAttrMaxSharedMemoryPerBlockOptin) return cudaErrorInvalidValue;
  *value = kMaxSharedOptin;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetLimit(size_t* value, cudaLimit limit) {
  if (limit != cudaLimitStackSize) return cudaErrorInvalidValue;
  *value = 1024;
  return cudaSuccess;
}
// Synchronisation runs what is queued (streams.h), then reports a kernel's fault.
cudaError_t cudaDeviceSynchronize() {
  cuda_emu::drain_all();
  return take_fault();
}
namespace cuda_emu {
// The null stream is the current device's.
void check_stream_device(cudaStream_t stream, const char* call) {
  if (stream && stream->device != current_device) wrong_device(call, "a stream", stream->device);
}
}  // namespace cuda_emu

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = new CUstream_st{current_device, {}};
  cuda_emu::register_stream(*stream);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  cuda_emu::check_stream_device(stream, "cudaStreamDestroy");
  cuda_emu::unregister_stream(stream);
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  cuda_emu::check_stream_device(stream, "cudaStreamSynchronize");
  cuda_emu::drain_stream(stream);
  return take_fault();
}
// CUDA_EMU_PINNED_LIMIT=<bytes>: cudaHostAlloc and cudaHostRegister fail once the pinned bytes
// held would pass it, as on a machine that cannot pin (or lock) that much memory.
namespace {
std::mutex pinned_mutex;
std::map<const char*, size_t> pinned;  // the pinned regions held: start -> bytes
std::map<const char*, bool> registered;  // which of them cudaHostRegister made
size_t pinned_bytes = 0;
size_t pinned_limit() {
  static const size_t limit = [] {
    const char* text = std::getenv("CUDA_EMU_PINNED_LIMIT");
    return text ? size_t(std::strtoull(text, nullptr, 10)) : SIZE_MAX;
  }();
  return limit;
}
}  // namespace
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned) {
  const std::lock_guard<std::mutex> lock(pinned_mutex);
  *ptr = nullptr;
  if (bytes > pinned_limit() - pinned_bytes) return cudaErrorMemoryAllocation;
  *ptr = std::malloc(std::max<size_t>(bytes, 1));
  if (!*ptr) return cudaErrorMemoryAllocation;
  pinned[static_cast<const char*>(*ptr)] = bytes;
  pinned_bytes += bytes;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) {
  cuda_emu::drain_all();  // as cudaFree: queued copies may still read it
  {
    const std::lock_guard<std::mutex> lock(pinned_mutex);
    if (auto it = pinned.find(static_cast<const char*>(ptr)); it != pinned.end()) {
      if (registered.count(it->first)) {
        std::fprintf(stderr, "cuda_emu: cudaFreeHost of registered memory (cudaHostUnregister it)\n");
        std::abort();
      }
      pinned_bytes -= it->second;
      pinned.erase(it);
    }
  }
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void* ptr, size_t bytes, unsigned) {
  const std::lock_guard<std::mutex> lock(pinned_mutex);
  const char* start = static_cast<const char*>(ptr);
  auto next = pinned.lower_bound(start);  // no overlap with a region held: CUDA refuses it
  const bool overlaps = (next != pinned.end() && next->first < start + bytes) ||
                        (next != pinned.begin() && std::prev(next)->first + std::prev(next)->second > start);
  if (bytes == 0 || overlaps) return set_error(cudaErrorInvalidValue), cudaErrorInvalidValue;
  if (bytes > pinned_limit() - pinned_bytes)
    return set_error(cudaErrorMemoryAllocation), cudaErrorMemoryAllocation;
  pinned[start] = bytes;
  registered[start] = true;
  pinned_bytes += bytes;
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* ptr) {
  cuda_emu::drain_all();  // queued copies may still read it
  const std::lock_guard<std::mutex> lock(pinned_mutex);
  const char* start = static_cast<const char*>(ptr);
  const auto it = pinned.find(start);
  if (it == pinned.end() || !registered.count(start))
    return set_error(cudaErrorInvalidValue), cudaErrorInvalidValue;
  pinned_bytes -= it->second;
  pinned.erase(it);
  registered.erase(start);
  return cudaSuccess;
}
namespace {
// The pinned region holding p: its start and bytes, or {nullptr, 0} when none does.
std::pair<const char*, size_t> pinned_region(const void* p) {
  const char* c = static_cast<const char*>(p);
  const std::lock_guard<std::mutex> lock(pinned_mutex);
  auto it = pinned.upper_bound(c);
  if (it == pinned.begin()) return {nullptr, 0};
  --it;
  if (c >= it->first + it->second) return {nullptr, 0};
  return {it->first, it->second};
}
// An async copy is async only within one pinned region: one whose host side starts in a region
// and runs past its end is a bug of the caller (the CUDA backend splits its copies at the ends).
void check_pinned_span(const void* host, size_t bytes) {
  const auto [start, n] = pinned_region(host);
  const size_t left = start ? size_t(start + n - static_cast<const char*>(host)) : 0;
  if (left == 0 || bytes <= left) return;
  std::fprintf(stderr, "cuda_emu: a cudaMemcpyAsync of %zu bytes runs %zu bytes past the end of "
                       "the pinned region its host side starts in\n", bytes, bytes - left);
  std::abort();
}
}  // namespace
namespace cuda_emu {
size_t pinned_region_bytes(const void* p) { return pinned_region(p).second; }
}  // namespace cuda_emu
// Stricter than CUDA, an event is destroyed only by the thread that made it: one dropped on a
// helper thread (a watchdog's last reference) is destroyed at a moment the owner does not know,
// while it may still record or wait on it.
namespace {
void check_event_device(cudaEvent_t event, const char* call) {
  if (!event) {
    std::fprintf(stderr, "cuda_emu: %s on a null event\n", call);
    std::abort();
  }
  if (event->device != current_device) wrong_device(call, "an event", event->device);
}
}  // namespace
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  *event = new CUevent_st{current_device, std::this_thread::get_id(), {0}, {0}, {0},
                          (flags & cudaEventDisableTiming) == 0};
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  check_event_device(event, "cudaEventDestroy");
  if (event->owner != std::this_thread::get_id()) {
    std::fprintf(stderr, "cuda_emu: cudaEventDestroy on a thread other than the one that made the "
                         "event (destroy it where it is made and used)\n");
    std::abort();
  }
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  check_event_device(event, "cudaEventRecord");
  cuda_emu::check_stream_device(stream, "cudaEventRecord");
  cuda_emu::record(event, stream);
  return cudaSuccess;
}
// NotReady until its stream reaches it (at once unless streams are deferred); a query runs no
// work, so the watchdog's thread may ask. Reached, it reports a kernel's fault, as a GPU does.
cudaError_t cudaEventQuery(cudaEvent_t event) {
  check_event_device(event, "cudaEventQuery");
  if (!cuda_emu::reached(event)) return cudaErrorNotReady;
  return take_fault();
}
// The host's time between the two events' streams reaching them (work runs on the host here). As
// CUDA documents it: an event never recorded, or made with cudaEventDisableTiming, is an invalid
// handle here (the engine's copy and phase timers make theirs with cudaEventDefault).
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  check_event_device(start, "cudaEventElapsedTime");
  check_event_device(end, "cudaEventElapsedTime");
  for (const cudaEvent_t e : {start, end})
    if (!e->timing || e->recorded.load() == 0) return cudaErrorInvalidResourceHandle;
  if (!cuda_emu::reached(start) || !cuda_emu::reached(end)) return cudaErrorNotReady;
  *ms = float(double(end->reached_ns.load() - start->reached_ns.load()) / 1e6);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  check_event_device(event, "cudaEventSynchronize");
  cuda_emu::drain_event(event);
  return take_fault();
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  check_event_device(event, "cudaStreamWaitEvent");
  cuda_emu::check_stream_device(stream, "cudaStreamWaitEvent");
  cuda_emu::wait(stream, event);
  return cudaSuccess;
}

// ---- fibers ----------------------------------------------------------------------------------
// Every emulated thread is a fiber, so a switch must be cheap: on x86-64 a few instructions save
// the callee-saved registers and the stack pointer (ucontext's swapcontext also makes a signal-mask
// system call each time, which made thread-heavy kernels ten times slower). The floating-point
// control words are not switched: nothing here changes them. Elsewhere, ucontext.
namespace {

constexpr size_t kStackBytes = 64 << 10;  // the attention kernels' fragments take ~16 KiB

#if defined(__x86_64__)
extern "C" void cuda_emu_switch(void** save_sp, void* load_sp);
asm(R"(
.text
.p2align 4
.globl cuda_emu_switch
.type cuda_emu_switch,@function
cuda_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size cuda_emu_switch, .-cuda_emu_switch
)");

struct Context {
  void* sp = nullptr;
};
// A fresh stack that cuda_emu_switch "returns" into entry (which must never return).
void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  auto* top = reinterpret_cast<uint64_t*>(
      (reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15)) - 16);
  top[0] = reinterpret_cast<uint64_t>(entry);  // 16-aligned: entry starts as if called
  top[1] = 0;
  uint64_t* sp = top - 6;  // r15 r14 r13 r12 rbx rbp
  for (int i = 0; i < 6; i++) sp[i] = 0;
  c.sp = sp;
}
void switch_context(Context& from, Context& to) { cuda_emu_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc;
};
void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

}  // namespace

// ---- kernels ---------------------------------------------------------------------------------
namespace {

struct Barrier {
  int arrived = 0;
  int expected = 0;
  std::vector<int> waiters;  // fibers suspended here, released together by the last arrival
  // A warp's: the warp-collective instruction its waiters are at (mma.sync, ldmatrix), or null
  // for __syncwarp and shuffles.
  const char* op = nullptr;
};

// One cp.async under CUDA_EMU_CP_ASYNC=late: the source's bytes as they were at issue, to land
// at the wait that needs them.
struct AsyncCopy {
  unsigned char* dst;
  unsigned char bytes[16];
};

struct Fiber {
  Context context;
  uint3 tid{};
  int warp = 0;
  bool done = false;
  unsigned shuffles = 0;  // how many shuffles it has made: picks the exchange round
  // Its cp.async copies not yet landed (late mode): those issued since its last commit, and its
  // committed groups, oldest first.
  std::vector<AsyncCopy> open_copies;
  std::deque<std::vector<AsyncCopy>> copy_groups;
};

// A warp-collective instruction's operands, deposited by each lane, and its results, written for
// every lane by the last lane to arrive.
struct WarpOperands {
  alignas(16) unsigned char in[32][48];
  alignas(16) unsigned char out[32][16];
};

// CUDA_EMU_ORDER picks the order in which threads and blocks run; a race (a read of what another
// thread writes, with no barrier between) or a result that leans on an order the GPU does not
// promise shows in one order and hides in another:
//   unset      blocks and each block's threads first to last
//   reverse    each block's threads last to first
//   seed:N     seeded random: each grid's blocks in a random order, each block's threads started in
//              one, and the threads a barrier releases resumed in one. The same N and the same
//              launches give the same orders, so a failure repeats.
struct Order {
  enum Kind { Forward, Reverse, Random } kind = Forward;
  uint64_t seed = 0;
};
const Order& order() {
  static const Order o = [] {
    Order parsed;
    const char* text = std::getenv("CUDA_EMU_ORDER");
    const std::string v = text ? text : "";
    if (v == "reverse") {
      parsed.kind = Order::Reverse;
    } else if (v.rfind("seed:", 0) == 0 && v.size() > 5 &&
               v.find_first_not_of("0123456789", 5) == std::string::npos) {
      parsed.kind = Order::Random;
      parsed.seed = std::stoull(v.substr(5));
    } else if (!v.empty()) {
      std::fprintf(stderr, "cuda_emu: CUDA_EMU_ORDER=%s: not \"reverse\" or \"seed:N\"\n", v.c_str());
      std::abort();
    }
    return parsed;
  }();
  return o;
}
// Random mode's generator, reseeded at each launch from the seed and the launch's number.
thread_local std::mt19937_64 order_rng;

struct Block {
  std::vector<Fiber> fibers;
  Barrier block_barrier;
  std::vector<Barrier> warp_barriers;
  std::vector<int> warp_exited;
  std::vector<std::array<uint64_t, 64>> exchange;  // two rounds of 32 slots per warp
  std::vector<WarpOperands> operands;               // one per warp
  std::vector<unsigned char> dynamic_shared;
  // static __shared__ variables poisoned in this block: address and size
  std::vector<std::pair<const void*, size_t>> shared_seen;
  std::deque<int> ready;  // fibers to run, in order
  int current = 0;
  int exited = 0;
  Context scheduler;
  const std::function<void()>* body = nullptr;
  std::string error;  // set by a fiber: the launch fails
  cudaError_t fault = cudaErrorLaunchFailure;  // what the failure reports
};
thread_local Block* running = nullptr;
thread_local std::vector<char*> stacks;  // each kStackBytes above a guard page; reused

char* stack_for(size_t i) {
  while (stacks.size() <= i) {
    void* map = mmap(nullptr, kStackBytes + kPage, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (map == MAP_FAILED) {
      std::fprintf(stderr, "cuda_emu: cannot map a fiber stack\n");
      std::abort();
    }
    mprotect(map, kPage, PROT_NONE);
    stacks.push_back(static_cast<char*>(map) + kPage);
  }
  return stacks[i];
}

std::mutex attribute_mutex;
std::map<const void*, int> max_dynamic_shared;  // cudaFuncSetAttribute per kernel

std::string describe_thread(const Fiber& f) {
  return "thread (" + std::to_string(f.tid.x) + "," + std::to_string(f.tid.y) + "," +
         std::to_string(f.tid.z) + ")";
}

// A fiber that broke a rule: note it and hand control back for good (the launch is abandoned).
[[noreturn]] void fail_fiber(const std::string& why,
                             cudaError_t fault = cudaErrorLaunchFailure) {
  Block& b = *running;
  if (b.error.empty()) {
    b.error = why;
    b.fault = fault;
  }
  Fiber& me = b.fibers[size_t(b.current)];
  switch_context(me.context, b.scheduler);
  std::abort();  // never resumed
}

[[noreturn]] void fiber_entry() {
  Block& b = *running;
  try {
    (*b.body)();
  } catch (const std::exception& e) {
    fail_fiber(std::string("exception in the kernel: ") + e.what());
  }
  Fiber& me = b.fibers[size_t(b.current)];
  // a .sync.aligned instruction waits for every lane: on the GPU the waiting lanes hang
  const Barrier& warp = b.warp_barriers[size_t(me.warp)];
  if (warp.arrived > 0 && warp.op)
    fail_fiber(describe_thread(me) + " returned while " + std::to_string(warp.arrived) +
               " lanes of its warp wait at " + warp.op + ", which every lane must reach");
  me.done = true;
  b.exited++;
  b.warp_exited[size_t(me.warp)]++;
  switch_context(me.context, b.scheduler);
  std::abort();  // a finished fiber is never resumed
}

// The last thread to arrive releases the others and goes on (true); the others wait for it.
bool arrive(Barrier& bar) {
  Block& b = *running;
  if (++bar.arrived == bar.expected) {
    bar.arrived = 0;
    if (order().kind == Order::Random) std::shuffle(bar.waiters.begin(), bar.waiters.end(), order_rng);
    b.ready.insert(b.ready.end(), bar.waiters.begin(), bar.waiters.end());
    bar.waiters.clear();
    return true;
  }
  bar.waiters.push_back(b.current);
  switch_context(b.fibers[size_t(b.current)].context, b.scheduler);
  return false;
}

// An access past a device buffer hits its guard page: SIGSEGV, which a GPU reports as an
// asynchronous cudaErrorIllegalAddress. While a grid runs, this handler (on its own stack, and
// SA_NODEFER, since it never returns) abandons the faulting fiber as fail_fiber does. A fault
// that is not a fiber's (the emulator's own code) gets the previous handler back and happens
// again there. Building the message allocates, which a kernel's own code never interrupts.
struct sigaction previous_segv;             // while a grid runs: what FaultTrap replaced
thread_local std::vector<char> signal_stack;  // the handler's

bool on_fiber_stack(const void* uc) {
#if defined(__x86_64__)
  const Block* b = running;
  if (!b) return false;
  const uintptr_t sp = uintptr_t(static_cast<const ucontext_t*>(uc)->uc_mcontext.gregs[REG_RSP]);
  const uintptr_t stack = reinterpret_cast<uintptr_t>(stacks[size_t(b->current)]);
  return sp >= stack - kPage && sp < stack + kStackBytes;  // its guard page included
#else
  (void)uc;
  return false;  // other targets: a fault ends the process, as before
#endif
}

void on_segv(int, siginfo_t* info, void* uc) {
  if (!on_fiber_stack(uc)) {
    sigaction(SIGSEGV, &previous_segv, nullptr);
    return;
  }
  char where[64];
  std::snprintf(where, sizeof where, "%p", info->si_addr);
  fail_fiber("illegal memory access at " + std::string(where) + " by " +
                 describe_thread(running->fibers[size_t(running->current)]),
             cudaErrorIllegalAddress);
}

// Installs the handler for one grid, and puts back what was there (Catch2 has its own).
struct FaultTrap {
  stack_t saved_stack;
  FaultTrap() {
    if (signal_stack.empty()) signal_stack.resize(size_t(64) << 10);
    stack_t st{};
    st.ss_sp = signal_stack.data();
    st.ss_size = signal_stack.size();
    sigaltstack(&st, &saved_stack);
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
  }
  ~FaultTrap() {
    sigaction(SIGSEGV, &previous_segv, nullptr);
    sigaltstack(&saved_stack, nullptr);
  }
};

// Runs one block to completion; returns "" or what went wrong.
std::string run_block(Block& b, int threads) {
  b.ready.clear();
  for (int i = 0; i < threads; i++) {
    Fiber& f = b.fibers[size_t(i)];
    f.done = false;
    f.shuffles = 0;
    f.open_copies.clear();  // copies a thread of the last block never waited for never land
    f.copy_groups.clear();
    make_context(f.context, stack_for(size_t(i)), kStackBytes, fiber_entry);
    b.ready.push_back(i);
  }
  if (order().kind == Order::Reverse) std::reverse(b.ready.begin(), b.ready.end());
  if (order().kind == Order::Random) std::shuffle(b.ready.begin(), b.ready.end(), order_rng);
  while (!b.ready.empty()) {
    const int i = b.ready.front();
    b.ready.pop_front();
    b.current = i;
    threadIdx = b.fibers[size_t(i)].tid;
    switch_context(b.scheduler, b.fibers[size_t(i)].context);
    if (!b.error.empty()) return b.error;
  }
  if (b.exited == threads) return "";
  size_t at_warp = 0;
  std::string ops;  // the warp-collective instructions lanes wait at
  for (const Barrier& w : b.warp_barriers) {
    at_warp += w.waiters.size();
    if (!w.waiters.empty() && w.op && ops.find(w.op) == std::string::npos)
      ops += std::string(ops.empty() ? " (" : ", ") + w.op;
  }
  if (!ops.empty()) ops += ")";
  return "deadlock: " + std::to_string(b.block_barrier.waiters.size()) +
         " threads wait at __syncthreads, " + std::to_string(at_warp) + " at a warp barrier" +
         ops + ", " + std::to_string(b.exited) + " have returned";
}

// Arrival of the calling thread at its warp's barrier for `op`, a warp-collective instruction
// (null: __syncwarp or a shuffle); true for the last lane to arrive. Lanes that meet at one
// barrier must all be at the same instruction.
bool warp_arrive(const char* op) {
  Block& b = *running;
  const Fiber& me = b.fibers[size_t(b.current)];
  Barrier& bar = b.warp_barriers[size_t(me.warp)];
  const auto reached = [&] {
    return std::string(op ? op : "a warp-wide operation") + " reached by " + describe_thread(me);
  };
  if (b.warp_exited[size_t(me.warp)] > 0)
    fail_fiber(reached() + " after lanes of its warp returned");
  if (bar.arrived > 0 && bar.op != op)
    fail_fiber(reached() + " while " + std::to_string(bar.arrived) + " lanes of its warp wait at " +
               (bar.op ? bar.op : "__syncwarp or a shuffle"));
  bar.op = op;
  return arrive(bar);
}

// A warp-collective instruction: every lane of a full warp deposits `in`; the last to arrive
// runs compute(ins, outs, warp) on all 32 lanes' operands at once (so the instruction reads
// memory at one moment, with every lane of the warp stopped at it), and each lane leaves with
// its own result. A lane's next deposit cannot overwrite a result not yet read: results are
// written only when all 32 lanes have arrived again.
template <typename Out, typename In, typename Compute>
Out warp_collective(const char* op, const In& in, Compute compute) {
  static_assert(sizeof(In) <= sizeof(WarpOperands::in[0]) && sizeof(Out) <= sizeof(WarpOperands::out[0]));
  Block& b = *running;
  const Fiber& me = b.fibers[size_t(b.current)];
  const int lane = b.current % 32;
  if (b.warp_barriers[size_t(me.warp)].expected != 32)
    fail_fiber(std::string(op) + " by " + describe_thread(me) + " in a warp of fewer than 32 threads");
  WarpOperands& w = b.operands[size_t(me.warp)];
  std::memcpy(w.in[lane], &in, sizeof(In));
  if (warp_arrive(op)) {
    In ins[32];
    Out outs[32];
    for (int l = 0; l < 32; l++) std::memcpy(&ins[l], w.in[l], sizeof(In));
    compute(ins, outs, me.warp);
    for (int l = 0; l < 32; l++) std::memcpy(w.out[l], &outs[l], sizeof(Out));
  }
  Out out;
  std::memcpy(&out, w.out[lane], sizeof(Out));
  return out;
}

const Fiber& lane_fiber(int warp, int lane) { return running->fibers[size_t(warp * 32 + lane)]; }

std::string pointer_text(const void* p) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", p);
  return text;
}

// Whether [p, p + bytes) lies inside the running block's shared memory: its dynamic shared
// memory or one static __shared__ variable it has reached.
bool in_shared(const void* p, size_t bytes) {
  const Block& b = *running;
  const auto inside = [&](const void* base, size_t size) {
    const uintptr_t start = reinterpret_cast<uintptr_t>(base), at = reinterpret_cast<uintptr_t>(p);
    return at >= start && at + bytes <= start + size;
  };
  if (inside(b.dynamic_shared.data(), b.dynamic_shared.size())) return true;
  for (const auto& [base, size] : b.shared_seen)
    if (inside(base, size)) return true;
  return false;
}

// CUDA_EMU_CP_ASYNC: unset, a cp.async copies at issue; "late", at the wait that needs it
// (cuda_runtime.h). cuda_emu.h's set_cp_async_late overrides it.
bool late_copies_from_environment() {
  static const bool late = [] {
    const char* text = std::getenv("CUDA_EMU_CP_ASYNC");
    const std::string v = text ? text : "";
    if (!v.empty() && v != "late") {
      std::fprintf(stderr, "cuda_emu: CUDA_EMU_CP_ASYNC=%s: not \"late\"\n", v.c_str());
      std::abort();
    }
    return v == "late";
  }();
  return late;
}
std::atomic<int> late_copies_override{-1};  // -1: the environment's
bool late_copies() {
  const int o = late_copies_override;
  return o < 0 ? late_copies_from_environment() : o == 1;
}

float bf16_low(uint32_t pair) { return __uint_as_float(pair << 16); }
float bf16_high(uint32_t pair) { return __uint_as_float(pair & 0xFFFF0000u); }

}  // namespace

namespace {

// Registers a thread, static shared memory and the launch bound, by kernel name. nvcc decides
// them, which g++ cannot see (__launch_bounds__ is nvcc's): they come from
// tools/ptxas_budget.json (CUDA_EMU_PTXAS_BUDGET, sm_90, recorded by tools/ptxas_budget.py), so a
// launch the hardware refuses for any of them is refused here too.
std::mutex usage_mutex;  // the set_kernel_* calls write the table

struct KernelUsage {
  int registers = 0;
  int static_shared = 0;  // bytes
  int max_threads = 0;    // __launch_bounds__' (the PTX's .maxntid); 0: none
};

// "void grass::cuda::k<float>(float*, long)", "grass::cuda::k" and "k<HD>" are all "k".
std::string kernel_base_name(std::string name) {
  name = name.substr(0, name.find('('));
  name = name.substr(0, name.find('<'));
  if (const size_t space = name.rfind(' '); space != std::string::npos) name.erase(0, space + 1);
  if (const size_t scope = name.rfind("::"); scope != std::string::npos) name.erase(0, scope + 2);
  return name;
}

// The budget's figures by base name, the most over a kernel's instantiations; empty when the file
// cannot be read (kernel_registers' test then finds none).
std::map<std::string, KernelUsage> load_usage() {
  std::map<std::string, KernelUsage> table;
  std::FILE* f = std::fopen(CUDA_EMU_PTXAS_BUDGET, "rb");
  if (!f) return table;
  const nlohmann::json budget = nlohmann::json::parse(f, nullptr, false);
  std::fclose(f);
  if (budget.is_discarded() || !budget.contains("kernels")) return table;
  for (const auto& [key, usage] : budget["kernels"].items()) {
    const size_t colon = key.find(": ");  // "kernels/cuda/file.cu: signature"
    KernelUsage& k = table[kernel_base_name(key.substr(colon + 2))];
    k.registers = std::max(k.registers, usage.value("registers", 0));
    k.static_shared = std::max(k.static_shared, usage.value("smem", 0));
    // the tightest bound over the instantiations (0 where none has one)
    const int bound = usage.value("max_threads", 0);
    if (bound > 0) k.max_threads = k.max_threads > 0 ? std::min(k.max_threads, bound) : bound;
  }
  return table;
}

// Never destroyed: a launch may come from another static's destructor at exit.
std::map<std::string, KernelUsage>& usage_table() {  // under usage_mutex
  static auto* const table = new std::map<std::string, KernelUsage>(load_usage());
  return *table;
}

KernelUsage kernel_usage(const std::string& name) {
  std::lock_guard<std::mutex> lock(usage_mutex);
  const auto& table = usage_table();
  const auto it = table.find(kernel_base_name(name));
  return it == table.end() ? KernelUsage{} : it->second;
}

}  // namespace

namespace cuda_emu {

int kernel_registers(const std::string& name) { return kernel_usage(name).registers; }
int kernel_static_shared(const std::string& name) { return kernel_usage(name).static_shared; }
int kernel_max_threads(const std::string& name) { return kernel_usage(name).max_threads; }

void set_kernel_registers(const std::string& name, int registers) {
  std::lock_guard<std::mutex> lock(usage_mutex);
  usage_table()[kernel_base_name(name)].registers = registers;
}
void set_kernel_static_shared(const std::string& name, int bytes) {
  std::lock_guard<std::mutex> lock(usage_mutex);
  usage_table()[kernel_base_name(name)].static_shared = bytes;
}
void set_kernel_max_threads(const std::string& name, int threads) {
  std::lock_guard<std::mutex> lock(usage_mutex);
  usage_table()[kernel_base_name(name)].max_threads = threads;
}

cudaError_t set_max_dynamic_shared(const void* kernel, int bytes) {
  if (bytes < 0 || bytes > kMaxSharedOptin) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(attribute_mutex);
  max_dynamic_shared[kernel] = bytes;
  return cudaSuccess;
}

unsigned char* dynamic_shared_memory() { return running->dynamic_shared.data(); }

void shared_declared(void* p, size_t bytes) {
  auto& seen = running->shared_seen;
  for (const auto& [base, size] : seen)
    if (base == p) return;
  seen.emplace_back(p, bytes);
  std::memset(p, 0xFF, bytes);
}

void block_barrier() {
  Block& b = *running;
  if (b.exited > 0)
    fail_fiber("__syncthreads() reached by " + describe_thread(b.fibers[size_t(b.current)]) +
               " after " + std::to_string(b.exited) + " threads of its block returned");
  arrive(b.block_barrier);
}

void warp_barrier() { warp_arrive(nullptr); }

uint64_t* warp_exchange() {
  Block& b = *running;
  const Fiber& me = b.fibers[size_t(b.current)];
  if (b.warp_barriers[size_t(me.warp)].expected != 32)
    fail_fiber("a full-mask shuffle in a warp of fewer than 32 threads");
  return b.exchange[size_t(b.fibers[size_t(b.current)].warp)].data();
}

int lane_id() { return running->current % 32; }

unsigned shuffle_round() { return running->fibers[size_t(running->current)].shuffles++; }

void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  struct Operands {
    uint32_t a[4], b[2];
    float c[4];
  } in;
  std::memcpy(in.a, a, sizeof in.a);
  std::memcpy(in.b, b, sizeof in.b);
  std::memcpy(in.c, c, sizeof in.c);
  struct Result {
    float d[4];
  };
  const Result out = warp_collective<Result>(
      "mma.sync.m16n8k16", in, [](const Operands* ins, Result* outs, int) {
        float A[16][16], B[16][8], C[16][8];
        for (int lane = 0; lane < 32; lane++) {  // the PTX ISA's fragments (cuda_runtime.h)
          const int g = lane / 4, t = lane % 4;
          const Operands& o = ins[lane];
          for (int h = 0; h < 4; h++) {  // a[h]: rows g (+8 for h odd), columns 2t (+8 for h >= 2)
            const int row = g + 8 * (h & 1), col = 2 * t + 8 * (h >> 1);
            A[row][col] = bf16_low(o.a[h]);
            A[row][col + 1] = bf16_high(o.a[h]);
          }
          for (int h = 0; h < 2; h++) {  // b[h]: rows (k) 2t (+8 for h = 1), column g
            B[2 * t + 8 * h][g] = bf16_low(o.b[h]);
            B[2 * t + 8 * h + 1][g] = bf16_high(o.b[h]);
          }
          for (int i = 0; i < 4; i++) C[g + 8 * (i >> 1)][2 * t + (i & 1)] = o.c[i];
        }
        for (int lane = 0; lane < 32; lane++) {
          const int g = lane / 4, t = lane % 4;
          for (int i = 0; i < 4; i++) {
            const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
            float s = C[row][col];
            for (int k = 0; k < 16; k++) s = std::fma(A[row][k], B[k][col], s);
            outs[lane].d[i] = s;
          }
        }
      });
  std::memcpy(d, out.d, sizeof out.d);
}

void ldmatrix(uint32_t* r, int count, bool trans, const void* row) {
  static const char* const names[3][2] = {{"ldmatrix.x1", "ldmatrix.x1.trans"},
                                          {"ldmatrix.x2", "ldmatrix.x2.trans"},
                                          {"ldmatrix.x4", "ldmatrix.x4.trans"}};
  if (count != 1 && count != 2 && count != 4) std::abort();  // the header's templates ask 1, 2, 4
  struct Result {
    uint32_t r[4];
  };
  const Result out = warp_collective<Result>(
      names[count / 2][trans], row, [count, trans](const void* const* rows, Result* outs, int warp) {
        uint16_t m[4][8][8];
        for (int l = 0; l < 8 * count; l++) {  // lane 8·matrix + row gives that row's address
          if (reinterpret_cast<uintptr_t>(rows[l]) % 16 != 0 || !in_shared(rows[l], 16))
            fail_fiber(std::string(names[count / 2][trans]) + ": the row address " +
                       pointer_text(rows[l]) + " of " + describe_thread(lane_fiber(warp, l)) +
                       " is not 16 aligned bytes of the block's shared memory");
          std::memcpy(m[l / 8][l % 8], rows[l], 16);
        }
        for (int lane = 0; lane < 32; lane++) {
          const int g = lane / 4, t = lane % 4;
          for (int i = 0; i < count; i++) {
            const uint16_t lo = trans ? m[i][2 * t][g] : m[i][g][2 * t];
            const uint16_t hi = trans ? m[i][2 * t + 1][g] : m[i][g][2 * t + 1];
            outs[lane].r[i] = uint32_t(lo) | uint32_t(hi) << 16;
          }
        }
      });
  std::memcpy(r, out.r, sizeof(uint32_t) * size_t(count));
}

void cp_async_16(void* shared_dst, const void* global_src) {
  Fiber& me = running->fibers[size_t(running->current)];
  const auto fail = [&](const char* why) {
    fail_fiber("cp.async of 16 bytes from " + pointer_text(global_src) + " to " +
               pointer_text(shared_dst) + " by " + describe_thread(me) + ": " + why);
  };
  if (reinterpret_cast<uintptr_t>(shared_dst) % 16 || reinterpret_cast<uintptr_t>(global_src) % 16)
    fail("both addresses must be 16-byte aligned");
  if (!in_shared(shared_dst, 16)) fail("the destination is not in the block's shared memory");
  if (!is_device_range(global_src, 16)) fail("the source is not 16 bytes of one device allocation");
  if (!late_copies()) {
    std::memcpy(shared_dst, global_src, 16);
    return;
  }
  AsyncCopy copy{static_cast<unsigned char*>(shared_dst), {}};
  std::memcpy(copy.bytes, global_src, 16);
  std::memset(shared_dst, 0xFF, 16);
  me.open_copies.push_back(copy);
}

void cp_async_commit() {
  Fiber& me = running->fibers[size_t(running->current)];
  me.copy_groups.push_back(std::move(me.open_copies));
  me.open_copies.clear();
}

void cp_async_wait(int pending) {
  Fiber& me = running->fibers[size_t(running->current)];
  if (pending < 0) fail_fiber("cp.async.wait_group with a negative count by " + describe_thread(me));
  while (me.copy_groups.size() > size_t(pending)) {
    for (const AsyncCopy& c : me.copy_groups.front()) std::memcpy(c.dst, c.bytes, 16);
    me.copy_groups.pop_front();
  }
}

bool in_kernel() { return running != nullptr; }

void misaligned_pointer(const void* p, size_t alignment, size_t bytes) {
  fail_fiber("misaligned address: " + describe_thread(running->fibers[size_t(running->current)]) +
                 " made a pointer to " + std::to_string(bytes) + "-byte elements at " +
                 pointer_text(p) + ", not a multiple of their alignment, " +
                 std::to_string(alignment),
             cudaErrorMisalignedAddress);
}

std::string last_kernel_fault() {
  std::lock_guard<std::mutex> lock(fault_message_mutex);
  return fault_message;
}

bool set_cp_async_late(bool late) {
  const bool before = late_copies();
  late_copies_override = late ? 1 : 0;
  return before;
}

namespace {
void execute_grid(const LaunchConfig& cfg, const std::function<void()>& body);
}  // namespace

void run_grid(const LaunchConfig& cfg, cudaStream_t stream, std::function<void()> body) {
  const dim3 g = cfg.grid, bd = cfg.block;
  const uint64_t threads = uint64_t(bd.x) * bd.y * bd.z;
  auto reject = [&](cudaError_t err, const std::string& why) {
    std::fprintf(stderr, "cuda_emu: launch of %s: %s\n", cfg.name, why.c_str());
    set_error(err);
  };
  if (g.x == 0 || g.y == 0 || g.z == 0 || threads == 0 || threads > 1024 || bd.z > 64 ||
      g.x > 2147483647u || g.y > 65535 || g.z > 65535)
    return reject(cudaErrorInvalidConfiguration,
                  "grid (" + std::to_string(g.x) + "," + std::to_string(g.y) + "," +
                      std::to_string(g.z) + ") block (" + std::to_string(bd.x) + "," +
                      std::to_string(bd.y) + "," + std::to_string(bd.z) + ")");
  // Dynamic shared memory: up to the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize, which
  // starts at 48 KiB less its static shared memory; static and dynamic together never over the
  // opt-in maximum (a GPU refuses that attribute at cudaFuncSetAttribute, keyed by the kernel's
  // address; here the launch knows the kernel's static bytes by name, so it refuses the launch).
  const KernelUsage usage = kernel_usage(cfg.name);
  int shared_limit = kDefaultMaxShared - usage.static_shared;
  {
    std::lock_guard<std::mutex> lock(attribute_mutex);
    auto it = max_dynamic_shared.find(cfg.kernel);
    if (it != max_dynamic_shared.end()) shared_limit = it->second;
  }
  shared_limit = std::min(shared_limit, kMaxSharedOptin - usage.static_shared);
  if (cfg.shared_bytes > size_t(std::max(shared_limit, 0)))
    return reject(cudaErrorInvalidValue,
                  std::to_string(cfg.shared_bytes) + " bytes of dynamic shared memory, the kernel " +
                      "may use " + std::to_string(std::max(shared_limit, 0)) + " beside its " +
                      std::to_string(usage.static_shared) +
                      " static (tools/ptxas_budget.json, sm_90)");
  // A block over the kernel's __launch_bounds__ fails to launch (the CUDA programming guide;
  // cudaFuncGetAttributes' maxThreadsPerBlock is the bound). The error code is the emulator's
  // choice: the one a block over the registers gets.
  if (usage.max_threads > 0 && threads > uint64_t(usage.max_threads))
    return reject(cudaErrorLaunchOutOfResources,
                  std::to_string(threads) + " threads, over the kernel's __launch_bounds__ of " +
                      std::to_string(usage.max_threads) + " (tools/ptxas_budget.json, sm_90)");
  // Registers go to whole warps, a thread's count rounded up to a multiple of 8.
  if (const int regs = usage.registers; regs > 0) {
    const uint64_t need = (threads + 31) / 32 * 32 * ((uint64_t(regs) + 7) / 8 * 8);
    if (need > kRegistersPerBlock)
      return reject(cudaErrorLaunchOutOfResources,
                    std::to_string(threads) + " threads of " + std::to_string(regs) +
                        " registers (tools/ptxas_budget.json, sm_90) need " + std::to_string(need) +
                        " of a block's " + std::to_string(kRegistersPerBlock));
  }
  enqueue(stream, [cfg, body = std::move(body)] { execute_grid(cfg, body); });
}

namespace {

void execute_grid(const LaunchConfig& cfg, const std::function<void()>& body) {
  const dim3 g = cfg.grid, bd = cfg.block;
  const uint64_t threads = uint64_t(bd.x) * bd.y * bd.z;
  if (running) {
    std::fprintf(stderr, "cuda_emu: a kernel launched from a kernel\n");
    std::abort();
  }
  if (lazy_module_loading()) {  // the kernel's code goes to the device at its first launch
    std::lock_guard<std::mutex> lock(memory_mutex);
    if (loaded_kernels.insert(cfg.name).second) {
      allocation_count++;
      allocated_bytes += kKernelCodeBytes;
    }
  }

  Block b;
  b.body = &body;
  b.fibers.resize(threads);
  const int warps = int((threads + 31) / 32);
  b.warp_barriers.resize(size_t(warps));
  b.warp_exited.assign(size_t(warps), 0);
  b.exchange.resize(size_t(warps));
  b.operands.resize(size_t(warps));
  b.block_barrier.expected = int(threads);
  for (int w = 0; w < warps; w++) b.warp_barriers[size_t(w)].expected = std::min(32, int(threads) - 32 * w);
  for (unsigned z = 0, i = 0; z < bd.z; z++)
    for (unsigned y = 0; y < bd.y; y++)
      for (unsigned x = 0; x < bd.x; x++, i++) {
        b.fibers[i].tid = {x, y, z};
        b.fibers[i].warp = int(i / 32);
      }
  gridDim = g;
  blockDim = bd;
  running = &b;
  std::string error;
  const FaultTrap trap;
  std::vector<uint3> blocks;
  blocks.reserve(size_t(g.x) * g.y * g.z);
  for (unsigned z = 0; z < g.z; z++)
    for (unsigned y = 0; y < g.y; y++)
      for (unsigned x = 0; x < g.x; x++) blocks.push_back({x, y, z});
  if (order().kind == Order::Random) {
    static std::atomic<uint64_t> launches{0};
    order_rng.seed(order().seed * 0x9E3779B97F4A7C15ull + launches++);
    std::shuffle(blocks.begin(), blocks.end(), order_rng);
  }
  for (size_t at = 0; at < blocks.size() && error.empty(); at++) {
    const auto [x, y, z] = blocks[at];
    blockIdx = {x, y, z};
    b.dynamic_shared.assign(cfg.shared_bytes, 0xFF);  // uninitialised shared memory is NaN
    b.shared_seen.clear();  // and the static variables, as each block first reaches them
    b.exited = 0;
    std::fill(b.warp_exited.begin(), b.warp_exited.end(), 0);
    b.block_barrier.arrived = 0;
    b.block_barrier.waiters.clear();
    for (Barrier& w : b.warp_barriers) {
      w.arrived = 0;
      w.waiters.clear();
    }
    error = run_block(b, int(threads));
    if (!error.empty())
      error = "block (" + std::to_string(x) + "," + std::to_string(y) + "," +
              std::to_string(z) + "): " + error;
  }
  running = nullptr;
  if (!error.empty()) {  // the kernel ran and failed: the next synchronising call says so
    std::fprintf(stderr, "cuda_emu: kernel %s: %s\n", cfg.name, error.c_str());
    {
      std::lock_guard<std::mutex> lock(fault_message_mutex);
      fault_message = std::string("kernel ") + cfg.name + ": " + error;
    }
    if (pending_fault == cudaSuccess) pending_fault = b.fault;
  }
}

}  // namespace
}  // namespace cuda_emu
