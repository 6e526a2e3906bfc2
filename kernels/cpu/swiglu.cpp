// SwiGLU: out = silu(gate) * up, silu(g) = g·sigmoid(g), gate and up read from one packed [N, 2F]
// buffer (ops.h).
#include <algorithm>
#include <cmath>

#include "ops.h"

namespace grass::ops {

// exp(-g) is clamped below float's overflow (88.7): this file builds with -ffast-math, where
// 1/(1+inf) may come out as NaN (a reciprocal estimate refined by Newton's step computes
// 0·(2 - inf·0)). With the clamp, sigmoid(-80) = 1.8e-35 still saturates to 0 for all purposes.
template <typename T>
constexpr T kExpClamp = T(80);

// Each row goes in chunks of kChunk columns, the last one zero-filled: every element takes the same
// (vectorised) exp whatever its column, so the bits do not depend on F (a padded ffn gives the
// unpadded one's numbers, docs/memory.md).
constexpr int kChunk = 8;

template <typename T>
void swiglu_forward(T* out, const T* gu, int64_t N, int F) {
#pragma omp parallel for
  for (int64_t r = 0; r < N; r++) {
    const T* gate = gu + r * 2 * F;
    const T* up = gate + F;
    T* o = out + r * F;
    for (int c0 = 0; c0 < F; c0 += kChunk) {
      const int n = std::min(kChunk, F - c0);
      T g[kChunk] = {}, u[kChunk] = {}, y[kChunk];
      std::copy(gate + c0, gate + c0 + n, g);
      std::copy(up + c0, up + c0 + n, u);
#pragma omp simd
      for (int j = 0; j < kChunk; j++)
        y[j] = g[j] / (T(1) + std::exp(std::min(-g[j], kExpClamp<T>))) * u[j];
      std::copy(y, y + n, o + c0);
    }
  }
}

template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gu, int64_t N, int F) {
  // silu'(g) = s·(1 + g·(1 - s)),  s = sigmoid(g)
#pragma omp parallel for
  for (int64_t r = 0; r < N; r++) {
    const T* gate = gu + r * 2 * F;
    const T* up = gate + F;
    const int64_t row = r * F;
    for (int c0 = 0; c0 < F; c0 += kChunk) {
      const int n = std::min(kChunk, F - c0);
      T g[kChunk] = {}, u[kChunk] = {}, d[kChunk] = {}, dg[kChunk], du[kChunk];
      std::copy(gate + c0, gate + c0 + n, g);
      std::copy(up + c0, up + c0 + n, u);
      std::copy(dout + row + c0, dout + row + c0 + n, d);
#pragma omp simd
      for (int j = 0; j < kChunk; j++) {
        const T s = T(1) / (T(1) + std::exp(std::min(-g[j], kExpClamp<T>)));
        du[j] = d[j] * g[j] * s;
        dg[j] = d[j] * u[j] * s * (T(1) + g[j] * (T(1) - s));
      }
      std::copy(du, du + n, dup + row + c0);
      std::copy(dg, dg + n, dgate + row + c0);
    }
  }
}

#define INSTANTIATE(T)                                                   \
  template void swiglu_forward<T>(T*, const T*, int64_t, int);          \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, int64_t, int);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace grass::ops
