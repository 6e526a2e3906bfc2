// The GaLore and FLORA ops (kernels/lowrank_ops.h, docs/lowrank.md): each op against its formula
// written out as scalar sums on fresh random inputs, the projected gradient from the activations
// against the projection of the full gradient, the SVD basis on matrices with known singular
// vectors, FLORA's projection stream, and six steps of both methods on three weights against the
// float64 reference of tools/reference/make_lowrank_fixture.py.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cpu/blas.h"
#include "kernels/lowrank_ops.h"
#include "src/core/rng.h"
#include "src/io/safetensors.h"
#include "tests/subspace.h"

using namespace grass;

namespace {

const std::string kFixtureDir = std::string(GRASS_SOURCE_DIR) + "/tests/fixtures/lowrank_ref";

// The bar per precision: float64 agrees to rounding, fp32 to its epsilon times the conditioning.
// Measured on the six-step sequences: double ≤ 3e-14; fp32 FLORA ≤ 4e-7, fp32 GaLore ≤ 4e-6, set
// by the fp32 SVD (error ~ 6e-8·σ1 / singular-value gap, the gaps ≥ 3% of σ1 by the fixture's
// construction).
template <typename T>
constexpr double kTol = sizeof(T) == 8 ? 1e-10 : 1e-5;

// n numbers N(0, std²) from the counter-based stream `seed`, rounded to T
template <typename T>
std::vector<T> randn(size_t n, uint64_t seed, double std = 1.0) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; i++) v[i] = T(std * normal(seed, i));
  return v;
}

// Outputs an op overwrites start as NaN, so an element it never writes shows.
template <typename T>
std::vector<T> poisoned(size_t n) {
  return std::vector<T>(n, std::numeric_limits<T>::quiet_NaN());
}

// ‖a - b‖ / ‖b‖ (NaN in a gives NaN, which fails every `<` check)
template <typename A, typename B>
double rel_err(const std::vector<A>& a, const std::vector<B>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); i++) {
    num += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num / den);
}

// ---- the formulas, as scalar sums in double --------------------------------------------------
// R = Pᵀ·G [r, in] (rows) or G·P [out, r] (cols), of G[out, in] and P[side, r]
template <typename TG, typename TP>
std::vector<double> project_ref(const std::vector<TG>& G, const std::vector<TP>& P, int out, int in,
                                int r, bool rows) {
  std::vector<double> R(size_t(r) * (rows ? in : out), 0.0);
  for (int i = 0; i < out; i++)
    for (int c = 0; c < in; c++)
      for (int j = 0; j < r; j++) {
        const double g = G[size_t(i) * in + c];
        if (rows)
          R[size_t(j) * in + c] += double(P[size_t(i) * r + j]) * g;
        else
          R[size_t(i) * r + j] += g * double(P[size_t(c) * r + j]);
      }
  return R;
}

// G[out, in] = dyᵀ·x
template <typename T>
std::vector<T> full_grad(const std::vector<T>& dy, const std::vector<T>& x, int N, int in,
                         int out) {
  std::vector<double> G(size_t(out) * in, 0.0);
  for (int n = 0; n < N; n++)
    for (int i = 0; i < out; i++)
      for (int c = 0; c < in; c++)
        G[size_t(i) * in + c] += double(dy[size_t(n) * out + i]) * x[size_t(n) * in + c];
  return {G.begin(), G.end()};
}

// back(N) [out, in] = P·N (rows) or N·Pᵀ (cols)
template <typename T>
std::vector<double> back_ref(const std::vector<double>& N, const std::vector<T>& P, int out, int in,
                             int r, bool rows) {
  std::vector<double> B(size_t(out) * in, 0.0);
  for (int i = 0; i < out; i++)
    for (int c = 0; c < in; c++)
      for (int j = 0; j < r; j++)
        B[size_t(i) * in + c] += rows ? double(P[size_t(i) * r + j]) * N[size_t(j) * in + c]
                                      : N[size_t(i) * r + j] * double(P[size_t(c) * r + j]);
  return B;
}

// Columns of a random [rows, cols] matrix made orthonormal (Gram-Schmidt, twice for accuracy).
std::vector<double> orthonormal(int rows, int cols, uint64_t seed) {
  std::vector<double> Q = randn<double>(size_t(rows) * cols, seed);
  for (int j = 0; j < cols; j++)
    for (int pass = 0; pass < 2; pass++) {
      for (int k = 0; k < j; k++) {
        double dot = 0;
        for (int i = 0; i < rows; i++) dot += Q[size_t(i) * cols + j] * Q[size_t(i) * cols + k];
        for (int i = 0; i < rows; i++) Q[size_t(i) * cols + j] -= dot * Q[size_t(i) * cols + k];
      }
      double norm = 0;
      for (int i = 0; i < rows; i++) norm += Q[size_t(i) * cols + j] * Q[size_t(i) * cols + j];
      for (int i = 0; i < rows; i++) Q[size_t(i) * cols + j] /= std::sqrt(norm);
    }
  return Q;
}

// The first r columns of Q[side, k], each flipped so its largest-magnitude entry is positive.
std::vector<double> sign_normalised(const std::vector<double>& Q, int side, int k, int r) {
  std::vector<double> P(size_t(side) * r);
  for (int j = 0; j < r; j++) {
    int peak = 0;
    for (int i = 1; i < side; i++)
      if (std::abs(Q[size_t(i) * k + j]) > std::abs(Q[size_t(peak) * k + j])) peak = i;
    const double sign = Q[size_t(peak) * k + j] < 0 ? -1.0 : 1.0;
    for (int i = 0; i < side; i++) P[size_t(i) * r + j] = sign * Q[size_t(i) * k + j];
  }
  return P;
}

