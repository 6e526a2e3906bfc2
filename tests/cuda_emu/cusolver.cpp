// cuda_emu's cuSOLVER (include/cusolverDn.h): each call checks that its matrices, work space and
// info lie inside device allocations, as cuSOLVER requires, and that the work space is at least
// what the matching _bufferSize answered; the factorisation is LAPACK's, run in the handle's
// stream order (streams.h). The buffer sizes are LAPACK's workspace queries.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "cusolverDn.h"
#include "streams.h"

extern "C" {
void sgeqrf_(const int* m, const int* n, float* a, const int* lda, float* tau, float* work,
             const int* lwork, int* info);
void sorgqr_(const int* m, const int* n, const int* k, float* a, const int* lda, const float* tau,
             float* work, const int* lwork, int* info);
void spotrf_(const char* uplo, const int* n, float* a, const int* lda, int* info, size_t uplo_len);
// the trailing size_t: gfortran's hidden lengths of the two strings
void ssyevd_(const char* jobz, const char* uplo, const int* n, float* a, const int* lda, float* w,
             float* work, const int* lwork, int* iwork, const int* liwork, int* info,
             size_t jobz_len, size_t uplo_len);
}

// Creating a handle takes device memory, as cuSOLVER's does (its own work buffers).
constexpr size_t kHandleDeviceBytes = size_t(1) << 20;

struct cusolverDnContext {
  void* device = nullptr;
  cudaStream_t stream = nullptr;
};

namespace {

cusolverStatus_t invalid(const std::string& why) {
  std::fprintf(stderr, "cuda_emu: cuSOLVER: %s\n", why.c_str());
  return CUSOLVER_STATUS_INVALID_VALUE;
}

// A column-major m x n matrix with leading dimension ld, inside one device allocation.
bool on_device(const void* p, int64_t rows, int64_t cols, int64_t ld) {
  if (rows == 0 || cols == 0) return true;
  return cuda_emu::is_device_range(p, size_t((cols - 1) * ld + rows) * sizeof(float));
}

int geqrf_lwork(int m, int n) {
  int lwork = -1, info = 0, lda = std::max(1, m);
  float query = 0;
  sgeqrf_(&m, &n, nullptr, &lda, nullptr, &query, &lwork, &info);
  return std::max(1, int(query));
}
int orgqr_lwork(int m, int n, int k) {
  int lwork = -1, info = 0, lda = std::max(1, m);
  float query = 0;
  sorgqr_(&m, &n, &k, nullptr, &lda, nullptr, &query, &lwork, &info);
  return std::max(1, int(query));
}
struct SyevdSizes {
  int lwork, liwork;
};
SyevdSizes syevd_sizes(int n) {
  int lwork = -1, liwork = -1, info = 0, lda = std::max(1, n), iquery = 0;
  float query = 0;
  ssyevd_("V", "L", &n, nullptr, &lda, nullptr, &query, &lwork, &iquery, &liwork, &info, 1, 1);
  return {std::max(1, int(query)), std::max(1, iquery)};
}

}  // namespace

cusolverStatus_t cusolverDnCreate(cusolverDnHandle_t* handle) {
  void* device = nullptr;
  if (cudaMalloc(&device, kHandleDeviceBytes) != cudaSuccess) {
    cudaGetLastError();
    return CUSOLVER_STATUS_ALLOC_FAILED;
  }
  *handle = new cusolverDnContext{device};
  return CUSOLVER_STATUS_SUCCESS;
}
cusolverStatus_t cusolverDnDestroy(cusolverDnHandle_t handle) {
  if (handle) cudaFree(handle->device);
  delete handle;
  return CUSOLVER_STATUS_SUCCESS;
}
cusolverStatus_t cusolverDnSetStream(cusolverDnHandle_t handle, cudaStream_t stream) {
  cuda_emu::check_stream_device(stream, "cusolverDnSetStream");
  if (!handle) return CUSOLVER_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUSOLVER_STATUS_SUCCESS;
}

cusolverStatus_t cusolverDnSgeqrf_bufferSize(cusolverDnHandle_t handle, int m, int n, float*,
                                             int lda, int* lwork) {
  if (!handle) return CUSOLVER_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || lda < std::max(1, m)) return invalid("geqrf_bufferSize: shape");
  *lwork = geqrf_lwork(m, n);
  return CUSOLVER_STATUS_SUCCESS;
}
cusolverStatus_t cusolverDnSgeqrf(cusolverDnHandle_t handle, int m, int n, float* A, int lda,
                                  float* tau, float* work, int lwork, int* info) {
  if (!handle) return CUSOLVER_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || lda < std::max(1, m)) return invalid("geqrf: shape");
  if (!on_device(A, m, n, lda) || !on_device(tau, std::min(m, n), 1, 1) ||
      !on_device(work, lwork, 1, lwork) || !on_device(info, 1, 1, 1))
    return invalid("geqrf: A, tau, work or info outside device memory");
  if (lwork < geqrf_lwork(m, n)) return invalid("geqrf: lwork below geqrf_bufferSize's");
  cuda_emu::enqueue(handle->stream, [=] { sgeqrf_(&m, &n, A, &lda, tau, work, &lwork, info); });
  return CUSOLVER_STATUS_SUCCESS;
}

