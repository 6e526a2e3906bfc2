// The two row ops of a sampled weight gradient on the GPU (the CPU reference:
// kernels/cpu/sampling.cpp). One block per row; math in fp32, one rounding per store.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "src/core/error.h"

namespace grass::cuda {

namespace {

constexpr int kThreads = 256;  // a multiple of 32 (block_sum)

// out[j, :] = scale[j] · x[rows[j], :]: block j copies one row
__global__ void gather_rows_kernel(bf16* out, const bf16* x, const int32_t* rows,
                                   const float* scale, int D) {
  const int64_t j = blockIdx.x;
  const float s = scale ? scale[j] : 1.0f;
  const bf16* src = x + int64_t(rows[j]) * D;
  for (int c = threadIdx.x; c < D; c += blockDim.x)
    out[j * D + c] = __float2bfloat16_rn(s * __bfloat162float(src[c]));
}

// norms[n] = ‖x[n, :]‖₂: block n sums one row's squares in a fixed order
__global__ void row_norms_kernel(float* norms, const bf16* x, int D) {
  const bf16* row = x + int64_t(blockIdx.x) * D;
  float sum = 0.0f;
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    const float v = __bfloat162float(row[c]);
    sum += v * v;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) norms[blockIdx.x] = sqrtf(sum);
}

}  // namespace

void gather_rows(const Context& ctx, bf16* out, const bf16* x, const int32_t* rows,
                 const float* scale, int64_t k, int D) {
  GRASS_CHECK(k >= 0 && k <= INT32_MAX && D >= 0, "gather_rows: bad size");
  if (k == 0 || D == 0) return;
  gather_rows_kernel<<<unsigned(k), kThreads, 0, ctx.stream>>>(out, x, rows, scale, D);
  GRASS_LAUNCH_CHECK();
}

void row_norms(const Context& ctx, float* norms, const bf16* x, int64_t N, int D) {
  GRASS_CHECK(N >= 0 && N <= INT32_MAX && D >= 0, "row_norms: bad size");
  if (N == 0) return;
  row_norms_kernel<<<unsigned(N), kThreads, 0, ctx.stream>>>(norms, x, D);
  GRASS_LAUNCH_CHECK();
}

}  // namespace grass::cuda
