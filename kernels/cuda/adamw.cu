// The AdamW step on the GPU in its two storage schemes (the CPU reference: kernels/cpu/adamw.cpp).
//
// It follows ops::adamw_update (torch.optim.AdamW's order of operations): the step-dependent
// scalars are computed once on the host in double, as the CPU does, and the per-element math is
// fp32. In the pure-bf16 scheme every store rounds stochastically (common.cuh), so updates far
// smaller than a bf16 ulp still move the weight in expectation instead of vanishing. With 8-bit
// moments (kernels/quant8.h) one kernel dequantizes, steps and requantizes each block.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/quant8.h"
#include "src/core/error.h"

namespace grass::cuda {

namespace {

constexpr int kThreads = 256;

// The per-step scalars of ops::adamw_update (adam_scalars()), narrowed to fp32.
struct AdamwStep {
  double grad_scale;   // with *clip (the clipping coefficient, device memory) when set
  const double* clip;
  float beta1, beta2, eps;
  float one_minus_beta1, one_minus_beta2;
  float decay;      // 1 - lr·weight_decay
  float step_size;  // lr / (1 - beta1^step)
  float bc2_sqrt;   // sqrt(1 - beta2^step)
  ProximalTerm proximal;  // its anchor S-typed [n]
};

// The gradient as the update reads it: clipped, then with the proximal term on the weight p
// before this step.
template <typename S>
__device__ __forceinline__ float read_gradient(const AdamwStep& k, float g, float p, int64_t i) {
  return k.proximal.apply<S>(g * float(grad_scale_of(k.grad_scale, k.clip)), p, i);
}

// One element's update in fp32 from its read gradient gi: returns the new weight, writes the new
// moments.
__device__ __forceinline__ float adam_step(const AdamwStep& k, float p, float gi, float& m,
                                           float& v) {
  m = k.beta1 * m + k.one_minus_beta1 * gi;
  v = k.beta2 * v + k.one_minus_beta2 * gi * gi;
  return p * k.decay - k.step_size * m / (sqrtf(v) / k.bc2_sqrt + k.eps);
}

// "bf16-mixed": param[n] (bf16) = RN(master[n]) after master, m, v (fp32) step with g[n] (fp32).
__global__ void adamw_mixed_kernel(bf16* param, float* master, const float* g, float* m, float* v,
                                   int64_t n, AdamwStep k) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float mi = m[i], vi = v[i];
  const float p = adam_step(k, master[i], read_gradient<float>(k, g[i], master[i], i), mi, vi);
  m[i] = mi;
  v[i] = vi;
  master[i] = p;
  param[i] = __float2bfloat16_rn(p);
}

// "bf16": param, m, v, g all bf16[n]; each store rounds stochastically, with its own stream per
// array and the element index as the counter.
__global__ void adamw_pure_kernel(bf16* param, const bf16* g, bf16* m, bf16* v, int64_t n,
                                  AdamwStep k, uint64_t seed_param, uint64_t seed_m,
                                  uint64_t seed_v) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float mi = __bfloat162float(m[i]), vi = __bfloat162float(v[i]);
  const float p0 = __bfloat162float(param[i]);
  const float p = adam_step(k, p0, read_gradient<bf16>(k, __bfloat162float(g[i]), p0, i), mi, vi);
  m[i] = stochastic_round_bf16(mi, seed_m, uint64_t(i));
  v[i] = stochastic_round_bf16(vi, seed_v, uint64_t(i));
  param[i] = stochastic_round_bf16(p, seed_param, uint64_t(i));
}

// The 8-bit step (ops::adamw_update_q8). Each block of kThreads threads takes quantization
// blocks in turn (grid-stride, so the maps are copied to shared memory once per thread block);
// thread t owns elements t, t + kThreads, ... of a quantization block, at most kMaxPerThread
// (state_block ≤ 4096), kept in registers between the step and the requantization.
constexpr int kMaxPerThread = 4096 / kThreads;

// The largest of every thread's x (x ≥ 0, so the order of the max does not matter).
__device__ float block_max(float x, float* warp_max) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // the previous call's readers are done with warp_max
  if (lane == 0) warp_max[warp] = x;
  __syncthreads();
  float all = 0.0f;
  for (int w = 0; w < kThreads / 32; w++) all = fmaxf(all, warp_max[w]);
  return all;
}

