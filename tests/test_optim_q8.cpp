// AdamW, GRASS, GaLore and FLORA with 8-bit moments (ops::adamw_update_q8,
// ops::grass_adam_update_q8, ops::lowrank_adam_update_q8, ops::flora_transfer_q8;
// kernels/quant8.h) against the fp32 steps on the same, dequantized, moments: the weights they
// write, the absmax they take from the new moments, the codes they requantize to; and the rules:
// a non-finite gradient leaves its weight and zeroes its moments, an all-zero block is coded
// without 0/0, a nonzero v never decodes to 0, and the result does not depend on the thread count.
#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/lowrank_ops.h"
#include "kernels/ops.h"
#include "kernels/quant8.h"

using grass::AdamArgs;
using grass::Quant8Moments;

namespace {

// One tensor's state for the 8-bit step: weights, gradient, codes and absmax of m and v.
struct Q8State {
  std::vector<float> p, g, absmax_m, absmax_v;
  std::vector<uint8_t> m, v;
  int block = 0;

  Q8State(int64_t n, int block_size) : block(block_size) {
    const size_t blocks = size_t((n + block - 1) / block);
    p.resize(static_cast<size_t>(n));
    g.resize(static_cast<size_t>(n));
    m.assign(size_t(n), 0xAB);
    v.assign(size_t(n), 0xAB);
    absmax_m.assign(blocks, 0.0f);
    absmax_v.assign(blocks, 0.0f);
  }
  int64_t n() const { return int64_t(p.size()); }
  Quant8Moments moments() {
    return {.m = m.data(), .v = v.data(), .absmax_m = absmax_m.data(), .absmax_v = absmax_v.data(),
            .block = block};
  }
  // The moments as they decode.
  std::vector<float> decoded(bool first) const {
    std::vector<float> out(p.size());
    grass::ops::dequantize_blockwise(grass::quant8_map(first), first ? m.data() : v.data(),
                                     first ? absmax_m.data() : absmax_v.data(), n(), block,
                                     out.data());
    return out;
  }
};

// Heavy-tailed values (Student's t, 3 degrees of freedom) times `scale`, from a fresh seed.
std::vector<float> heavy(std::mt19937_64& rng, int64_t n, float scale) {
  std::student_t_distribution<float> t(3.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& xi : x) xi = t(rng) * scale;
  return x;
}

// A state after some training: random weights, moments of a few heavy-tailed gradients, quantized.
Q8State trained_state(std::mt19937_64& rng, int64_t n, int block) {
  Q8State s(n, block);
  s.p = heavy(rng, n, 0.02f);
  s.g = heavy(rng, n, 1e-3f);
  const std::vector<float> g0 = heavy(rng, n, 1e-3f);
  std::vector<float> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  for (size_t i = 0; i < m.size(); i++) {
    m[i] = 0.1f * g0[i];
    v[i] = 0.001f * g0[i] * g0[i] + 1e-12f;
  }
  grass::ops::quantize_blockwise(grass::quant8_map(true), m.data(), n, block, s.m.data(),
                                 s.absmax_m.data());
  grass::ops::quantize_blockwise(grass::quant8_map(false), v.data(), n, block, s.v.data(),
                                 s.absmax_v.data());
  return s;
}

// Weights of the 8-bit step further from the fp32 step's than rounding explains. Each is
// p0·decay − u, u = step_size·m/(sqrt(v)/bc2 + eps), m = β1·m̂ + (1 − β1)·g: FMA contraction and
// vectorisation may differ between the two loops, so each may be a few ulps off, m by a few ulps
// of its terms (which can cancel), u by as much relative to its size.
int64_t weights_off(const std::vector<float>& got, const std::vector<float>& want,
                    const std::vector<float>& p0, const std::vector<float>& m_hat,
                    const std::vector<float>& g, const std::vector<float>& v_new, const AdamArgs& a) {
  const grass::AdamScalars s = grass::adam_scalars(a);
  const double step_size = s.lr / s.bias_correction1;
  int64_t off = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double terms = s.beta1 * std::fabs(m_hat[i]) + s.one_minus_beta1 * std::fabs(g[i] * a.grad_scale);
    const double u = step_size * terms / (std::sqrt(v_new[i]) / s.bias_correction2_sqrt + s.eps);
    const double tol = 8 * std::numeric_limits<float>::epsilon() * (std::fabs(p0[i]) + u);
    if (std::fabs(double(got[i]) - want[i]) <= tol) continue;
    UNSCOPED_INFO("element " << i << ": " << got[i] << ", the fp32 step's " << want[i]);
    off++;
  }
  return off;
}

