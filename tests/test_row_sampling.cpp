// Sampled token rows (src/model/row_sampling.h): every estimator unbiased for dYᵀX, its mean
// squared error equal to the variance formula, wta-crs no worse than crs where it keeps winners,
// and the draws a pure function of the stream.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/row_draw.h"
#include "src/core/rng.h"
#include "src/model/row_sampling.h"

using namespace grass;

namespace {

struct Rows {  // dy [N, out] and x [N, in], row-major, with uneven row norms
  int N, in, out;
  std::vector<double> dy, x;
};

// Row i is scaled by exp(2·normal): a few rows carry most of the norm, as real activations' do,
// so wta-crs finds winners worth keeping.
Rows fresh_rows(int N, int in, int out, uint64_t seed) {
  Rows r{N, in, out, std::vector<double>(size_t(N) * out), std::vector<double>(size_t(N) * in)};
  for (int i = 0; i < N; i++) {
    const double sx = std::exp(2 * normal(seed, uint64_t(i))), sy = std::exp(normal(seed + 1, uint64_t(i)));
    for (int c = 0; c < in; c++) r.x[size_t(i) * in + c] = sx * normal(seed + 2, uint64_t(i) * in + c);
    for (int c = 0; c < out; c++) r.dy[size_t(i) * out + c] = sy * normal(seed + 3, uint64_t(i) * out + c);
  }
  return r;
}

// Σ_j scale_j · dy_{rows_j} x_{rows_j}ᵀ  [out, in]; with every row once at scale 1, S itself
std::vector<double> estimate(const Rows& r, const std::vector<int32_t>& rows, const std::vector<float>& scale) {
  std::vector<double> s(size_t(r.out) * r.in, 0.0);
  for (size_t j = 0; j < rows.size(); j++)
    for (int o = 0; o < r.out; o++)
      for (int c = 0; c < r.in; c++)
        s[size_t(o) * r.in + c] += double(scale[j]) * r.dy[size_t(rows[j]) * r.out + o] * r.x[size_t(rows[j]) * r.in + c];
  return s;
}

double row_norm(const std::vector<double>& m, int row, int cols) {
  double ss = 0;
  for (int c = 0; c < cols; c++) ss += m[size_t(row) * cols + c] * m[size_t(row) * cols + c];
  return std::sqrt(ss);
}

const char* name_of(RowSampler s) {
  return s == RowSampler::Crs ? "crs" : s == RowSampler::WtaCrs ? "wta-crs" : "bernoulli";
}

struct Moments {  // over the draws: the mean estimate, its per-element spread, the mean error²
  std::vector<double> mean, sd;
  double mse = 0;
  double along_mean = 0, along_sd = 0;  // the error's component along S, ⟨Ŝ − S, S⟩ / ‖S‖
};

Moments draw_many(const Rows& r, RowSampler sampler, const std::vector<double>& weight, int k, int draws) {
  std::vector<int32_t> all(size_t(r.N));
  std::iota(all.begin(), all.end(), 0);
  const std::vector<double> S = estimate(r, all, std::vector<float>(size_t(r.N), 1.0f));
  std::vector<double> sum(S.size(), 0.0), sum_sq(S.size(), 0.0);
  const double S_norm = std::sqrt(std::inner_product(S.begin(), S.end(), S.begin(), 0.0));
  double along = 0, along_sq = 0;
  Moments m;
  for (int d = 0; d < draws; d++) {
    const RowSample sample = sample_rows(sampler, weight, k, derive_seed(7, uint64_t(d)));
    const std::vector<double> e = estimate(r, sample.rows, sample.scale);
    double a = 0;
    for (size_t i = 0; i < e.size(); i++) {
      sum[i] += e[i];
      sum_sq[i] += e[i] * e[i];
      m.mse += (e[i] - S[i]) * (e[i] - S[i]) / draws;
      a += (e[i] - S[i]) * S[i] / S_norm;
    }
    along += a;
    along_sq += a * a;
  }
  m.along_mean = along / draws;
  m.along_sd = std::sqrt(std::max(0.0, along_sq / draws - m.along_mean * m.along_mean));
  for (size_t i = 0; i < S.size(); i++) {
    m.mean.push_back(sum[i] / draws);
    m.sd.push_back(std::sqrt(std::max(0.0, sum_sq[i] / draws - m.mean[i] * m.mean[i])));
  }
  return m;
}

}  // namespace

