// Choosing which r rows (or columns) of a weight GRASS trains until the next refresh, and their
// scales ρ, from the squared norms of the slices of that step's full gradient (GRASS.md):
//   top_r           the r largest norms                              ρ = 1
//   multinomial     r draws with replacement, q_i = n_i / Σ n         ρ_j = 1 / sqrt(r · q_σj)
//   multinomial_nr  r distinct draws ∝ q                              ρ = 1
//   uniform         r draws with replacement, q_i = 1/m               ρ = sqrt(m / r)
//   uniform_nr      r distinct uniform draws                          ρ = 1
// σ is returned in ascending order (ρ permuted with it). With replacement σ may repeat.
// If every norm is zero, the multinomial methods fall back to their uniform counterparts.
#pragma once
#include <cstdint>
#include <vector>

#include "config/choices.h"

namespace grass {

struct SliceSelection {
  std::vector<int32_t> sigma;  // [r] selected slice indices, ascending
  std::vector<float> rho;      // [r] their scales
};

// Random draws come from the counter-based stream `seed`: the same seed gives the same σ on
// every rank.
SliceSelection select_slices(Selection method, const std::vector<double>& norms_sq, int r,
                             uint64_t seed);

}  // namespace grass
