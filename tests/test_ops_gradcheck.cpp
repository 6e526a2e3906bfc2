// Every op's backward against central finite differences, in double, on random shapes and inputs.
//
// For an op y = f(x1, x2, ...) the test takes the scalar L = Σ y·R with a fixed random R, runs the
// backward with dout = R, and compares each input gradient to (L(x+h) - L(x-h)) / 2h. Outputs are
// poisoned with NaN first, so an element a kernel forgets to write fails the test. Each op's float
// instantiation is also compared with its double one on the same inputs (fp32 tolerance).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "kernels/ops.h"
#include "src/core/rng.h"

using namespace grass;
using Vec = std::vector<double>;

namespace {

uint64_t g_seed = 1000;  // every call to randn draws fresh numbers

Vec randn(size_t n, double scale = 1.0) {
  const uint64_t s = g_seed++;
  Vec v(n);
  for (size_t i = 0; i < n; i++) v[i] = scale * normal(s, i);
  return v;
}

Vec poisoned(size_t n) { return Vec(n, std::numeric_limits<double>::quiet_NaN()); }

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

// ‖a - b‖ / ‖b‖; NaN anywhere makes it NaN, which fails every `<` comparison.
double rel_err(const Vec& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); i++) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::sqrt(den);
}

// Central differences of loss() with respect to every element of x.
Vec numeric_grad(const std::function<double()>& loss, Vec& x, double h = 1e-5) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

std::vector<float> to_f32(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }
Vec to_f64(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

constexpr double kGradTol = 1e-6;  // double-precision finite differences
constexpr double kF32Tol = 1e-5;   // float kernel against the double kernel

}  // namespace

TEST_CASE("linear backward matches finite differences", "[ops][gradcheck]") {
  const int N = 7, in = 5, out = 6;
  Vec x = randn(N * in), w = randn(out * in), R = randn(N * out);
  auto loss = [&] {
    Vec y = poisoned(N * out);
    ops::linear_forward(y.data(), x.data(), w.data(), N, in, out);
    return dot(y, R);
  };
  // dx starts random to check accumulate_dx; dw starts random because it always accumulates.
  Vec dx0 = randn(N * in), dw0 = randn(out * in);
  Vec dx = dx0, dw = dw0;
  ops::linear_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), N, in, out, true);
  for (size_t i = 0; i < dx.size(); i++) dx[i] -= dx0[i];
  for (size_t i = 0; i < dw.size(); i++) dw[i] -= dw0[i];
  CHECK(rel_err(dx, numeric_grad(loss, x)) < kGradTol);
  CHECK(rel_err(dw, numeric_grad(loss, w)) < kGradTol);
  // overwrite mode writes every element of dx
  Vec dx_over = poisoned(N * in);
  ops::linear_backward(dx_over.data(), (double*)nullptr, R.data(), x.data(), w.data(), N, in, out,
                       false);
  CHECK(rel_err(dx_over, dx) < 1e-12);
}

TEST_CASE("embedding backward matches finite differences", "[ops][gradcheck]") {
  const int N = 9, C = 4, V = 5;
  std::vector<int32_t> tokens = {3, 1, 3, 0, 4, 4, 3, 2, 1};  // repeats must add up
  Vec table = randn(V * C), R = randn(N * C);
  auto loss = [&] {
    Vec y = poisoned(N * C);
    ops::embedding_forward(y.data(), tokens.data(), table.data(), N, C);
    return dot(y, R);
  };
  Vec d0 = randn(V * C), d = d0;
  ops::embedding_backward(d.data(), R.data(), tokens.data(), N, C);
  for (size_t i = 0; i < d.size(); i++) d[i] -= d0[i];
  CHECK(rel_err(d, numeric_grad(loss, table)) < kGradTol);
}

TEST_CASE("rmsnorm backward matches finite differences", "[ops][gradcheck]") {
  const int N = 6, C = 11;
  const double eps = 1e-5;
  Vec x = randn(N * C), w = randn(C), R = randn(N * C);
  for (auto& wi : w) wi += 1.0;
  Vec rstd = poisoned(N);
  auto loss = [&] {
    Vec y = poisoned(N * C);
    ops::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    return dot(y, R);
  };
  loss();  // fills rstd for the backward
  Vec dx0 = randn(N * C), dw0 = randn(C), dx = dx0, dw = dw0;
  ops::rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  for (size_t i = 0; i < dx.size(); i++) dx[i] -= dx0[i];
  for (size_t i = 0; i < dw.size(); i++) dw[i] -= dw0[i];
  CHECK(rel_err(dx, numeric_grad(loss, x)) < kGradTol);
  CHECK(rel_err(dw, numeric_grad(loss, w)) < kGradTol);

  SECTION("float matches double") {
    auto xf = to_f32(x), wf = to_f32(w);
    std::vector<float> yf(N * C), rf(N);
    Vec y(N * C);
    ops::rmsnorm_forward(yf.data(), rf.data(), xf.data(), wf.data(), N, C, eps);
    ops::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    CHECK(rel_err(to_f64(yf), y) < kF32Tol);
  }
}

