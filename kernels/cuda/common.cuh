// What every CUDA file of the backend shares: checked calls, checked launches, bf16 helpers and
// stochastic rounding. Include only from .cu files.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "stochastic_round.h"

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

// ---- stochastic rounding (kernels/stochastic_round.h: the same bits as the CPU's emulation) ----
__device__ __forceinline__ uint32_t hash_u32(uint64_t seed, uint64_t index) {
  return rounding_hash(seed, index);
}
__device__ __forceinline__ bf16 stochastic_round_bf16(float x, uint64_t seed, uint64_t index) {
  return __ushort_as_bfloat16(stochastic_round_bits(__float_as_uint(x), seed, index));
}

}  // namespace grass::cuda