cusolverStatus_t cusolverDnSorgqr_bufferSize(cusolverDnHandle_t handle, int m, int n, int k,
                                             const float*, int lda, const float*, int* lwork) {
  if (!handle) return CUSOLVER_STATUS_NOT_INITIALIZED;
  if (m < n || n < k || k < 0 || lda < std::max(1, m)) return invalid("orgqr_bufferSize: shape");
  *lwork = orgqr_lwork(m, n, k);
  return CUSOLVER_STATUS_SUCCESS;
}
cusolverStatus_t cusolverDnSorgqr(cusolverDnHandle_t handle, int m, int n, int k, float* A,
                                  int lda, const float* tau, float* work, int lwork, int* info) {
  if (!handle) return CUSOLVER_STATUS_NOT_INITIALIZED;
  if (m < n || n < k || k < 0 || lda < std::max(1, m)) return invalid("orgqr: shape");
  if (!on_device(A, m, n, lda) || !on_device(tau, k, 1, 1) || !on_device(work, lwork, 1, lwork) ||
      !on_device(info, 1, 1, 1))
    return invalid("orgqr: A, tau, work or info outside device memory");
  if (lwork < orgqr_lwork(m, n, k)) return invalid("orgqr: lwork below orgqr_bufferSize's");
  cuda_emu::enqueue(handle->stream, [=] { sorgqr_(&m, &n, &k, A, &lda, tau, work, &lwork, info); });
  return CUSOLVER_STATUS_SUCCESS;
}

cusolverStatus_t cusolverDnSsyevd_bufferSize(cusolverDnHandle_t handle, cusolverEigMode_t jobz,
                                             cublasFillMode_t, int n, const float*, int lda,
                                             const float*, int* lwork) {
  if (!handle) return CUSOLVER_STATUS_NOT_INITIALIZED;
  if (jobz != CUSOLVER_EIG_MODE_VECTOR) return invalid("syevd: the emulation computes vectors only");
  if (n < 0 || lda < std::max(1, n)) return invalid("syevd_bufferSize: shape");
  *lwork = syevd_sizes(n).lwork;
  return CUSOLVER_STATUS_SUCCESS;
}
cusolverStatus_t cusolverDnSsyevd(cusolverDnHandle_t handle, cusolverEigMode_t jobz,
                                  cublasFillMode_t uplo, int n, float* A, int lda, float* W,
                                  float* work, int lwork, int* info) {
  if (!handle) return CUSOLVER_STATUS_NOT_INITIALIZED;
  if (jobz != CUSOLVER_EIG_MODE_VECTOR) return invalid("syevd: the emulation computes vectors only");
  if (n < 0 || lda < std::max(1, n)) return invalid("syevd: shape");
  if (!on_device(A, n, n, lda) || !on_device(W, n, 1, n) || !on_device(work, lwork, 1, lwork) ||
      !on_device(info, 1, 1, 1))
    return invalid("syevd: A, W, work or info outside device memory");
  const SyevdSizes sizes = syevd_sizes(n);
  if (lwork < sizes.lwork) return invalid("syevd: lwork below syevd_bufferSize's");
  cuda_emu::enqueue(handle->stream, [=] {
    std::vector<int> iwork(size_t(sizes.liwork));  // cuSOLVER keeps its integer work itself
    const char up = uplo == CUBLAS_FILL_MODE_UPPER ? 'U' : 'L';
    ssyevd_("V", &up, &n, A, &lda, W, work, &lwork, iwork.data(), &sizes.liwork, info, 1, 1);
  });
  return CUSOLVER_STATUS_SUCCESS;
}

namespace {
// cuSOLVER asks for work space for potrf (LAPACK's needs none): one block column of n, so a call
// is held to its _bufferSize as the others are.
int potrf_lwork(int n) { return std::max(1, 64 * n); }
}  // namespace

cusolverStatus_t cusolverDnSpotrf_bufferSize(cusolverDnHandle_t handle, cublasFillMode_t, int n,
                                             float*, int lda, int* lwork) {
  if (!handle) return CUSOLVER_STATUS_NOT_INITIALIZED;
  if (n < 0 || lda < std::max(1, n)) return invalid("potrf_bufferSize: shape");
  *lwork = potrf_lwork(n);
  return CUSOLVER_STATUS_SUCCESS;
}
cusolverStatus_t cusolverDnSpotrf(cusolverDnHandle_t handle, cublasFillMode_t uplo, int n,
                                  float* A, int lda, float* work, int lwork, int* info) {
  if (!handle) return CUSOLVER_STATUS_NOT_INITIALIZED;
  if (n < 0 || lda < std::max(1, n)) return invalid("potrf: shape");
  if (!on_device(A, n, n, lda) || !on_device(work, lwork, 1, lwork) || !on_device(info, 1, 1, 1))
    return invalid("potrf: A, work or info outside device memory");
  if (lwork < potrf_lwork(n)) return invalid("potrf: lwork below potrf_bufferSize's");
  cuda_emu::enqueue(handle->stream, [=] {
    const char up = uplo == CUBLAS_FILL_MODE_UPPER ? 'U' : 'L';
    spotrf_(&up, &n, A, &lda, info, 1);
  });
  return CUSOLVER_STATUS_SUCCESS;
}

