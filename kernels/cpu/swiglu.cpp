// SwiGLU: out = silu(gate) * up, silu(g) = g·sigmoid(g), gate and up read from one packed [N, 2F]
// buffer (ops.h).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"
#include "kernels/ops.h"

namespace grass::ops {

// exp(-g) is clamped below float's overflow (88.7): this file builds with -ffast-math, where
// 1/(1+inf) may come out as NaN (a reciprocal estimate refined by Newton's step computes
// 0·(2 - inf·0)). With the clamp, sigmoid(-80) = 1.8e-35 still saturates to 0 for all purposes.
template <typename T>
constexpr T kExpClamp = T(80);

// Each row goes in chunks of kChunk columns through one out-of-line function per direction (the
// last chunk from zero-filled copies): every element takes the same code and so the same
// vectorised exp (libmvec's, whose last bit differs from glibc's scalar expf) whatever its column,
// F or thread, so a padded ffn gives the unpadded one's bits (docs/memory.md).
constexpr int kChunk = 8;

template <typename T>
[[gnu::noinline]] void forward_chunk(T* out, const T* gate, const T* up) {
#pragma omp simd
  for (int j = 0; j < kChunk; j++) {
    const T g = gate[j];
    out[j] = g / (T(1) + std::exp(std::min(-g, kExpClamp<T>))) * up[j];
  }
}

// silu'(g) = s·(1 + g·(1 - s)),  s = sigmoid(g)
template <typename T>
[[gnu::noinline]] void backward_chunk(T* dgate, T* dup, const T* dout, const T* gate, const T* up) {
#pragma omp simd
  for (int j = 0; j < kChunk; j++) {
    const T g = gate[j];
    const T s = T(1) / (T(1) + std::exp(std::min(-g, kExpClamp<T>)));
    const T d = dout[j];
    dup[j] = d * g * s;
    dgate[j] = d * up[j] * s * (T(1) + g * (T(1) - s));
  }
}

template <typename T>
void swiglu_forward(T* out, const T* gu, int64_t N, int F) {
#pragma omp parallel for if (N * F >= kParallelWork)
  for (int64_t r = 0; r < N; r++) {
    const T* gate = gu + r * 2 * F;
    const T* up = gate + F;
    T* o = out + r * F;
    int c0 = 0;
    for (; c0 + kChunk <= F; c0 += kChunk) forward_chunk(o + c0, gate + c0, up + c0);
    if (const int n = F - c0; n > 0) {  // the last columns, through the same code
      T g[kChunk] = {}, u[kChunk] = {}, y[kChunk];
      std::copy(gate + c0, gate + F, g);
      std::copy(up + c0, up + F, u);
      forward_chunk(y, g, u);
      std::copy(y, y + n, o + c0);
    }
  }
}

template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gu, int64_t N, int F, int64_t ld) {
#pragma omp parallel for if (N * F >= kParallelWork)
  for (int64_t r = 0; r < N; r++) {
    const T* gate = gu + r * 2 * F;
    const T* up = gate + F;
    const T* d_out = dout + r * F;
    T* d_gate = dgate + r * ld;
    T* d_up = dup + r * ld;
    int c0 = 0;
    for (; c0 + kChunk <= F; c0 += kChunk)
      backward_chunk(d_gate + c0, d_up + c0, d_out + c0, gate + c0, up + c0);
    if (const int n = F - c0; n > 0) {
      T g[kChunk] = {}, u[kChunk] = {}, d[kChunk] = {}, dg[kChunk], du[kChunk];
      std::copy(gate + c0, gate + F, g);
      std::copy(up + c0, up + F, u);
      std::copy(d_out + c0, d_out + F, d);
      backward_chunk(dg, du, d, g, u);
      std::copy(dg, dg + n, d_gate + c0);
      std::copy(du, du + n, d_up + c0);
    }
  }
}

#define INSTANTIATE(T)                                                   \
  template void swiglu_forward<T>(T*, const T*, int64_t, int);          \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, int64_t, int, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace grass::ops
