// cuda_emu: the CUDA runtime as the grass kernels use it, emulated on the CPU, so that CI (which
// has no GPU) runs the real kernel sources against the CPU reference. Not a general emulator: it
// covers what kernels/cuda uses, and fails loudly on what it does not know.
//
// Execution model (tests/cuda_emu/runtime.cpp): the blocks of a grid run one after another; the
// threads of a block run as fibers (ucontext) on one OS thread, switching only at __syncthreads,
// __syncwarp, warp shuffles and the warp-collective matrix instructions (mma.sync, ldmatrix). __shared__ variables become static thread_local: one copy per
// block at a time, which is what a block sees on the GPU. The emulator checks what it can see:
// launch limits, a __syncthreads or warp operation that not every thread reaches (a deadlock or
// an early return on the GPU), a kernel's misaligned vector pointer (device_cast, below), and
// device buffers are fenced by guard pages.
//
// Errors come when a GPU gives them: a bad launch configuration at once (cudaGetLastError), a
// fault while a kernel runs (an access past a buffer, which hits a guard page: illegal address; a
// barrier not every thread reaches: launch failure) at the next synchronising call
// (cudaDeviceSynchronize, cudaStreamSynchronize, cudaMemcpy, cudaMemset), once; unlike a GPU's,
// the device stays usable afterwards. Module loading follows CUDA_MODULE_LOADING as read at the
// process's first CUDA call: lazy (CUDA's default) takes device memory for a kernel's code at
// its first launch, eager takes none after that first call. tests/cuda_emu/include/cuda_emu.h
// lets tests see what the emulator counts.
//
// Kernel launches and casts are rewritten at build time (tests/cuda_emu/translate.cmake):
//   kernel<<<grid, block, smem, stream>>>(args);
//     ->  ::cuda_emu::launch("kernel", &kernel or nullptr, {grid, block, smem, stream}, [&] { kernel(args); });
//   reinterpret_cast<T>(x)  ->  ::cuda_emu::device_cast<T>(x)
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- qualifiers -------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static thread_local
// kernels/cuda/common.cuh's hook for a header's static shared memory (translate.cmake handles the
// .cu files' own): NaN bytes before the block's first use
#define GRASS_SHARED_DECLARED(name) ::cuda_emu::shared_declared(&(name), sizeof(name))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict

// ---- vector types and built-in variables -----------------------------------------------------
struct uint3 {
  unsigned x, y, z;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

// ---- errors, streams, devices ----------------------------------------------------------------
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorMisalignedAddress = 716,
  cudaErrorLaunchFailure = 719,
};
using cudaError = cudaError_t;
struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
using cudaDataType = cudaDataType_t;
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrAsyncEngineCount = 40,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaLimit { cudaLimitStackSize = 0x00 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int major, minor;
  int multiProcessorCount;
};

cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t err);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
// The per-thread stack: the driver's default, 1 KiB; the emulator's kernels never grow it.
cudaError_t cudaDeviceGetLimit(size_t* value, cudaLimit limit);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
// Pinned host memory and events: every call completes before it returns, so an event is
// complete as soon as it is recorded.
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
constexpr unsigned cudaHostAllocDefault = 0;
constexpr unsigned cudaEventDefault = 0;
constexpr unsigned cudaEventDisableTiming = 2;
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* ptr);
// Pins (and unpins) host memory the caller allocated: a pinned region of its own, like a
// cudaHostAlloc's. An async copy whose host side starts in a pinned region must end in it.
constexpr unsigned cudaHostRegisterDefault = 0;
cudaError_t cudaHostRegister(void* ptr, size_t bytes, unsigned flags);
cudaError_t cudaHostUnregister(void* ptr);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
typedef void (*cudaHostFn_t)(void* user_data);
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data);
cudaError_t cudaMalloc(void** ptr, size_t bytes);
template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
// Rows of width bytes at the two pitches; the emulation takes cudaMemcpyDeviceToDevice only.
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaMemset2DAsync(void* dst, size_t pitch, int value, size_t width, size_t height,
                              cudaStream_t stream = nullptr);

