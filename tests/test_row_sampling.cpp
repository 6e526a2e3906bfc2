// Sampled token rows (src/model/row_sampling.h): every estimator unbiased for dYᵀX, its mean
// squared error equal to the variance formula, wta-crs no worse than crs where it keeps winners,
// and the draws a pure function of the stream.
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>
#include <vector>

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
  const RowSample exact = sample_rows(RowSampler::WtaCrs, few, 4, 1);
  CHECK(exact.winners == 2);
  CHECK(exact.rows == std::vector<int32_t>{3, 40});
  CHECK(exact.scale == std::vector<float>{1.0f, 1.0f});
}
