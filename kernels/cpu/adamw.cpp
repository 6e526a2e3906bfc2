// Decoupled AdamW, exactly torch.optim.AdamW's arithmetic order (so the PyTorch fixture matches).
#include <cmath>

#include "kernels/ops.h"

namespace grass::ops {

template <typename T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const AdamArgs& a) {
  const T b1 = T(a.beta1), b2 = T(a.beta2);
  const T decay = T(1.0 - a.lr * a.weight_decay);
  const T step_size = T(a.lr / (1.0 - std::pow(a.beta1, double(a.step))));
  const T bc2_sqrt = T(std::sqrt(1.0 - std::pow(a.beta2, double(a.step))));
  const T e = T(a.eps), gs = T(host_grad_scale(a));
#pragma omp parallel for simd
  for (int64_t i = 0; i < n; i++) {
    const T gi = g[i] * gs;
    const T mi = b1 * m[i] + (T(1) - b1) * gi;
    const T vi = b2 * v[i] + (T(1) - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + e);
  }
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t, const AdamArgs&);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t,
                                   const AdamArgs&);

}  // namespace grass::ops
