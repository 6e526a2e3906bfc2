#include "src/model/row_sampling.h"

#include <cmath>

#include "kernels/ops.h"
#include "src/core/error.h"
#include "src/core/rng.h"

namespace grass {

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
  out.rows.resize(size_t(k));
  out.scale.resize(size_t(k));
  out.winners = ops::draw_rows(out.rows.data(), out.scale.data(), weight.data(), N, k,
                               sampler == RowSampler::WtaCrs, stream);
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
