// Rotary position embedding in HF's rotate-half layout (pairs are (i, i + HD/2), not adjacent),
// so weights export to Hugging Face without permuting q_proj/k_proj.
#include <cmath>
#include <vector>

#include "kernels/ops.h"

namespace grass::ops {

namespace {

// cos/sin[T, HD/2] of angle t / theta^(2i/HD), computed in double.
template <typename T>
void rope_table(std::vector<T>& cos_t, std::vector<T>& sin_t, int T_, int HD, double theta) {
  const int half = HD / 2;
  cos_t.resize(size_t(T_) * half);
  sin_t.resize(size_t(T_) * half);
  for (int t = 0; t < T_; t++)
    for (int i = 0; i < half; i++) {
      const double angle = t / std::pow(theta, 2.0 * i / HD);
      cos_t[size_t(t) * half + i] = T(std::cos(angle));
      sin_t[size_t(t) * half + i] = T(std::sin(angle));
    }
}

// out = R(sign·angle) x on each (i, i+HD/2) pair; sign = -1 is the transpose (the backward).
template <typename T>
void rotate(T* out, const T* x, int B, int T_, int H, int HD, double theta, T sign) {
  std::vector<T> cos_t, sin_t;
  rope_table(cos_t, sin_t, T_, HD, theta);
  const int half = HD / 2;
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T_; t++) {
      const T* c = cos_t.data() + size_t(t) * half;
      const T* s = sin_t.data() + size_t(t) * half;
      for (int h = 0; h < H; h++) {
        const size_t base = ((size_t(b) * T_ + t) * H + h) * HD;
        for (int i = 0; i < half; i++) {
          const T x1 = x[base + i], x2 = x[base + half + i];
          out[base + i] = x1 * c[i] - sign * x2 * s[i];
          out[base + half + i] = x2 * c[i] + sign * x1 * s[i];
        }
      }
    }
}

}  // namespace

template <typename T>
void rope_forward(T* out, const T* x, int B, int T_, int H, int HD, double theta) {
  rotate(out, x, B, T_, H, HD, theta, T(1));
}

template <typename T>
void rope_backward(T* dx, const T* dout, int B, int T_, int H, int HD, double theta) {
  rotate(dx, dout, B, T_, H, HD, theta, T(-1));
}

#define INSTANTIATE(T)                                                          \
  template void rope_forward<T>(T*, const T*, int, int, int, int, double);     \
  template void rope_backward<T>(T*, const T*, int, int, int, int, double);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace grass::ops
