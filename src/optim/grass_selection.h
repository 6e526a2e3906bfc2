// Choosing which r rows (or columns) of a weight GRASS trains until the next refresh, and their
// scales ρ, from the squared norms n_i of the slices of that step's full gradient (GRASS.md,
// docs/grass.md):
//   top_r           the r largest norms                              ρ = 1
//   multinomial     r draws with replacement, q_i = n_i / Σ n         ρ_j = 1 / sqrt(r · q_σj)
//   multinomial_nr  r distinct draws ∝ q (successive sampling)        ρ = 1
//   uniform         r draws with replacement, q_i = 1/m               ρ = sqrt(m / r)
//   uniform_nr      r distinct uniform draws                          ρ = sqrt(m / r)
// Under SGD (update = P·Pᵀ·G) multinomial, uniform and uniform_nr are unbiased, E[P·Pᵀ] = I:
// with replacement Σ_j ρ_j² 1(σ_j = i) has mean r·q_i/(r·q_i) = 1; uniform_nr includes each
// slice with probability r/m and ρ² = m/r. top_r and multinomial_nr are biased: E[P·Pᵀ] is the
// diagonal of their inclusion probabilities (0/1 for top_r).
// σ is returned in ascending order (ρ permuted with it). With replacement σ may repeat.
// If every norm is zero, the multinomial methods fall back to their uniform counterparts.
#pragma once
#include <cstdint>
#include <vector>

#include "src/config/choices.h"

namespace grass {

struct SliceSelection {
  std::vector<int32_t> sigma;  // [r] selected slice indices, ascending
  std::vector<float> rho;      // [r] their scales
  std::vector<int32_t> count;  // [r] how often each was drawn (1; compact_slices merges)
};

// Random draws come from the counter-based stream `seed`: the same seed gives the same σ on
// every rank.
SliceSelection select_slices(Selection method, const std::vector<double>& norms_sq, int r,
                             uint64_t seed);

// Repeated draws merged: each distinct slice once, with its draw count. A slice drawn c times
// contributes c identical rows to P (ρ depends on the slice alone), whose G_C rows, moments and
// Adam steps are identical too, so training it once with its step multiplied by c is the same
// update with 1/c of the state.
SliceSelection compact_slices(const SliceSelection& drawn);

}  // namespace grass
