#include "src/optim/grass_selection.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "src/core/error.h"
#include "src/core/rng.h"

namespace grass {

namespace {

// Indices of the r largest keys (ties: the lower index first).
std::vector<int32_t> top_keys(const std::vector<double>& keys, int r) {
  std::vector<int32_t> idx(keys.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + r, idx.end(), [&](int32_t a, int32_t b) {
    return keys[a] > keys[b] || (keys[a] == keys[b] && a < b);
  });
  idx.resize(r);
  return idx;
}

// r draws with replacement from the distribution q (Σ q = 1), by inverting its CDF.
std::vector<int32_t> draw_with_replacement(const std::vector<double>& q, int r, uint64_t seed) {
  std::vector<double> cdf(q.size());
  std::partial_sum(q.begin(), q.end(), cdf.begin());
  std::vector<int32_t> picks(r);
  for (int j = 0; j < r; j++) {
    const double u = uniform_open01(seed, uint64_t(j)) * cdf.back();
    int32_t i = int32_t(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    i = std::min<int32_t>(i, int32_t(q.size()) - 1);
    while (q[i] == 0) i--;  // u landed on the right edge of a run of zero-probability slices
    picks[j] = i;
  }
  return picks;
}

// r distinct draws, successive sampling ∝ weights (Efraimidis-Spirakis: the r largest
// log(u_i) / w_i); zero-weight slices come last, in random order.
std::vector<int32_t> draw_without_replacement(const std::vector<double>& weights, int r,
                                              uint64_t seed) {
  std::vector<double> keys(weights.size());
  for (size_t i = 0; i < weights.size(); i++) {
    const double log_u = std::log(uniform_open01(seed, i));
    keys[i] = weights[i] > 0 ? log_u / weights[i] : -1e300 + log_u;  // zero weight: below all others
  }
  return top_keys(keys, r);
}

}  // namespace

SliceSelection select_slices(Selection method, const std::vector<double>& norms_sq, int r,
                             uint64_t seed) {
  const int m = int(norms_sq.size());
  GRASS_CHECK(r >= 1 && r <= m, "select_slices: rank outside [1, slices]");
  const double total = std::accumulate(norms_sq.begin(), norms_sq.end(), 0.0);
  Selection how = method;
  if (total == 0 && how == Selection::Multinomial) how = Selection::Uniform;
  if (total == 0 && how == Selection::MultinomialNR) how = Selection::UniformNR;

  std::vector<int32_t> sigma;
  std::vector<float> rho;
  switch (how) {
    case Selection::TopR:
      sigma = top_keys(norms_sq, r);
      rho.assign(r, 1.0f);
      break;
    case Selection::Multinomial:
    case Selection::Uniform: {
      std::vector<double> q(m, 1.0 / m);
      if (how == Selection::Multinomial)
        for (int i = 0; i < m; i++) q[i] = norms_sq[i] / total;
      sigma = draw_with_replacement(q, r, seed);
      for (int32_t i : sigma) rho.push_back(float(1.0 / std::sqrt(double(r) * q[i])));
      break;
    }
    case Selection::MultinomialNR:
      sigma = draw_without_replacement(norms_sq, r, seed);
      rho.assign(r, 1.0f);
      break;
    case Selection::UniformNR:  // inclusion probability r/m: ρ² = m/r makes E[P·Pᵀ] = I
      sigma = draw_without_replacement(std::vector<double>(m, 1.0), r, seed);
      rho.assign(r, float(std::sqrt(double(m) / r)));
      break;
  }

  // ascending σ: sequential memory in the gather and the update
  std::vector<int32_t> order(r);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return sigma[a] < sigma[b] || (sigma[a] == sigma[b] && a < b);
  });
  SliceSelection s;
  for (int32_t j : order) {
    s.sigma.push_back(sigma[j]);
    s.rho.push_back(rho[j]);
    s.count.push_back(1);
  }
  return s;
}

SliceSelection compact_slices(const SliceSelection& drawn) {
  SliceSelection s;
  for (size_t j = 0; j < drawn.sigma.size(); j++) {
    if (!s.sigma.empty() && s.sigma.back() == drawn.sigma[j]) {  // ascending: repeats adjoin
      s.count.back() += drawn.count[j];
      continue;
    }
    s.sigma.push_back(drawn.sigma[j]);
    s.rho.push_back(drawn.rho[j]);
    s.count.push_back(drawn.count[j]);
  }
  return s;
}

}  // namespace grass
