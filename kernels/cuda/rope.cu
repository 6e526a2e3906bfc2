// Rotary position embedding on the GPU, HF rotate-half layout (pairs (i, i + HD/2)), in place.
//
// The angle t / theta^(2i/HD) depends on (t, i) only, so a thread owns one (b, t, i) and rotates
// that pair in all H heads: its cos and sin are computed once, in double exactly as the CPU
// reference's table (kernels/cpu/rope.cpp) and then narrowed to fp32, so both backends rotate by
// the same fp32 cos/sin and long contexts lose no angle precision. The math per pair is
// rope_rotate's (common.cuh), with one rounding to bf16 at the store.
#include <cstdint>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "src/core/error.h"

namespace grass::cuda {

namespace {

constexpr int kThreads = 256;

// x[B, T, H, HD] (rows at a pitch of ld) ← R(sign·angle) x. Block = (HD/2 pair indices) × (a few
// (b, t) positions); consecutive threads read consecutive channels of a head. sign = -1 is the
// transpose rotation.
__global__ void rope_kernel(bf16* x, int64_t ld, int64_t BT, int T, int H, int HD, double theta,
                            float sign) {
  const int half = HD / 2;
  const int i = threadIdx.x;
  const int64_t bt = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (bt >= BT) return;
  const int t = int(bt % T);
  const double angle = double(t) / pow(theta, 2.0 * i / HD);
  double sin_d, cos_d;
  sincos(angle, &sin_d, &cos_d);
  const float c = float(cos_d), s = sign * float(sin_d);
  bf16* row = x + bt * ld;
  for (int h = 0; h < H; h++) {
    bf16* head = row + int64_t(h) * HD;
    const float2 y = rope_rotate(__bfloat162float(head[i]), __bfloat162float(head[half + i]), c, s);
    head[i] = __float2bfloat16_rn(y.x);
    head[half + i] = __float2bfloat16_rn(y.y);
  }
}

void rope_launch(const Context& ctx, bf16* x, int B, int T, int H, int HD, float theta, float sign,
                 int64_t ld) {
  GRASS_CHECK(B >= 0 && T >= 0 && H > 0 && HD > 0 && HD % 2 == 0 && HD / 2 <= kThreads,
              "rope: HD must be even and at most " + std::to_string(2 * kThreads));
  const int64_t BT = int64_t(B) * T;
  if (BT == 0) return;
  const int half = HD / 2;
  const dim3 block(half, kThreads / half);
  rope_kernel<<<unsigned(ceil_div(BT, block.y)), block, 0, ctx.stream>>>(
      x, ld == 0 ? int64_t(H) * HD : ld, BT, T, H, HD, double(theta), sign);
  GRASS_LAUNCH_CHECK();
}

// table[t·half + i] = cos, table[T·half + t·half + i] = sin; one thread per (t, i), the angle as
// rope_kernel computes it.
__global__ void rope_table_kernel(float* table, int T, int HD, double theta) {
  const int half = HD / 2;
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= int64_t(T) * half) return;
  const int t = int(e / half), i = int(e % half);
  const double angle = double(t) / pow(theta, 2.0 * i / HD);
  double sin_d, cos_d;
  sincos(angle, &sin_d, &cos_d);
  table[e] = float(cos_d);
  table[int64_t(T) * half + e] = float(sin_d);
}

}  // namespace

void rope_table(const Context& ctx, float* table, int T, int HD, float theta) {
  GRASS_CHECK(T >= 1 && HD > 0 && HD % 2 == 0, "rope_table: T >= 1 and an even HD");
  const int64_t n = int64_t(T) * (HD / 2);
  rope_table_kernel<<<unsigned(ceil_div(n, kThreads)), kThreads, 0, ctx.stream>>>(table, T, HD,
                                                                                 double(theta));
  GRASS_LAUNCH_CHECK();
}

void rope_forward(const Context& ctx, bf16* x, int B, int T, int H, int HD, float theta,
                  int64_t ld) {
  rope_launch(ctx, x, B, T, H, HD, theta, 1.0f, ld);
}

void rope_backward(const Context& ctx, bf16* dx, int B, int T, int H, int HD, float theta,
                   int64_t ld) {
  rope_launch(ctx, dx, B, T, H, HD, theta, -1.0f, ld);
}

}  // namespace grass::cuda