AdamArgs step_args(int64_t step) {
  AdamArgs a;
  a.lr = 1e-3;
  a.grad_scale = 0.8;  // a clipping coefficient
  a.weight_decay = 0.1;
  a.step = step;
  return a;
}

}  // namespace

TEST_CASE("adamw q8: one step is the fp32 step on the decoded moments, requantized", "[quant8][adamw]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (const int block : {64, 256, 2048}) {
    INFO("block " << block);
    const int64_t n = 23 * block + 37;  // a short last block
    Q8State s = trained_state(rng, n, block);
    // the reference: the fp32 step on the decoded moments
    const std::vector<float> p0 = s.p, m_hat = s.decoded(true);
    std::vector<float> p = s.p, m = m_hat, v = s.decoded(false);
    const AdamArgs a = step_args(5);
    // (the 8-bit steps take the GPU kernels' scalars, narrowed to fp32 first: so does the reference)
    grass::ops::adamw_update(p.data(), s.g.data(), m.data(), v.data(), n, grass::narrowed_to_f32(a));
    grass::ops::adamw_update_q8(s.p.data(), s.g.data(), s.moments(), n, a);

    CHECK(weights_off(s.p, p, p0, m_hat, s.g, v, a) == 0);
    // each block's absmax is the largest new |m| and v
    for (int64_t b = 0; b * block < n; b++) {
      float am = 0, av = 0;
      for (int64_t i = b * block; i < std::min(n, (b + 1) * block); i++) {
        am = std::max(am, std::fabs(m[size_t(i)]));
        av = std::max(av, v[size_t(i)]);
      }
      CHECK(s.absmax_m[size_t(b)] == Approx(am).epsilon(1e-6));
      CHECK(s.absmax_v[size_t(b)] == Approx(av).epsilon(1e-6));
      CHECK(s.absmax_m[size_t(b)] > 0);
    }
    // the codes are the quantizer's codes of the new moments (a moment an ulp off may sit on
    // the other side of a bound: then one code off, and rarely)
    for (const bool first : {true, false}) {
      std::vector<uint8_t> want(static_cast<size_t>(n));
      std::vector<float> want_absmax(s.absmax_m.size());
      grass::ops::quantize_blockwise(grass::quant8_map(first), (first ? m : v).data(), n, block,
                                     want.data(), want_absmax.data());
      const std::vector<uint8_t>& got = first ? s.m : s.v;
      int64_t differ = 0, far = 0;
      for (size_t i = 0; i < want.size(); i++) {
        differ += got[i] != want[i];
        far += std::abs(int(got[i]) - int(want[i])) > 1;
      }
      INFO((first ? "m" : "v") << ": " << differ << " of " << n << " codes differ");
      CHECK(far == 0);
      CHECK(differ <= n / 1000);
    }
  }
}

