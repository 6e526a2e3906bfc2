// cuda_emu's cuBLAS(Lt): column-major D = alpha·op(A)·op(B) + beta·C with fp32 accumulation in a
// K order that follows the shape, the alignment and the call (SumOrder), the descriptors checked
// as cuBLASLt documents them (see include/cublasLt.h).
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <cblas.h>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_emu.h"
#include "streams.h"

// cuBLAS's docs: creating a handle "allocates hardware resources on the host and device" (for
// cuBLAS, its default workspace pool). A handle here holds a device allocation of this size.
constexpr size_t kHandleDeviceBytes = size_t(1) << 20;

struct cublasLtContext {
  void* device = nullptr;
};
struct cublasContext {
  void* device = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
  cudaStream_t stream = nullptr;  // cublasSetStream's
};
struct cublasLtMatmulDescOpaque {
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
};
struct cublasLtMatrixLayoutOpaque {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque {
  uint64_t workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's default assumption
  uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;  // every scheme: the default
};

namespace {

// What cuda_emu.h reports.
int last_math_mode = -1;
uint64_t gemm_ex_call_count = 0;
int lt_matmul_failures = 0;  // fail_next_lt_matmuls
int lt_in_place_only = 0;    // lt_in_place_only_algorithms
// An emulated algorithm's data: [0..3] the alignments of A, B, C and D it was chosen for (bytes),
// [4] whether it takes D != C.
constexpr int kOutOfPlaceSlot = 4;
std::map<cudaDataType_t, int64_t> last_masks;  // by the output's type

cublasStatus_t invalid(const std::string& why) {
  std::fprintf(stderr, "cuda_emu: cuBLAS: %s\n", why.c_str());
  return CUBLAS_STATUS_INVALID_VALUE;
}

size_t element_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
float load(const void* p, cudaDataType_t t, int64_t i) {
  return t == CUDA_R_32F ? static_cast<const float*>(p)[i]
                         : float(static_cast<const __nv_bfloat16*>(p)[i]);
}
void store(void* p, cudaDataType_t t, int64_t i, float v) {
  if (t == CUDA_R_32F)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
}

struct Operand {
  const void* ptr;
  cudaDataType_t type;
  int64_t rows, cols, ld;  // as stored, column-major
  const char* name;
};

// The stored matrix lies inside one device allocation, with ld covering a column.
cublasStatus_t check_operand(const Operand& o) {
  if (o.type != CUDA_R_32F && o.type != CUDA_R_16BF) return invalid(std::string(o.name) + ": type");
  if (o.ld < std::max<int64_t>(1, o.rows))
    return invalid(std::string(o.name) + ": leading dimension " + std::to_string(o.ld) + " < rows " +
                   std::to_string(o.rows));
  const size_t bytes = size_t((o.cols - 1) * o.ld + o.rows) * element_bytes(o.type);
  if (!cuda_emu::is_device_range(o.ptr, bytes))
    return invalid(std::string(o.name) + ": " + std::to_string(o.rows) + "x" +
                   std::to_string(o.cols) + " (ld " + std::to_string(o.ld) +
                   ") is not inside one device allocation");
  return CUBLAS_STATUS_SUCCESS;
}

// The order in which one output's k products are summed. cuBLAS picks a kernel by the shape and
// the operands' alignment, and kernels differ in their K tile and in whether they split K across
// blocks (fp32 partials added at the end); cublasGemmEx runs others again. The same shape,
// alignment and call give the same order, so a repeated computation repeats its bits; another
// shape, alignment or call gives another, so an exact claim between two different GEMMs (a
// padded against an unpadded width, the fallback against cuBLASLt) fails here as on hardware.
struct SumOrder {
  int64_t tile;    // products summed per K tile, the tiles then added in order
  int64_t splits;  // contiguous K ranges summed apart, then added in order
};
SumOrder lt_order(int64_t m, int64_t n, int64_t k, int64_t alignment) {
  const int64_t tile = alignment >= 16 ? 64 : alignment >= 8 ? 32 : 16;  // deeper with wider loads
  const int64_t splits = m * n <= 128 * 128 && k >= 1024 ? std::min<int64_t>(8, k / 512) : 1;
  return {tile, splits};
}
constexpr SumOrder kGemmExOrder = {8, 1};

float dot(const float* a, const float* b, int64_t k, SumOrder order) {
  const int64_t chunk = ((k + order.splits - 1) / order.splits + order.tile - 1) / order.tile * order.tile;
  float total = 0.0f;
  for (int64_t s0 = 0; s0 < k; s0 += chunk) {
    const int64_t s1 = std::min(k, s0 + chunk);
    float part = 0.0f;
    for (int64_t t0 = s0; t0 < s1; t0 += order.tile) {
      float tile = 0.0f;
      for (int64_t p = t0; p < std::min(s1, t0 + order.tile); p++) tile += a[p] * b[p];
      part += tile;
    }
    total += part;
  }
  return total;
}

// D[m,n] = alpha·op(A)[m,k]·op(B)[k,n] + beta·C (C is not read when beta is 0, as in cuBLAS).
void compute(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const Operand& a,
             const Operand& b, float beta, const Operand& c, void* d, SumOrder order);

// Checked at the call, computed in `stream`'s order (streams.h).
cublasStatus_t gemm(cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n,
                    int64_t k, float alpha, const Operand& a, const Operand& b, float beta,
                    const Operand& c, void* d, SumOrder order, cudaStream_t stream) {
  const bool ta = op_a == CUBLAS_OP_T, tb = op_b == CUBLAS_OP_T;
  if (a.rows != (ta ? k : m) || a.cols != (ta ? m : k))
    return invalid("A is " + std::to_string(a.rows) + "x" + std::to_string(a.cols) +
                   ", op(A) must be " + std::to_string(m) + "x" + std::to_string(k));
  if (b.rows != (tb ? n : k) || b.cols != (tb ? k : n))
    return invalid("B is " + std::to_string(b.rows) + "x" + std::to_string(b.cols) +
                   ", op(B) must be " + std::to_string(k) + "x" + std::to_string(n));
  if (c.rows != m || c.cols != n) return invalid("C/D shape");
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  if (k > 0) {
    if (cublasStatus_t s = check_operand(a)) return s;
    if (cublasStatus_t s = check_operand(b)) return s;
  }
  if (cublasStatus_t s = check_operand(c)) return s;
  if (d != c.ptr)
    if (cublasStatus_t s = check_operand({d, c.type, c.rows, c.cols, c.ld, "D"})) return s;
  cuda_emu::enqueue(stream, [=] { compute(ta, tb, m, n, k, alpha, a, b, beta, c, d, order); });
  return CUBLAS_STATUS_SUCCESS;
}

void compute(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const Operand& a,
             const Operand& b, float beta, const Operand& c, void* d, SumOrder order) {
  // op(A) as rows of k and op(B) as columns of k, widened once: the inner loop is a plain dot.
  std::vector<float> a_rows(size_t(m * k)), b_cols(size_t(n * k));
  for (int64_t i = 0; i < m; i++)
    for (int64_t p = 0; p < k; p++)
      a_rows[size_t(i * k + p)] = load(a.ptr, a.type, ta ? p + i * a.ld : i + p * a.ld);
  for (int64_t j = 0; j < n; j++)
    for (int64_t p = 0; p < k; p++)
      b_cols[size_t(j * k + p)] = load(b.ptr, b.type, tb ? j + p * b.ld : p + j * b.ld);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < m; i++) {
      const float* ar = &a_rows[size_t(i * k)];
      const float* bc = &b_cols[size_t(j * k)];
      float out = alpha * dot(ar, bc, k, order);
      if (beta != 0.0f) out += beta * load(c.ptr, c.type, i + j * c.ld);
      store(d, c.type, i + j * c.ld, out);
    }
}

}  // namespace

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  }
  return "unknown cuBLAS status";
}