TEST_CASE("row sampling: unbiased, with the variance of its formula", "[row_sampling]") {
  const Rows r = fresh_rows(256, 8, 6, 11);
  std::vector<int32_t> all(size_t(r.N));
  std::iota(all.begin(), all.end(), 0);
  const std::vector<double> S = estimate(r, all, std::vector<float>(size_t(r.N), 1.0f));
  std::vector<double> x_norm(size_t(r.N)), xy_norm(size_t(r.N)), z_sq(size_t(r.N));
  for (int i = 0; i < r.N; i++) {
    x_norm[size_t(i)] = row_norm(r.x, i, r.in);
    xy_norm[size_t(i)] = x_norm[size_t(i)] * row_norm(r.dy, i, r.out);
    z_sq[size_t(i)] = xy_norm[size_t(i)] * xy_norm[size_t(i)];
  }
  const int k = 32, draws = 10000;
  for (const RowSampler sampler : {RowSampler::Crs, RowSampler::WtaCrs, RowSampler::Bernoulli})
    for (const bool by_dy : {false, true}) {  // p ∝ ‖x_i‖, and the optimum ‖x_i‖·‖dy_i‖
      INFO(name_of(sampler) << (by_dy ? ", p ∝ ‖x‖‖dy‖" : ", p ∝ ‖x‖"));
      const std::vector<double>& weight = by_dy ? xy_norm : x_norm;
      const Moments m = draw_many(r, sampler, weight, k, draws);
      for (size_t i = 0; i < S.size(); i++) {  // the mean within 5 standard errors of S
        INFO("element " << i << ": mean " << m.mean[i] << ", S " << S[i] << ", sd " << m.sd[i]);
        CHECK(std::fabs(m.mean[i] - S[i]) <= 5 * m.sd[i] / std::sqrt(double(draws)));
      }
      // and along S, where a bias that scales the estimate shows most
      CHECK(std::fabs(m.along_mean) <= 5 * m.along_sd / std::sqrt(double(draws)));
      // the mean squared error against the formula, within 5%
      const RowSample first = sample_rows(sampler, weight, k, derive_seed(7, 0));
      std::vector<int32_t> rest;
      for (int i = 0; i < r.N; i++)
        if (std::find(first.rows.begin(), first.rows.begin() + first.winners, i) ==
            first.rows.begin() + first.winners)
          rest.push_back(i);
      const std::vector<double> S_rest = estimate(r, rest, std::vector<float>(rest.size(), 1.0f));
      const double rest_sq = std::inner_product(S_rest.begin(), S_rest.end(), S_rest.begin(), 0.0);
      const double formula = sampling_variance(sampler, weight, k, z_sq, rest_sq, first);
      INFO("mse " << m.mse << ", formula " << formula << ", winners " << first.winners);
      CHECK(m.mse == Approx(formula).epsilon(0.05));
      if (sampler == RowSampler::WtaCrs) {
        // these rows' norms are uneven enough that winners are kept, and then beat plain CRS
        REQUIRE(first.winners > 0);
        const RowSample crs = sample_rows(RowSampler::Crs, weight, k, 0);
        const double S_sq = std::inner_product(S.begin(), S.end(), S.begin(), 0.0);
        CHECK(formula < sampling_variance(RowSampler::Crs, weight, k, z_sq, S_sq, crs));
      }
    }
}

TEST_CASE("row sampling: a pure function of the stream, never drawing a row of weight 0",
          "[row_sampling]") {
  std::vector<double> weight(100);
  for (size_t i = 0; i < weight.size(); i++) weight[i] = i % 3 == 0 ? 0.0 : 1.0 + double(i % 7);
  for (const RowSampler sampler : {RowSampler::Crs, RowSampler::WtaCrs, RowSampler::Bernoulli}) {
    INFO(name_of(sampler));
    const RowSample a = sample_rows(sampler, weight, 20, 5), b = sample_rows(sampler, weight, 20, 5),
                    c = sample_rows(sampler, weight, 20, 6);
    CHECK(a.rows == b.rows);
    CHECK(a.scale == b.scale);
    CHECK(a.rows != c.rows);
    if (sampler != RowSampler::Bernoulli) {
      CHECK(a.rows.size() == 20);
      for (const int32_t row : a.rows) CHECK(weight[size_t(row)] > 0);
    }
  }
  // every row of nonzero weight among the winners: exact, nothing drawn
  std::vector<double> few(50, 0.0);
  few[3] = 5, few[40] = 1;
  // (still k rows: the draws are row N − 1 at scale 0)
  const RowSample exact = sample_rows(RowSampler::WtaCrs, few, 4, 1);
  CHECK(exact.winners == 2);
  CHECK(exact.rows == std::vector<int32_t>{3, 40, 49, 49});
  CHECK(exact.scale == std::vector<float>{1.0f, 1.0f, 0.0f, 0.0f});
}