// ‖PᵀP - I‖ max-abs, P [side, r]
template <typename T>
double orthonormality_error(const std::vector<T>& P, int side, int r) {
  double worst = 0;
  for (int a = 0; a < r; a++)
    for (int b = 0; b < r; b++) {
      double dot = 0;
      for (int i = 0; i < side; i++) dot += double(P[size_t(i) * r + a]) * P[size_t(i) * r + b];
      worst = std::max(worst, std::abs(dot - (a == b ? 1.0 : 0.0)));
    }
  return worst;
}

// P·Pᵀ [side, side]: the projector onto the span, which has no sign ambiguity
template <typename T>
std::vector<double> span_projector(const T* P, int side, int r) {
  std::vector<double> S(size_t(side) * side, 0.0);
  for (int a = 0; a < side; a++)
    for (int b = 0; b < side; b++)
      for (int j = 0; j < r; j++)
        S[size_t(a) * side + b] += double(P[size_t(a) * r + j]) * P[size_t(b) * r + j];
  return S;
}

// ---- the fixture -----------------------------------------------------------------------------
struct Fixture {
  nlohmann::json meta;
  SafetensorsFile tensors{kFixtureDir + "/fixture.safetensors"};
  Fixture() {
    std::ifstream in(kFixtureDir + "/fixture.json");
    meta = nlohmann::json::parse(in);
  }
  template <typename T>
  std::vector<T> read(const std::string& name) const {
    const std::vector<double> v = tensors.read_f64(name);
    return {v.begin(), v.end()};
  }
};

struct CaseInfo {
  std::string name;
  int out, in;
  bool rows;
  int64_t tensor;
  double weight_decay;
  int side() const { return rows ? out : in; }
};

std::vector<CaseInfo> cases(const Fixture& fx, const std::string& method) {
  std::vector<CaseInfo> all;
  for (const auto& c : fx.meta["cases"])
    all.push_back({c["name"].get<std::string>(), c["out"].get<int>(), c["in"].get<int>(),
                   c["rows"].get<bool>(), c["tensor"].get<int64_t>(),
                   c["weight_decay_" + method].get<double>()});
  return all;
}

AdamArgs adam_args(const nlohmann::json& h, double weight_decay, double grad_scale, int64_t step) {
  AdamArgs a;
  a.grad_scale = grad_scale;
  a.lr = h["lr"];
  a.beta1 = h["beta1"];
  a.beta2 = h["beta2"];
  a.eps = h["eps"];
  a.weight_decay = weight_decay;
  a.step = step;
  return a;
}

// What one method's run on one fixture case gives, against the reference: the worst relative
// error of the weight change w_t - w0 over the steps, and of the projections.
struct RunErrors {
  double weights = 0, projections = 0;
};

// GaLore as the engine runs it: at a refresh (step counter % gap == 0, before its increment) the
// transient full gradient gives the basis and R; between refreshes R comes from the activations.
template <typename T>
RunErrors run_galore(const Fixture& fx, const CaseInfo& c) {
  const nlohmann::json& h = fx.meta["galore"];
  const int S = fx.meta["steps"], N = fx.meta["tokens"], r = fx.meta["rank"];
  const int gap = h["update_proj_gap"];
  const std::vector<double> gscale = fx.meta["grad_scale"];
  const size_t nw = size_t(c.out) * c.in, nr = size_t(r) * (c.rows ? c.in : c.out);
  const std::vector<T> dy = fx.read<T>(c.name + ".dy"), x = fx.read<T>(c.name + ".x");
  const std::vector<double> w0 = fx.read<double>(c.name + ".w0");
  const std::vector<double> ref_w = fx.read<double>("galore." + c.name + ".w");
  const std::vector<double> ref_P = fx.read<double>("galore." + c.name + ".P");
  std::vector<T> w(w0.begin(), w0.end()), m(nr, T(0)), v(nr, T(0)), R(nr), P(size_t(c.side()) * r);
  std::vector<T> scratch(size_t(N) * r);
  RunErrors err;
  for (int s = 0; s < S; s++) {
    const T* dys = dy.data() + size_t(s) * N * c.out;
    const T* xs = x.data() + size_t(s) * N * c.in;
    if (s % gap == 0) {
      std::vector<T> G(nw);
      cpu::gemm(true, false, c.out, c.in, N, T(1), dys, c.out, xs, c.in, T(0), G.data(), c.in);
      ops::galore_basis(P.data(), G.data(), c.out, c.in, r, c.rows);
      ops::lowrank_project(R.data(), G.data(), P.data(), c.out, c.in, r, c.rows);
      const std::vector<double> want(ref_P.begin() + (s / gap) * P.size(),
                                     ref_P.begin() + (s / gap + 1) * P.size());
      err.projections = std::max(err.projections, rel_err(P, want));
    } else {
      std::fill(R.begin(), R.end(), T(0));
      ops::lowrank_compressed_grad(R.data(), scratch.data(), dys, xs, P.data(), N, c.in, c.out, r,
                                   c.rows);
    }
    ops::lowrank_adam_update(w.data(), R.data(), m.data(), v.data(), P.data(), c.out, c.in, r,
                             c.rows, h["alpha"], 0.0, adam_args(h, c.weight_decay, gscale[s], s + 1));
    std::vector<double> delta(nw), want(nw);
    for (size_t i = 0; i < nw; i++) {
      delta[i] = double(w[i]) - w0[i];
      want[i] = ref_w[size_t(s) * nw + i] - w0[i];
    }
    err.weights = std::max(err.weights, rel_err(delta, want));
  }
  return err;
}