TEST_CASE("rope backward matches finite differences and is a rotation", "[ops][gradcheck]") {
  const int B = 2, T = 5, H = 3, HD = 8;
  const double theta = 10000.0;
  const size_t n = size_t(B) * T * H * HD;
  Vec x = randn(n), R = randn(n);
  auto loss = [&] {
    Vec y = poisoned(n);
    ops::rope_forward(y.data(), x.data(), B, T, H, HD, theta);
    return dot(y, R);
  };
  Vec dx = poisoned(n);
  ops::rope_backward(dx.data(), R.data(), B, T, H, HD, theta);
  CHECK(rel_err(dx, numeric_grad(loss, x)) < kGradTol);

  // Position 0 is the identity; norms are preserved at every position.
  Vec y(n);
  ops::rope_forward(y.data(), x.data(), B, T, H, HD, theta);
  for (int i = 0; i < H * HD; i++) CHECK(y[i] == Approx(x[i]).margin(1e-15));
  CHECK(std::sqrt(dot(y, y)) == Approx(std::sqrt(dot(x, x))).epsilon(1e-12));

  SECTION("HF rotate-half layout: pair (i, i+HD/2) rotates by t/theta^(2i/HD)") {
    Vec one(n, 0.0), out(n);
    const int t = 3, i = 1;
    const size_t base = size_t(t) * H * HD;  // b=0, head 0
    one[base + i] = 1.0;                      // x1 = 1, x2 = 0
    ops::rope_forward(out.data(), one.data(), B, T, H, HD, theta);
    const double angle = t / std::pow(theta, 2.0 * i / HD);
    CHECK(out[base + i] == Approx(std::cos(angle)));
    CHECK(out[base + HD / 2 + i] == Approx(std::sin(angle)));
  }

  SECTION("rows at a pitch: in place inside wider rows, the other columns left alone") {
    const int64_t width = int64_t(H) * HD, ld = width + 7;
    Vec wide = randn(size_t(B) * T * ld);
    for (int64_t r = 0; r < B * T; r++)
      std::copy_n(x.begin() + r * width, width, wide.begin() + r * ld);
    const Vec before = wide;
    ops::rope_forward(wide.data(), wide.data(), B, T, H, HD, theta, ld, ld);
    for (int64_t r = 0; r < B * T; r++)
      for (int64_t c = 0; c < ld; c++)  // the same arithmetic per element: the same bits
        REQUIRE(wide[size_t(r * ld + c)] == (c < width ? y[size_t(r * width + c)]
                                                       : before[size_t(r * ld + c)]));
    Vec back(n);  // and from the wide rows back into contiguous ones
    ops::rope_backward(back.data(), wide.data(), B, T, H, HD, theta, 0, ld);
    CHECK(rel_err(back, x) < 1e-12);
  }
}

