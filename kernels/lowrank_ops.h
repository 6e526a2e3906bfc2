// The ops of the two dense-projection baselines, GaLore and FLORA (docs/lowrank.md has the
// formulas, the reference code they follow and every choice): a weight w[out, in] trains through
// a projection P [side, r] of its gradient G = dyᵀ·x onto r dimensions of one side,
//   rows (side = out):  R[r, in]  = Pᵀ·G,   back-projection P·R      [out, in]
//   cols (side = in):   R[out, r] = G·P,    back-projection R·Pᵀ     [out, in]
// GaLore's P is G's top-r singular vectors, recomputed from the full gradient every
// update_proj_gap steps; FLORA's P is Gaussian, regenerated from a seed every kappa steps, and
// its first moment is carried over to the new P. Both then run the same Adam step on R.
// P is always stored [side, r] row-major. Same conventions as ops.h: explicit shapes, row-major,
// instantiated for float and double, implemented on the CPU in kernels/cpu/lowrank.cpp.
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/adam_args.h"
#include "kernels/quant8.h"

namespace grass::ops {

// R += the projected gradient of y = x·wᵀ, straight from the activations (the out x in gradient
// is never formed): 2·N·r·(out + in) FLOPs instead of 2·N·out·in.
//   rows: scratch[N, r] = dy[N, out]·P[out, r];  R[r, in]  += scratchᵀ·x[N, in]
//   cols: scratch[N, r] = x[N, in]·P[in, r];     R[out, r] += dyᵀ·scratch
template <typename T>
void lowrank_compressed_grad(T* R, T* scratch, const T* dy, const T* x, const T* P, int64_t N,
                             int in, int out, int r, bool rows);

// R = Pᵀ·G (rows, R[r, in]) or G·P (cols, R[out, r]) of a full G[out, in], overwritten: at a
// refresh, where the full gradient exists anyway.
template <typename T>
void lowrank_project(T* R, const T* G, const T* P, int out, int in, int r, bool rows);

// GaLore's projection: the top-r singular vectors of G[out, in] (LAPACK gesdd),
//   rows: P[out, r] = U[:, :r];   cols: P[in, r] = V[:, :r] (= Vh[:r, :]ᵀ)
// each normalised so that its entry of largest magnitude (the first one on ties) is positive,
// which makes P a deterministic function of G. r ≤ min(out, in). Allocates its workspace.
template <typename T>
void galore_basis(T* P, const T* G, int out, int in, int r, bool rows);

// The phases of one randomized refresh, timed when GRASS_GALORE_TIMERS is set and not 0:
// steady_clock on the CPU, events on a GPU (kernels/cuda/cuda_ops.h, refresh_phase_times). Off,
// nothing is recorded.
enum class GalorePhase { TestMatrix, Gemm, Qr, Eigensolver, P };
constexpr int kGalorePhases = 5;
const char* name_of(GalorePhase phase);
bool galore_timers_enabled();
struct GaloreRefreshTimes {
  double ms[kGalorePhases] = {};  // summed over the targets since the last take
  int targets = 0;
};
// The CPU's times since the last call (zero and no targets with the timers off), then reset.
GaloreRefreshTimes take_galore_refresh_times();

// CholeskyQR2's shift in units of ε·trace(YᵀY): enough to cover the rounding of the Gram and of
// its factorisation, so that potrf fails only on a non-finite gradient; more damps the subspace
// (kernels/cpu/galore_basis.cpp has the measurements).
constexpr double kGalorePotrfShift = 1;

// GaLore's projection by a randomized range finder (Halko, Martinsson & Tropp 2011, Alg. 4.4 with
// a final Rayleigh-Ritz step; GaLore 2's choice, fast where an exact SVD is not): approximately the
// top-r singular vectors of galore_basis, from GEMMs, QRs and one k x k eigenproblem,
//   A = G[out, in] (rows) or Gᵀ (cols), m x n with m = side;  k = min(r + oversample, m, n)
//   Ω[n, k] = normal(seed, i) (core/rng.h);  Y = A·Ω;  power_iters times: Y = A·chol(Aᵀ·chol(Y))
//   Q = orth(Y);  B = Qᵀ·A [k, n];  B·Bᵀ = W·Λ·Wᵀ (Λ descending);  P = Q·W[:, :r]
// orth: Householder QR (LAPACK geqrf + orgqr; cuSOLVER's on a GPU), for the basis Rayleigh-Ritz
// reads. chol: shifted CholeskyQR2 for the power iterations' bases (two passes of a Gram by GEMM,
// potrf with kGalorePotrfShift, trsm: GEMM-bound where a QR is latency-bound; the span is the
// same, the orthonormality only approximate). Each column of P is then sign-normalised as
// galore_basis's. Its subspace is the exact one's to within a principal angle that shrinks as
// (σ_{k+1}/σ_r)^(2·power_iters+1) (tests/test_lowrank.cpp measures it).
// warm_start (the CPU only, for tools/galore_warm_start.cpp's study; no run uses it): P holds the
// target's previous projection [side, r] on entry, and the range finder starts from it instead of
// from A·Ω: Y = [P_prev | G_rest] with G_rest[side, k - r] = normal(seed, i) / √side, then the
// power iterations (at least one). It saves the product A·Ω and no factorisation, and on a 60M
// run's gradients one warm power iteration is further from the exact subspace than two fresh
// ones (docs/lowrank.md, "A warm-started refresh, measured on real gradients").
template <typename T>
void galore_basis_randomized(T* P, const T* G, int out, int in, int r, bool rows, uint64_t seed,
                             int power_iters, int oversample, bool warm_start = false);
// Its two halves, so that several targets' eigenproblems can be solved in one batched call (GaLore's
// optimizer.svd_batch "layer"): galore_sketch runs it up to Rayleigh-Ritz, Q[side, k] (orthonormal)
// and S = B·Bᵀ [k, k]; galore_finish solves S's eigenproblem (S is overwritten) and writes P[side, r]
// = Q·W[:, :r], sign-normalised. galore_basis_randomized is the one after the other.
inline int galore_sketch_columns(int out, int in, int r, int oversample) {
  return std::min({r + oversample, out, in});
}
template <typename T>
void galore_sketch(T* Q, T* S, const T* G, int out, int in, int r, bool rows, uint64_t seed,
                   int power_iters, int oversample, const T* warm = nullptr);
template <typename T>
void galore_finish(T* P, const T* Q, T* S, int side, int k, int r);

// FLORA's projection number `refresh` of tensor `tensor`: P[side, r] with i.i.d. N(0, 1/r)
// entries, P[i] = normal(derive_seed(derive_seed(seed, refresh), tensor), i) / sqrt(r)
// (core/rng.h), so E[P·Pᵀ] = I and it is regenerated, never stored.
template <typename T>
void flora_projection(T* P, uint64_t seed, int64_t tensor, int64_t refresh, int side, int r);

// FLORA's moment transfer at a resampling: m = down_new(up_old(m)), through the r x r matrix
// C = P_oldᵀ·P_new (the out x in up-projection is never formed):
//   rows: m[r, in]  = P_newᵀ·P_old·m = Cᵀ·m
//   cols: m[out, r] = m·P_oldᵀ·P_new = m·C
// P_old, P_new [side, r];  scratch [r·r + numel(m)] holds C and a copy of m.
template <typename T>
void flora_transfer(T* m, T* scratch, const T* P_old, const T* P_new, int out, int in, int r,
                    bool rows);

// The Adam step on the projected gradient and the update of w[out, in], galore_torch's AdamW
// (HF-transformers order; FLORA's step in this engine is the same, see docs/lowrank.md):
//   g = R·grad_scale;  m = b1·m + (1-b1)·g;  v = b2·v + (1-b2)·g²;  N = m / (sqrt(v) + eps)
//   w = (w - lr·sqrt(1-b2^t)/(1-b1^t)·alpha·back(N)) · (1 - lr·wd)      (t = a.step, from 1)
// eps is added to sqrt(v) without bias correction and the decay comes after the update, both
// unlike adamw_update (torch.optim.AdamW). alpha scales the back-projected update (GaLore's
// `scale`, 0.25 in its scripts). m, v shaped like R; P [side, r]. The back-projection is one GEMM
// into w (the out x in update matrix is never stored), the decay its beta. R is overwritten
// with N. The step counter is never reset at a refresh.
// max_rms > 0 bounds the update as flora-opt's clip_threshold does (Adafactor's update clipping):
// the bias-corrected direction N̂ = sqrt(1-b2^t)/(1-b1^t)·N is scaled by
// min(1, max_rms / RMS(N̂)), RMS over its r·in (or out·r) entries. That is the RMS of the
// back-projected update in expectation when E[PᵀP] = (side/r)·I (FLORA's Gaussian P), and it is
// taken without forming the out x in update. 0: no bound (GaLore).
template <typename T>
void lowrank_adam_update(T* w, T* R, T* m, T* v, const T* P, int out, int in, int r, bool rows,
                         double alpha, double max_rms, const AdamArgs& a);

// The same step with 8-bit moments (kernels/quant8.h), in fp32: m, v are codes shaped like R,
// blocked flat or down R's columns (by_columns). An element whose read gradient (or square) is
// not finite gets a zero direction and zero moments.
void lowrank_adam_update_q8(float* w, float* R, const Quant8Moments& q, bool by_columns,
                            const float* P, int out, int in, int r, bool rows, double alpha,
                            double max_rms, const AdamArgs& a);
// FLORA's transfer of an 8-bit m: decoded, carried as flora_transfer does, requantized (its
// blocks' absmax from the new values); scratch [r·r + 2·numel(m)].
void flora_transfer_q8(const Quant8Moments& q, bool by_columns, float* scratch,
                       const float* P_old, const float* P_new, int out, int in, int r, bool rows);

}  // namespace grass::ops