// FLORA as the engine runs it: projection k = t / kappa (t from 1) regenerated from the seed;
// before step t with t % kappa == 0 the first moment moves onto the new projection.
template <typename T>
RunErrors run_flora(const Fixture& fx, const CaseInfo& c) {
  const nlohmann::json& h = fx.meta["flora"];
  const int S = fx.meta["steps"], N = fx.meta["tokens"], r = fx.meta["rank"];
  const int kappa = h["kappa"];
  const uint64_t seed = h["seed"];
  const std::vector<double> gscale = fx.meta["grad_scale"];
  const size_t nw = size_t(c.out) * c.in, nr = size_t(r) * (c.rows ? c.in : c.out);
  const size_t np = size_t(c.side()) * r;
  const std::vector<T> dy = fx.read<T>(c.name + ".dy"), x = fx.read<T>(c.name + ".x");
  const std::vector<double> w0 = fx.read<double>(c.name + ".w0");
  const std::vector<double> ref_w = fx.read<double>("flora." + c.name + ".w");
  const std::vector<double> ref_P = fx.read<double>("flora." + c.name + ".P");
  std::vector<T> w(w0.begin(), w0.end()), m(nr, T(0)), v(nr, T(0)), R(nr), P(np), P_new(np);
  std::vector<T> scratch(size_t(N) * r), transfer_scratch(size_t(r) * r + nr);
  RunErrors err;
  auto check_projection = [&](const std::vector<T>& p, int k) {
    const std::vector<double> want(ref_P.begin() + k * np, ref_P.begin() + (k + 1) * np);
    err.projections = std::max(err.projections, rel_err(p, want));
  };
  ops::flora_projection(P.data(), seed, c.tensor, 0, c.side(), r);
  check_projection(P, 0);
  for (int s = 0; s < S; s++) {
    const int64_t t = s + 1;
    if (t % kappa == 0) {
      ops::flora_projection(P_new.data(), seed, c.tensor, t / kappa, c.side(), r);
      check_projection(P_new, int(t / kappa));
      ops::flora_transfer(m.data(), transfer_scratch.data(), P.data(), P_new.data(), c.out, c.in, r,
                          c.rows);
      std::swap(P, P_new);
    }
    std::fill(R.begin(), R.end(), T(0));
    ops::lowrank_compressed_grad(R.data(), scratch.data(), dy.data() + size_t(s) * N * c.out,
                                 x.data() + size_t(s) * N * c.in, P.data(), N, c.in, c.out, r,
                                 c.rows);
    ops::lowrank_adam_update(w.data(), R.data(), m.data(), v.data(), P.data(), c.out, c.in, r,
                             c.rows, h["alpha"], 0.0, adam_args(h, c.weight_decay, gscale[s], t));
    std::vector<double> delta(nw), want(nw);
    for (size_t i = 0; i < nw; i++) {
      delta[i] = double(w[i]) - w0[i];
      want[i] = ref_w[size_t(s) * nw + i] - w0[i];
    }
    err.weights = std::max(err.weights, rel_err(delta, want));
  }
  return err;
}

// ---- per-op checks, for float and double -----------------------------------------------------
template <typename T>
void check_projected_gradient(int out, int in, int r, int N, bool rows) {
  const std::vector<T> dy = randn<T>(size_t(N) * out, 1), x = randn<T>(size_t(N) * in, 2);
  const std::vector<T> P = randn<T>(size_t(rows ? out : in) * r, 3);
  const size_t nr = size_t(r) * (rows ? in : out);
  // compressed_grad accumulates onto what R holds
  const std::vector<T> R0 = randn<T>(nr, 4);
  std::vector<T> R = R0, scratch = poisoned<T>(size_t(N) * r);
  ops::lowrank_compressed_grad(R.data(), scratch.data(), dy.data(), x.data(), P.data(), N, in, out,
                               r, rows);
  const std::vector<T> G = full_grad(dy, x, N, in, out);
  std::vector<double> want = project_ref(G, P, out, in, r, rows);
  for (size_t i = 0; i < nr; i++) want[i] += R0[i];
  CHECK(rel_err(R, want) < kTol<T> / 10);
  // project overwrites
  std::vector<T> Rp = poisoned<T>(nr);
  ops::lowrank_project(Rp.data(), G.data(), P.data(), out, in, r, rows);
  CHECK(rel_err(Rp, project_ref(G, P, out, in, r, rows)) < kTol<T> / 10);
}

template <typename T>
void check_galore_basis(int out, int in, int r, bool rows) {
  // G = U·diag(s)·Vᵀ with known orthonormal U [out, k], V [in, k] and distinct s
  const int k = std::min(out, in);
  const std::vector<double> U = orthonormal(out, k, 11), V = orthonormal(in, k, 12);
  std::vector<T> G(size_t(out) * in);
  for (int i = 0; i < out; i++)
    for (int c = 0; c < in; c++) {
      double g = 0;
      for (int j = 0; j < k; j++)
        g += U[size_t(i) * k + j] * (3.0 / (1 + j)) * V[size_t(c) * k + j];
      G[size_t(i) * in + c] = T(g);
    }
  std::vector<T> P = poisoned<T>(size_t(rows ? out : in) * r);
  ops::galore_basis(P.data(), G.data(), out, in, r, rows);
  CHECK(orthonormality_error(P, rows ? out : in, r) < kTol<T>);
  CHECK(rel_err(P, sign_normalised(rows ? U : V, rows ? out : in, k, r)) < kTol<T>);
}

// G[out, in] = U·diag(s)·Vᵀ with orthonormal U [out, k], V [in, k], k = min(out, in).
template <typename T>
std::vector<T> with_spectrum(int out, int in, const std::vector<double>& s, std::vector<double>* U,
                             std::vector<double>* V) {
  const int k = std::min(out, in);
  *U = orthonormal(out, k, 31);
  *V = orthonormal(in, k, 32);
  std::vector<T> G(size_t(out) * in);
  for (int i = 0; i < out; i++)
    for (int c = 0; c < in; c++) {
      double g = 0;
      for (int j = 0; j < k; j++) g += (*U)[size_t(i) * k + j] * s[size_t(j)] * (*V)[size_t(c) * k + j];
      G[size_t(i) * in + c] = T(g);
    }
  return G;
}

