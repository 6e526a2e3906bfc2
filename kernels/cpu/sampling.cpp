// The two row ops of a sampled weight gradient (src/model/row_sampling.h): the sampling weights
// (each token row's norm) and the stored rows, scaled.
#include <cmath>

#include "kernels/ops.h"

namespace grass::ops {

template <typename T>
void gather_rows(T* out, const T* x, const int32_t* rows, const float* scale, int64_t k, int D) {
#pragma omp parallel for
  for (int64_t j = 0; j < k; j++) {
    const T s = scale ? T(scale[j]) : T(1);
    const T* src = x + int64_t(rows[j]) * D;
    for (int c = 0; c < D; c++) out[j * D + c] = s * src[c];
  }
}

template <typename T>
void row_norms(float* norms, const T* x, int64_t N, int D) {
#pragma omp parallel for
  for (int64_t n = 0; n < N; n++) {
    double sum = 0;
    for (int c = 0; c < D; c++) sum += double(x[n * D + c]) * double(x[n * D + c]);
    norms[n] = float(std::sqrt(sum));
  }
}

#define INSTANTIATE(T)                                                                     \
  template void gather_rows<T>(T*, const T*, const int32_t*, const float*, int64_t, int); \
  template void row_norms<T>(float*, const T*, int64_t, int);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace grass::ops
