// The linear layer y = x·wᵀ on the GPU (the CPU reference: kernels/cpu/linear.cpp): the forward
// (for o_proj and down with the residual stream added in the epilogue), the backward's two
// products, and rows of the transient full weight gradient a projected target's refresh reads.
// Each is one bf16 GEMM with fp32 accumulation through gemm_bf16 (gemm.cuh; kernels/cuda/gemm.cu
// has the cuBLASLt machinery: plans, alignment, the fallback, determinism).
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.cuh"
#include "src/core/error.h"

namespace grass::cuda {

void linear_forward(const Context& ctx, bf16* y, const bf16* x, const bf16* w, int64_t N, int in,
                    int out) {
  // y[N,out] = x[N,in] · w[out,in]ᵀ
  gemm_bf16(ctx, false, true, N, out, in, x, in, w, in, 0.0f, y, CUDA_R_16BF, out);
}

void linear_residual_forward(const Context& ctx, bf16* y, const bf16* x, const bf16* w,
                             const bf16* r, int64_t N, int in, int out) {
  // y[N,out] = r + x[N,in] · w[out,in]ᵀ: cuBLASLt's D = A·B + β·C with C = r, β = 1
  gemm_bf16(ctx, false, true, N, out, in, x, in, w, in, 1.0f, r, y, CUDA_R_16BF, out);
}

void linear_backward_dx(const Context& ctx, bf16* dx, const bf16* dy, const bf16* w, int64_t N,
                        int in, int out, bool accumulate_dx) {
  // dx[N,in] (+)= dy[N,out] · w[out,in]
  gemm_bf16(ctx, false, false, N, in, out, dy, out, w, in, accumulate_dx ? 1.0f : 0.0f, dx,
            CUDA_R_16BF, in);
}

void linear_backward_dw(const Context& ctx, void* dw, GradType gtype, const bf16* dy, const bf16* x,
                        int64_t N, int in, int out) {
  // dw[out,in] += dy[N,out]ᵀ · x[N,in]
  gemm_bf16(ctx, true, false, out, in, N, dy, out, x, in, 1.0f, dw, cuda_type(gtype), in);
}

void linear_full_grad_f32(const Context& ctx, float* g, const bf16* dy, const bf16* x, int64_t N,
                          int in, int out, int row0, int rows) {
  GRASS_CHECK(row0 >= 0 && rows >= 0 && row0 + rows <= out, "linear_full_grad_f32: rows outside the weight");
  // g[rows,in] = dy[N, row0 : row0+rows]ᵀ · x[N,in]: dy's columns, a view with leading dimension out
  gemm_bf16(ctx, true, false, rows, in, N, dy + row0, out, x, in, 0.0f, g, CUDA_R_32F, in);
}

}  // namespace grass::cuda
