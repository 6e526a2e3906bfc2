// The draw of crs's and wta-crs's sampled token rows (src/model/row_sampling.h) in exact integer
// arithmetic, shared by the CPU reference (kernels/cpu/sampling.cpp, ops::draw_rows) and the GPU's
// kernels (kernels/cuda/sampling.cu), so that the two draw the same rows and scales bit for bit
// (issue 46; ../shared/GPU_PERF.md §2.4): every sum below is of integers, the same in any order a
// GPU forms it, where a sum of doubles is not.
//
//   weights   w_i = round(weight_i · 2^shift), at least 1 where weight_i > 0; shift from the
//             largest weight so that every w_i ≤ 2^(61 − L), N ≤ 2^L: Σ w_i ≤ 2^61 < 2^62. A
//             weight that is NaN or infinite, or weights all 0: every w_i = 1 (uniform draws,
//             unbiased too; a diverged input's NaN reaches the loss anyway).
//   order     rows by w descending, the lower row first on ties: key_i = w_i·2^L + (2^L − 1 − i).
//   winners   (wta-crs) c in [0, k) minimising (T − S_c)/(k − c), T = Σ w and S_c the sum of the c
//             first in that order, compared as (T − S_c)(k − c') < (T − S_c')(k − c) in 128 bits,
//             ties to the smaller c (c = 0 is plain crs).
//   pool      w_i of the rows that are not winners, in row order; cum its inclusive scan and
//             rest = cum[N − 1].
//   draws     draw j (of s = k − c) takes u_j = uniform_open01(stream, j), its target
//             t_j = ⌊u_j·rest⌋ in exact integers (u_j·2^54 is an integer), the first row whose cum
//             exceeds t_j (upper_bound: a row of w 0 is never drawn), and scale rest / (s·w_row) in
//             double, rounded once to float. rest = 0 (the winners hold every row of weight > 0:
//             exact): each draw is row N − 1 at scale 0, so a draw always fills k rows and the
//             GPU never reports a count.
//
// How far this moves each probability from weight_i / Σ weight (the double arithmetic it
// replaced): w_i ≥ 2^(60 − L)·weight_i / max weight, so rounding moves it by at most
// 2^-(61 − L)·max / weight_i relative (≤ 2^-40 for every row of at least 2^-8 of the largest
// weight at N ≤ 2^13), and Σ w by less; u_j's 53 bits move a probability by at most 2^-53
// absolute, as before. The estimate stays unbiased for the weights drawn with: each scale is the
// inverse of its row's probability, computed from the same integers (up to u_j's 2^-53, as before).
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/stochastic_round.h"  // GRASS_HOST_DEVICE
#include "src/core/rng.h"

namespace grass {

using draw_u128 = unsigned __int128;

// L: the least L with N ≤ 2^L, so a row index fits in a key's low L bits.
GRASS_HOST_DEVICE int draw_index_bits(int64_t N) {
  int L = 0;
  while ((int64_t(1) << L) < N) L++;
  return L;
}

// Neither NaN nor infinite (without the math library's isfinite, which device code lacks here).
GRASS_HOST_DEVICE bool draw_finite(double v) { return v - v == 0; }

// shift with max_weight·2^shift < 2^(61 − L) (max_weight > 0 and finite).
GRASS_HOST_DEVICE int draw_shift(double max_weight, int L) {
  int e = 0;
  ::frexp(max_weight, &e);  // max_weight in [2^(e − 1), 2^e)
  return 61 - L - e;
}

// w_i: exact up to the rounding (a power-of-two scaling of a double is exact), ties away from 0.
GRASS_HOST_DEVICE uint64_t draw_weight(double weight, int shift) {
  if (!(weight > 0)) return 0;
  const long long w = ::llround(::ldexp(weight, shift));
  return w > 0 ? uint64_t(w) : 1;  // a row of weight > 0 stays drawable
}

// The sort key: descending keys are w descending, then row ascending; every key distinct.
GRASS_HOST_DEVICE uint64_t draw_key(uint64_t w, int64_t row, int L) {
  return (w << L) | (((uint64_t(1) << L) - 1) - uint64_t(row));
}

// wta-crs's scores (T − S_a)/(k − a) < (T − S_b)/(k − b), given as remainders and counts left.
GRASS_HOST_DEVICE bool draw_score_less(uint64_t rest_a, int64_t left_a, uint64_t rest_b,
                                       int64_t left_b) {
  return draw_u128(rest_a) * draw_u128(uint64_t(left_b)) <
         draw_u128(rest_b) * draw_u128(uint64_t(left_a));
}

// Draw j's target ⌊u_j·rest⌋ in [0, rest) (rest > 0). u_j·2^54 is an integer (u_j is a multiple
// of 2^-54, below 2^53·2^-53); u_j rounds to 1 once in 2^53 draws, kept inside by the min.
GRASS_HOST_DEVICE uint64_t draw_target(uint64_t stream, int64_t j, uint64_t rest) {
  const uint64_t m = uint64_t(uniform_open01(stream, uint64_t(j)) * 18014398509481984.0);  // 2^54
  const uint64_t t = uint64_t((draw_u128(m) * draw_u128(rest)) >> 54);
  return t < rest ? t : rest - 1;
}

// The row drawn for target t: the first i with cum[i] > t (cum [N] non-decreasing, t < cum[N − 1]).
GRASS_HOST_DEVICE int64_t draw_row(const uint64_t* cum, int64_t N, uint64_t t) {
  int64_t lo = 0, hi = N - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (cum[mid] > t) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// A drawn row's factor 1 / (s·q_row), q_row = w_row / rest.
GRASS_HOST_DEVICE float draw_scale(uint64_t rest, int64_t s, uint64_t w_row) {
  return float(double(rest) / (double(s) * double(w_row)));
}

}  // namespace grass