namespace cuda_emu {
// Checks the device-memory range [p, p + bytes) lies inside one live cudaMalloc block; a host
// pointer or an overrun fails the call that was given it.
bool is_device_range(const void* p, size_t bytes);
cudaError_t set_max_dynamic_shared(const void* kernel, int bytes);

struct LaunchConfig {
  dim3 grid, block;
  size_t shared_bytes;
  const void* kernel;
  const char* name;
};
// Runs body once per thread of the grid (threadIdx & co. set) in `stream`'s order (now, or queued
// under CUDA_EMU_STREAMS=deferred: body must then hold copies of the launch's arguments); records
// a launch error at once if the configuration is invalid, a kernel fault when the grid runs.
void run_grid(const LaunchConfig& cfg, cudaStream_t stream, std::function<void()> body);
// The block's dynamic shared memory (extern __shared__).
unsigned char* dynamic_shared_memory();
// A static __shared__ variable of `bytes` at `p` is declared (translate.cmake): the first thread of
// a block to reach it fills it with 0xFF (NaN), as a block's dynamic shared memory starts.
void shared_declared(void* p, size_t bytes);
// Block- and warp-wide barriers, and the exchange area a warp's shuffles go through.
void block_barrier();
void warp_barrier();
uint64_t* warp_exchange();  // 2 x 32 slots of 8 bytes for the calling thread's warp
int lane_id();
unsigned shuffle_round();  // the calling thread's shuffle count so far, then counted up

// sm_80's warp-level matrix instructions and asynchronous copies, exactly as the PTX ISA lays them
// out (kernels/cuda/mma_ptx.cuh is the kernels' interface; these are its emulated side). The
// matrix operations are warp-collective: all 32 lanes of a full warp must reach the same one, or
// the launch fails naming the thread (a lane that returned, or one at another warp operation).
// When the last lane arrives it computes every lane's result at once, from every lane's operands.
//
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d = a·b + c, a 16x16 (row), b 16x8
// (col), c and d 16x8 fp32. groupID g = lane/4, t = lane%4; a register holds two bf16, the lower
// index in the low half. a[0]: A[g][2t..2t+1], a[1]: A[g+8][2t..], a[2]: A[g][2t+8..],
// a[3]: A[g+8][2t+8..]; b[0]: B[2t..2t+1][g], b[1]: B[2t+8..2t+9][g]; c, d: [0] (g, 2t),
// [1] (g, 2t+1), [2] (g+8, 2t), [3] (g+8, 2t+1). Summation order, the emulator's choice: each
// d[i][j] starts from c[i][j] and adds the 16 products in ascending k, each by one fused
// multiply-add (fmaf: one rounding a step; a bf16 product is exact in fp32). The hardware's
// order and internal rounding are not specified: a GPU may differ in the last bits.
void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]);
// ldmatrix.sync.aligned.m8n8.x{count}{.trans}.shared.b16: lane 8·m + r gives the shared-memory
// address of row r of matrix m (m < count; 16 bytes, 16-byte aligned); lane l receives in r[m]
// row l/4, elements 2·(l%4) and +1 of matrix m (the low half the first), or with trans the
// transpose's: rows 2·(l%4) and +1 of column l/4.
void ldmatrix(uint32_t* r, int count, bool trans, const void* row);
// cp.async.cg.shared.global, 16 bytes, and its groups (the calling thread's own, as on the GPU):
// a copy joins the group open when it is issued; commit closes that group; wait(n) returns when
// at most n committed groups are pending (an uncommitted copy is never waited for). Both addresses
// must be 16-byte aligned, the destination in the block's shared memory, the source in a device
// allocation. When the copy lands is CUDA_EMU_CP_ASYNC's: unset, at issue; "late", only when a
// wait needs it, its destination holding 0xFF bytes (NaN) until then, so a read before the wait
// (or before the barrier that follows other threads' waits) reads NaN.
void cp_async_16(void* shared_dst, const void* global_src);
void cp_async_commit();
void cp_async_wait(int pending);