namespace cuda_emu {
int last_gemm_ex_math_mode() { return last_math_mode; }
uint64_t gemm_ex_calls() { return gemm_ex_call_count; }
void fail_next_lt_matmuls(int count) { lt_matmul_failures = count; }
void lt_in_place_only_algorithms(int count) { lt_in_place_only = count; }
int64_t last_reduction_scheme_mask(cudaDataType_t output) {
  const auto it = last_masks.find(output);
  return it == last_masks.end() ? -1 : it->second;
}
}  // namespace cuda_emu

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  void* device = nullptr;
  if (cudaMalloc(&device, kHandleDeviceBytes) != cudaSuccess) {
    cudaGetLastError();
    return CUBLAS_STATUS_ALLOC_FAILED;
  }
  *handle = new cublasLtContext{device};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle) cudaFree(handle->device);
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return invalid("compute/scale type");
  *desc = new cublasLtMatmulDescOpaque;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  if (size != sizeof(cublasOperation_t)) return invalid("matmul desc attribute size");
  cublasOperation_t op;
  std::memcpy(&op, buf, size);
  if (attr == CUBLASLT_MATMUL_DESC_TRANSA)
    desc->trans_a = op;
  else if (attr == CUBLASLT_MATMUL_DESC_TRANSB)
    desc->trans_b = op;
  else
    return invalid("matmul desc attribute");
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  *layout = new cublasLtMatrixLayoutOpaque{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      if (size != 8) return invalid("workspace attribute size");
      std::memcpy(&pref->workspace, buf, 8);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      if (size != 4) return invalid("reduction mask size");
      std::memcpy(&pref->reduction_mask, buf, 4);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      if (size != 4) return invalid("alignment attribute size");
      std::memcpy(&pref->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, 4);
      return CUBLAS_STATUS_SUCCESS;
  }
  return invalid("preference attribute");
}
// One "algorithm" per problem: the alignments it was chosen for, which cublasLtMatmul holds the
// operands to (a real kernel would read misaligned rows wrongly or fault).
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results,
                                              int* returned) {
  if (requested < 1) return invalid("heuristic: requested < 1");
  last_masks[d->type] = pref->reduction_mask;
  *returned = 0;
  for (uint32_t a : pref->align)
    if (a < 16) return CUBLAS_STATUS_NOT_SUPPORTED;
  const int offered = std::min(requested, lt_in_place_only + 1);
  for (int r = 0; r < offered; r++) {
    results[r] = {};
    for (int i = 0; i < 4; i++) results[r].algo.data[i] = pref->align[i];
    results[r].algo.data[kOutOfPlaceSlot] = r >= lt_in_place_only;
    results[r].state = CUBLAS_STATUS_SUCCESS;
  }
  *returned = offered;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoCapGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                 cublasLtMatmulAlgoCapAttributes_t attr, void* buf,
                                                 size_t size, size_t* written) {
  if (!algo || attr != CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT) return invalid("algo capability");
  if (written) *written = sizeof(int32_t);
  if (size != sizeof(int32_t) || !buf) return invalid("algo capability size");
  const int32_t supported = algo->data[kOutOfPlaceSlot] != 0;
  std::memcpy(buf, &supported, sizeof supported);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t al, const void* b,
                              cublasLtMatrixLayout_t bl, const void* beta, const void* c,
                              cublasLtMatrixLayout_t cl, void* d, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t* algo, void*, size_t, cudaStream_t stream) {
  cuda_emu::check_stream_device(stream, "cublasLtMatmul");
  if (!handle || !algo) return invalid("cublasLtMatmul: no handle or algorithm");
  if (lt_matmul_failures > 0) {
    lt_matmul_failures--;
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  if (cl->rows != dl->rows || cl->cols != dl->cols || cl->ld != dl->ld || cl->type != dl->type)
    return invalid("cublasLtMatmul: the emulation takes C and D of one layout only");
  if (c != d && algo->data[kOutOfPlaceSlot] == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (c != d && cl->rows > 0 && cl->cols > 0) {  // out of place: a kernel would read tiles D wrote
    const uint64_t extent = uint64_t((int64_t(cl->cols) - 1) * cl->ld + int64_t(cl->rows)) *
                            uint64_t(element_bytes(cl->type));
    const auto c0 = uint64_t(reinterpret_cast<uintptr_t>(c)), d0 = uint64_t(reinterpret_cast<uintptr_t>(d));
    if (c0 < d0 + extent && d0 < c0 + extent)
      return invalid("cublasLtMatmul: C overlaps D without being D");
  }
  const void* ptrs[4] = {a, b, c, d};
  const int64_t lds[4] = {al->ld, bl->ld, cl->ld, dl->ld};
  const cudaDataType_t types[4] = {al->type, bl->type, cl->type, dl->type};
  int64_t alignment = 16;  // the least aligned operand's, up to 16 bytes
  for (int i = 0; i < 4; i++) {
    const uint64_t bits = uint64_t(reinterpret_cast<uintptr_t>(ptrs[i])) |
                          uint64_t(lds[i]) * element_bytes(types[i]);
    if (bits % algo->data[i] != 0)
      return invalid("cublasLtMatmul: operand " + std::to_string(i) + " is less aligned than the " +
                     std::to_string(algo->data[i]) + " bytes its algorithm was chosen for");
    while (bits % uint64_t(alignment) != 0) alignment /= 2;
  }
  const bool ta = desc->trans_a == CUBLAS_OP_T;
  const int64_t m = int64_t(dl->rows), n = int64_t(dl->cols);
  const int64_t k = int64_t(ta ? al->rows : al->cols);
  return gemm(desc->trans_a, desc->trans_b, m, n, k, *static_cast<const float*>(alpha),
              {a, al->type, int64_t(al->rows), int64_t(al->cols), al->ld, "A"},
              {b, bl->type, int64_t(bl->rows), int64_t(bl->cols), bl->ld, "B"},
              *static_cast<const float*>(beta),
              {c, cl->type, int64_t(cl->rows), int64_t(cl->cols), cl->ld, "C"}, d,
              lt_order(m, n, k, alignment), stream);
}

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  void* device = nullptr;
  if (cudaMalloc(&device, kHandleDeviceBytes) != cudaSuccess) {
    cudaGetLastError();
    return CUBLAS_STATUS_ALLOC_FAILED;
  }
  *handle = new cublasContext{device};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle) cudaFree(handle->device);
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  *mode = handle->math;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  cuda_emu::check_stream_device(stream, "cublasSetStream");
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t, void* workspace, size_t bytes) {
  if (bytes && !cuda_emu::is_device_range(workspace, bytes)) return invalid("workspace");
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b,
                            int m, int n, int k, const void* alpha, const void* a,
                            cudaDataType_t a_type, int lda, const void* b, cudaDataType_t b_type,
                            int ldb, const void* beta, void* c, cudaDataType_t c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (!handle || compute != CUBLAS_COMPUTE_32F) return invalid("cublasGemmEx: handle or compute");
  last_math_mode = handle->math;
  gemm_ex_call_count++;
  const bool ta = op_a == CUBLAS_OP_T, tb = op_b == CUBLAS_OP_T;
  return gemm(op_a, op_b, m, n, k, *static_cast<const float*>(alpha),
              {a, a_type, ta ? k : m, ta ? m : k, lda, "A"},
              {b, b_type, tb ? n : k, tb ? k : n, ldb, "B"}, *static_cast<const float*>(beta),
              {c, c_type, m, n, ldc, "C"}, c, kGemmExOrder, handle->stream);
}

