// RMSNorm as in HF LlamaRMSNorm: out = w * x / sqrt(mean(x²) + eps), statistics in double.
#include <cmath>
#include <vector>

#include <omp.h>

#include "kernels/cpu/parallel.h"
#include "kernels/ops.h"

namespace grass::ops {

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int64_t N, int C, double eps) {
#pragma omp parallel for if (N * C >= kParallelWork)
  for (int64_t n = 0; n < N; n++) {
    const T* xr = x + n * C;
    double ss = 0;
    for (int c = 0; c < C; c++) ss += double(xr[c]) * xr[c];
    const T r = T(1.0 / std::sqrt(ss / C + eps));
    rstd[n] = r;
    T* o = out + n * C;
    for (int c = 0; c < C; c++) o[c] = w[c] * (xr[c] * r);
  }
}

template <typename T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd, int64_t N,
                      int C) {
  // With xhat = x·rstd and g = dout·w:  dx = rstd · (g - xhat · mean(g·xhat)),  dw = Σ_n dout·xhat.
  // dw is summed per thread, then the partial sums are added in thread order (deterministic for a
  // fixed thread count; under kParallelWork, thread 0's alone, the others' partials zero).
  const int nthreads = omp_get_max_threads();
  std::vector<double> dw_partial(size_t(nthreads) * C, 0.0);
#pragma omp parallel if (N * C >= kParallelWork)
  {
    double* dw_mine = dw_partial.data() + size_t(omp_get_thread_num()) * C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n++) {
      const T* xr = x + n * C;
      const T* dor = dout + n * C;
      const double r = rstd[n];
      double dot = 0;  // Σ_c g·xhat
      for (int c = 0; c < C; c++) dot += double(dor[c]) * w[c] * xr[c] * r;
      const double mean_dot = dot / C;
      T* dxr = dx + n * C;
      for (int c = 0; c < C; c++) {
        const double xhat = xr[c] * r;
        dxr[c] += T(r * (double(dor[c]) * w[c] - xhat * mean_dot));
        dw_mine[c] += double(dor[c]) * xhat;
      }
    }
  }
  for (int t = 0; t < nthreads; t++)
    for (int c = 0; c < C; c++) dw[c] += T(dw_partial[size_t(t) * C + c]);
}

#define INSTANTIATE(T)                                                                        \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int, double);        \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, \
                                    int);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace grass::ops
