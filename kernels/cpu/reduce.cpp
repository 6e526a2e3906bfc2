// The reduction behind gradient clipping, and the clipping coefficient from it. Sums go in fixed
// 64K-element chunks, each summed in double, then added in chunk order: the result does not
// depend on the number of threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/ops.h"

namespace grass::ops {

template <typename T>
double sum_squares(const T* x, int64_t n) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    double s = 0;
    for (int64_t i = c * kChunk; i < end; i++) s += double(x[i]) * double(x[i]);
    partial[c] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

template double sum_squares<float>(const float*, int64_t);
template double sum_squares<double>(const double*, int64_t);

void clip(ClipScalars* s, double max_norm) { clip_gathered(s, max_norm); }

}  // namespace grass::ops