TEST_CASE("row sampling: the integer CDF, boundaries included", "[row_sampling]") {
  static std::mt19937_64 rng(std::random_device{}());
  // draw_row: the first row whose cumulative weight exceeds t, at every t; rows of weight 0
  // (repeated cumulatives, the first row's included) never
  const std::vector<uint64_t> cum = {0, 3, 3, 4, 9, 9, 9, 10, 17};
  for (uint64_t t = 0; t < cum.back(); t++) {
    size_t want = 0;
    while (cum[want] <= t) want++;
    INFO("t " << t);
    CHECK(draw_row(cum.data(), int64_t(cum.size()), t) == int64_t(want));
  }
  // draw_target: ⌊u·rest⌋ (u's 53 bits times rest's 10 fit long double's 64), below rest
  const uint64_t stream = rng();
  for (int64_t j = 0; j < 2000; j++) {
    const uint64_t rest = 1 + rng() % 1000;
    const long double u = uniform_open01(stream, uint64_t(j));
    const uint64_t want = std::min(uint64_t(std::floor(u * (long double)rest)), rest - 1);
    INFO("j " << j << ", rest " << rest);
    CHECK(draw_target(stream, j, rest) == want);
  }
  // Whole draws on small integer weights (their fixed point is exact): draw j's row i is the one
  // with C_{i−1} ≤ u_j·W < C_i, C the cumulative weights and W their sum, and its scale
  // W / (k·weight_i) rounded once
  std::vector<double> weight(40);
  for (double& w : weight) w = double(rng() % 10);  // zeros included
  weight[7] = 3;
  const int k = 25;
  const RowSample s = sample_rows(RowSampler::Crs, weight, k, stream);
  REQUIRE(s.rows.size() == size_t(k));
  std::vector<uint64_t> C(weight.size());
  uint64_t W = 0;
  for (size_t i = 0; i < weight.size(); i++) C[i] = W += uint64_t(weight[i]);
  for (int j = 0; j < k; j++) {
    const size_t i = size_t(s.rows[size_t(j)]);
    const auto m = (unsigned __int128)(uniform_open01(stream, uint64_t(j)) * 18014398509481984.0);
    const unsigned __int128 uW = m * W, below = i == 0 ? 0 : C[i - 1];
    INFO("draw " << j << ", row " << i);
    CHECK((below << 54) <= uW);
    CHECK(uW < ((unsigned __int128)C[i] << 54));
    CHECK(s.scale[size_t(j)] == float(double(W) / (double(k) * weight[i])));
  }
}

TEST_CASE("row sampling: wta-crs's winner count, ties to the fewer winners", "[row_sampling]") {
  // weights 3, 1, 1, 1 of 6, k = 4: c = 0 scores 6/4; c = 1, 2 and 3 score 3/3, 2/2 and 1/1
  std::vector<double> weight(20, 0.0);
  weight[9] = 3, weight[2] = 1, weight[5] = 1, weight[14] = 1;
  const RowSample tie = sample_rows(RowSampler::WtaCrs, weight, 4, 3);
  CHECK(tie.winners == 1);
  CHECK(tie.rows[0] == 9);
  // weights 6, 3, 1, 1 of 11, k = 3: c = 0 scores 11/3, c = 1 5/2, c = 2 2/1: two winners, the
  // larger first; each draw from the 1s scaled by 2 / (1·1)
  std::vector<double> steep(12, 0.0);
  steep[4] = 6, steep[0] = 3, steep[11] = 1, steep[6] = 1;
  const RowSample two = sample_rows(RowSampler::WtaCrs, steep, 3, 5);
  CHECK(two.winners == 2);
  CHECK(std::vector<int32_t>(two.rows.begin(), two.rows.begin() + 2) == std::vector<int32_t>{4, 0});
  CHECK((two.rows[2] == 6 || two.rows[2] == 11));
  CHECK(two.scale == std::vector<float>{1.0f, 1.0f, 2.0f});
}
