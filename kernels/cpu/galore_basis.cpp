// GaLore's projection on the CPU (kernels/lowrank_ops.h; docs/lowrank.md): the exact top-r singular
// vectors by LAPACK's SVD, and the randomized range finder that approximates them from GEMMs, QRs
// and one small eigenproblem. The reference kernels/cuda/galore_basis.cu is tested against.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
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
// Cholesky factorisation of a symmetric positive definite matrix.
void spotrf_(const char* uplo, const int* n, float* a, const int* lda, int* info, size_t uplo_len);
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info, size_t uplo_len);
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
inline void potrf(int n, float* a, int* info) { spotrf_("L", &n, a, &n, info, 1); }
inline void potrf(int n, double* a, int* info) { dpotrf_("L", &n, a, &n, info, 1); }
// Y[m, k] := Y·R⁻¹, R upper triangular [k, k] (row-major)
inline void trsm_right_upper(int m, int k, const float* R, float* Y) {
  cblas_strsm(CblasRowMajor, CblasRight, CblasUpper, CblasNoTrans, CblasNonUnit, m, k, 1.0f, R, k,
              Y, k);
}
inline void trsm_right_upper(int m, int k, const double* R, double* Y) {
  cblas_dtrsm(CblasRowMajor, CblasRight, CblasUpper, CblasNoTrans, CblasNonUnit, m, k, 1.0, R, k,
              Y, k);
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

// Y[m, k] (row-major) replaced by a well-conditioned basis of its columns' span: CholeskyQR2
// (Fukaya et al. 2014) with a shift (Fukaya et al. 2020, shifted CholeskyQR), for the power
// iterations' intermediate bases, whose orthonormality matters less than their span. Each pass
// is a Gram by GEMM, a Cholesky factor and a triangular solve: S = YᵀY + s·I = RᵀR, Y := Y·R⁻¹.
// The shift s = kGalorePotrfShift·ε·trace(S) (plus the smallest normal number, for Y = 0) keeps S
// positive definite against the Gram's and the factorisation's rounding, so a rank-deficient or
// ill-conditioned Y (a gradient of fewer tokens than k, a spectrum steeper than 1/√ε) still
// factors; it only damps the directions below √s, which the span keeps. The factorisation then
// fails only on a non-finite Y (made to fail: below) or rounding beyond the shift, and either
// stops the refresh as a failed eigensolver does. kernels/cuda/galore_basis.cu takes the same
// steps. The shift's unit, ε·trace, measured on the CPU in float (m up to 5,000, k up to 136,
// rank-deficient spectra and one falling to 10^-6 over k): no failed factorisation from 0.25 to
// 100 units (every rank-deficient case failed unshifted); the range finder's subspace as
// Householder's at 1 unit, 17 times further from the exact one at 10 on the steep spectrum, and
// lost at 100.
template <typename T>
void cholesky_qr2(std::vector<T>& Y, int m, int k) {
  std::vector<T> S(size_t(k) * k);
  for (int pass = 0; pass < 2; pass++) {
    cpu::gemm(true, false, k, k, m, T(1), Y.data(), k, Y.data(), k, T(0), S.data(), k);
    T trace = 0;
    for (int i = 0; i < k; i++) trace += S[size_t(i) * k + i];
    const T shift = T(kGalorePotrfShift) * std::numeric_limits<T>::epsilon() * trace +
                    std::numeric_limits<T>::min();
    // a non-finite Y: a diagonal of -1, which potrf reports whatever its NaN tests (OpenBLAS's
    // pass a NaN pivot)
    for (int i = 0; i < k; i++)
      S[size_t(i) * k + i] = std::isfinite(trace) ? S[size_t(i) * k + i] + shift : T(-1);
    // LAPACK's column-major lower factor L (S = L·Lᵀ) is, read row-major, R = Lᵀ: upper
    int info = 0;
    potrf(k, S.data(), &info);
    GRASS_CHECK(info == 0, "galore_basis_randomized: the Cholesky factorisation of a Gram matrix "
                           "failed (non-finite gradient?), info " + std::to_string(info));
    trsm_right_upper(m, k, S.data(), Y.data());
  }
}

GaloreRefreshTimes cpu_times;  // the CPU's phases since the last take

// Adds the time since the last switch to the running phase (the timers on).
class PhaseClock {
 public:
  explicit PhaseClock(bool on) : on_(on) {}
  void start(GalorePhase phase) {
    if (!on_) return;
    stop();
    phase_ = int(phase);
  }
  void stop() {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    if (phase_ >= 0)
      cpu_times.ms[phase_] += std::chrono::duration<double, std::milli>(now - since_).count();
    since_ = now;
    phase_ = -1;
  }

 private:
  bool on_;
  int phase_ = -1;
  std::chrono::steady_clock::time_point since_;
};

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

const char* name_of(GalorePhase phase) {
  switch (phase) {
    case GalorePhase::TestMatrix: return "test matrix";
    case GalorePhase::Gemm: return "GEMMs";
    case GalorePhase::Qr: return "QRs";
    case GalorePhase::Eigensolver: return "eigensolver";
    case GalorePhase::P: return "P";
  }
  return "?";
}

bool galore_timers_enabled() {  // read at each refresh of a target: a test can set it
  const char* v = std::getenv("GRASS_GALORE_TIMERS");
  return v && *v && std::strcmp(v, "0") != 0;
}

GaloreRefreshTimes take_galore_refresh_times() {
  const GaloreRefreshTimes times = cpu_times;
  cpu_times = {};
  return times;
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
void galore_sketch(T* Q, T* S, const T* G, int out, int in, int r, bool rows, uint64_t seed,
                   int power_iters, int oversample, const T* warm) {
  const int m = rows ? out : in, n = rows ? in : out;
  GRASS_CHECK(r >= 1 && r <= std::min(m, n), "galore_basis_randomized: rank outside [1, min(out, in)]");
  GRASS_CHECK(power_iters >= 0 && oversample >= 0, "galore_basis_randomized: negative parameters");
  GRASS_CHECK(!warm || power_iters >= 1, "galore_basis_randomized: a warm start needs a power iteration");
  const int k = galore_sketch_columns(out, in, r, oversample);
  // A·X for X[n, k] and Aᵀ·X for X[m, k], with A = G (rows) or Gᵀ (cols), G row-major [out, in]
  const auto times_a = [&](const std::vector<T>& X, std::vector<T>& Y) {  // Y[m, k]
    cpu::gemm(!rows, false, m, k, n, T(1), G, in, X.data(), k, T(0), Y.data(), k);
  };
  const auto times_at = [&](const std::vector<T>& X, std::vector<T>& Z) {  // Z[n, k]
    cpu::gemm(rows, false, n, k, m, T(1), G, in, X.data(), k, T(0), Z.data(), k);
  };
  PhaseClock clock(galore_timers_enabled());
  clock.start(GalorePhase::TestMatrix);
  std::vector<T> Y(size_t(m) * k), Z(size_t(n) * k);
  if (warm) {  // Y = [P_prev | Gaussian columns scaled to about unit norm], in place of A·Ω
    const T scale = T(1) / std::sqrt(T(m));
    for (int i = 0; i < m; i++)
      for (int j = 0; j < k; j++)
        Y[size_t(i) * k + j] = j < r ? warm[size_t(i) * r + j]
                                     : T(normal(seed, size_t(i) * (k - r) + (j - r))) * scale;
  } else {
    std::vector<T> omega(size_t(n) * k);
    for (size_t i = 0; i < omega.size(); i++) omega[i] = T(normal(seed, i));
    clock.start(GalorePhase::Gemm);
    times_a(omega, Y);
  }
  // Householder QR for the basis the Rayleigh-Ritz step reads, CholeskyQR2 for those before it
  for (int it = 0; it < power_iters; it++) {
    clock.start(GalorePhase::Qr);
    cholesky_qr2(Y, m, k);
    clock.start(GalorePhase::Gemm);
    times_at(Y, Z);
    clock.start(GalorePhase::Qr);
    cholesky_qr2(Z, n, k);
    clock.start(GalorePhase::Gemm);
    times_a(Z, Y);
  }
  clock.start(GalorePhase::Qr);
  orthonormalise(Y, m, k);
  std::copy(Y.begin(), Y.end(), Q);
  // Rayleigh-Ritz: B = Qᵀ·A [k, n] (Bᵀ = Aᵀ·Q), S = B·Bᵀ [k, k]
  clock.start(GalorePhase::Gemm);
  times_at(Y, Z);  // Z = Bᵀ
  cpu::gemm(true, false, k, k, n, T(1), Z.data(), k, Z.data(), k, T(0), S, k);
  clock.stop();
}

template <typename T>
void galore_finish(T* P, const T* Q, T* S, int side, int k, int r) {
  PhaseClock clock(galore_timers_enabled());
  clock.start(GalorePhase::Eigensolver);
  int info = 0, iquery = 0;
  T query;
  std::vector<T> lambda(static_cast<size_t>(k));
  syevd(k, S, lambda.data(), &query, -1, &iquery, -1, &info);
  std::vector<T> work(size_t(query) + 1);
  std::vector<int> iwork(size_t(iquery) + 1);
  syevd(k, S, lambda.data(), work.data(), int(work.size()), iwork.data(), int(iwork.size()), &info);
  GRASS_CHECK(info == 0, "galore_basis_randomized: the eigensolver did not converge (non-finite "
                         "gradient?), info " + std::to_string(info));
  // syevd: ascending eigenvalues, eigenvector j in column j (S symmetric: S[i + j·k]); W_top[k, r]
  clock.start(GalorePhase::P);
  std::vector<T> w_top(size_t(k) * r);
  for (int c = 0; c < r; c++)
    for (int i = 0; i < k; i++) w_top[size_t(i) * r + c] = S[size_t(k - 1 - c) * k + i];
  cpu::gemm(false, false, side, r, k, T(1), Q, k, w_top.data(), r, T(0), P, r);
  sign_normalise(P, side, r);
  clock.stop();
  if (galore_timers_enabled()) cpu_times.targets++;
}

template <typename T>
void galore_basis_randomized(T* P, const T* G, int out, int in, int r, bool rows, uint64_t seed,
                             int power_iters, int oversample, bool warm_start) {
  const int side = rows ? out : in, k = galore_sketch_columns(out, in, r, oversample);
  std::vector<T> Q(size_t(side) * k), S(size_t(k) * k);
  galore_sketch(Q.data(), S.data(), G, out, in, r, rows, seed, power_iters, oversample,
                warm_start ? P : nullptr);
  galore_finish(P, Q.data(), S.data(), side, k, r);
}

#define INSTANTIATE(T)                                                                          \
  template void galore_basis<T>(T*, const T*, int, int, int, bool);                             \
  template void galore_basis_randomized<T>(T*, const T*, int, int, int, bool, uint64_t, int, int, \
                                           bool);                                               \
  template void galore_sketch<T>(T*, T*, const T*, int, int, int, bool, uint64_t, int, int,     \
                                 const T*);                                                     \
  template void galore_finish<T>(T*, const T*, T*, int, int, int);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace grass::ops
