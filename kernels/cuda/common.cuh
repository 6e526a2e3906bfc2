// What every CUDA file of the backend shares: checked calls, checked launches, launch geometry
// (grid_for, vectorizable), bf16 helpers and stochastic rounding. Include only from .cu files.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/adam_args.h"
#include "kernels/cuda/device.h"
#include "kernels/stochastic_round.h"
#include "src/core/error.h"

namespace grass::cuda {

using bf16 = __nv_bfloat16;

// Throws grass::InternalError (core/error.h) with the call, file, line and the CUDA message.
[[noreturn]] void fail_cuda(const char* what, const char* file, int line, const std::string& msg);

#define GRASS_CUDA_CHECK(call)                                                      \
  do {                                                                              \
    const cudaError_t grass_err_ = (call);                                          \
    if (grass_err_ != cudaSuccess)                                                  \
      ::grass::cuda::fail_cuda(#call, __FILE__, __LINE__, cudaGetErrorString(grass_err_)); \
  } while (0)

#define GRASS_CUBLAS_CHECK(call)                                                         \
  do {                                                                                   \
    const cublasStatus_t grass_st_ = (call);                                             \
    if (grass_st_ != CUBLAS_STATUS_SUCCESS)                                              \
      ::grass::cuda::fail_cuda(#call, __FILE__, __LINE__, cublasGetStatusString(grass_st_)); \
  } while (0)

// After every <<<...>>>: a bad launch configuration surfaces here, named by the launching function,
// file and line, not three kernels later. A fault while the kernel runs is asynchronous: CUDA
// reports it at the next synchronising call (an upload, a download), far from its kernel, unless
// GRASS_CUDA_SYNC=1 (launch_sync(), cuda/device.h) makes every launch check wait for its kernel.
void check_launch(const char* launcher, const char* file, int line);
#define GRASS_LAUNCH_CHECK() ::grass::cuda::check_launch(__func__, __FILE__, __LINE__)
// What a launch check does after a library call that launches kernels (cuBLAS): with
// GRASS_CUDA_SYNC=1, wait for the device and name `what` if its work faulted; else nothing.
void debug_sync(const char* what, const char* file, int line);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
// True when n splits into 8-wide packs and every pointer can be read 16 bytes at a time.
template <typename... Ptrs>
bool vectorizable(int64_t n, const Ptrs*... ptrs) {
  return n % 8 == 0 && ((reinterpret_cast<uintptr_t>(ptrs) % 16 == 0) && ...);
}
// The blocks of `threads` threads that give one thread to each of n items, checked against the
// grid's limit.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = ceil_div(n, threads);
  GRASS_CHECK(blocks <= INT32_MAX, "elementwise kernel: too many elements");
  return unsigned(blocks);
}

// ---- shared device helpers -------------------------------------------------------------------
// VEC bf16 values moved as one load or store (16 bytes when VEC = 8).
template <int VEC>
struct alignas(2 * VEC) BF16Pack {
  bf16 v[VEC];
};

// A parameter gradient += v, in its storage type (bf16 rounds once, at this store).
__device__ __forceinline__ void accumulate_grad(float* g, float v) { *g += v; }
__device__ __forceinline__ void accumulate_grad(bf16* g, float v) {
  *g = __float2bfloat16_rn(__bfloat162float(*g) + v);
}

// The CUDA emulator (tests/cuda_emu) fills a block's static shared memory with NaN bytes before
// its first use, so a read of a slot no thread wrote shows. translate.cmake does that for the
// declarations in .cu files; a header's own (block_sum's) names itself with this hook, which the
// emulator's cuda_runtime.h defines and nvcc's build leaves empty.
#ifndef GRASS_SHARED_DECLARED
#define GRASS_SHARED_DECLARED(name)
#endif

// Sum of v over the block (blockDim.x a multiple of 32), returned to every thread. The tree is
// fixed (an xor butterfly in each warp, then the warp sums in warp order), so the bits are too.
// Every thread of the block must call it; it may be called repeatedly.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T warp_sums[32];
  GRASS_SHARED_DECLARED(warp_sums);
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  T total = T(0);
  for (int w = 0; w < int(blockDim.x / 32); w++) total += warp_sums[w];
  __syncthreads();  // the next call overwrites warp_sums
  return total;
}

// ---- stochastic rounding (kernels/stochastic_round.h: the same bits as the CPU's emulation) ----
__device__ __forceinline__ bf16 stochastic_round_bf16(float x, uint64_t seed, uint64_t index) {
  return __ushort_as_bfloat16(stochastic_round_bits(__float_as_uint(x), seed, index));
}

// ---- RoPE's rotation, one definition for every kernel that rotates ------------------------------
// The rotate-half pair (x1, x2) turned by (c, s): (x1·c − x2·s, x2·c + x1·s), each product and the
// sum rounded on its own. The explicit roundings keep nvcc from contracting the two kernels that
// rotate (rope.cu's pass, attention.cu's tile loads) into different FMAs, so they give the same
// bits, and those of the CPU's reference (built without contraction, ISO C++).
__device__ __forceinline__ float2 rope_rotate(float x1, float x2, float c, float s) {
  return make_float2(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)),
                     __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

// ---- the optimizers' element types: fp32 (bf16-mixed's states, master) or bf16 (pure bf16's) ----
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
// The state stores: fp32 as is; bf16 rounded stochastically from the stream (seed, index).
__device__ __forceinline__ void store_state(float* p, float x, uint64_t, uint64_t) { *p = x; }
__device__ __forceinline__ void store_state(bf16* p, float x, uint64_t seed, uint64_t index) {
  *p = stochastic_round_bf16(x, seed, index);
}
// A copy of a value its type already holds exactly (a weight into the proximal anchor).
__device__ __forceinline__ void store_exact(float* p, float x) { *p = x; }
__device__ __forceinline__ void store_exact(bf16* p, float x) { *p = __float2bfloat16_rn(x); }

// The proximal term of an Adam update (AdamArgs::anchor), as the AdamW and GRASS kernels take it.
struct ProximalTerm {
  void* anchor = nullptr;  // S-typed, shaped like the gradient the kernel reads; null: no term
  float coef = 0;
  bool reset = false;
  // Element i's gradient g (already clipped) plus coef·(w − anchor[i]), w the weight before the
  // step; at an inner loop's first step the anchor takes w instead and g is left as it is.
  template <typename S>
  __device__ __forceinline__ float apply(float g, float w, int64_t i) const {
    if (!anchor) return g;
    S* a = static_cast<S*>(anchor) + i;
    if (reset) {
      store_exact(a, w);
      return g;
    }
    return fmaf(coef, w - to_f32(*a), g);  // written out: the 8-bit steps' CPU twins fma it too
  }
};
inline ProximalTerm proximal_term(const AdamArgs& a) {
  return {a.anchor, float(a.proximal_coef), a.anchor_reset};
}

}  // namespace grass::cuda