TEST_CASE("adamw q8: non-finite gradients, all-zero blocks, the zero point of v", "[quant8][adamw]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const int block = 256;
  const int64_t n = 8 * block + 100;
  Q8State s = trained_state(rng, n, block);
  // block 2: a refresh's reset (zero moments) and no gradient; block 3: tiny gradients beside a
  // large one, so most of its v sit far below the absmax
  for (int64_t i = 2 * block; i < 3 * block; i++) s.g[size_t(i)] = 0.0f;
  std::fill(s.m.begin() + 2 * block, s.m.begin() + 3 * block, grass::quant8_map(true).zero);
  std::fill(s.v.begin() + 2 * block, s.v.begin() + 3 * block, grass::quant8_map(false).zero);
  s.absmax_m[2] = s.absmax_v[2] = 0.0f;
  for (int64_t i = 3 * block; i < 4 * block; i++) s.g[size_t(i)] *= 1e-5f;
  s.g[size_t(3 * block)] = 1.0f;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<int64_t> bad = {5, 6, 7, 4 * block + 1};
  s.g[5] = std::numeric_limits<float>::quiet_NaN();
  s.g[6] = inf;
  s.g[7] = -inf;
  s.g[size_t(4 * block + 1)] = 1e22f;  // finite, but (1 - β2)·g² is not
  const std::vector<float> p0 = s.p;
  const AdamArgs a = step_args(3);
  grass::ops::adamw_update_q8(s.p.data(), s.g.data(), s.moments(), n, a);
  const std::vector<float> m = s.decoded(true), v = s.decoded(false);

  for (const int64_t i : bad) {
    INFO("element " << i << ", gradient " << s.g[size_t(i)]);
    CHECK(s.p[size_t(i)] == p0[size_t(i)]);
    CHECK(m[size_t(i)] == 0.0f);
    CHECK(v[size_t(i)] == 0.0f);
  }
  for (size_t b = 0; b < s.absmax_m.size(); b++) {
    CHECK(std::isfinite(s.absmax_m[b]));
    CHECK(std::isfinite(s.absmax_v[b]));
  }
  // the reset block: weight decay only, zero moments coded as the maps' 0
  CHECK(s.absmax_m[2] == 0.0f);
  CHECK(s.absmax_v[2] == 0.0f);
  for (int64_t i = 2 * block; i < 3 * block; i++) {
    CHECK(s.p[size_t(i)] == Approx(p0[size_t(i)] * (1 - 1e-4)).epsilon(1e-6));
    CHECK(int(s.m[size_t(i)]) == grass::quant8_map(true).zero);
    CHECK(int(s.v[size_t(i)]) == grass::quant8_map(false).zero);
  }
  // every finite nonzero gradient leaves a positive v, and an m of its sign (β1·m̂ may outweigh
  // it, so only where the old m was 0)
  int64_t tiny = 0;
  for (int64_t i = 0; i < n; i++) {
    if (std::find(bad.begin(), bad.end(), i) != bad.end() || s.g[size_t(i)] == 0.0f) continue;
    INFO("element " << i);
    CHECK(v[size_t(i)] > 0.0f);
    tiny += v[size_t(i)] < 1e-6f * s.absmax_v[size_t(i / block)];
  }
  CHECK(tiny > 0);  // block 3 reached the map's smallest codes
}

TEST_CASE("adamw q8: the same bits on any thread count, and with the proximal anchor",
          "[quant8][adamw]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const Q8State start = trained_state(rng, 40 * 256 + 3, 256);
  const int threads = omp_get_max_threads();
  std::vector<Q8State> runs;
  for (const int t : {1, std::max(2, threads)}) {
    omp_set_num_threads(t);
    Q8State s = start;
    for (int64_t step = 1; step <= 3; step++)
      grass::ops::adamw_update_q8(s.p.data(), s.g.data(), s.moments(), s.n(), step_args(step));
    runs.push_back(s);
  }
  omp_set_num_threads(threads);
  CHECK(runs[0].p == runs[1].p);
  CHECK(runs[0].m == runs[1].m);
  CHECK(runs[0].v == runs[1].v);
  CHECK(runs[0].absmax_m == runs[1].absmax_m);
  CHECK(runs[0].absmax_v == runs[1].absmax_v);

  // the proximal term: the fp32 step's, on the decoded moments
  Q8State s = start;
  std::vector<float> anchor(s.p.size()), ref_anchor(s.p.size());
  for (size_t i = 0; i < anchor.size(); i++) anchor[i] = ref_anchor[i] = s.p[i] + 1e-3f;
  const std::vector<float> m_hat = s.decoded(true);
  std::vector<float> p = s.p, m = m_hat, v = s.decoded(false), g = s.g;
  AdamArgs a = step_args(2), ref = a;
  a.anchor = anchor.data();
  ref.anchor = ref_anchor.data();
  a.proximal_coef = ref.proximal_coef = 0.5;
  grass::ops::adamw_update(p.data(), s.g.data(), m.data(), v.data(), s.n(), grass::narrowed_to_f32(ref));
  grass::ops::adamw_update_q8(s.p.data(), s.g.data(), s.moments(), s.n(), a);
  // The bound's gradient term is the summands' sizes, |g| + |the proximal term|, not their sum:
  // the two may cancel, and the q8 step adds them by an fma where the reference rounds twice.
  for (size_t i = 0; i < g.size(); i++)
    g[i] = std::fabs(g[i]) + std::fabs(float(0.5 / a.grad_scale) * (start.p[i] - ref_anchor[i]));
  CHECK(weights_off(s.p, p, start.p, m_hat, g, v, a) == 0);
  CHECK(anchor == ref_anchor);
}