//   S = float: mixed (master is the weight, param its bf16 copy, g fp32);
//   S = bf16:  pure bf16 (param is the weight, g bf16, stochastic rounding of the weight).
template <typename S>
__global__ void adamw_q8_kernel(bf16* param, float* master, const S* g, uint8_t* codes_m,
                                uint8_t* codes_v, float* absmax_m, float* absmax_v, int64_t n,
                                int block, AdamwStep k, uint64_t seed_param, const Quant8Map map_m,
                                const Quant8Map map_v) {
  constexpr bool kPure = std::is_same_v<S, bf16>;
  __shared__ Quant8Map qm;
  __shared__ Quant8Map qv;
  __shared__ float warp_max[kThreads / 32];
  for (int c = threadIdx.x; c < 256; c += kThreads) {
    qm.value[c] = map_m.value[c];
    qv.value[c] = map_v.value[c];
    if (c < 255) {
      qm.bound[c] = map_m.bound[c];
      qv.bound[c] = map_v.bound[c];
    }
  }
  if (threadIdx.x == 0) {
    qm.zero = map_m.zero;
    qv.zero = map_v.zero;
  }
  __syncthreads();
  const int64_t blocks = (n + block - 1) / block;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t i0 = b * block;
    const int64_t i1 = i0 + block < n ? i0 + block : n;
    const float old_m = absmax_m[b], old_v = absmax_v[b];
    float m[kMaxPerThread], v[kMaxPerThread];
    float max_m = 0.0f, max_v = 0.0f;
#pragma unroll
    for (int e = 0; e < kMaxPerThread; e++) {
      const int64_t i = i0 + threadIdx.x + int64_t(e) * kThreads;
      m[e] = v[e] = 0.0f;
      if (i >= i1) continue;
      const float p0 = kPure ? __bfloat162float(param[i]) : master[i];
      const float gi = read_gradient<S>(k, to_f32(g[i]), p0, i);
      float mi = quant8_decode(qm, codes_m[i], old_m), vi = quant8_decode(qv, codes_v[i], old_v);
      float p = adam_step(k, p0, gi, mi, vi);
      if (fabsf(gi) <= FLT_MAX && fabsf(vi) <= FLT_MAX) {  // finite (NaN compares false)
        m[e] = mi;
        v[e] = vi;
      } else {
        p = p0;  // a non-finite gradient leaves the weight (and zeroes the moments)
      }
      if constexpr (kPure) {
        param[i] = stochastic_round_bf16(p, seed_param, uint64_t(i));  // exact for p0
      } else {
        master[i] = p;
        param[i] = __float2bfloat16_rn(p);
      }
      max_m = fmaxf(max_m, fabsf(m[e]));
      max_v = fmaxf(max_v, v[e]);
    }
    max_m = block_max(max_m, warp_max);
    max_v = block_max(max_v, warp_max);
    if (threadIdx.x == 0) {
      absmax_m[b] = max_m;
      absmax_v[b] = max_v;
    }
#pragma unroll
    for (int e = 0; e < kMaxPerThread; e++) {
      const int64_t i = i0 + threadIdx.x + int64_t(e) * kThreads;
      if (i >= i1) continue;
      codes_m[i] = quant8_encode(qm, m[e], max_m);
      codes_v[i] = quant8_encode(qv, v[e], max_v);
    }
  }
}

// The kernels' scalars from the step's arguments (adam_scalars(), narrowed to fp32).
AdamwStep adamw_step(const AdamArgs& a) {
  const AdamScalars s = adam_scalars(narrowed_to_f32(a));
  AdamwStep k;
  k.grad_scale = a.grad_scale;
  k.clip = a.clip;
  k.beta1 = float(s.beta1);
  k.beta2 = float(s.beta2);
  k.eps = float(s.eps);
  k.one_minus_beta1 = float(s.one_minus_beta1);
  k.one_minus_beta2 = float(s.one_minus_beta2);
  k.decay = float(s.decay);
  k.step_size = float(s.lr / s.bias_correction1);
  k.bc2_sqrt = float(s.bias_correction2_sqrt);
  k.proximal = proximal_term(a);
  return k;
}

// Thread blocks of the 8-bit step: enough to fill an H100 several times over; each copies the
// maps (4 KiB) once.
constexpr int64_t kQ8MaxGrid = 2048;

}  // namespace

void adamw_update(const Context& ctx, bf16* param, float* master, const void* g, void* m, void* v,
                  int64_t n, const AdamArgs& a, uint64_t seed) {
  const int64_t step = a.step;
  GRASS_CHECK(n >= 0 && step >= 1, "adamw_update: bad size or step (steps count from 1)");
  if (n == 0) return;
  const AdamwStep k = adamw_step(a);
  if (master != nullptr)
    adamw_mixed_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(
        param, master, static_cast<const float*>(g), static_cast<float*>(m), static_cast<float*>(v),
        n, k);
  else
    adamw_pure_kernel<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(
        param, static_cast<const bf16*>(g), static_cast<bf16*>(m), static_cast<bf16*>(v), n, k,
        rounding_stream_seed(seed, step, kRoundWeight),
        rounding_stream_seed(seed, step, kRoundFirstMoment),
        rounding_stream_seed(seed, step, kRoundSecondMoment));
  GRASS_LAUNCH_CHECK();
}

void adamw_update_q8(const Context& ctx, bf16* param, float* master, const void* g,
                     const Quant8Moments& s, int64_t n, const AdamArgs& a, uint64_t seed) {
  GRASS_CHECK(n >= 0 && a.step >= 1, "adamw_update_q8: bad size or step (steps count from 1)");
  GRASS_CHECK(s.block >= 1 && s.block <= kMaxPerThread * kThreads,
              "adamw_update_q8: a quantization block of more than 4096 elements");
  if (n == 0) return;
  const AdamwStep k = adamw_step(a);
  const unsigned grid = unsigned(std::min(ceil_div(n, s.block), kQ8MaxGrid));
  const Quant8Map& qm = quant8_map(true);
  const Quant8Map& qv = quant8_map(false);
  if (master != nullptr)
    adamw_q8_kernel<float><<<grid, kThreads, 0, ctx.stream>>>(
        param, master, static_cast<const float*>(g), s.m, s.v, s.absmax_m, s.absmax_v, n, s.block,
        k, 0, qm, qv);
  else
    adamw_q8_kernel<bf16><<<grid, kThreads, 0, ctx.stream>>>(
        param, nullptr, static_cast<const bf16*>(g), s.m, s.v, s.absmax_m, s.absmax_v, n, s.block,
        k, rounding_stream_seed(seed, a.step, kRoundWeight), qm, qv);
  GRASS_LAUNCH_CHECK();
}

}  // namespace grass::cuda