template <typename T>
void check_flora_transfer(int out, int in, int r, bool rows) {
  const int side = rows ? out : in;
  const size_t nr = size_t(r) * (rows ? in : out);
  const std::vector<T> m0 = randn<T>(nr, 21),
                       P_old = randn<T>(size_t(side) * r, 22, 1 / std::sqrt(r));
  const std::vector<T> P_new = randn<T>(size_t(side) * r, 23, 1 / std::sqrt(r));
  std::vector<T> m = m0, scratch = poisoned<T>(size_t(r) * r + nr);
  ops::flora_transfer(m.data(), scratch.data(), P_old.data(), P_new.data(), out, in, r, rows);
  // down_new(up_old(m)) through the full out x in matrix
  const std::vector<double> up =
      back_ref(std::vector<double>(m0.begin(), m0.end()), P_old, out, in, r, rows);
  CHECK(rel_err(m, project_ref(up, P_new, out, in, r, rows)) < kTol<T> / 10);
}

// max_rms_of_rms: the bound as a multiple of the step's RMS(N̂) (0: no bound), so a factor below
// 1 must scale the update by exactly that factor and one above must leave it as it is.
template <typename T>
void check_adam_update(int out, int in, int r, bool rows, double max_rms_of_rms = 0) {
  const size_t nw = size_t(out) * in, nr = size_t(r) * (rows ? in : out);
  const std::vector<T> w0 = randn<T>(nw, 31, 0.1), R0 = randn<T>(nr, 32),
                       m0 = randn<T>(nr, 33, 0.3);
  std::vector<T> v0 = randn<T>(nr, 34, 0.5);
  for (T& e : v0) e = e * e;
  const std::vector<T> P = randn<T>(size_t(rows ? out : in) * r, 35, 0.5);
  const AdamArgs a{.grad_scale = 0.7, .lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-6,
                   .weight_decay = 0.1, .step = 3};
  const double alpha = 0.25;

  std::vector<double> m1(nr), v1(nr), N(nr);
  double sum_squares = 0;
  for (size_t i = 0; i < nr; i++) {
    const double g = double(R0[i]) * a.grad_scale;
    m1[i] = a.beta1 * m0[i] + (1 - a.beta1) * g;
    v1[i] = a.beta2 * v0[i] + (1 - a.beta2) * g * g;
    N[i] = m1[i] / (std::sqrt(v1[i]) + a.eps);
    sum_squares += N[i] * N[i];
  }
  const double bias = std::sqrt(1 - std::pow(a.beta2, 3)) / (1 - std::pow(a.beta1, 3));
  const double rms = bias * std::sqrt(sum_squares / double(nr));  // RMS(N̂)
  const double max_rms = max_rms_of_rms * rms;
  const double factor = max_rms_of_rms > 0 && max_rms_of_rms < 1 ? max_rms_of_rms : 1.0;
  const double step_size = a.lr * bias * factor;

  std::vector<T> w = w0, R = R0, m = m0, v = v0;
  ops::lowrank_adam_update(w.data(), R.data(), m.data(), v.data(), P.data(), out, in, r, rows,
                           alpha, max_rms, a);
  const std::vector<double> B = back_ref(N, P, out, in, r, rows);
  std::vector<double> w1(nw);
  for (size_t i = 0; i < nw; i++) {
    w1[i] = w0[i] - step_size * alpha * B[i];  // galore_torch: the update, then the decay
    w1[i] -= a.lr * a.weight_decay * w1[i];
  }
  CHECK(rel_err(m, m1) < kTol<T> / 10);
  CHECK(rel_err(v, v1) < kTol<T> / 10);
  CHECK(rel_err(R, N) < kTol<T> / 10);
  std::vector<double> delta(nw), want(nw);  // the change, not w itself, which would hide it
  for (size_t i = 0; i < nw; i++) {
    delta[i] = double(w[i]) - w0[i];
    want[i] = w1[i] - w0[i];
  }
  CHECK(rel_err(delta, want) < kTol<T>);
}

}  // namespace

TEST_CASE("lowrank_compressed_grad and lowrank_project match their sums", "[lowrank]") {
  for (bool rows : {true, false})
    for (auto [out, in] : {std::pair{7, 11}, std::pair{11, 7}}) {
      INFO("rows " << rows << " out " << out << " in " << in);
      check_projected_gradient<double>(out, in, 3, 5, rows);
      check_projected_gradient<float>(out, in, 3, 5, rows);
    }
}

TEST_CASE("the projected gradient from the activations is the projection of dyT x", "[lowrank]") {
  const int out = 48, in = 86, r = 8, N = 24;
  for (bool rows : {true, false}) {
    INFO("rows " << rows);
    const std::vector<float> dy = randn<float>(size_t(N) * out, 41),
                             x = randn<float>(size_t(N) * in, 42);
    const std::vector<float> P = randn<float>(size_t(rows ? out : in) * r, 43);
    const size_t nr = size_t(r) * (rows ? in : out);
    const std::vector<float> G = full_grad(dy, x, N, in, out);
    std::vector<float> from_G = poisoned<float>(nr), whole(nr, 0.f), halves(nr, 0.f),
                       scratch(size_t(N) * r);
    ops::lowrank_project(from_G.data(), G.data(), P.data(), out, in, r, rows);
    ops::lowrank_compressed_grad(whole.data(), scratch.data(), dy.data(), x.data(), P.data(), N, in,
                                 out, r, rows);
    CHECK(rel_err(whole, from_G) < 1e-5);
    // two micro-batches accumulate to the whole batch
    const int h = N / 2;
    ops::lowrank_compressed_grad(halves.data(), scratch.data(), dy.data(), x.data(), P.data(), h,
                                 in, out, r, rows);
    ops::lowrank_compressed_grad(halves.data(), scratch.data(), dy.data() + size_t(h) * out,
                                 x.data() + size_t(h) * in, P.data(), N - h, in, out, r, rows);
    CHECK(rel_err(halves, whole) < 1e-6);
  }
}

