// Decoupled AdamW, exactly torch.optim.AdamW's arithmetic order (so the PyTorch fixture matches).
#include <algorithm>
#include <cmath>
#include <vector>

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
#pragma omp parallel for simd
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
  const AdamScalars sc = adam_scalars<float>(a);
  const float b1 = float(sc.beta1), b2 = float(sc.beta2), c1 = float(sc.one_minus_beta1),
              c2 = float(sc.one_minus_beta2), decay = float(sc.decay),
              step_size = float(sc.lr / sc.bias_correction1),
              bc2_sqrt = float(sc.bias_correction2_sqrt), e = float(sc.eps),
              gs = float(host_grad_scale(a)), pc = float(a.proximal_coef);
  float* const anchor = static_cast<float*>(a.anchor);
  const Quant8Map& qm = quant8_map(true);
  const Quant8Map& qv = quant8_map(false);
  const int64_t blocks = (n + s.block - 1) / s.block;
#pragma omp parallel
  {
    std::vector<float> m(size_t(s.block)), v(size_t(s.block));  // one block's new moments
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
      const int64_t i0 = b * s.block, i1 = std::min(n, i0 + s.block);
      const float old_m = s.absmax_m[b], old_v = s.absmax_v[b];
      float absmax_m = 0.0f, absmax_v = 0.0f;
      for (int64_t i = i0; i < i1; i++) {
        float gi = g[i] * gs;
        if (anchor && a.anchor_reset) anchor[i] = p[i];
        else if (anchor) gi += pc * (p[i] - anchor[i]);
        float mi = b1 * quant8_decode(qm, s.m[i], old_m) + c1 * gi;
        float vi = b2 * quant8_decode(qv, s.v[i], old_v) + c2 * gi * gi;
        if (std::isfinite(gi) && std::isfinite(vi)) {
          p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + e);
        } else {
          mi = vi = 0.0f;
        }
        m[size_t(i - i0)] = mi;
        v[size_t(i - i0)] = vi;
        absmax_m = std::fmax(absmax_m, std::fabs(mi));
        absmax_v = std::fmax(absmax_v, vi);
      }
      s.absmax_m[b] = absmax_m;
      s.absmax_v[b] = absmax_v;
      for (int64_t i = i0; i < i1; i++) {
        s.m[i] = quant8_encode(qm, m[size_t(i - i0)], absmax_m);
        s.v[i] = quant8_encode(qv, v[size_t(i - i0)], absmax_v);
      }
    }
  }
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t, const AdamArgs&);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t,
                                   const AdamArgs&);

}  // namespace grass::ops
