// Linear layer y = x·wᵀ: the GEMMs that carry nearly all of the model's FLOPs (o_proj's and
// down's with the residual stream added), and rows of the full weight gradient a projected
// target's refresh reads.
#include <climits>
#include <cstdint>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/parallel.h"
#include "kernels/ops.h"
#include "src/core/error.h"

namespace grass::ops {

template <typename T>
void linear_forward(T* y, const T* x, const T* w, int64_t N, int in, int out) {
  GRASS_CHECK(N <= INT_MAX, "linear_forward: too many rows for one BLAS call");
  // y[N,out] = x[N,in] · w[out,in]ᵀ
  cpu::gemm(false, true, int(N), out, in, T(1), x, in, w, in, T(0), y, out);
}

template <typename T>
void linear_residual_forward(T* y, const T* x, const T* w, const T* r, int64_t N, int in, int out) {
  const int64_t n = N * out;
  const auto y0 = reinterpret_cast<uintptr_t>(y), r0 = reinterpret_cast<uintptr_t>(r);
  const auto bytes = uintptr_t(n) * sizeof(T);
  GRASS_CHECK(r0 + bytes <= y0 || y0 + bytes <= r0, "linear_residual_forward: r overlaps y");
  linear_forward(y, x, w, N, in, out);
#pragma omp parallel for simd if (n >= kParallelWork)
  for (int64_t i = 0; i < n; i++) y[i] = r[i] + y[i];
}

template <typename T>
void linear_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t N, int in, int out,
                     bool accumulate_dx) {
  GRASS_CHECK(N <= INT_MAX, "linear_backward: too many rows for one BLAS call");
  // dx[N,in] = dy[N,out] · w[out,in]
  if (dx) cpu::gemm(false, false, int(N), in, out, T(1), dy, out, w, in, T(accumulate_dx), dx, in);
  // dw[out,in] += dy[N,out]ᵀ · x[N,in]
  if (dw) cpu::gemm(true, false, out, in, int(N), T(1), dy, out, x, in, T(1), dw, in);
}

template <typename T>
void linear_full_grad(T* g, const T* dy, const T* x, int64_t N, int in, int out, int row0,
                      int rows) {
  GRASS_CHECK(N <= INT_MAX, "linear_full_grad: too many rows for one BLAS call");
  GRASS_CHECK(row0 >= 0 && rows >= 0 && row0 + rows <= out,
              "linear_full_grad: rows outside the weight");
  // g[rows,in] = dy[N, row0 : row0+rows]ᵀ · x[N,in]: dy's columns, a view with leading dimension out
  cpu::gemm(true, false, rows, in, int(N), T(1), dy + row0, out, x, in, T(0), g, in);
}

#define INSTANTIATE(T)                                                                     \
  template void linear_forward<T>(T*, const T*, const T*, int64_t, int, int);              \
  template void linear_residual_forward<T>(T*, const T*, const T*, const T*, int64_t, int, int); \
  template void linear_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int, int, \
                                   bool);                                                   \
  template void linear_full_grad<T>(T*, const T*, const T*, int64_t, int, int, int, int);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace grass::ops