namespace {

// Codes and absmax of x under a layout, block by block, as the 8-bit steps requantize.
void quantize_layout(const grass::Quant8Layout& L, const std::vector<float>& x, bool first,
                     std::vector<uint8_t>& codes, std::vector<float>& absmax) {
  const grass::Quant8Map& map = grass::quant8_map(first);
  for (int64_t b = 0; b < L.blocks(); b++) {
    float a = 0;
    for (int k = 0; k < L.block && L.index(b, k) >= 0; k++) a = std::fmax(a, std::fabs(x[size_t(L.index(b, k))]));
    absmax[size_t(b)] = a;
    for (int k = 0; k < L.block && L.index(b, k) >= 0; k++)
      codes[size_t(L.index(b, k))] = grass::quant8_encode(map, x[size_t(L.index(b, k))], a);
  }
}

std::vector<float> dequantize_layout(const grass::Quant8Layout& L, const std::vector<uint8_t>& codes,
                                     const std::vector<float>& absmax, bool first) {
  std::vector<float> x(codes.size());
  for (int64_t b = 0; b < L.blocks(); b++)
    for (int k = 0; k < L.block && L.index(b, k) >= 0; k++)
      x[size_t(L.index(b, k))] = grass::quant8_decode(grass::quant8_map(first), codes[size_t(L.index(b, k))], absmax[size_t(b)]);
  return x;
}

}  // namespace

TEST_CASE("grass q8: one step is the fp32 step on the decoded moments, flat and per feature",
          "[quant8][grass]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const int out = 96, in = 80, r = 24;
  for (const bool rows : {true, false})
    for (const bool by_columns : {false, true})
      for (const int block : {64, 256}) {
        INFO((rows ? "rows" : "cols") << (by_columns ? ", per feature" : ", flat") << ", blocks of " << block);
        const grass::Quant8Layout L = grass::projected_quant8_layout(out, in, r, rows, block, by_columns);
        const int64_t n = L.rows * L.cols, blocks = L.blocks();
        // σ: r distinct slices of the selected side, ascending; step factors of 1 or 2
        std::vector<int32_t> sigma(static_cast<size_t>(rows ? out : in));
        for (size_t i = 0; i < sigma.size(); i++) sigma[i] = int32_t(i);
        std::shuffle(sigma.begin(), sigma.end(), rng);
        sigma.resize(static_cast<size_t>(r));
        std::sort(sigma.begin(), sigma.end());
        std::vector<float> scale(static_cast<size_t>(r));
        for (int j = 0; j < r; j++) scale[size_t(j)] = float(1 + j % 2);
        const std::vector<float> w0 = heavy(rng, int64_t(out) * in, 0.02f), gc = heavy(rng, n, 1e-3f);
        std::vector<float> m0 = heavy(rng, n, 1e-4f), v0 = heavy(rng, n, 1e-4f);
        for (float& x : v0) x = x * x + 1e-12f;
        for (int64_t i = 0; i < n; i++) m0[size_t(i)] *= 1 + 100.0f * (i % 17 == 3);  // outliers
        std::vector<uint8_t> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
        std::vector<float> am(static_cast<size_t>(blocks)), av(static_cast<size_t>(blocks));
        quantize_layout(L, m0, true, m, am);
        quantize_layout(L, v0, false, v, av);

        const std::vector<float> m_hat = dequantize_layout(L, m, am, true);
        std::vector<float> w_ref = w0, m_ref = m_hat, v_ref = dequantize_layout(L, v, av, false), g_ref = gc;
        const AdamArgs a = step_args(3);
        grass::ops::grass_adam_update(w_ref.data(), g_ref.data(), m_ref.data(), v_ref.data(), sigma.data(),
                                      scale.data(), out, in, r, rows, 0.25, grass::narrowed_to_f32(a));
        std::vector<float> w = w0;
        grass::ops::grass_adam_update_q8(w.data(), gc.data(),
                                         {.m = m.data(), .v = v.data(), .absmax_m = am.data(),
                                          .absmax_v = av.data(), .block = block},
                                         by_columns, sigma.data(), scale.data(), out, in, r, rows, 0.25, a);
        // weights: the selected slices as the fp32 step's (the update's size: up to 2x the
        // largest lr·alpha·Δ), the rest untouched
        int64_t off = 0, touched = 0;
        for (int64_t i = 0; i < int64_t(w.size()); i++) {
          const bool selected = std::binary_search(sigma.begin(), sigma.end(), int32_t(rows ? i / in : i % in));
          if (!selected) {
            off += w[size_t(i)] != w0[size_t(i)];
            continue;
          }
          touched += w[size_t(i)] != w0[size_t(i)];
          const float u = std::fabs(w_ref[size_t(i)] - w0[size_t(i)]);
          off += std::fabs(w[size_t(i)] - w_ref[size_t(i)]) >
                 1e-5f * (std::fabs(w0[size_t(i)]) + u) + 1e-9f;
        }
        CHECK(off == 0);
        CHECK(touched > n / 2);
        // absmax and codes: the layout's blocks of the fp32 step's new moments
        std::vector<uint8_t> want_m(static_cast<size_t>(n)), want_v(static_cast<size_t>(n));
        std::vector<float> want_am(static_cast<size_t>(blocks)), want_av(static_cast<size_t>(blocks));
        quantize_layout(L, m_ref, true, want_m, want_am);
        quantize_layout(L, v_ref, false, want_v, want_av);
        for (int64_t b = 0; b < blocks; b++) {
          CHECK(am[size_t(b)] == Approx(want_am[size_t(b)]).epsilon(1e-5));
          CHECK(av[size_t(b)] == Approx(want_av[size_t(b)]).epsilon(1e-5));
        }
        int64_t differ = 0, far = 0;
        for (int64_t i = 0; i < n; i++) {
          differ += (m[size_t(i)] != want_m[size_t(i)]) + (v[size_t(i)] != want_v[size_t(i)]);
          far += std::abs(m[size_t(i)] - want_m[size_t(i)]) > 1 || std::abs(v[size_t(i)] - want_v[size_t(i)]) > 1;
        }
        CHECK(far == 0);
        CHECK(differ <= 2 * n / 500);
      }
}

