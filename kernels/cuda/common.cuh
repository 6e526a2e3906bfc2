// What every CUDA file of the backend shares: checked calls, checked launches, bf16 helpers and
// stochastic rounding. Include only from .cu files.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

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

// After every <<<...>>>: a bad launch configuration surfaces here, named, not three kernels later.
#define GRASS_LAUNCH_CHECK() GRASS_CUDA_CHECK(cudaGetLastError())

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- stochastic rounding ---------------------------------------------------------------------
// A counter-based hash (no state): the same (seed, index) always rounds the same way, so two
// identical runs stay identical, and different elements and steps get independent draws.
__device__ __forceinline__ uint32_t hash_u32(uint64_t seed, uint64_t index) {
  uint64_t z = seed ^ (index * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return uint32_t((z ^ (z >> 31)) >> 32);
}

// Rounds x to bf16 up or down with probability proportional to the distance, so that
// E[round(x)] = x: adds 16 random bits below the kept mantissa, then truncates.
__device__ __forceinline__ bf16 stochastic_round_bf16(float x, uint64_t seed, uint64_t index) {
  uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return __float2bfloat16_rn(x);  // inf, NaN
  bits += hash_u32(seed, index) & 0xffffu;
  return __ushort_as_bfloat16(uint16_t(bits >> 16));
}

}  // namespace grass::cuda
