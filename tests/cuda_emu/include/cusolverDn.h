// cuda_emu: the part of cuSOLVER's dense API that GaLore's refresh uses (kernels/cuda/
// galore_basis.cu): single-precision QR (geqrf, orgqr), Cholesky (potrf) and the symmetric
// eigensolver (syevd),
// column-major as cuSOLVER's, computed by the host's LAPACK in the handle's stream order.
#pragma once
#include "cublas_v2.h"

enum cusolverStatus_t {
  CUSOLVER_STATUS_SUCCESS = 0,
  CUSOLVER_STATUS_NOT_INITIALIZED = 1,
  CUSOLVER_STATUS_ALLOC_FAILED = 2,
  CUSOLVER_STATUS_INVALID_VALUE = 3,
};
enum cusolverEigMode_t { CUSOLVER_EIG_MODE_NOVECTOR = 0, CUSOLVER_EIG_MODE_VECTOR = 1 };

struct cusolverDnContext;
using cusolverDnHandle_t = cusolverDnContext*;

cusolverStatus_t cusolverDnCreate(cusolverDnHandle_t* handle);
cusolverStatus_t cusolverDnDestroy(cusolverDnHandle_t handle);
cusolverStatus_t cusolverDnSetStream(cusolverDnHandle_t handle, cudaStream_t stream);
cusolverStatus_t cusolverDnSgeqrf_bufferSize(cusolverDnHandle_t handle, int m, int n, float* A,
                                             int lda, int* lwork);
cusolverStatus_t cusolverDnSgeqrf(cusolverDnHandle_t handle, int m, int n, float* A, int lda,
                                  float* tau, float* work, int lwork, int* info);
cusolverStatus_t cusolverDnSorgqr_bufferSize(cusolverDnHandle_t handle, int m, int n, int k,
                                             const float* A, int lda, const float* tau, int* lwork);
cusolverStatus_t cusolverDnSorgqr(cusolverDnHandle_t handle, int m, int n, int k, float* A,
                                  int lda, const float* tau, float* work, int lwork, int* info);
cusolverStatus_t cusolverDnSsyevd_bufferSize(cusolverDnHandle_t handle, cusolverEigMode_t jobz,
                                             cublasFillMode_t uplo, int n, const float* A, int lda,
                                             const float* W, int* lwork);
cusolverStatus_t cusolverDnSsyevd(cusolverDnHandle_t handle, cusolverEigMode_t jobz,
                                  cublasFillMode_t uplo, int n, float* A, int lda, float* W,
                                  float* work, int lwork, int* info);
cusolverStatus_t cusolverDnSpotrf_bufferSize(cusolverDnHandle_t handle, cublasFillMode_t uplo,
                                             int n, float* A, int lda, int* lwork);
cusolverStatus_t cusolverDnSpotrf(cusolverDnHandle_t handle, cublasFillMode_t uplo, int n,
                                  float* A, int lda, float* work, int lwork, int* info);
