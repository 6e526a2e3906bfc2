// The GEMMs the CUDA files call (kernels/cuda/gemm.cu): gemm_bf16, a row-major product of bf16
// matrices with fp32 accumulation, its output fp32 or bf16 (linear_* in kernels/cuda/linear.cu,
// the GRASS compressed gradient and the low-rank projections are thin wrappers around it), and
// gemm_f32 for GaLore's randomized refresh.
// Include only from .cu files.
#pragma once
#include <cublasLt.h>

#include <cstdint>

#include "kernels/cuda/cuda_ops.h"

namespace grass::cuda {

// The cuBLAS type of a parameter gradient's storage.
inline cudaDataType_t cuda_type(GradType gtype) {
  return gtype == GradType::F32 ? CUDA_R_32F : CUDA_R_16BF;
}

// D[M,N] = op(A)·op(B) + beta·C, row-major with explicit leading dimensions (row pitches):
//   A: [M,K] with ld lda, or [K,M] when trans_a (op(A) = Aᵀ)
//   B: [K,N] with ld ldb, or [N,K] when trans_b
//   C, D: [M,N] with ld ldc, of c_type CUDA_R_32F or CUDA_R_16BF; C is D itself (in place) or a
//   read-only matrix that does not overlap D (the residual stream added in the epilogue:
//   linear_residual_forward)
// beta = 0 overwrites D, beta = 1 adds C: the fp32 sum plus C, rounded to c_type once. Any width
// and pointer alignment works (5461 included); same inputs, same bits. Launches on ctx.stream.
void gemm_bf16(const Context& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, const void* C,
               void* D, cudaDataType_t c_type, int64_t ldc);
// In place: C = op(A)·op(B) + beta·C (beta = 1 accumulates into C).
inline void gemm_bf16(const Context& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N,
                      int64_t K, const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta,
                      void* C, cudaDataType_t c_type, int64_t ldc) {
  gemm_bf16(ctx, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, C, c_type, ldc);
}

// The same row-major product of fp32 matrices into fp32 (C = op(A)·op(B) + beta·C), for the few
// products that need fp32 inputs (GaLore's randomized refresh: kernels/cuda/galore_basis.cu).
// Through cublasGemmEx with CUBLAS_COMPUTE_32F: true fp32, no TF32. Same inputs, same bits.
void gemm_f32(const Context& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
              const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
              int64_t ldc);

}  // namespace grass::cuda
