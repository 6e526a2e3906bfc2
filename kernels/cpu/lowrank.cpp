// GaLore and FLORA on the CPU (kernels/lowrank_ops.h; the methods: docs/lowrank.md): the projected
// gradient from the activations, FLORA's projection and moment transfer, and the Adam step whose
// back-projection is one GEMM into w (GaLore's projection: galore_basis.cpp). The reference the
// CUDA kernels are tested against.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/quant8_step.h"
#include "kernels/lowrank_ops.h"
#include "src/core/error.h"
#include "src/core/rng.h"

namespace grass::ops {

template <typename T>
void lowrank_compressed_grad(T* R, T* scratch, const T* dy, const T* x, const T* P, int64_t N,
                             int in, int out, int r, bool rows) {
  GRASS_CHECK(N <= INT_MAX, "lowrank_compressed_grad: too many rows for one BLAS call");
  const int n = int(N);
  if (rows) {  // scratch[N, r] = dy·P;  R[r, in] += scratchᵀ·x
    cpu::gemm(false, false, n, r, out, T(1), dy, out, P, r, T(0), scratch, r);
    cpu::gemm(true, false, r, in, n, T(1), scratch, r, x, in, T(1), R, in);
  } else {     // scratch[N, r] = x·P;   R[out, r] += dyᵀ·scratch
    cpu::gemm(false, false, n, r, in, T(1), x, in, P, r, T(0), scratch, r);
    cpu::gemm(true, false, out, r, n, T(1), dy, out, scratch, r, T(1), R, r);
  }
}

template <typename T>
void lowrank_project(T* R, const T* G, const T* P, int out, int in, int r, bool rows) {
  if (rows)  // R[r, in] = P[out, r]ᵀ · G[out, in]
    cpu::gemm(true, false, r, in, out, T(1), P, r, G, in, T(0), R, in);
  else  // R[out, r] = G[out, in] · P[in, r]
    cpu::gemm(false, false, out, r, in, T(1), G, in, P, r, T(0), R, r);
}

template <typename T>
void flora_projection(T* P, uint64_t seed, int64_t tensor, int64_t refresh, int side, int r) {
  const uint64_t stream = derive_seed(derive_seed(seed, uint64_t(refresh)), uint64_t(tensor));
  const double sqrt_r = std::sqrt(double(r));
  const int64_t n = int64_t(side) * r;
#pragma omp parallel for
  for (int64_t i = 0; i < n; i++) P[i] = T(normal(stream, uint64_t(i)) / sqrt_r);
}

template <typename T>
void flora_transfer(T* m, T* scratch, const T* P_old, const T* P_new, int out, int in, int r,
                    bool rows) {
  const int side = rows ? out : in, other = rows ? in : out;
  T* C = scratch;                      // [r, r]
  T* copy = scratch + int64_t(r) * r;  // m's old value, [r, in] or [out, r]
  cpu::gemm(true, false, r, r, side, T(1), P_old, r, P_new, r, T(0), C, r);
  std::memcpy(copy, m, sizeof(T) * size_t(r) * size_t(other));
  if (rows)  // m[r, in] = Cᵀ · m
    cpu::gemm(true, false, r, in, r, T(1), C, r, copy, in, T(0), m, in);
  else  // m[out, r] = m · C
    cpu::gemm(false, false, out, r, r, T(1), copy, r, C, r, T(0), m, r);
}

namespace {

// The factor of lowrank_adam_update's bound: min(1, max_rms / RMS(N̂)) for the direction N[n]
// (N̂ = N·sqrt(1-b2^t)/(1-b1^t)); 1 when max_rms is 0. The squares are summed in order, in
// double, so the factor does not depend on the thread count.
template <typename T>
double update_rms_factor(const T* N, int64_t n, const AdamScalars& s, double max_rms) {
  if (max_rms <= 0) return 1.0;
  double sum = 0;
  for (int64_t i = 0; i < n; i++) sum += double(N[i]) * double(N[i]);
  const double rms = std::sqrt(sum / double(n)) * s.bias_correction2_sqrt / s.bias_correction1;
  return rms > max_rms ? max_rms / rms : 1.0;
}

// After the direction N is in R: w = (w - step_size·alpha·back(N))·decay as one GEMM,
// galore_torch's update followed by its decay, with the decay folded into the GEMM's beta so w
// is read and written once.
template <typename T>
void apply_direction(T* w, const T* R, const T* P, int out, int in, int r, bool rows, double alpha,
                     double max_rms, const AdamScalars& s) {
  const int64_t n = int64_t(r) * (rows ? in : out);
  const double step_size = s.lr * s.bias_correction2_sqrt / s.bias_correction1;
  const double decay = s.decay;
  const T scale = T(-step_size * alpha * decay * update_rms_factor(R, n, s, max_rms));
  if (rows)  // back(N) = P[out, r] · N[r, in]
    cpu::gemm(false, false, out, in, r, scale, P, r, R, in, T(decay), w, in);
  else  // back(N) = N[out, r] · P[in, r]ᵀ
    cpu::gemm(false, true, out, in, r, scale, R, r, P, r, T(decay), w, in);
}

}  // namespace

template <typename T>
void lowrank_adam_update(T* w, T* R, T* m, T* v, const T* P, int out, int in, int r, bool rows,
                         double alpha, double max_rms, const AdamArgs& a) {
  // 1. Adam on the projected gradient; R becomes the normalised direction N.
  const int64_t n = int64_t(r) * (rows ? in : out);
  // 1 - β in double, then rounded: in fp32, 1 - float(0.999) is 1.3e-5 away from 0.001, which
  // would bias v by as much.
  const AdamScalars s = adam_scalars(a);
  const T b1 = T(s.beta1), b2 = T(s.beta2), c1 = T(s.one_minus_beta1), c2 = T(s.one_minus_beta2);
  const T gs = T(host_grad_scale(a)), e = T(s.eps);
#pragma omp parallel for simd if (n >= kParallelWork)
  for (int64_t i = 0; i < n; i++) {
    const T g = R[i] * gs;
    const T mi = b1 * m[i] + c1 * g;
    const T vi = b2 * v[i] + c2 * g * g;
    m[i] = mi;
    v[i] = vi;
    R[i] = mi / (std::sqrt(vi) + e);
  }
  // 2. The back-projected update and the decay.
  apply_direction(w, R, P, out, in, r, rows, alpha, max_rms, s);
}

void lowrank_adam_update_q8(float* w, float* R, const Quant8Moments& q, bool by_columns,
                            const float* P, int out, int in, int r, bool rows, double alpha,
                            double max_rms, const AdamArgs& a) {
  const AdamScalars s = adam_scalars(a);
  const float b1 = float(s.beta1), b2 = float(s.beta2), c1 = float(s.one_minus_beta1),
              c2 = float(s.one_minus_beta2), gs = float(host_grad_scale(a)), e = float(s.eps);
  quant8_adam_blocks(projected_quant8_layout(out, in, r, rows, q.block, by_columns), q,
                     [&](int64_t i, float& m, float& v) {
                       const float g = R[i] * gs;
                       adam_moments_rn(m, v, g, b1, c1, b2, c2);  // the GPU's bits
                       R[i] = m / (std::sqrt(v) + e);
                       if (!std::isfinite(g) || !std::isfinite(v)) m = v = R[i] = 0.0f;
                     });
  apply_direction(w, R, P, out, in, r, rows, alpha, max_rms, s);
}

void flora_transfer_q8(const Quant8Moments& q, bool by_columns, float* scratch,
                       const float* P_old, const float* P_new, int out, int in, int r, bool rows) {
  const Quant8Layout layout = projected_quant8_layout(out, in, r, rows, q.block, by_columns);
  float* m = scratch + int64_t(r) * r + layout.rows * layout.cols;  // after flora_transfer's own
  dequantize_layout(quant8_map(true), q.m, q.absmax_m, layout, m);
  flora_transfer(m, scratch, P_old, P_new, out, in, r, rows);
  quantize_layout(quant8_map(true), m, layout, q.m, q.absmax_m);
}

#define INSTANTIATE(T)                                                                         \
  template void lowrank_compressed_grad<T>(T*, T*, const T*, const T*, const T*, int64_t, int, \
                                           int, int, bool);                                    \
  template void lowrank_project<T>(T*, const T*, const T*, int, int, int, bool);               \
  template void flora_projection<T>(T*, uint64_t, int64_t, int64_t, int, int);                 \
  template void flora_transfer<T>(T*, T*, const T*, const T*, int, int, int, bool);            \
  template void lowrank_adam_update<T>(T*, T*, T*, T*, const T*, int, int, int, bool, double,  \
                                       double, const AdamArgs&);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace grass::ops
