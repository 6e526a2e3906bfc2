// SwiGLU (out = silu(gate) · up) on the GPU (the CPU reference: kernels/cpu/swiglu.cpp):
// elementwise, memory-bound.
//
// Each thread handles one pack of VEC bf16 values: 8 (16-byte loads and stores) when the row is a
// multiple of 8 and every pointer is 16-byte aligned, else 1. Math in fp32, one rounding
// to bf16 per store. SwiGLU reads gate and up from one [N, 2F] buffer, the output of gate_proj and
// up_proj as one GEMM.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "src/core/error.h"

namespace grass::cuda {

namespace {

constexpr int kThreads = 256;
// exp's argument is clamped as on the CPU (kernels/cpu/swiglu.cpp), so both backends saturate the
// sigmoid identically: sigmoid(-200) = 1/(1 + e^80), never 1/(1 + inf).
constexpr float kExpClamp = 80.0f;

// out[N,F] = gate·sigmoid(gate)·up, gate and up the halves of gu[N,2F]; a thread owns one pack of
// VEC columns of one row, F = row_packs·VEC.
template <int VEC>
__global__ void swiglu_forward_kernel(bf16* out, const bf16* gu, int64_t packs, int row_packs) {
  using Pack = BF16Pack<VEC>;
  const int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= packs) return;
  const int64_t r = p / row_packs, c = p % row_packs;
  const Pack* row = reinterpret_cast<const Pack*>(gu) + r * 2 * row_packs;
  const Pack gp = row[c];
  const Pack up_p = row[row_packs + c];
  Pack op;
#pragma unroll
  for (int j = 0; j < VEC; j++) {
    const float g = __bfloat162float(gp.v[j]);
    op.v[j] =
        __float2bfloat16_rn(g / (1.0f + expf(fminf(-g, kExpClamp))) * __bfloat162float(up_p.v[j]));
  }
  reinterpret_cast<Pack*>(out)[p] = op;
}

// dup = dout·silu(gate);  dgate = dout·up·silu'(gate),  silu'(g) = s·(1 + g·(1 - s)),
// s = sigmoid(g)
//   dgate, dup: N rows of F at a pitch of ld_packs packs, overwritten; dout[N,F], gu[N,2F]
template <int VEC>
__global__ void swiglu_backward_kernel(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gu,
                                       int64_t packs, int row_packs, int64_t ld_packs) {
  using Pack = BF16Pack<VEC>;
  const int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= packs) return;
  const int64_t r = p / row_packs, c = p % row_packs;
  const Pack* row = reinterpret_cast<const Pack*>(gu) + r * 2 * row_packs;
  const Pack dp = reinterpret_cast<const Pack*>(dout)[p];
  const Pack gp = row[c];
  const Pack up_p = row[row_packs + c];
  Pack dgate_p, dup_p;
#pragma unroll
  for (int j = 0; j < VEC; j++) {
    const float g = __bfloat162float(gp.v[j]);
    const float s = 1.0f / (1.0f + expf(fminf(-g, kExpClamp)));
    const float d = __bfloat162float(dp.v[j]);
    dup_p.v[j] = __float2bfloat16_rn(d * g * s);
    const float u = __bfloat162float(up_p.v[j]);
    dgate_p.v[j] = __float2bfloat16_rn(d * u * s * (1.0f + g * (1.0f - s)));
  }
  reinterpret_cast<Pack*>(dgate)[r * ld_packs + c] = dgate_p;
  reinterpret_cast<Pack*>(dup)[r * ld_packs + c] = dup_p;
}

}  // namespace

void swiglu_forward(const Context& ctx, bf16* out, const bf16* gu, int64_t N, int F) {
  GRASS_CHECK(N >= 0 && F >= 0, "swiglu_forward: negative size");
  if (N == 0 || F == 0) return;
  if (vectorizable(F, out, gu))  // F % 8 == 0: up's half of each row is 16-byte aligned too
    swiglu_forward_kernel<8>
        <<<grid_for(N * F / 8, kThreads), kThreads, 0, ctx.stream>>>(out, gu, N * F / 8, F / 8);
  else
    swiglu_forward_kernel<1>
        <<<grid_for(N * F, kThreads), kThreads, 0, ctx.stream>>>(out, gu, N * F, F);
  GRASS_LAUNCH_CHECK();
}

void swiglu_backward(const Context& ctx, bf16* dgate, bf16* dup, const bf16* dout, const bf16* gu,
                     int64_t N, int F, int64_t ld) {
  GRASS_CHECK(N >= 0 && F >= 0 && ld >= F, "swiglu_backward: negative size or pitch below F");
  if (N == 0 || F == 0) return;
  if (vectorizable(F, dgate, dup, dout, gu) && ld % 8 == 0)
    swiglu_backward_kernel<8><<<grid_for(N * F / 8, kThreads), kThreads, 0, ctx.stream>>>(
        dgate, dup, dout, gu, N * F / 8, F / 8, ld / 8);
  else
    swiglu_backward_kernel<1><<<grid_for(N * F, kThreads), kThreads, 0, ctx.stream>>>(
        dgate, dup, dout, gu, N * F, F, ld);
  GRASS_LAUNCH_CHECK();
}

}  // namespace grass::cuda
