// GRASS on the CPU: the compressed weight gradient straight from the activations, the row (or
// column) norms that choose what to train, and the sparse Adam update. This is the reference the
// CUDA kernels are tested against, so it is written for clarity first.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/quant8_step.h"
#include "kernels/ops.h"

namespace grass::ops {

template <typename T>
void grass_gather_columns(T* dst, const T* source, const int32_t* sigma, const T* rho, int64_t N,
                          int width, int r) {
#pragma omp parallel for if (N * r >= kParallelWork)
  for (int64_t n = 0; n < N; n++)
    for (int j = 0; j < r; j++) dst[n * r + j] = source[n * width + sigma[j]] * rho[j];
}

template <typename T>
void grass_selected_cols_grad(T* gc, const T* dy, int64_t ldy, const T* xs, int64_t N, int out,
                              int r) {
  cpu::gemm(true, false, out, r, int(N), T(1), dy, int(ldy), xs, r, T(1), gc, r);
}

template <typename T>
void grass_compressed_grad(T* gc, T* scratch, const T* dy, const T* x, const int32_t* sigma,
                           const T* rho, int64_t N, int in, int out, int r, bool rows) {
  // scratch[N, r]: the selected columns of dy (rows) or of x (cols), times ρ
  grass_gather_columns(scratch, rows ? dy : x, sigma, rho, N, rows ? out : in, r);
  if (rows)  // gc[r, in] += scratchᵀ · x
    cpu::gemm(true, false, r, in, int(N), T(1), scratch, r, x, in, T(1), gc, in);
  else       // gc[out, r] += dyᵀ · scratch
    grass_selected_cols_grad(gc, dy, out, scratch, N, out, r);
}

template <typename T>
void grass_slice_norms(double* norms_sq, const T* g, int out, int in, bool rows) {
  if (rows) {
#pragma omp parallel for
    for (int i = 0; i < out; i++) {
      double s = 0;
      for (int c = 0; c < in; c++) s += double(g[int64_t(i) * in + c]) * g[int64_t(i) * in + c];
      norms_sq[i] = s;
    }
    return;
  }
  std::fill(norms_sq, norms_sq + in, 0.0);
  for (int i = 0; i < out; i++)  // row by row: contiguous reads, one pass
    for (int c = 0; c < in; c++) norms_sq[c] += double(g[int64_t(i) * in + c]) * g[int64_t(i) * in + c];
}

template <typename T>
void grass_adam_update(T* w, T* gc, T* m, T* v, const int32_t* sigma, const T* scale, int out,
                       int in, int r, bool rows, double alpha, const AdamArgs& a) {
  // 1. Adam on the compressed gradient; gc becomes the direction Δ.
  const int64_t n = int64_t(r) * (rows ? in : out);
  const AdamScalars s = adam_scalars<T>(a);
  const T b1 = T(s.beta1), b2 = T(s.beta2), c1 = T(s.one_minus_beta1), c2 = T(s.one_minus_beta2);
  const T gs = T(host_grad_scale(a)), e = T(s.eps);
  const T bc1 = T(s.bias_correction1), bc2_sqrt = T(s.bias_correction2_sqrt);
  // The proximal term reads each element's weight before anything below changes it.
  T* const anchor = static_cast<T*>(a.anchor);
  if (anchor) {
    const T pc = T(a.proximal_coef);
#pragma omp parallel for if (n >= kParallelWork)
    for (int64_t i = 0; i < n; i++) {
      const int64_t j = rows ? i / in : i % r, e = rows ? i % in : i / r;
      const T wi = w[rows ? sigma[j] * int64_t(in) + e : e * in + sigma[j]];
      if (a.anchor_reset)
        anchor[i] = wi;
      else
        gc[i] = gc[i] * gs + pc * (wi - anchor[i]);
    }
  }
  const T gs_read = anchor && !a.anchor_reset ? T(1) : gs;  // the term's pass applied gs
#pragma omp parallel for simd if (n >= kParallelWork)
  for (int64_t i = 0; i < n; i++) {
    const T g = gc[i] * gs_read;
    const T mi = b1 * m[i] + c1 * g;
    const T vi = b2 * v[i] + c2 * g * g;
    m[i] = mi;
    v[i] = vi;
    gc[i] = (mi / bc1) / (std::sqrt(vi) / bc2_sqrt + e);
  }
  // 2. Weight decay, once per distinct selected slice.
  if (a.weight_decay > 0) {
    std::vector<int32_t> distinct(sigma, sigma + r);
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    const T decay = T(s.decay);
    if (rows) {
#pragma omp parallel for
      for (size_t j = 0; j < distinct.size(); j++)
        for (int c = 0; c < in; c++) w[int64_t(distinct[j]) * in + c] *= decay;
    } else {
#pragma omp parallel for
      for (int i = 0; i < out; i++)
        for (int32_t col : distinct) w[int64_t(i) * in + col] *= decay;
    }
  }
  // 3. The scatter: every thread owns whole columns (rows mode) or whole rows (cols mode) of w,
  //    so duplicate σ_j add up without races.
  const T step_size = T(s.lr * alpha);
  if (rows) {
    constexpr int kBlock = 256;  // columns per task: contiguous runs of each selected row
#pragma omp parallel for if (int64_t(r) * in >= kParallelWork)
    for (int c0 = 0; c0 < in; c0 += kBlock) {
      const int c1 = std::min(in, c0 + kBlock);
      for (int j = 0; j < r; j++) {
        T* wrow = w + int64_t(sigma[j]) * in;
        const T* drow = gc + int64_t(j) * in;
        const T s = step_size * scale[j];
        for (int c = c0; c < c1; c++) wrow[c] -= s * drow[c];
      }
    }
  } else {
#pragma omp parallel for if (int64_t(out) * r >= kParallelWork)
    for (int i = 0; i < out; i++)
      for (int j = 0; j < r; j++) w[int64_t(i) * in + sigma[j]] -= step_size * scale[j] * gc[int64_t(i) * r + j];
  }
}

void grass_adam_update_q8(float* w, const float* gc, const Quant8Moments& s, bool by_columns,
                          const int32_t* sigma, const float* scale, int out, int in, int r,
                          bool rows, double alpha, const AdamArgs& a) {
  const AdamScalars sc = adam_scalars<float>(narrowed_to_f32(a));  // the GPU kernel's scalars
  const float b1 = float(sc.beta1), b2 = float(sc.beta2), c1 = float(sc.one_minus_beta1),
              c2 = float(sc.one_minus_beta2), gs = float(host_grad_scale(a)), e = float(sc.eps),
              bc1 = float(sc.bias_correction1), bc2_sqrt = float(sc.bias_correction2_sqrt),
              decay = float(sc.decay), step_size = float(sc.lr * float(alpha)),
              pc = float(a.proximal_coef);
  const bool apply_decay = a.weight_decay > 0;
  float* const anchor = static_cast<float*>(a.anchor);
  const Quant8Layout layout = projected_quant8_layout(out, in, r, rows, s.block, by_columns);
  quant8_adam_blocks(layout, s, [&](int64_t i, float& m, float& v) {
    const int64_t j = rows ? i / in : i % r, c = rows ? i % in : i / r;
    float& wi = w[rows ? sigma[j] * int64_t(in) + c : c * in + sigma[j]];
    // every rounding as the GPU's kernel writes it (adam_moments_rn), so the codes match
    float g = gc[i] * gs;
    if (anchor && a.anchor_reset) anchor[i] = wi;
    else if (anchor) g = std::fma(pc, wi - anchor[i], g);
    adam_moments_rn(m, v, g, b1, c1, b2, c2);
    if (!std::isfinite(g) || !std::isfinite(v)) {
      m = v = 0.0f;
      return;
    }
    const float delta = (m / bc1) / (std::sqrt(v) / bc2_sqrt + e);
    wi = std::fma(-(step_size * scale[j]), delta, apply_decay ? wi * decay : wi);
  });
}

template <typename T>
void pack_slices(T* delta, const T* w, const int32_t* sigma, int count, int out, int in, bool rows) {
  if (rows) {
    for (int j = 0; j < count; j++)
      std::copy_n(w + int64_t(sigma[j]) * in, in, delta + int64_t(j) * in);
    return;
  }
  for (int64_t o = 0; o < out; o++)
    for (int j = 0; j < count; j++) delta[o * count + j] = w[o * in + sigma[j]];
}

template <typename T>
void unpack_slices(T* w, const T* delta, const int32_t* sigma, int count, int out, int in,
                   bool rows) {
  if (rows) {
    for (int j = 0; j < count; j++)
      std::copy_n(delta + int64_t(j) * in, in, w + int64_t(sigma[j]) * in);
    return;
  }
  for (int64_t o = 0; o < out; o++)
    for (int j = 0; j < count; j++) w[o * in + sigma[j]] = delta[o * count + j];
}

#define INSTANTIATE(T)                                                                            \
  template void pack_slices<T>(T*, const T*, const int32_t*, int, int, int, bool);               \
  template void unpack_slices<T>(T*, const T*, const int32_t*, int, int, int, bool);             \
  template void grass_compressed_grad<T>(T*, T*, const T*, const T*, const int32_t*, const T*,   \
                                         int64_t, int, int, int, bool);                          \
  template void grass_gather_columns<T>(T*, const T*, const int32_t*, const T*, int64_t, int,    \
                                        int);                                                    \
  template void grass_selected_cols_grad<T>(T*, const T*, int64_t, const T*, int64_t, int, int); \
  template void grass_slice_norms<T>(double*, const T*, int, int, bool);                         \
  template void grass_adam_update<T>(T*, T*, T*, T*, const int32_t*, const T*, int, int, int,    \
                                     bool, double, const AdamArgs&);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace grass::ops
