// GaLore and FLORA on the CPU (kernels/lowrank_ops.h; the methods: docs/lowrank.md): the projected
// gradient from the activations, the two projections, FLORA's moment transfer and the Adam step
// whose back-projection is one GEMM into w. The reference the CUDA kernels are tested against.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/blas.h"
#include "kernels/lowrank_ops.h"
#include "src/core/error.h"
#include "src/core/rng.h"

// LAPACK's divide-and-conquer SVD, as OpenBLAS exports it (no LAPACKE header is needed). The
// trailing size_t is gfortran's hidden length of the jobz string.
extern "C" {
void sgesdd_(const char* jobz, const int* m, const int* n, float* a, const int* lda, float* s,
             float* u, const int* ldu, float* vt, const int* ldvt, float* work, const int* lwork,
             int* iwork, int* info, size_t jobz_len);
void dgesdd_(const char* jobz, const int* m, const int* n, double* a, const int* lda, double* s,
             double* u, const int* ldu, double* vt, const int* ldvt, double* work, const int* lwork,
             int* iwork, int* info, size_t jobz_len);
// Householder QR and the explicit Q; the symmetric eigenproblem (divide and conquer).
void sgeqrf_(const int* m, const int* n, float* a, const int* lda, float* tau, float* work,
             const int* lwork, int* info);
void dgeqrf_(const int* m, const int* n, double* a, const int* lda, double* tau, double* work,
             const int* lwork, int* info);
void sorgqr_(const int* m, const int* n, const int* k, float* a, const int* lda, const float* tau,
             float* work, const int* lwork, int* info);
void dorgqr_(const int* m, const int* n, const int* k, double* a, const int* lda,
             const double* tau, double* work, const int* lwork, int* info);
void ssyevd_(const char* jobz, const char* uplo, const int* n, float* a, const int* lda, float* w,
             float* work, const int* lwork, int* iwork, const int* liwork, int* info,
             size_t jobz_len, size_t uplo_len);
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
             double* work, const int* lwork, int* iwork, const int* liwork, int* info,
             size_t jobz_len, size_t uplo_len);
}