namespace {

// Causal rows that sum to 1, then q, k, v gradients against finite differences: q, k, v as three
// buffers, or packed as one [N, NH·HD + 2·NKV·HD] (the model's q_proj, k_proj, v_proj GEMM), and
// their gradients packed (the model's when the three are dense) or as three buffers.
void check_attention(int B, int T, int NH, int NKV, int HD, bool packed = false,
                     bool grads_packed = false) {
  const size_t nq = size_t(B) * T * NH * HD, nkv = size_t(B) * T * NKV * HD;
  Vec q = randn(nq), k = randn(nkv), v = randn(nkv), R = randn(nq);
  Vec qkv = randn(nq + 2 * nkv);  // packed: each row q, k and v
  const QkvRows<const double*> in =
      packed ? packed_qkv(static_cast<const double*>(qkv.data()), NH, NKV, HD, 8)
             : separate_qkv<const double*>(q.data(), k.data(), v.data(), NH, NKV, HD);
  Vec probs = poisoned(size_t(B) * NH * T * T);
  auto loss = [&] {
    Vec y = poisoned(nq);
    ops::attention_forward(y.data(), probs.data(), in, B, T, NH, NKV, HD);
    return dot(y, R);
  };
  loss();
  // causal: nothing of a later key leaks into an earlier query
  for (int bh = 0; bh < B * NH; bh++)
    for (int t = 0; t < T; t++) {
      double row = 0;
      for (int s = 0; s < T; s++) {
        const double p = probs[(size_t(bh) * T + t) * T + s];
        if (s > t) REQUIRE(p == 0.0);
        row += p;
      }
      REQUIRE(row == Approx(1.0));
    }
  Vec dq = poisoned(nq), dk = poisoned(nkv), dv = poisoned(nkv), dqkv = poisoned(qkv.size());
  Vec scratch = poisoned(size_t(B) * NH * T * T);
  const QkvRows<double*> d = grads_packed
                                 ? packed_qkv(dqkv.data(), NH, NKV, HD, 8)
                                 : separate_qkv(dq.data(), dk.data(), dv.data(), NH, NKV, HD);
  ops::attention_backward(d, scratch.data(), R.data(), in, probs.data(), B, T, NH, NKV, HD);
  // q, k and v (or their gradients) of rows laid out as `rows`, as three contiguous buffers
  const auto split = [&](QkvRows<const double*> rows) {
    std::array<Vec, 3> out;
    for (int64_t r = 0; r < int64_t(B) * T; r++) {
      out[0].insert(out[0].end(), rows.q + r * rows.ldq, rows.q + r * rows.ldq + NH * HD);
      out[1].insert(out[1].end(), rows.k + r * rows.ldk, rows.k + r * rows.ldk + NKV * HD);
      out[2].insert(out[2].end(), rows.v + r * rows.ldv, rows.v + r * rows.ldv + NKV * HD);
    }
    return out;
  };
  // every element of packed gradient rows is some head's q, k or v: all written (poisoned first)
  const std::array<Vec, 3> got = split(read_only(d));
  Vec g;  // the finite differences of the packed q, k, v
  if (packed) g = numeric_grad(loss, qkv);
  const std::array<Vec, 3> want =
      packed ? split(packed_qkv(static_cast<const double*>(g.data()), NH, NKV, HD, 8))
             : std::array<Vec, 3>{numeric_grad(loss, q), numeric_grad(loss, k),
                                  numeric_grad(loss, v)};
  CHECK(rel_err(got[0], want[0]) < kGradTol);
  CHECK(rel_err(got[1], want[1]) < kGradTol);
  CHECK(rel_err(got[2], want[2]) < kGradTol);
}

}  // namespace

TEST_CASE("attention backward matches finite differences (GQA, causal)", "[ops][gradcheck]") {
  check_attention(2, 5, 4, 2, 4);
}

TEST_CASE("attention backward matches finite differences on a packed q, k, v", "[ops][gradcheck]") {
  check_attention(2, 5, 4, 2, 4, /*packed=*/true, /*grads_packed=*/true);
  check_attention(2, 5, 4, 2, 4, /*packed=*/true, /*grads_packed=*/false);
}

TEST_CASE("attention backward matches finite differences across query blocks", "[ops][gradcheck]") {
  check_attention(1, 150, 2, 1, 2);  // several 64-row query blocks, a ragged last one
}

TEST_CASE("attention in float matches double", "[ops]") {
  const int B = 2, T = 70, NH = 4, NKV = 2, HD = 8;
  const size_t nq = size_t(B) * T * NH * HD, nkv = size_t(B) * T * NKV * HD;
  Vec q = randn(nq), k = randn(nkv), v = randn(nkv), y(nq), probs(size_t(B) * NH * T * T);
  auto qf = to_f32(q), kf = to_f32(k), vf = to_f32(v);
  std::vector<float> yf(nq), pf(probs.size());
  ops::attention_forward(yf.data(), pf.data(),
                         separate_qkv<const float*>(qf.data(), kf.data(), vf.data(), NH, NKV, HD),
                         B, T, NH, NKV, HD);
  ops::attention_forward(y.data(), probs.data(),
                         separate_qkv<const double*>(q.data(), k.data(), v.data(), NH, NKV, HD),
                         B, T, NH, NKV, HD);
  CHECK(rel_err(to_f64(yf), y) < kF32Tol);
}

