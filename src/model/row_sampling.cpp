#include "src/model/row_sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "src/core/error.h"
#include "src/core/rng.h"

namespace grass {

namespace {

// The k rows of largest weight, largest first (ties to the lower row, so the set is a function
// of the weights alone).
std::vector<int32_t> largest_rows(std::span<const double> weight, int k) {
  std::vector<int32_t> order(weight.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return weight[size_t(a)] != weight[size_t(b)] ? weight[size_t(a)] > weight[size_t(b)] : a < b;
  });
  order.resize(size_t(k));
  return order;
}

// wta-crs's number of winners among `top` (the k largest, largest first): the c in [0, k) with
// the least (1 − P_c) / (k − c), P_c the first c's share of `total`; c = 0 scores 1/k.
int winner_count(std::span<const double> weight, const std::vector<int32_t>& top, double total) {
  const int k = int(top.size());
  int best_c = 0;
  double best = 1.0 / k, share = 0;
  for (int c = 1; c < k; c++) {
    share += weight[size_t(top[size_t(c - 1)])] / total;
    const double score = (1.0 - share) / (k - c);
    if (score < best) best = score, best_c = c;
  }
  return best_c;
}

}  // namespace

RowSample sample_rows(RowSampler sampler, std::span<const double> weight, int k, uint64_t stream) {
  const int64_t N = int64_t(weight.size());
  GRASS_CHECK(k >= 1 && k <= N, "row sampling keeps 1 to N rows");
  double total = 0;
  for (const double w : weight) {
    GRASS_CHECK(w >= 0 && std::isfinite(w), "row sampling weights must be finite and >= 0");
    total += w;
  }
  GRASS_CHECK(total > 0, "row sampling weights are all 0");
  RowSample out;
  if (sampler == RowSampler::Bernoulli) {
    const double q = double(k) / double(N);
    for (int64_t i = 0; i < N; i++)
      if (uniform_open01(stream, uint64_t(i)) < q) {
        out.rows.push_back(int32_t(i));
        out.scale.push_back(float(1.0 / q));
      }
    return out;
  }
  // The winners (none for crs) are kept exactly; the rest of the rows are the pool drawn from.
  std::vector<char> is_winner(size_t(N), 0);
  if (sampler == RowSampler::WtaCrs) {
    const std::vector<int32_t> top = largest_rows(weight, k);
    out.winners = winner_count(weight, top, total);
    for (int c = 0; c < out.winners; c++) {
      out.rows.push_back(top[size_t(c)]);
      out.scale.push_back(1.0f);
      is_winner[size_t(top[size_t(c)])] = 1;
    }
  }
  std::vector<int32_t> pool;
  std::vector<double> cumulative;  // the pool's running weight
  double rest = 0;
  for (int64_t i = 0; i < N; i++)
    if (!is_winner[size_t(i)] && weight[size_t(i)] > 0) {
      rest += weight[size_t(i)];
      pool.push_back(int32_t(i));
      cumulative.push_back(rest);
    }
  if (pool.empty()) return out;  // the winners hold every row of nonzero weight: exact
  // s draws with replacement, q_i = w_i / rest; each row's factor 1 / (s q_i) = (1 − P_C) / (s p_i)
  const int s = k - out.winners;
  for (int j = 0; j < s; j++) {
    const double u = uniform_open01(stream, uint64_t(j)) * rest;
    const size_t at = std::min(size_t(std::upper_bound(cumulative.begin(), cumulative.end(), u) -
                                      cumulative.begin()),
                               pool.size() - 1);
    out.rows.push_back(pool[at]);
    out.scale.push_back(float(rest / (double(s) * weight[size_t(pool[at])])));
  }
  return out;
}

double sampling_variance(RowSampler sampler, std::span<const double> weight, int k,
                         std::span<const double> z_norm_sq, double rest_sum_norm_sq,
                         const RowSample& sample) {
  const int64_t N = int64_t(weight.size());
  if (sampler == RowSampler::Bernoulli) {
    const double q = double(k) / double(N);
    double v = 0;
    for (const double z : z_norm_sq) v += (1 - q) / q * z;
    return v;
  }
  std::vector<char> is_winner(size_t(N), 0);
  for (int c = 0; c < sample.winners; c++) is_winner[size_t(sample.rows[size_t(c)])] = 1;
  double rest = 0;
  for (int64_t i = 0; i < N; i++)
    if (!is_winner[size_t(i)]) rest += weight[size_t(i)];
  double sum = 0;
  for (int64_t i = 0; i < N; i++) {
    if (is_winner[size_t(i)] || z_norm_sq[size_t(i)] == 0) continue;
    if (weight[size_t(i)] == 0) return INFINITY;  // a row that can never be drawn: biased
    sum += z_norm_sq[size_t(i)] * rest / weight[size_t(i)];
  }
  return (sum - rest_sum_norm_sq) / double(k - sample.winners);
}

}  // namespace grass
