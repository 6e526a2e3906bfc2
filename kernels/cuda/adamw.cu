// The AdamW step on the GPU in its two storage schemes (the CPU reference: kernels/cpu/adamw.cpp).
//
// It follows ops::adamw_update (torch.optim.AdamW's order of operations): the step-dependent
// scalars are computed once on the host in double, as the CPU does, and the per-element math is
// fp32. In the pure-bf16 scheme every store rounds stochastically (common.cuh), so updates far
// smaller than a bf16 ulp still move the weight in expectation instead of vanishing. With 8-bit
// moments (kernels/quant8.h) one kernel dequantizes, steps and requantizes each block.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/quant8.cuh"
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
  uint64_t first;         // the rounding streams' counter at element 0 (AdamArgs::first)
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
// array and the element's index in the tensor as the counter.
__global__ void adamw_pure_kernel(bf16* param, const bf16* g, bf16* m, bf16* v, int64_t n,
                                  AdamwStep k, uint64_t seed_param, uint64_t seed_m,
                                  uint64_t seed_v) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float mi = __bfloat162float(m[i]), vi = __bfloat162float(v[i]);
  const float p0 = __bfloat162float(param[i]);
  const float p = adam_step(k, p0, read_gradient<bf16>(k, __bfloat162float(g[i]), p0, i), mi, vi);
  const uint64_t counter = k.first + uint64_t(i);
  m[i] = stochastic_round_bf16(mi, seed_m, counter);
  v[i] = stochastic_round_bf16(vi, seed_v, counter);
  param[i] = stochastic_round_bf16(p, seed_param, counter);
}

// The 8-bit step's element op (ops::adamw_update_q8; kernels/cuda/quant8.cuh), over the flat
// layout of the tensor:
//   S = float: mixed (master is the weight, param its bf16 copy, g fp32);
//   S = bf16:  pure bf16 (param is the weight, g bf16, stochastic rounding of the weight).
template <typename S>
struct AdamwQ8 {
  static constexpr bool kPure = std::is_same_v<S, bf16>;
  bf16* param;
  float* master;
  const S* g;
  AdamwStep k;
  uint64_t seed_param;
  float grad_scale = 0;  // prepare(): with the clipping coefficient, read once

  __device__ void prepare() { grad_scale = float(grad_scale_of(k.grad_scale, k.clip)); }
  __device__ bool reads_weight() const { return k.proximal.anchor != nullptr; }
  __device__ void position(int64_t, int64_t& row, int64_t& col) const { row = col = 0; }
  __device__ float gradient(int64_t i) const { return to_f32(g[i]); }
  __device__ float weight(int64_t i, int64_t, int64_t) const {
    return kPure ? __bfloat162float(param[i]) : master[i];
  }
  __device__ float step(int64_t i, int64_t, int64_t, float g, float p0, float& m, float& v) const {
    const float gi = k.proximal.apply<S>(g * grad_scale, p0, i);  // read_gradient's
    adam_moments_rn(m, v, gi, k.beta1, k.one_minus_beta1, k.beta2, k.one_minus_beta2);
    float p = fmaf(p0, k.decay, -((k.step_size * m) / (sqrtf(v) / k.bc2_sqrt + k.eps)));
    if (!quant8_finite(gi) || !quant8_finite(v)) {
      p = p0;  // a non-finite gradient leaves the weight and zeroes the moments
      m = v = 0.0f;
    }
    return p;
  }
  __device__ void put(int64_t i, int64_t, int64_t, float p) const {
    if constexpr (kPure) {
      param[i] = stochastic_round_bf16(p, seed_param, k.first + uint64_t(i));  // exact for p0
    } else {
      master[i] = p;
      param[i] = __float2bfloat16_rn(p);
    }
  }
  __device__ void gradient8(int64_t i0, float (&x)[8]) const { load8(g + i0, x); }
  __device__ void weight8(int64_t i0, float (&x)[8]) const {
    if constexpr (kPure) load8(param + i0, x);
    else load8(master + i0, x);
  }
  __device__ void put8(int64_t i0, const float (&p)[8]) const {
    if constexpr (kPure) {
      BF16Pack<8> pack;
#pragma unroll
      for (int e = 0; e < 8; e++)
        pack.v[e] = stochastic_round_bf16(p[e], seed_param, k.first + uint64_t(i0 + e));
      *reinterpret_cast<BF16Pack<8>*>(param + i0) = pack;
    } else {
      store8(master + i0, p);
      store8(param + i0, p);
    }
  }
};

// The step on quant8.cuh's drivers: the warp driver (elements [0, n), whole spans of 256) and the
// thread-block driver (from element `from` on; layout: the tensor as one row).
template <typename S>
__global__ void __launch_bounds__(kQuant8Threads, 4)
    adamw_q8_kernel(AdamwQ8<S> op, Quant8Moments s, int64_t n, const Quant8Map map_m,
                    const Quant8Map map_v) {
  quant8_warp_step(op, s, n, map_m, map_v);
}
template <typename S>
__global__ void __launch_bounds__(kQuant8Threads, 4)
    adamw_q8_block_kernel(AdamwQ8<S> op, Quant8Moments s, Quant8Layout layout, int64_t from,
                          const Quant8Map map_m, const Quant8Map map_v) {
  quant8_block_step(op, s, layout, from, map_m, map_v);
}

template <typename S>
void launch_adamw_q8(const Context& ctx, const AdamwQ8<S>& op, const Quant8Moments& s, int64_t n) {
  const Quant8Layout layout{.rows = 1, .cols = n, .block = s.block};
  const Quant8Map& qm = quant8_map(true);
  const Quant8Map& qv = quant8_map(false);
  const bool aligned = quant8_codes_aligned(s) && aligned16(op.param) &&
                       (op.master == nullptr || aligned16(op.master)) && aligned16(op.g);
  const int64_t end = quant8_warp_end(layout, aligned);
  if (end > 0) {
    adamw_q8_kernel<<<quant8_warp_grid(end), kQuant8Threads, 0, ctx.stream>>>(op, s, end, qm, qv);
    GRASS_LAUNCH_CHECK();
  }
  if (end < n) {
    adamw_q8_block_kernel<<<quant8_block_grid(layout, end), kQuant8Threads, 0, ctx.stream>>>(
        op, s, layout, end, qm, qv);
    GRASS_LAUNCH_CHECK();
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
  k.first = uint64_t(a.first);
  return k;
}

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
  check_quant8_block(s.block, "adamw_update_q8");
  if (n == 0) return;
  const AdamwStep k = adamw_step(a);
  if (master != nullptr)
    launch_adamw_q8(ctx, AdamwQ8<float>{param, master, static_cast<const float*>(g), k, 0}, s, n);
  else
    launch_adamw_q8(ctx,
                    AdamwQ8<bf16>{param, nullptr, static_cast<const bf16*>(g), k,
                                  rounding_stream_seed(seed, a.step, kRoundWeight)},
                    s, n);
}

}  // namespace grass::cuda
