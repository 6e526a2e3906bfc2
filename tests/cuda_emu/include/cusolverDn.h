// cuda_emu: the part of cuSOLVER's dense API that GaLore's refresh uses (kernels/cuda/
// galore_basis.cu): single-precision QR (geqrf, orgqr), Cholesky (potrf) and the symmetric
// eigensolver (syevd, and the 64-bit API's batched XsyevBatched on single precision, which runs
// syevd on each matrix in turn),
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

struct cusolverDnParams;
using cusolverDnParams_t = cusolverDnParams*;
cusolverStatus_t cusolverDnCreateParams(cusolverDnParams_t* params);
cusolverStatus_t cusolverDnDestroyParams(cusolverDnParams_t params);
cusolverStatus_t cusolverDnXsyevBatched_bufferSize(
    cusolverDnHandle_t handle, cusolverDnParams_t params, cusolverEigMode_t jobz,
    cublasFillMode_t uplo, int64_t n, cudaDataType dataTypeA, const void* A, int64_t lda,
    cudaDataType dataTypeW, const void* W, cudaDataType computeType,
    size_t* workspaceInBytesOnDevice, size_t* workspaceInBytesOnHost, int64_t batchSize);
cusolverStatus_t cusolverDnXsyevBatched(cusolverDnHandle_t handle, cusolverDnParams_t params,
                                        cusolverEigMode_t jobz, cublasFillMode_t uplo, int64_t n,
                                        cudaDataType dataTypeA, void* A, int64_t lda,
                                        cudaDataType dataTypeW, void* W, cudaDataType computeType,
                                        void* bufferOnDevice, size_t workspaceInBytesOnDevice,
                                        void* bufferOnHost, size_t workspaceInBytesOnHost,
                                        int* info, int64_t batchSize);
