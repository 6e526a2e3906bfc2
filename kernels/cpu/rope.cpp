// Rotary position embedding in HF's rotate-half layout (pairs are (i, i + HD/2), not adjacent),
// so weights export to Hugging Face without permuting q_proj/k_proj.
#include <cmath>
#include <vector>

#include "kernels/cpu/parallel.h"
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
// Rows at pitches ld_out, ld_x (0: H·HD).
template <typename T>
void rotate(T* out, const T* x, int B, int T_, int H, int HD, double theta, T sign, int64_t ld_out,
            int64_t ld_x) {
  std::vector<T> cos_t, sin_t;
  rope_table(cos_t, sin_t, T_, HD, theta);
  const int half = HD / 2;
  if (ld_out == 0) ld_out = int64_t(H) * HD;
  if (ld_x == 0) ld_x = int64_t(H) * HD;
#pragma omp parallel for collapse(2) if (int64_t(B) * T_ * H * HD >= kParallelWork)
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T_; t++) {
      const T* c = cos_t.data() + size_t(t) * half;
      const T* s = sin_t.data() + size_t(t) * half;
      const int64_t row = int64_t(b) * T_ + t;
      for (int h = 0; h < H; h++) {
        const T* xh = x + row * ld_x + int64_t(h) * HD;
        T* oh = out + row * ld_out + int64_t(h) * HD;
        for (int i = 0; i < half; i++) {
          const T x1 = xh[i], x2 = xh[half + i];
          oh[i] = x1 * c[i] - sign * x2 * s[i];
          oh[half + i] = x2 * c[i] + sign * x1 * s[i];
        }
      }
    }
}

}  // namespace

template <typename T>
void rope_forward(T* out, const T* x, int B, int T_, int H, int HD, double theta, int64_t ld_out,
                  int64_t ld_x) {
  rotate(out, x, B, T_, H, HD, theta, T(1), ld_out, ld_x);
}

template <typename T>
void rope_backward(T* dx, const T* dout, int B, int T_, int H, int HD, double theta, int64_t ld_dx,
                   int64_t ld_dout) {
  rotate(dx, dout, B, T_, H, HD, theta, T(-1), ld_dx, ld_dout);
}

#define INSTANTIATE(T)                                                                          \
  template void rope_forward<T>(T*, const T*, int, int, int, int, double, int64_t, int64_t);  \
  template void rope_backward<T>(T*, const T*, int, int, int, int, double, int64_t, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace grass::ops