// Stops the program, naming both devices, when `stream` is not the current device's (runtime.cpp).
void check_stream_device(cudaStream_t stream, const char* call);

// A GPU reads and writes a T only at an address that is a multiple of T's alignment: a 16-byte
// load (uint4, float4, BF16Pack<8>) from an address 8 past one faults with "misaligned address",
// where x86 loads it anyway. translate.cmake turns every reinterpret_cast of the kernels' sources
// and headers into device_cast, which checks a pointer it makes while a kernel runs: a misaligned
// one fails the launch (cudaErrorMisalignedAddress) naming the thread. A kernel that makes such a
// pointer and never uses it is refused too; none of the engine's does.
bool in_kernel();
[[noreturn]] void misaligned_pointer(const void* p, size_t alignment, size_t bytes);
template <typename To, typename From>
inline To device_cast(From from) {
  static_assert(!std::is_reference_v<To>, "cuda_emu: device_cast of a reference");
  if constexpr (std::is_pointer_v<To> && std::is_pointer_v<From>) {
    using Element = std::remove_cv_t<std::remove_pointer_t<To>>;
    if constexpr (std::is_object_v<Element>) {
      if (reinterpret_cast<uintptr_t>(from) % alignof(Element) != 0 && in_kernel())
        misaligned_pointer(from, alignof(Element), sizeof(Element));
    }
  }
  return reinterpret_cast<To>(from);
}

struct LaunchDims {
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
  LaunchDims(dim3 g, dim3 b, size_t shared = 0, cudaStream_t s = nullptr)
      : grid(g), block(b), shared_bytes(shared), stream(s) {}
};
// kernel: the kernel's address where the launch names one instantiation (cudaFuncSetAttribute
// is keyed by it), else nullptr; body: the kernel called with the launch's arguments.
inline void launch(const char* name, const void* kernel, const LaunchDims& dims,
                   const std::function<void()>& body) {
  check_stream_device(dims.stream, name);
  run_grid({dims.grid, dims.block, dims.shared_bytes, kernel, name}, dims.stream, body);
}
}  // namespace cuda_emu

template <typename... Params>
cudaError_t cudaFuncSetAttribute(void (*kernel)(Params...), cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
  return cuda_emu::set_max_dynamic_shared(reinterpret_cast<const void*>(kernel), value);
}

// ---- device intrinsics -----------------------------------------------------------------------
inline void __syncthreads() { cuda_emu::block_barrier(); }
inline void __syncwarp(unsigned = 0xffffffffu) { cuda_emu::warp_barrier(); }

// Every lane of the warp must call it (the mask must be full: partial masks are not emulated).
// Successive shuffles alternate between two rounds of slots: a lane writes round p again only
// after the next shuffle's barrier, which every lane reaches after reading round p.
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  static_assert(sizeof(T) <= 8, "cuda_emu: shuffles of at most 8 bytes");
  if (mask != 0xffffffffu || width != 32) std::abort();
  uint64_t* slots = cuda_emu::warp_exchange() + 32 * (cuda_emu::shuffle_round() & 1);
  const int lane = cuda_emu::lane_id();
  std::memcpy(&slots[lane], &value, sizeof(T));
  cuda_emu::warp_barrier();
  T out;
  std::memcpy(&out, &slots[lane ^ lane_mask], sizeof(T));
  return out;
}

inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
// The explicitly rounded arithmetic: each result is rounded on its own, never contracted with
// its neighbours into an FMA, whatever -ffp-contract the emulated kernels are compiled with (the
// empty asm makes the value opaque to the optimizer, as nvcc treats these intrinsics).
inline float cuda_emu_opaque(float x) {
  asm volatile("" : "+x"(x));
  return x;
}
inline float __fmul_rn(float a, float b) { return cuda_emu_opaque(a * b); }
inline float __fadd_rn(float a, float b) { return cuda_emu_opaque(a + b); }
inline float __fsub_rn(float a, float b) { return cuda_emu_opaque(a - b); }
inline float __fmaf_rn(float a, float b, float c) { return cuda_emu_opaque(std::fma(a, b, c)); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