cublasStatus_t cublasStrsm(cublasHandle_t handle, cublasSideMode_t side, cublasFillMode_t uplo,
                           cublasOperation_t trans, cublasDiagType_t diag, int m, int n,
                           const float* alpha, const float* A, int lda, float* B, int ldb) {
  if (!handle) return invalid("cublasStrsm: handle");
  if (m < 0 || n < 0) return invalid("cublasStrsm: shape");
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const int a_side = side == CUBLAS_SIDE_LEFT ? m : n;
  if (cublasStatus_t s = check_operand({A, CUDA_R_32F, a_side, a_side, lda, "A"})) return s;
  if (cublasStatus_t s = check_operand({B, CUDA_R_32F, m, n, ldb, "B"})) return s;
  const float a = *alpha;  // a host scalar, read at the call as cuBLAS's default pointer mode
  cuda_emu::enqueue(handle->stream, [=] {
    cblas_strsm(CblasColMajor, side == CUBLAS_SIDE_LEFT ? CblasLeft : CblasRight,
                uplo == CUBLAS_FILL_MODE_UPPER ? CblasUpper : CblasLower,
                trans == CUBLAS_OP_T ? CblasTrans : CblasNoTrans,
                diag == CUBLAS_DIAG_UNIT ? CblasUnit : CblasNonUnit, m, n, a, A, lda, B, ldb);
  });
  return CUBLAS_STATUS_SUCCESS;
}