TEST_CASE("galore_basis gives the top-r singular vectors, sign-normalised", "[lowrank]") {
  for (auto [out, in, rows] : {std::tuple{9, 14, true}, std::tuple{14, 9, false},
                               std::tuple{10, 10, false}, std::tuple{10, 10, true}}) {
    INFO("out " << out << " in " << in << " rows " << rows);
    check_galore_basis<double>(out, in, 4, rows);
    check_galore_basis<float>(out, in, 4, rows);
  }
}

TEST_CASE("galore_basis_randomized spans the top-r singular subspace", "[lowrank]") {
  // The range finder's error falls as (σ_{k+1}/σ_r)^(2q+1) (Halko, Martinsson & Tropp, 2011, §10):
  // with a gap of 100 after r it is at rounding level (measured 2e-12 in double, 1e-6 in float);
  // on a smooth decay (0.9^j, no gap) two power iterations and 8 extra columns leave a small angle
  // (measured 0.008 to 0.014), which none gives a larger one.
  const int r = 8;
  for (auto [out, in, rows] : {std::tuple{96, 64, true}, std::tuple{64, 96, false},
                               std::tuple{96, 64, false}}) {
    const int k = std::min(out, in), side = rows ? out : in;
    std::vector<double> gapped(static_cast<size_t>(k)), smooth(static_cast<size_t>(k));
    for (int j = 0; j < k; j++) {
      gapped[size_t(j)] = (j < r ? 3.0 : 0.03) / (1 + j);
      smooth[size_t(j)] = std::pow(0.9, j);
    }
    for (const auto& [spectrum, name] : {std::pair{gapped, "gap of 100 after r"},
                                         std::pair{smooth, "0.9^j"}}) {
      INFO("out " << out << " in " << in << " rows " << rows << ", spectrum " << name);
      const bool gap = spectrum[size_t(r)] < spectrum[size_t(r - 1)] / 50;
      std::vector<double> U, V;
      const std::vector<double> Gd = with_spectrum<double>(out, in, spectrum, &U, &V);
      const std::vector<float> Gf(Gd.begin(), Gd.end());
      std::vector<double> Pd = poisoned<double>(size_t(side) * r);
      std::vector<float> Pf = poisoned<float>(size_t(side) * r);
      ops::galore_basis_randomized(Pd.data(), Gd.data(), out, in, r, rows, 77, 2, 8);
      ops::galore_basis_randomized(Pf.data(), Gf.data(), out, in, r, rows, 77, 2, 8);
      CHECK(orthonormality_error(Pd, side, r) < 1e-12);
      CHECK(orthonormality_error(Pf, side, r) < 1e-5);
      const std::vector<double>& E = rows ? U : V;
      const double sine_d = test::subspace_sine(E, k, Pd, side, r), sine_f = test::subspace_sine(E, k, Pf, side, r);
      INFO("sin(largest principal angle) <= " << sine_d << " (double), " << sine_f << " (float)");
      CHECK(sine_d < (gap ? 1e-10 : 2e-2));
      CHECK(sine_f < (gap ? 1e-5 : 2e-2));
      if (!gap) {  // the power iterations are what brings it there
        std::vector<double> plain(Pd.size());
        ops::galore_basis_randomized(plain.data(), Gd.data(), out, in, r, rows, 77, 0, 8);
        CHECK(test::subspace_sine(E, k, plain, side, r) > 2 * sine_d);
      }
      if (gap)  // and, the subspace being exact, the vectors are the exact basis's, sign included
        CHECK(rel_err(Pd, sign_normalised(E, side, k, r)) < 1e-8);
      // a function of (G, seed): the same bits again, another seed another basis of that subspace
      std::vector<double> again(Pd.size()), other(Pd.size());
      ops::galore_basis_randomized(again.data(), Gd.data(), out, in, r, rows, 77, 2, 8);
      ops::galore_basis_randomized(other.data(), Gd.data(), out, in, r, rows, 78, 2, 8);
      CHECK(again == Pd);
      CHECK(test::subspace_sine(E, k, other, side, r) < (gap ? 1e-10 : 2e-2));
    }
  }
}

