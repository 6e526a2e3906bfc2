// One name for sgemm and dgemm, so the CPU ops are written once for float and double.
#pragma once
#include <cblas.h>

namespace grass::cpu {

// C[M,N] = alpha · op(A)·op(B) + beta · C, row-major, with explicit leading dimensions
// (strided views such as one head of q[B,T,NH,HD] need lda = NH*HD).
inline void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void gemm(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda,
                 const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace grass::cpu