TEST_CASE("grass q8: per-feature blocks keep an outlier feature from flattening the others",
          "[quant8][grass]") {
  // rows mode [r, in]: feature 5's entries are 1000x the rest. Flat blocks of 256 share its
  // absmax with 255 other features' entries; per-feature blocks do not.
  const int r = 64, in = 512;
  std::mt19937_64 rng(7);
  std::vector<float> m = heavy(rng, int64_t(r) * in, 1e-3f);
  for (int j = 0; j < r; j++) m[size_t(j * in + 5)] *= 1000.0f;
  double error[2] = {0, 0};
  for (const bool by_columns : {false, true}) {
    const grass::Quant8Layout L = grass::projected_quant8_layout(0, in, r, true, 256, by_columns);
    std::vector<uint8_t> codes(m.size());
    std::vector<float> absmax(static_cast<size_t>(L.blocks()));
    quantize_layout(L, m, true, codes, absmax);
    const std::vector<float> back = dequantize_layout(L, codes, absmax, true);
    for (size_t i = 0; i < m.size(); i++)
      if (i % in != 5) error[by_columns] += std::fabs(back[i] - m[i]) / std::fabs(m[i]);
  }
  INFO("mean relative error of the other features: flat " << error[0] / (r * (in - 1))
       << ", per feature " << error[1] / (r * (in - 1)));
  CHECK(error[1] < error[0] / 2);  // 0.019 against 0.050 here
}