namespace grass::ops {

namespace {

inline void gesdd(int m, int n, float* a, float* s, float* u, float* vt, float* work, int lwork,
                  int* iwork, int* info) {
  const int ldu = m, ldvt = std::min(m, n);
  sgesdd_("S", &m, &n, a, &m, s, u, &ldu, vt, &ldvt, work, &lwork, iwork, info, 1);
}
inline void gesdd(int m, int n, double* a, double* s, double* u, double* vt, double* work,
                  int lwork, int* iwork, int* info) {
  const int ldu = m, ldvt = std::min(m, n);
  dgesdd_("S", &m, &n, a, &m, s, u, &ldu, vt, &ldvt, work, &lwork, iwork, info, 1);
}

inline void geqrf(int m, int n, float* a, float* tau, float* work, int lwork, int* info) {
  sgeqrf_(&m, &n, a, &m, tau, work, &lwork, info);
}
inline void geqrf(int m, int n, double* a, double* tau, double* work, int lwork, int* info) {
  dgeqrf_(&m, &n, a, &m, tau, work, &lwork, info);
}
inline void orgqr(int m, int n, float* a, const float* tau, float* work, int lwork, int* info) {
  sorgqr_(&m, &n, &n, a, &m, tau, work, &lwork, info);
}
inline void orgqr(int m, int n, double* a, const double* tau, double* work, int lwork, int* info) {
  dorgqr_(&m, &n, &n, a, &m, tau, work, &lwork, info);
}
inline void syevd(int n, float* a, float* w, float* work, int lwork, int* iwork, int liwork,
                  int* info) {
  ssyevd_("V", "U", &n, a, &n, w, work, &lwork, iwork, &liwork, info, 1, 1);
}
inline void syevd(int n, double* a, double* w, double* work, int lwork, int* iwork, int liwork,
                  int* info) {
  dsyevd_("V", "U", &n, a, &n, w, work, &lwork, iwork, &liwork, info, 1, 1);
}

// Y[m, k] (row-major) replaced by an orthonormal basis of its columns' span: Householder QR.
template <typename T>
void orthonormalise(std::vector<T>& Y, int m, int k) {
  std::vector<T> a(Y.size()), tau(static_cast<size_t>(k));
  for (int i = 0; i < m; i++)  // LAPACK's column-major copy
    for (int j = 0; j < k; j++) a[size_t(j) * m + i] = Y[size_t(i) * k + j];
  int info = 0;
  T query;
  geqrf(m, k, a.data(), tau.data(), &query, -1, &info);
  std::vector<T> work(std::max<size_t>(size_t(query) + 1, size_t(k) * 64));
  geqrf(m, k, a.data(), tau.data(), work.data(), int(work.size()), &info);
  GRASS_CHECK(info == 0, "galore_basis_randomized: geqrf failed, info " + std::to_string(info));
  orgqr(m, k, a.data(), tau.data(), work.data(), int(work.size()), &info);
  GRASS_CHECK(info == 0, "galore_basis_randomized: orgqr failed, info " + std::to_string(info));
  for (int i = 0; i < m; i++)
    for (int j = 0; j < k; j++) Y[size_t(i) * k + j] = a[size_t(j) * m + i];
}

// Column j of P[side, r] multiplied by the sign that makes its largest-magnitude entry (the first
// on ties) positive: P a deterministic function of its subspace's basis.
template <typename T>
void sign_normalise(T* P, int side, int r) {
  for (int j = 0; j < r; j++) {
    int peak = 0;
    for (int i = 1; i < side; i++)
      if (std::abs(P[int64_t(i) * r + j]) > std::abs(P[int64_t(peak) * r + j])) peak = i;
    if (P[int64_t(peak) * r + j] < 0)
      for (int i = 0; i < side; i++) P[int64_t(i) * r + j] = -P[int64_t(i) * r + j];
  }
}

}  // namespace

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
void galore_basis(T* P, const T* G, int out, int in, int r, bool rows) {
  GRASS_CHECK(r >= 1 && r <= std::min(out, in), "galore_basis: rank outside [1, min(out, in)]");
  // Row-major G[out, in] is column-major Gᵀ[in, out], so LAPACK factors Gᵀ = U'·S·V'ᵀ, and
  // G = V'·S·U'ᵀ: G's left singular vectors are V' (the rows of vt), its right ones U'.
  const int m = in, n = out, k = std::min(m, n);
  std::vector<T> a(G, G + int64_t(out) * in);  // gesdd destroys its input
  std::vector<T> s(k), u(int64_t(m) * k), vt(int64_t(k) * n);
  std::vector<int> iwork(8 * size_t(k));
  int info = 0;
  T query;
  gesdd(m, n, a.data(), s.data(), u.data(), vt.data(), &query, -1, iwork.data(), &info);
  GRASS_CHECK(info == 0,
              "galore_basis: gesdd workspace query failed, info " + std::to_string(info));
  // The query answers in T, which in float may round the size down: never go below the
  // documented minimum for jobz = 'S'.
  const size_t kk = size_t(k);
  const size_t minimum = 3 * kk + std::max(size_t(std::max(m, n)), 5 * kk * kk + 4 * kk);
  std::vector<T> work(std::max(size_t(query), minimum));
  gesdd(m, n, a.data(), s.data(), u.data(), vt.data(), work.data(), int(work.size()), iwork.data(),
        &info);
  GRASS_CHECK(info == 0, "galore_basis: the SVD did not converge (non-finite gradient?), info " +
                             std::to_string(info));
  const int side = rows ? out : in;
  for (int j = 0; j < r; j++) {
    // column j of P: vt(j, i) = vt[j + i·k] (rows) or u(c, j) = u[c + j·m] (cols)
    const T* src = rows ? vt.data() + j : u.data() + int64_t(j) * m;
    const int64_t stride = rows ? k : 1;
    for (int i = 0; i < side; i++) P[int64_t(i) * r + j] = src[i * stride];
  }
  sign_normalise(P, side, r);
}

template <typename T>
void galore_basis_randomized(T* P, const T* G, int out, int in, int r, bool rows, uint64_t seed,
                             int power_iters, int oversample) {
  const int m = rows ? out : in, n = rows ? in : out;
  GRASS_CHECK(r >= 1 && r <= std::min(m, n), "galore_basis_randomized: rank outside [1, min(out, in)]");
  GRASS_CHECK(power_iters >= 0 && oversample >= 0, "galore_basis_randomized: negative parameters");
  const int k = std::min({r + oversample, m, n});
  // A·X for X[n, k] and Aᵀ·X for X[m, k], with A = G (rows) or Gᵀ (cols), G row-major [out, in]
  const auto times_a = [&](const std::vector<T>& X, std::vector<T>& Y) {  // Y[m, k]
    cpu::gemm(!rows, false, m, k, n, T(1), G, in, X.data(), k, T(0), Y.data(), k);
  };
  const auto times_at = [&](const std::vector<T>& X, std::vector<T>& Z) {  // Z[n, k]
    cpu::gemm(rows, false, n, k, m, T(1), G, in, X.data(), k, T(0), Z.data(), k);
  };
  std::vector<T> omega(size_t(n) * k), Q(size_t(m) * k), Z(size_t(n) * k);
  for (size_t i = 0; i < omega.size(); i++) omega[i] = T(normal(seed, i));
  times_a(omega, Q);
  orthonormalise(Q, m, k);
  for (int it = 0; it < power_iters; it++) {
    times_at(Q, Z);
    orthonormalise(Z, n, k);
    times_a(Z, Q);
    orthonormalise(Q, m, k);
  }
  // Rayleigh-Ritz: B = Qᵀ·A [k, n] (Bᵀ = Aᵀ·Q), S = B·Bᵀ [k, k], its top-r eigenvectors W
  times_at(Q, Z);  // Z = Bᵀ
  std::vector<T> S(size_t(k) * k), lambda(static_cast<size_t>(k));
  cpu::gemm(true, false, k, k, n, T(1), Z.data(), k, Z.data(), k, T(0), S.data(), k);
  int info = 0, iquery = 0;
  T query;
  syevd(k, S.data(), lambda.data(), &query, -1, &iquery, -1, &info);
  std::vector<T> work(size_t(query) + 1);
  std::vector<int> iwork(size_t(iquery) + 1);
  syevd(k, S.data(), lambda.data(), work.data(), int(work.size()), iwork.data(), int(iwork.size()),
        &info);
  GRASS_CHECK(info == 0, "galore_basis_randomized: the eigensolver did not converge (non-finite "
                         "gradient?), info " + std::to_string(info));
  // syevd: ascending eigenvalues, eigenvector j in column j (S symmetric: S[i + j·k]); W_top[k, r]
  std::vector<T> w_top(size_t(k) * r);
  for (int c = 0; c < r; c++)
    for (int i = 0; i < k; i++) w_top[size_t(i) * r + c] = S[size_t(k - 1 - c) * k + i];
  cpu::gemm(false, false, m, r, k, T(1), Q.data(), k, w_top.data(), r, T(0), P, r);
  sign_normalise(P, m, r);
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
#pragma omp parallel for simd
  for (int64_t i = 0; i < n; i++) {
    const T g = R[i] * gs;
    const T mi = b1 * m[i] + c1 * g;
    const T vi = b2 * v[i] + c2 * g * g;
    m[i] = mi;
    v[i] = vi;
    R[i] = mi / (std::sqrt(vi) + e);
  }
  // 2. w = (w - step_size·alpha·back(N))·decay as one GEMM: galore_torch's update followed by its
  //    decay, with the decay folded into the GEMM's beta so w is read and written once.
  const double step_size = s.lr * s.bias_correction2_sqrt / s.bias_correction1;
  const double decay = s.decay;
  const T scale = T(-step_size * alpha * decay * update_rms_factor(R, n, s, max_rms));
  if (rows)  // back(N) = P[out, r] · N[r, in]
    cpu::gemm(false, false, out, in, r, scale, P, r, R, in, T(decay), w, in);
  else  // back(N) = N[out, r] · P[in, r]ᵀ
    cpu::gemm(false, true, out, in, r, scale, R, r, P, r, T(decay), w, in);
}

#define INSTANTIATE(T)                                                                         \
  template void lowrank_compressed_grad<T>(T*, T*, const T*, const T*, const T*, int64_t, int, \
                                           int, int, bool);                                    \
  template void lowrank_project<T>(T*, const T*, const T*, int, int, int, bool);               \
  template void galore_basis<T>(T*, const T*, int, int, int, bool);                            \
  template void galore_basis_randomized<T>(T*, const T*, int, int, int, bool, uint64_t, int, int); \
  template void flora_projection<T>(T*, uint64_t, int64_t, int64_t, int, int);                 \
  template void flora_transfer<T>(T*, T*, const T*, const T*, int, int, int, bool);            \
  template void lowrank_adam_update<T>(T*, T*, T*, T*, const T*, int, int, int, bool, double,  \
                                       double, const AdamArgs&);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace grass::ops
