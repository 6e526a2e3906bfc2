// SwiGLU: out = silu(gate) * up, silu(g) = g·sigmoid(g).
#include <algorithm>
#include <cmath>

#include "ops.h"

namespace grass::ops {

// exp(-g) is clamped below float's overflow (88.7): this file builds with -ffast-math, where
// 1/(1+inf) may come out as NaN (a reciprocal estimate refined by Newton's step computes
// 0·(2 - inf·0)). With the clamp, sigmoid(-80) = 1.8e-35 still saturates to 0 for all purposes.
template <typename T>
constexpr T kExpClamp = T(80);

template <typename T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t n) {
#pragma omp parallel for simd
  for (int64_t i = 0; i < n; i++) {
    const T g = gate[i];
    out[i] = g / (T(1) + std::exp(std::min(-g, kExpClamp<T>))) * up[i];
  }
}

template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n) {
  // silu'(g) = s·(1 + g·(1 - s)),  s = sigmoid(g)
#pragma omp parallel for simd
  for (int64_t i = 0; i < n; i++) {
    const T g = gate[i];
    const T s = T(1) / (T(1) + std::exp(std::min(-g, kExpClamp<T>)));
    const T d = dout[i];
    dup[i] = d * g * s;
    dgate[i] = d * up[i] * s * (T(1) + g * (T(1) - s));
  }
}

#define INSTANTIATE(T)                                                                      \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t);                        \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace grass::ops
