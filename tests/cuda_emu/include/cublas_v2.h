// cuda_emu: cuBLAS's cublasGemmEx (the fallback of kernels/cuda/gemm.cu) and cublasStrsm (GaLore's
// CholeskyQR2, kernels/cuda/galore_basis.cu) on the CPU.
#pragma once
#include "cublasLt.h"

struct cublasContext;
using cublasHandle_t = cublasContext*;
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
enum cublasFillMode_t { CUBLAS_FILL_MODE_LOWER = 0, CUBLAS_FILL_MODE_UPPER = 1 };
enum cublasSideMode_t { CUBLAS_SIDE_LEFT = 0, CUBLAS_SIDE_RIGHT = 1 };
enum cublasDiagType_t { CUBLAS_DIAG_NON_UNIT = 0, CUBLAS_DIAG_UNIT = 1 };
enum cublasMath_t {
  CUBLAS_DEFAULT_MATH = 0,
  CUBLAS_PEDANTIC_MATH = 2,
  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16,
};

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b,
                            int m, int n, int k, const void* alpha, const void* a,
                            cudaDataType_t a_type, int lda, const void* b, cudaDataType_t b_type,
                            int ldb, const void* beta, void* c, cudaDataType_t c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo);
// B[m, n] := alpha·op(A)⁻¹·B (left) or alpha·B·op(A)⁻¹ (right), A triangular, column-major fp32.
cublasStatus_t cublasStrsm(cublasHandle_t handle, cublasSideMode_t side, cublasFillMode_t uplo,
                           cublasOperation_t trans, cublasDiagType_t diag, int m, int n,
                           const float* alpha, const float* A, int lda, float* B, int ldb);
