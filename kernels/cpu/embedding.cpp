// Token embedding: a row gather forward, a row scatter-add backward.
#include <cstring>

#include "kernels/cpu/parallel.h"
#include "kernels/ops.h"

namespace grass::ops {

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* table, int64_t N, int C) {
#pragma omp parallel for if (N * C >= kParallelWork)
  for (int64_t n = 0; n < N; n++) std::memcpy(out + n * C, table + int64_t(tokens[n]) * C, C * sizeof(T));
}

template <typename T>
void embedding_backward(T* dtable, const T* dout, const int32_t* tokens, int64_t N, int C) {
  // Tokens repeat, so rows of dtable are shared: split the work over channels, not tokens.
#pragma omp parallel if (N * C >= kParallelWork)
  {
#pragma omp for schedule(static)
    for (int c0 = 0; c0 < C; c0 += 16) {
      const int c1 = c0 + 16 < C ? c0 + 16 : C;
      for (int64_t n = 0; n < N; n++) {
        T* row = dtable + int64_t(tokens[n]) * C;
        const T* d = dout + n * C;
        for (int c = c0; c < c1; c++) row[c] += d[c];
      }
    }
  }
}

#define INSTANTIATE(T)                                                                      \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int);          \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int64_t, int);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace grass::ops
