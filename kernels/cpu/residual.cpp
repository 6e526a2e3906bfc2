// Residual add on the hidden stream.
#include "kernels/cpu/parallel.h"
#include "kernels/ops.h"

namespace grass::ops {

template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd if (n >= kParallelWork)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

template void residual_forward<float>(float*, const float*, const float*, int64_t);
template void residual_forward<double>(double*, const double*, const double*, int64_t);

}  // namespace grass::ops