// The 64-bit API's batched eigensolver: the batch's matrices lie next to each other (matrix j at
// A + j·lda·n), each solved by syevd in order, so its eigenvectors are Ssyevd's bit for bit. Its
// work space: syevd's for each matrix on the device, and some on the host, as cuSOLVER asks for
// both, so a caller that passes no host buffer is caught.
struct cusolverDnParams {};
cusolverStatus_t cusolverDnCreateParams(cusolverDnParams_t* params) {
  *params = new cusolverDnParams{};
  return CUSOLVER_STATUS_SUCCESS;
}
cusolverStatus_t cusolverDnDestroyParams(cusolverDnParams_t params) {
  delete params;
  return CUSOLVER_STATUS_SUCCESS;
}

namespace {
constexpr size_t kBatchedEigHostBytes = 64;  // per matrix
bool batched_eig_args_valid(cusolverDnHandle_t handle, cusolverDnParams_t params,
                            cusolverEigMode_t jobz, int64_t n, cudaDataType a, int64_t lda,
                            cudaDataType w, cudaDataType compute, int64_t batch,
                            std::string* why) {
  if (!handle || !params) *why = "XsyevBatched: no handle or params";
  else if (jobz != CUSOLVER_EIG_MODE_VECTOR) *why = "XsyevBatched: the emulation computes vectors only";
  else if (a != CUDA_R_32F || w != CUDA_R_32F || compute != CUDA_R_32F)
    *why = "XsyevBatched: the emulation takes single precision only";
  else if (n < 0 || lda < std::max<int64_t>(1, n) || batch < 1 || n > INT32_MAX)
    *why = "XsyevBatched: shape";
  else return true;
  return false;
}
}  // namespace

cusolverStatus_t cusolverDnXsyevBatched_bufferSize(
    cusolverDnHandle_t handle, cusolverDnParams_t params, cusolverEigMode_t jobz, cublasFillMode_t,
    int64_t n, cudaDataType dataTypeA, const void*, int64_t lda, cudaDataType dataTypeW,
    const void*, cudaDataType computeType, size_t* device_bytes, size_t* host_bytes,
    int64_t batch) {
  std::string why;
  if (!batched_eig_args_valid(handle, params, jobz, n, dataTypeA, lda, dataTypeW, computeType,
                              batch, &why))
    return invalid(why);
  *device_bytes = size_t(batch) * size_t(syevd_sizes(int(n)).lwork) * sizeof(float);
  *host_bytes = size_t(batch) * kBatchedEigHostBytes;
  return CUSOLVER_STATUS_SUCCESS;
}
cusolverStatus_t cusolverDnXsyevBatched(cusolverDnHandle_t handle, cusolverDnParams_t params,
                                        cusolverEigMode_t jobz, cublasFillMode_t uplo, int64_t n64,
                                        cudaDataType dataTypeA, void* A, int64_t lda64,
                                        cudaDataType dataTypeW, void* W, cudaDataType computeType,
                                        void* device_work, size_t device_bytes, void* host_work,
                                        size_t host_bytes, int* info, int64_t batch) {
  std::string why;
  if (!batched_eig_args_valid(handle, params, jobz, n64, dataTypeA, lda64, dataTypeW, computeType,
                              batch, &why))
    return invalid(why);
  const int n = int(n64), lda = int(lda64);
  const SyevdSizes sizes = syevd_sizes(n);
  if (!on_device(A, n, n * batch, lda) || !on_device(W, n * batch, 1, n * batch) ||
      !on_device(info, batch, 1, batch) ||
      !cuda_emu::is_device_range(device_work, device_bytes))
    return invalid("XsyevBatched: A, W, info or the device work space outside device memory");
  if (device_bytes < size_t(batch) * size_t(sizes.lwork) * sizeof(float))
    return invalid("XsyevBatched: device work space below XsyevBatched_bufferSize's");
  if (!host_work || host_bytes < size_t(batch) * kBatchedEigHostBytes)
    return invalid("XsyevBatched: host work space below XsyevBatched_bufferSize's");
  cuda_emu::enqueue(handle->stream, [=] {
    std::vector<int> iwork(size_t(sizes.liwork));
    const char up = uplo == CUBLAS_FILL_MODE_UPPER ? 'U' : 'L';
    for (int64_t j = 0; j < batch; j++) {
      float* a = static_cast<float*>(A) + j * int64_t(lda) * n;
      float* w = static_cast<float*>(W) + j * int64_t(n);
      float* work = static_cast<float*>(device_work) + j * int64_t(sizes.lwork);
      ssyevd_("V", &up, &n, a, &lda, w, work, &sizes.lwork, iwork.data(), &sizes.liwork, info + j,
              1, 1);
    }
  });
  return CUSOLVER_STATUS_SUCCESS;
}