TEST_CASE("galore_basis_randomized's warm start keeps the subspace it starts from", "[lowrank]") {
  // Started from a P that spans the top-r subspace exactly, one power iteration keeps it exactly
  // (the Rayleigh-Ritz step sees U_r inside its basis, and U_r's Ritz values are the top ones) on
  // a spectrum with no gap (0.9^j), where a fresh start at one power iteration is far off. The
  // study this serves: tools/galore_warm_start.cpp, docs/lowrank.md ("Warm start").
  const int out = 96, in = 64, r = 8, k = std::min(out, in);
  std::vector<double> spectrum(static_cast<size_t>(k));
  for (int j = 0; j < k; j++) spectrum[size_t(j)] = std::pow(0.9, j);
  std::vector<double> U, V;
  const std::vector<double> Gd = with_spectrum<double>(out, in, spectrum, &U, &V);
  const std::vector<float> Gf(Gd.begin(), Gd.end());
  for (const bool rows : {true, false}) {
    INFO("rows " << rows);
    const int side = rows ? out : in;
    const std::vector<double>& E = rows ? U : V;
    // another basis of the exact subspace, E_r·(I + C/2) with C the cyclic shift (invertible:
    // its eigenvalues 1 + ω/2 are never 0): the warm start must not need the vectors themselves
    std::vector<double> start(size_t(side) * r, 0.0);
    for (int i = 0; i < side; i++)
      for (int j = 0; j < r; j++)
        start[size_t(i) * r + j] = E[size_t(i) * k + j] + 0.5 * E[size_t(i) * k + (j + 1) % r];
    std::vector<double> warm = start, fresh(start.size());
    std::vector<float> warm_f(start.begin(), start.end());
    ops::galore_basis_randomized(warm.data(), Gd.data(), out, in, r, rows, 77, 1, 8, true);
    ops::galore_basis_randomized(warm_f.data(), Gf.data(), out, in, r, rows, 77, 1, 8, true);
    ops::galore_basis_randomized(fresh.data(), Gd.data(), out, in, r, rows, 77, 1, 8);
    const double sine_warm = test::subspace_sine(E, k, warm, side, r),
                 sine_fresh = test::subspace_sine(E, k, fresh, side, r);
    INFO("sin(largest principal angle): warm " << sine_warm << ", fresh " << sine_fresh);
    CHECK(orthonormality_error(warm, side, r) < 1e-12);
    CHECK(orthonormality_error(warm_f, side, r) < 1e-5);
    CHECK(sine_warm < 1e-10);
    CHECK(test::subspace_sine(E, k, warm_f, side, r) < 1e-4);
    CHECK(sine_fresh > 1e-3);
    CHECK(rel_err(warm, sign_normalised(E, side, k, r)) < 1e-8);  // the exact vectors, signs too
    // a function of (G, P_prev, seed)
    std::vector<double> again = start;
    ops::galore_basis_randomized(again.data(), Gd.data(), out, in, r, rows, 77, 1, 8, true);
    CHECK(again == warm);
  }
  std::vector<float> P(size_t(out) * r, 0.5f);
  CHECK_THROWS_WITH(ops::galore_basis_randomized(P.data(), Gf.data(), out, in, r, true, 77, 0, 8, true),
                    Catch::Contains("a warm start needs a power iteration"));
}

TEST_CASE("galore_basis_randomized takes a rank-deficient or zero gradient", "[lowrank]") {
  // A gradient of rank 6 < k = r + 8: the power iterations' Grams YᵀY are singular, which plain
  // CholeskyQR cannot factor; the shift keeps them positive definite and the span exact, so P is
  // the exact top-r basis (r = 4), or contains the whole range (r = 8 > 6).
  const int out = 96, in = 64, rank = 6;
  std::vector<double> spectrum(static_cast<size_t>(std::min(out, in)), 0.0);
  for (int j = 0; j < rank; j++) spectrum[size_t(j)] = 3.0 / (1 + j);
  std::vector<double> U, V;
  const std::vector<double> Gd = with_spectrum<double>(out, in, spectrum, &U, &V);
  const std::vector<float> Gf(Gd.begin(), Gd.end());
  for (const bool rows : {true, false}) {
    const int side = rows ? out : in, k = std::min(out, in);
    const std::vector<double>& E = rows ? U : V;
    for (const int r : {4, 8}) {
      INFO("rows " << rows << " r " << r);
      std::vector<double> Pd = poisoned<double>(size_t(side) * r);
      std::vector<float> Pf = poisoned<float>(size_t(side) * r);
      ops::galore_basis_randomized(Pd.data(), Gd.data(), out, in, r, rows, 5, 2, 8);
      ops::galore_basis_randomized(Pf.data(), Gf.data(), out, in, r, rows, 5, 2, 8);
      CHECK(orthonormality_error(Pd, side, r) < 1e-12);
      CHECK(orthonormality_error(Pf, side, r) < 1e-5);
      if (r <= rank) {
        CHECK(test::subspace_sine(E, k, Pd, side, r) < 1e-10);
        CHECK(test::subspace_sine(E, k, Pf, side, r) < 1e-5);
        CHECK(rel_err(Pd, sign_normalised(E, side, k, r)) < 1e-8);
      } else {  // the range, E's first `rank` columns, inside span(P): ‖(I − P·Pᵀ)·E_rank‖
        std::vector<double> range(size_t(side) * r, 0.0);
        for (int i = 0; i < side; i++)
          for (int j = 0; j < rank; j++) range[size_t(i) * r + j] = E[size_t(i) * k + j];
        CHECK(test::subspace_sine(Pd, r, range, side, r) < 1e-10);
        CHECK(test::subspace_sine(Pf, r, range, side, r) < 1e-5);
      }
    }
    // a zero gradient (no token reached the weight): an orthonormal P all the same
    const std::vector<float> zero(Gf.size(), 0.0f);
    std::vector<float> P0 = poisoned<float>(size_t(side) * 8);
    ops::galore_basis_randomized(P0.data(), zero.data(), out, in, 8, rows, 5, 2, 8);
    CHECK(orthonormality_error(P0, side, 8) < 1e-6);
  }
}

TEST_CASE("galore_basis_randomized stops a non-finite gradient at its first Cholesky factor",
          "[lowrank]") {
  // The GPU keeps potrf's info for the refresh's one read (tests/gpu/test_gpu_lowrank.cpp); the
  // CPU's LAPACK throws at once, before the eigensolver would.
  std::vector<float> G = randn<float>(size_t(40) * 30, 9), P(size_t(40) * 4);
  G[17] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(ops::galore_basis_randomized(P.data(), G.data(), 40, 30, 4, true, 5, 1, 4),
                    Catch::Contains("Cholesky factorisation of a Gram matrix failed"));
  G[17] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH(ops::galore_basis_randomized(P.data(), G.data(), 40, 30, 4, true, 5, 1, 4),
                    Catch::Contains("Cholesky factorisation of a Gram matrix failed"));
}

