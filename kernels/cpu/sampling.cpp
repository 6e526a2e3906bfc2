// The row ops of a sampled weight gradient (src/model/row_sampling.h): the sampling weights
// (each token row's norm), the draw of crs's and wta-crs's rows in exact integers
// (kernels/row_draw.h), and the stored rows, scaled.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/ops.h"
#include "kernels/row_draw.h"

namespace grass::ops {

template <typename T>
void gather_rows(T* out, const T* x, const int32_t* rows, const float* scale, int64_t k, int D) {
#pragma omp parallel for if (k * D >= kParallelWork)
  for (int64_t j = 0; j < k; j++) {
    const T s = scale ? T(scale[j]) : T(1);
    const T* src = x + int64_t(rows[j]) * D;
    for (int c = 0; c < D; c++) out[j * D + c] = s * src[c];
  }
}

template <typename T>
void row_norms(float* norms, const T* x, int64_t N, int D) {
#pragma omp parallel for if (N * D >= kParallelWork)
  for (int64_t n = 0; n < N; n++) {
    double sum = 0;
    for (int c = 0; c < D; c++) sum += double(x[n * D + c]) * double(x[n * D + c]);
    norms[n] = float(std::sqrt(sum));
  }
}

int draw_rows(int32_t* rows, float* scale, const double* weight, int64_t N, int k, bool winners,
              uint64_t stream) {
  const int L = draw_index_bits(N);
  double max_weight = 0;
  bool usable = true;
  for (int64_t i = 0; i < N; i++) {
    usable = usable && draw_finite(weight[i]);
    max_weight = std::max(max_weight, weight[i]);
  }
  usable = usable && max_weight > 0;
  const int shift = usable ? draw_shift(max_weight, L) : 0;
  std::vector<uint64_t> w(static_cast<size_t>(N));
  uint64_t total = 0;
  for (int64_t i = 0; i < N; i++) total += w[size_t(i)] = usable ? draw_weight(weight[i], shift) : 1;
  // wta-crs: the k first rows by key, then the least score (T − S_c)/(k − c), ties to the lower c
  int c = 0;
  std::vector<char> is_winner(static_cast<size_t>(N), 0);
  if (winners) {
    std::vector<int32_t> top(static_cast<size_t>(N));
    std::iota(top.begin(), top.end(), 0);
    std::partial_sort(top.begin(), top.begin() + k, top.end(), [&](int32_t a, int32_t b) {
      return draw_key(w[size_t(a)], a, L) > draw_key(w[size_t(b)], b, L);
    });
    uint64_t best_rest = total, rest = total;
    for (int cc = 1; cc < k; cc++) {
      rest -= w[size_t(top[size_t(cc - 1)])];
      if (draw_score_less(rest, k - cc, best_rest, k - c)) best_rest = rest, c = cc;
    }
    for (int j = 0; j < c; j++) {
      rows[j] = top[size_t(j)];
      scale[j] = 1.0f;
      is_winner[size_t(top[size_t(j)])] = 1;
    }
  }
  std::vector<uint64_t> cum(static_cast<size_t>(N));
  uint64_t rest = 0;
  for (int64_t i = 0; i < N; i++) cum[size_t(i)] = rest += is_winner[size_t(i)] ? 0 : w[size_t(i)];
  const int s = k - c;
  for (int j = 0; j < s; j++) {
    if (rest == 0) {
      rows[c + j] = int32_t(N - 1);
      scale[c + j] = 0.0f;
      continue;
    }
    const int64_t row = draw_row(cum.data(), N, draw_target(stream, j, rest));
    rows[c + j] = int32_t(row);
    scale[c + j] = draw_scale(rest, s, w[size_t(row)]);
  }
  return c;
}

#define INSTANTIATE(T)                                                                     \
  template void gather_rows<T>(T*, const T*, const int32_t*, const float*, int64_t, int); \
  template void row_norms<T>(float*, const T*, int64_t, int);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace grass::ops
