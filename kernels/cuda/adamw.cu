// The AdamW step on the GPU in its two storage schemes (the CPU reference: kernels/cpu/adamw.cpp).
//
// It follows ops::adamw_update (torch.optim.AdamW's order of operations): the step-dependent
// scalars are computed once on the host in double, as the CPU does, and the per-element math is
// fp32. In the pure-bf16 scheme every store rounds stochastically (common.cuh), so updates far
// smaller than a bf16 ulp still move the weight in expectation instead of vanishing.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
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

}  // namespace

void adamw_update(const Context& ctx, bf16* param, float* master, const void* g, void* m, void* v,
                  int64_t n, const AdamArgs& a, uint64_t seed) {
  const int64_t step = a.step;
  GRASS_CHECK(n >= 0 && step >= 1, "adamw_update: bad size or step (steps count from 1)");
  if (n == 0) return;
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

}  // namespace grass::cuda