TEST_CASE("GRASS_GALORE_TIMERS times each phase of the CPU's randomized refresh", "[lowrank]") {
  const std::vector<float> G = randn<float>(size_t(48) * 40, 10);
  std::vector<float> P(size_t(48) * 6);
  ::setenv("GRASS_GALORE_TIMERS", "1", 1);
  ops::take_galore_refresh_times();  // whatever an earlier test left
  ops::galore_basis_randomized(P.data(), G.data(), 48, 40, 6, true, 5, 2, 8);
  ops::galore_basis_randomized(P.data(), G.data(), 48, 40, 6, false, 5, 2, 8);
  const ops::GaloreRefreshTimes times = ops::take_galore_refresh_times();
  CHECK(times.targets == 2);
  for (int p = 0; p < ops::kGalorePhases; p++) {
    INFO(ops::name_of(ops::GalorePhase(p)));
    CHECK(times.ms[p] > 0);
    CHECK(times.ms[p] < 10000);
  }
  CHECK(ops::take_galore_refresh_times().targets == 0);  // taken: reset
  ::unsetenv("GRASS_GALORE_TIMERS");  // off: nothing recorded
  ops::galore_basis_randomized(P.data(), G.data(), 48, 40, 6, true, 5, 2, 8);
  const ops::GaloreRefreshTimes off = ops::take_galore_refresh_times();
  CHECK(off.targets == 0);
  for (const double ms : off.ms) CHECK(ms == 0);
}

TEST_CASE("galore_basis matches the float64 reference on the fixture's gradients", "[lowrank]") {
  Fixture fx;
  const int N = fx.meta["tokens"], r = fx.meta["rank"], gap = fx.meta["galore"]["update_proj_gap"];
  for (const CaseInfo& c : cases(fx, "galore")) {
    const std::vector<double> dy = fx.read<double>(c.name + ".dy"),
                              x = fx.read<double>(c.name + ".x");
    const std::vector<double> ref_P = fx.read<double>("galore." + c.name + ".P");
    const size_t np = size_t(c.side()) * r;
    for (int k = 0; k < int(ref_P.size() / np); k++) {
      INFO(c.name << " refresh " << k);
      const int s = k * gap;
      const std::vector<double> G =
          full_grad(std::vector<double>(dy.begin() + size_t(s) * N * c.out,
                                        dy.begin() + size_t(s + 1) * N * c.out),
                    std::vector<double>(x.begin() + size_t(s) * N * c.in,
                                        x.begin() + size_t(s + 1) * N * c.in),
                    N, c.in, c.out);
      const std::vector<double> want(ref_P.begin() + k * np, ref_P.begin() + (k + 1) * np);
      std::vector<double> P = poisoned<double>(np);
      ops::galore_basis(P.data(), G.data(), c.out, c.in, r, c.rows);
      CHECK(orthonormality_error(P, c.side(), r) < 1e-12);
      CHECK(rel_err(span_projector(P.data(), c.side(), r),
                    span_projector(want.data(), c.side(), r)) < 1e-10);
      CHECK(rel_err(P, want) < 1e-10);
      const std::vector<float> Gf(G.begin(), G.end());  // the inputs are fp32 values
      std::vector<float> Pf = poisoned<float>(np);
      ops::galore_basis(Pf.data(), Gf.data(), c.out, c.in, r, c.rows);
      CHECK(rel_err(Pf, want) < 1e-5);
    }
  }
}

TEST_CASE("flora_projection is regenerated bit for bit from seed, tensor and refresh",
          "[lowrank]") {
  const int side = 2048, r = 8;
  const size_t n = size_t(side) * r;
  std::vector<double> a = poisoned<double>(n), b = poisoned<double>(n), c(n), d(n);
  ops::flora_projection(a.data(), 777, 5, 2, side, r);
  ops::flora_projection(b.data(), 777, 5, 2, side, r);
  CHECK(std::memcmp(a.data(), b.data(), n * sizeof(double)) == 0);
  ops::flora_projection(c.data(), 777, 5, 3, side, r);  // the next refresh
  ops::flora_projection(d.data(), 777, 6, 2, side, r);  // another tensor
  size_t same_c = 0, same_d = 0;
  for (size_t i = 0; i < n; i++) {
    same_c += a[i] == c[i];
    same_d += a[i] == d[i];
  }
  CHECK(same_c == 0);
  CHECK(same_d == 0);
  // fp32 is the float64 stream rounded
  std::vector<float> f = poisoned<float>(n);
  ops::flora_projection(f.data(), 777, 5, 2, side, r);
  for (size_t i = 0; i < n; i++) REQUIRE(f[i] == float(a[i]));
  // entries N(0, 1/r): mean 0 and variance 1/r within 5 standard errors
  double sum = 0, sum_sq = 0;
  for (double e : a) {
    sum += e;
    sum_sq += e * e;
  }
  const double var = 1.0 / r;
  CHECK(std::abs(sum / n) < 5 * std::sqrt(var / n));
  CHECK(std::abs(sum_sq / n - var) < 5 * var * std::sqrt(2.0 / n));
}

TEST_CASE("flora_transfer equals compressing the decompressed moment anew", "[lowrank]") {
  for (bool rows : {true, false})
    for (auto [out, in] : {std::pair{7, 11}, std::pair{11, 7}}) {
      INFO("rows " << rows << " out " << out << " in " << in);
      check_flora_transfer<double>(out, in, 3, rows);
      check_flora_transfer<float>(out, in, 3, rows);
    }
}

