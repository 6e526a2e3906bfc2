// Decoupled AdamW, exactly torch.optim.AdamW's arithmetic order (so the PyTorch fixture matches).
#include <cmath>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/quant8_step.h"
#include "kernels/ops.h"

namespace grass::ops {

namespace {

// The proximal term's three cases, each its own loop so the plain one stays as it was.
enum class Proximal { None, Reset, Term };

template <Proximal kProximal, typename T>
void adamw_loop(T* p, const T* g, T* m, T* v, int64_t n, const AdamArgs& a) {
  const AdamScalars s = adam_scalars<T>(a);
  const T b1 = T(s.beta1), b2 = T(s.beta2), c1 = T(s.one_minus_beta1), c2 = T(s.one_minus_beta2);
  const T decay = T(s.decay);
  const T step_size = T(s.lr / s.bias_correction1);
  const T bc2_sqrt = T(s.bias_correction2_sqrt);
  const T e = T(s.eps), gs = T(host_grad_scale(a));
  T* const anchor = static_cast<T*>(a.anchor);
  const T pc = T(a.proximal_coef);
#pragma omp parallel for simd if (n >= kParallelWork)
  for (int64_t i = 0; i < n; i++) {
    T gi = g[i] * gs;
    if constexpr (kProximal == Proximal::Reset) anchor[i] = p[i];
    if constexpr (kProximal == Proximal::Term) gi += pc * (p[i] - anchor[i]);
    const T mi = b1 * m[i] + c1 * gi;
    const T vi = b2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + e);
  }
}

}  // namespace

template <typename T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const AdamArgs& a) {
  if (!a.anchor)
    adamw_loop<Proximal::None>(p, g, m, v, n, a);
  else if (a.anchor_reset)
    adamw_loop<Proximal::Reset>(p, g, m, v, n, a);
  else
    adamw_loop<Proximal::Term>(p, g, m, v, n, a);
}

void adamw_update_q8(float* p, const float* g, const Quant8Moments& s, int64_t n,
                     const AdamArgs& a) {
  const AdamScalars sc = adam_scalars<float>(narrowed_to_f32(a));  // the GPU kernel's scalars
  const float b1 = float(sc.beta1), b2 = float(sc.beta2), c1 = float(sc.one_minus_beta1),
              c2 = float(sc.one_minus_beta2), decay = float(sc.decay),
              step_size = float(sc.lr / sc.bias_correction1),
              bc2_sqrt = float(sc.bias_correction2_sqrt), e = float(sc.eps),
              gs = float(host_grad_scale(a)), pc = float(a.proximal_coef);
  float* const anchor = static_cast<float*>(a.anchor);
  quant8_adam_blocks({.rows = 1, .cols = n, .block = s.block}, s, [&](int64_t i, float& m, float& v) {
    // every rounding as the GPU's kernel writes it (adam_moments_rn), so the codes match
    float gi = g[i] * gs;
    if (anchor && a.anchor_reset) anchor[i] = p[i];
    else if (anchor) gi = std::fma(pc, p[i] - anchor[i], gi);
    adam_moments_rn(m, v, gi, b1, c1, b2, c2);
    if (std::isfinite(gi) && std::isfinite(v))
      p[i] = std::fma(p[i], decay, -((step_size * m) / (std::sqrt(v) / bc2_sqrt + e)));
    else
      m = v = 0.0f;
  });
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t, const AdamArgs&);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t,
                                   const AdamArgs&);

}  // namespace grass::ops
