// Sampled token rows for a weight gradient (issue 28; ../shared/MEMORY_TIERS.md §2.5, §2.6): an
// unbiased estimate of S = Σ_i z_i, z_i = dy_i x_iᵀ over the N token rows of a linear layer,
// from k' stored rows, each with a factor:
//
//   Ŝ = Σ_j scale_j · dy_{rows_j} x_{rows_j}ᵀ,   E[Ŝ] = S for any weights positive where z_i ≠ 0.
//
//   crs        column-row sampling: k draws with replacement, p_i ∝ weight_i, scale 1 / (k p_i)
//   wta-crs    the authors' winner-take-all rule: the c largest p_i (the set C) kept exactly
//              (scale 1) where that beats sampling, c minimising (1 − P_c) / (k − c) over the
//              k largest (P_c their summed p; c = 0 when none beats 1/k, which is plain CRS); the
//              other s = k − c draws with replacement from p restricted to the rest, each
//              scaled by (1 − P_C) / (s p_i)
//   bernoulli  RAD-style: each row kept with probability q = k / N, scaled by 1 / q (a random
//              number of rows, k on average)
//
// Draws come from the counter-based stream `stream` (src/core/rng.h), so a sample is a pure
// function of (weights, k, stream): a resumed run draws the same rows. crs and wta-crs draw in
// exact integer arithmetic (kernels/row_draw.h: the weights in fixed point, which moves each p_i by
// at most 2^-40 relative for rows of at least 2^-8 of the largest weight at N ≤ 2^13, still
// unbiased), so that the GPU draws the same rows and scales bit for bit (Backend::draw_rows), and
// always k rows: when wta-crs's winners hold every row of weight > 0 (exact), the s draws are
// row N − 1 at scale 0.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace grass {

enum class RowSampler { Crs, WtaCrs, Bernoulli };

struct RowSample {
  std::vector<int32_t> rows;  // [k'] token rows, repeats possible (with replacement)
  std::vector<float> scale;   // [k'] each stored row's factor
  int winners = 0;            // wta-crs: rows[0, winners) are C, kept exactly
};

// weight: [N] ≥ 0 and finite, not all 0 (p_i = weight_i / Σ weight); 1 ≤ k ≤ N.
RowSample sample_rows(RowSampler sampler, std::span<const double> weight, int k, uint64_t stream);

// E‖Ŝ − S‖²_F of sampling with these weights, from each row's ‖z_i‖²_F = ‖dy_i‖²‖x_i‖² and
// ‖S_R‖²_F of R, the rows that are sampled (all of them but wta-crs's winners, which `sample`
// names; crs and bernoulli ignore it):
//   crs, wta-crs   (1/s) · [(1 − P_C) · Σ_{i∉C} ‖z_i‖² / p_i − ‖S_R‖²]   (C empty for crs, s = k)
//   bernoulli      Σ_i (1 − q)/q · ‖z_i‖²
double sampling_variance(RowSampler sampler, std::span<const double> weight, int k,
                         std::span<const double> z_norm_sq, double rest_sum_norm_sq,
                         const RowSample& sample);

}  // namespace grass
