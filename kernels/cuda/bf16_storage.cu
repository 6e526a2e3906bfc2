// bf16 storage on the GPU (the CPU twin: kernels/cpu/bf16_storage.cpp, which emulates it in fp32
// memory): the conversions of a tensor between fp32 and bf16, to bf16 rounding to nearest even
// (bf16-mixed's compute copy of a master weight), to fp32 exactly. Stochastic rounding has no
// kernel of its own: each optimizer kernel rounds its own stores (common.cuh).
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "src/core/error.h"

namespace grass::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void f32_to_bf16_kernel(bf16* out, const float* in, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void bf16_to_f32_kernel(float* out, const bf16* in, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __bfloat162float(in[i]);
}

}  // namespace

void f32_to_bf16(const Context& ctx, bf16* out, const float* in, int64_t n) {
  GRASS_CHECK(n >= 0, "f32_to_bf16: negative size");
  if (n == 0) return;
  f32_to_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(out, in, n);
  GRASS_LAUNCH_CHECK();
}

void bf16_to_f32(const Context& ctx, float* out, const bf16* in, int64_t n) {
  GRASS_CHECK(n >= 0, "bf16_to_f32: negative size");
  if (n == 0) return;
  bf16_to_f32_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(out, in, n);
  GRASS_LAUNCH_CHECK();
}

}  // namespace grass::cuda