TEST_CASE("galore and flora q8: the fp32 step on the decoded moments, and FLORA's transfer",
          "[quant8][lowrank]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const int out = 72, in = 56, r = 12;
  for (const bool rows : {true, false})
    for (const bool by_columns : {false, true})
      for (const double max_rms : {0.0, 1e-3}) {  // GaLore; FLORA's bound, binding here
        INFO((rows ? "rows" : "cols") << (by_columns ? ", per feature" : ", flat") << ", max_rms " << max_rms);
        const int block = 64, side = rows ? out : in;
        const grass::Quant8Layout L = grass::projected_quant8_layout(out, in, r, rows, block, by_columns);
        const int64_t n = L.rows * L.cols, blocks = L.blocks();
        const std::vector<float> w0 = heavy(rng, int64_t(out) * in, 0.02f), R0 = heavy(rng, n, 1e-3f);
        std::vector<float> P = heavy(rng, int64_t(side) * r, 0.3f);
        std::vector<float> m0 = heavy(rng, n, 1e-4f), v0 = heavy(rng, n, 1e-4f);
        for (float& x : v0) x = x * x + 1e-12f;
        std::vector<uint8_t> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
        std::vector<float> am(static_cast<size_t>(blocks)), av(static_cast<size_t>(blocks));
        quantize_layout(L, m0, true, m, am);
        quantize_layout(L, v0, false, v, av);
        const std::vector<uint8_t> m_start = m;
        const std::vector<float> am_start = am;
        const std::vector<float> m_hat = dequantize_layout(L, m, am, true);
        std::vector<float> w_ref = w0, R_ref = R0, m_ref = m_hat,
                           v_ref = dequantize_layout(L, v, av, false);
        const AdamArgs a = step_args(4);
        grass::ops::lowrank_adam_update(w_ref.data(), R_ref.data(), m_ref.data(), v_ref.data(), P.data(),
                                        out, in, r, rows, 0.25, max_rms, a);
        std::vector<float> w = w0, R = R0;
        const Quant8Moments q{.m = m.data(), .v = v.data(), .absmax_m = am.data(), .absmax_v = av.data(),
                              .block = block};
        grass::ops::lowrank_adam_update_q8(w.data(), R.data(), q, by_columns, P.data(), out, in, r, rows,
                                           0.25, max_rms, a);
        // the update: the fp32 step's, but for the direction's own rounding carried through the
        // back-projection (a linear map of it; FLORA's bound scales both alike)
        double err = 0, norm = 0, r_err = 0, r_norm = 0;
        for (size_t i = 0; i < w.size(); i++) {
          err += std::pow(double(w[i]) - w_ref[i], 2);
          norm += std::pow(double(w_ref[i]) - w0[i] * (1 - 1e-4), 2);
        }
        for (size_t i = 0; i < R.size(); i++) {
          r_err += std::pow(double(R[i]) - R_ref[i], 2);
          r_norm += double(R_ref[i]) * R_ref[i];
        }
        INFO("update error " << std::sqrt(err / norm) << ", direction error " << std::sqrt(r_err / r_norm));
        CHECK(std::sqrt(err / norm) <= 4 * std::sqrt(r_err / r_norm) + 1e-6);
        // each direction element to a few ulps of its terms (β1·m̂ and (1 − β1)·g may cancel)
        const grass::AdamScalars sc = grass::adam_scalars(a);
        int64_t r_off = 0;
        for (size_t i = 0; i < R.size(); i++) {
          const double terms = sc.beta1 * std::fabs(m_hat[i]) + sc.one_minus_beta1 * std::fabs(R0[i] * a.grad_scale);
          const double tol = 8 * std::numeric_limits<float>::epsilon() *
                             (std::fabs(R_ref[i]) + terms / (std::sqrt(v_ref[i]) + sc.eps));
          r_off += std::fabs(double(R[i]) - R_ref[i]) > tol;
        }
        CHECK(r_off == 0);
        std::vector<uint8_t> want_m(static_cast<size_t>(n)), want_v(static_cast<size_t>(n));
        std::vector<float> want_am(static_cast<size_t>(blocks)), want_av(static_cast<size_t>(blocks));
        quantize_layout(L, m_ref, true, want_m, want_am);
        quantize_layout(L, v_ref, false, want_v, want_av);
        int64_t differ = 0, far = 0;
        for (int64_t i = 0; i < n; i++) {
          differ += (m[size_t(i)] != want_m[size_t(i)]) + (v[size_t(i)] != want_v[size_t(i)]);
          far += std::abs(m[size_t(i)] - want_m[size_t(i)]) > 1 || std::abs(v[size_t(i)] - want_v[size_t(i)]) > 1;
        }
        CHECK(far == 0);
        CHECK(differ <= 2 * n / 200);
        for (int64_t b = 0; b < blocks; b++) CHECK(am[size_t(b)] == Approx(want_am[size_t(b)]).epsilon(1e-5));

        // FLORA's transfer from the starting codes: the fp32 transfer of the decoded m, requantized
        if (max_rms == 0) continue;
        std::vector<float> P_new = heavy(rng, int64_t(side) * r, 0.3f);
        std::vector<float> scratch(size_t(r) * r + 2 * size_t(n), std::numeric_limits<float>::quiet_NaN());
        std::vector<float> moved = dequantize_layout(L, m_start, am_start, true);
        std::vector<float> ref_scratch(size_t(r) * r + size_t(n));
        grass::ops::flora_transfer(moved.data(), ref_scratch.data(), P.data(), P_new.data(), out, in, r, rows);
        std::vector<uint8_t> tm = m_start;
        std::vector<float> tam = am_start;
        grass::ops::flora_transfer_q8({.m = tm.data(), .v = v.data(), .absmax_m = tam.data(),
                                       .absmax_v = av.data(), .block = block},
                                      by_columns, scratch.data(), P.data(), P_new.data(), out, in, r, rows);
        std::vector<uint8_t> want(static_cast<size_t>(n));
        std::vector<float> want_absmax(static_cast<size_t>(blocks));
        quantize_layout(L, moved, true, want, want_absmax);
        CHECK(tm == want);
        CHECK(tam == want_absmax);
        CHECK(tm != m_start);
      }
}