TEST_CASE("swiglu backward matches finite differences", "[ops][gradcheck]") {
  // gate and up as the halves of one packed gu[N, 2F]
  const int N = 3, F = 13;
  Vec gu = randn(N * 2 * F, 2.0), R = randn(N * F);
  auto loss = [&] {
    Vec y = poisoned(N * F);
    ops::swiglu_forward(y.data(), gu.data(), N, F);
    return dot(y, R);
  };
  // dgate and dup packed in gu's layout (pitch 2F), the model's path when gate_proj and up_proj
  // have dense gradients
  Vec packed = poisoned(N * 2 * F);
  ops::swiglu_backward(packed.data(), packed.data() + F, R.data(), gu.data(), N, F, 2 * F);
  CHECK(rel_err(packed, numeric_grad(loss, gu)) < kGradTol);
  // and as two [N, F] buffers (pitch F): the same values
  Vec dg = poisoned(N * F), du = poisoned(N * F);
  ops::swiglu_backward(dg.data(), du.data(), R.data(), gu.data(), N, F, F);
  for (int r = 0; r < N; r++)
    for (int c = 0; c < F; c++) {
      CHECK(dg[size_t(r) * F + c] == packed[size_t(r) * 2 * F + c]);
      CHECK(du[size_t(r) * F + c] == packed[size_t(r) * 2 * F + F + c]);
    }
}

TEST_CASE("swiglu stays finite where exp overflows", "[ops]") {
  // float exp overflows past 88.7: sigmoid must saturate to 0 or 1, not produce NaN
  const std::vector<float> gate = {-200.f, -90.f, -20.f, 0.f, 20.f, 90.f, 200.f, 1e30f};
  const int n = int(gate.size());
  std::vector<float> gu = gate;  // one row: gate, then up = 2
  gu.insert(gu.end(), gate.size(), 2.0f);
  const std::vector<float> dout(gate.size(), 1.0f);
  std::vector<float> out(n), dg(n), du(n);
  ops::swiglu_forward(out.data(), gu.data(), 1, n);
  ops::swiglu_backward(dg.data(), du.data(), dout.data(), gu.data(), 1, n, n);
  for (int i = 0; i < n; i++) {
    INFO("gate " << gate[i]);
    CHECK(std::isfinite(out[i]));
    CHECK(std::isfinite(dg[i]));
    CHECK(std::isfinite(du[i]));
  }
  CHECK(out[0] == Approx(0.0).margin(1e-30));
  CHECK(out[6] == Approx(400.0));
}

TEST_CASE("cross-entropy backward matches finite differences, ignored rows", "[ops][gradcheck]") {
  const int N = 6, V = 9;
  Vec logits = randn(N * V, 3.0);
  std::vector<int32_t> targets = {2, -100, 8, 0, -1, 5};
  Vec lse = poisoned(N);
  int64_t valid = -1;
  auto loss = [&] {
    return ops::cross_entropy_forward(lse.data(), &valid, logits.data(), targets.data(), N, V);
  };
  const double sum = loss();
  CHECK(valid == 4);
  // direct formula for one row
  double z = 0;
  for (int i = 0; i < V; i++) z += std::exp(logits[i]);
  CHECK(lse[0] == Approx(std::log(z)).epsilon(1e-12));
  CHECK(sum > 0);
  const double scale = 0.37;
  Vec d = poisoned(N * V);
  ops::cross_entropy_backward(d.data(), logits.data(), lse.data(), targets.data(), N, V, scale);
  Vec num = numeric_grad(loss, logits);
  for (auto& g : num) g *= scale;
  CHECK(rel_err(d, num) < kGradTol);
  for (int i = 0; i < V; i++) CHECK(d[1 * V + i] == 0.0);  // ignored row

  SECTION("a NaN logit gives a NaN loss (the file is built with -ffast-math)") {
    std::vector<float> lf(logits.begin(), logits.end()), lse_f(N);
    lf[3 * V + 4] = std::numeric_limits<float>::quiet_NaN();
    int64_t count = 0;
    CHECK(std::isnan(ops::cross_entropy_forward(lse_f.data(), &count, lf.data(), targets.data(), N, V)));
  }

  SECTION("in place: dlogits may alias logits") {
    loss();  // numeric_grad left lse from a perturbed input
    Vec inplace = logits;
    ops::cross_entropy_backward(inplace.data(), inplace.data(), lse.data(), targets.data(), N, V,
                                scale);
    CHECK(rel_err(inplace, d) < 1e-14);
  }
}
