// cuda_emu: nvcuda::wmma on the CPU. On the GPU a fragment is spread over the 32 lanes of a warp
// in an unspecified way; here every lane holds the whole tile, so load, mma and store give each
// lane the full result (the stores of a warp write the same values). The operations are
// warp-collective, as on the GPU: a load ends at a warp barrier, so no lane stores over a tile
// before every lane has read it (load, mma, store in place). Code that reads fragment elements
// (frag.x[i]) depends on the hardware layout and is not emulated: kernels that need element access
// use kernels/cuda/mma_ptx.cuh's mma.sync and ldmatrix, whose layouts the emulator models exactly.
#pragma once
#include <type_traits>

#include "cuda_bf16.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
  float v[rows * cols];  // row-major; bf16 inputs are exact in fp32
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, float value) {
  for (float& x : f.v) x = value;
}

// matrix_a / matrix_b: the layout is the fragment's.
template <typename Use, int M, int N, int K, typename Layout>
void load_matrix_sync(fragment<Use, M, N, K, __nv_bfloat16, Layout>& f, const __nv_bfloat16* p,
                      unsigned ldm) {
  using F = fragment<Use, M, N, K, __nv_bfloat16, Layout>;
  for (int i = 0; i < F::rows; i++)
    for (int j = 0; j < F::cols; j++)
      f.v[i * F::cols + j] = float(std::is_same_v<Layout, row_major> ? p[i * ldm + j] : p[j * ldm + i]);
  cuda_emu::warp_barrier();
}

template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm,
                      layout_t layout) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) f.v[i * N + j] = layout == mem_row_major ? p[i * ldm + j] : p[j * ldm + i];
  cuda_emu::warp_barrier();
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm,
                       layout_t layout) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) (layout == mem_row_major ? p[i * ldm + j] : p[j * ldm + i]) = f.v[i * N + j];
}

// d = a·b + c, fp32 accumulation.
template <int M, int N, int K, typename LayoutA, typename LayoutB>
void mma_sync(fragment<accumulator, M, N, K, float>& d,
              const fragment<matrix_a, M, N, K, __nv_bfloat16, LayoutA>& a,
              const fragment<matrix_b, M, N, K, __nv_bfloat16, LayoutB>& b,
              const fragment<accumulator, M, N, K, float>& c) {
  float out[M * N];
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float s = c.v[i * N + j];
      for (int k = 0; k < K; k++) s += a.v[i * K + k] * b.v[k * N + j];
      out[i * N + j] = s;
    }
  for (int i = 0; i < M * N; i++) d.v[i] = out[i];
}

}  // namespace nvcuda::wmma