TEST_CASE("lowrank_adam_update matches galore_torch's AdamW step", "[lowrank]") {
  for (bool rows : {true, false})
    for (auto [out, in] : {std::pair{7, 11}, std::pair{11, 7}}) {
      INFO("rows " << rows << " out " << out << " in " << in);
      check_adam_update<double>(out, in, 3, rows);
      check_adam_update<float>(out, in, 3, rows);
    }
}

TEST_CASE("lowrank_adam_update's RMS bound scales a larger update to it and leaves a smaller one",
          "[lowrank]") {
  for (bool rows : {true, false})
    for (auto [out, in] : {std::pair{7, 11}, std::pair{11, 7}}) {
      INFO("rows " << rows << " out " << out << " in " << in);
      for (const double bound : {0.5, 2.0}) {  // the bound as a multiple of the step's RMS
        INFO("bound " << bound << " x RMS");
        check_adam_update<double>(out, in, 3, rows, bound);
        check_adam_update<float>(out, in, 3, rows, bound);
      }
    }
  // A bound that does not bind changes no bit.
  const int out = 9, in = 13, r = 4;
  const std::vector<float> w0 = randn<float>(size_t(out) * in, 51, 0.1),
                           R0 = randn<float>(size_t(r) * in, 52), P = randn<float>(size_t(out) * r, 53);
  const AdamArgs a{.lr = 1e-2, .step = 1};
  std::vector<float> w[2];
  for (int k = 0; k < 2; k++) {
    std::vector<float> R = R0, m(R0.size(), 0.f), v(R0.size(), 0.f);
    w[k] = w0;
    ops::lowrank_adam_update(w[k].data(), R.data(), m.data(), v.data(), P.data(), out, in, r, true,
                             0.25, k == 0 ? 0.0 : 1e3, a);
  }
  CHECK(w[0] == w[1]);
}

// Issue 24, item 1: after a resampling, FLORA's carried first moment is about sqrt(side/r) times
// its old size and mostly noise while v keeps its old scale. On a fixed problem (the same
// gradient every step, so the steady update has RMS 1) at Table A's shape (side 128, r 32),
// resampling every 20 steps, the update at a resampling step grows several-fold without the bound
// and stays within 1.5x the step before it with flora-opt's bound of 1.
TEST_CASE("FLORA's update at a resampling stays within 1.5x the steady one under the RMS bound",
          "[lowrank]") {
  const int out = 128, in = 64, r = 32, K = 20, steps = 80;
  const std::vector<float> G = randn<float>(size_t(out) * in, 61);
  const auto ratios = [&](double max_rms) {
    std::vector<float> w = randn<float>(size_t(out) * in, 62, 0.1), P(size_t(out) * r),
                       P_old(P.size()), R(size_t(r) * in), m(R.size(), 0.f), v(R.size(), 0.f),
                       scratch(size_t(r) * r + R.size());
    ops::flora_projection(P.data(), 63, 0, 0, out, r);
    std::vector<double> norms;
    for (int t = 1; t <= steps; t++) {
      if (t > 1 && (t - 1) % K == 0) {  // a resampling: carry m to the new projection
        P_old = P;
        ops::flora_projection(P.data(), 63, 0, (t - 1) / K, out, r);
        ops::flora_transfer(m.data(), scratch.data(), P_old.data(), P.data(), out, in, r, true);
      }
      ops::lowrank_project(R.data(), G.data(), P.data(), out, in, r, true);
      const std::vector<float> before = w;
      const AdamArgs a{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .step = t};
      ops::lowrank_adam_update(w.data(), R.data(), m.data(), v.data(), P.data(), out, in, r, true,
                               1.0, max_rms, a);
      double sum = 0;
      for (size_t i = 0; i < w.size(); i++) sum += std::pow(double(w[i]) - before[i], 2);
      norms.push_back(std::sqrt(sum));
    }
    std::vector<double> at_resampling;  // the update at each resampling over the one before
    for (int t = K + 1; t <= steps; t += K) at_resampling.push_back(norms[t - 1] / norms[t - 2]);
    return at_resampling;
  };
  const std::vector<double> bounded = ratios(1.0), unbounded = ratios(0.0);
  REQUIRE(bounded.size() == 3);
  for (size_t j = 0; j < bounded.size(); j++) {
    INFO("resampling " << j + 1 << ": bounded " << bounded[j] << ", unbounded " << unbounded[j]);
    CHECK(bounded[j] <= 1.5);
    CHECK(unbounded[j] > 2.0);  // what the bound is for: the problem does show the jump
  }
}

TEST_CASE("GaLore steps match the float64 reference", "[lowrank]") {
  Fixture fx;
  for (const CaseInfo& c : cases(fx, "galore")) {
    const RunErrors d = run_galore<double>(fx, c), f = run_galore<float>(fx, c);
    INFO(c.name << ": weight change error double " << d.weights << " float " << f.weights
                << "; basis error double " << d.projections << " float " << f.projections);
    CHECK(d.weights < kTol<double>);
    CHECK(d.projections < kTol<double>);
    CHECK(f.weights < kTol<float>);
    CHECK(f.projections < kTol<float>);
  }
}

TEST_CASE("FLORA steps match the float64 reference", "[lowrank]") {
  Fixture fx;
  for (const CaseInfo& c : cases(fx, "flora")) {
    const RunErrors d = run_flora<double>(fx, c), f = run_flora<float>(fx, c);
    INFO(c.name << ": weight change error double " << d.weights << " float " << f.weights
                << "; projection error double " << d.projections << " float " << f.projections);
    CHECK(d.weights < kTol<double>);
    CHECK(d.projections < 1e-15);
    CHECK(f.weights < kTol<float>);
    CHECK(f.projections < 1e-7);
  }
}
