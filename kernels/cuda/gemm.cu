// The GEMM machinery on cuBLASLt behind every product of the CUDA backend (gemm.cuh's gemm_bf16:
// the linear layer's in linear.cu, GRASS's compressed gradient, the low-rank projections):
// row-major bf16 products with fp32 accumulation, their plans and their cublasGemmEx fallback.
//
// Row-major to column-major: a row-major matrix is the column-major view of its transpose, so
// row-major C = op(A)·op(B) is computed as column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: the operands swap,
// each keeps its own transpose flag, and M and N swap.
//
// Alignment: a width that is not a multiple of 8 (the 1B model's ffn 5461) puts rows at 2-byte
// boundaries, and a view into a buffer can start anywhere. cuBLASLt assumes 256-byte alignment
// unless told, so every problem tells it the true alignment of each operand (pointer and row
// pitch): its heuristic then offers only kernels that can load such rows. If it offers none, the
// problem goes to cublasGemmEx, which takes every alignment, and one line on stderr says so; so
// does a problem whose cuBLASLt launch fails after the heuristic offered a kernel (once: the plan
// then keeps to the fallback, and the line names the shape and cuBLAS's status). Its
// handle is the Context's (create_gemm_fallback_handle), made with the backend, before the run's
// memory is reserved: cublasCreate takes device memory of its own.
//
// Out of place (D = A·B + C with C ≠ D: the residual stream's add in o_proj's and down's
// epilogue): cuBLASLt reads C and writes D in the same epilogue, with an algorithm that says it
// can (CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT: the plan takes the heuristic's best of up
// to 8 that does, and such a problem has a plan of its own); cublasGemmEx takes only C = D, so its
// path copies C to D first, the same sums.
//
// Plans: each distinct problem (device, shape, leading dimensions, output type, alignments,
// in place or not, workspace) builds its descriptors and asks the heuristic once; the plan is
// kept for the life of the process, because the query costs more than a small GEMM.
//
// Determinism: for one problem the plan fixes the algorithm, and cuBLAS(Lt) gives the same bits
// for the same algorithm and inputs on one GPU model.
//
// Accumulation is fp32 everywhere, split-K included. cuBLASLt: compute type CUBLAS_COMPUTE_32F,
// and a split-K reduction only in a separate pass over fp32 partials (the preference's reduction
// scheme mask, make_plan). cublasGemmEx: compute type CUBLAS_COMPUTE_32F, and the handle's math
// mode carries CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION, without which cuBLAS may reduce
// a bf16 output's split-K partials in bf16.
#include <cublas_v2.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"
#include "src/core/error.h"

namespace grass::cuda {

namespace {

// One product as cuBLAS sees it, column-major: C[m,n] = op(A)[m,k]·op(B)[k,n] + beta·C.
struct Problem {
  cublasOperation_t op_a, op_b;
  int64_t m, n, k, lda, ldb, ldc;
  cudaDataType_t c_type;
  // bytes: what every row start of the operand is aligned to (align_c: of C and D both)
  uint32_t align_a, align_b, align_c;
  bool out_of_place = false;  // D != C: the algorithm must take it
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // false: cuBLASLt offered no kernel, or its kernel failed to launch; cublasGemmEx runs it
  // (set once, under cached_plan's lock or by the one thread that runs this plan's GEMMs)
  mutable bool lt_has_algo = false;
};

// "m=.. n=.. k=.. lda=.. ldb=.. ldc=.. (alignments a/b/c bytes)": a problem in a warning line.
std::string describe(const Problem& p) {
  char text[180];
  std::snprintf(text, sizeof text,
                "m=%lld n=%lld k=%lld lda=%lld ldb=%lld ldc=%lld (alignments %u/%u/%u bytes%s)",
                (long long)p.m, (long long)p.n, (long long)p.k, (long long)p.lda, (long long)p.ldb,
                (long long)p.ldc, p.align_a, p.align_b, p.align_c,
                p.out_of_place ? ", D apart from C" : "");
  return text;
}

// Whether cuBLASLt's algorithm writes D apart from C (not every one does).
bool takes_out_of_place(const cublasLtMatmulAlgo_t& algo) {
  int32_t supported = 0;
  size_t written = 0;
  GRASS_CUBLAS_CHECK(cublasLtMatmulAlgoCapGetAttribute(
      &algo, CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT, &supported, sizeof supported, &written));
  return supported != 0;
}

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing the pointer and
// the row pitch: the alignment of every row of the matrix.
uint32_t alignment_bytes(const void* ptr, int64_t ld, int64_t element_bytes) {
  const uint64_t bits =
      uint64_t(reinterpret_cast<uintptr_t>(ptr)) | uint64_t(ld * element_bytes) | 256u;
  return uint32_t(bits & (~bits + 1));  // the lowest set bit
}

template <typename T>
void set_preference(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                    T value) {
  GRASS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

Plan make_plan(const Context& ctx, const Problem& p) {
  Plan plan;
  GRASS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  GRASS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &p.op_a,
                                                    sizeof(p.op_a)));
  GRASS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &p.op_b,
                                                    sizeof(p.op_b)));
  // A layout describes the matrix as stored: a transposed operand is stored [k,m], not [m,k].
  const bool ta = p.op_a == CUBLAS_OP_T, tb = p.op_b == CUBLAS_OP_T;
  GRASS_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, ta ? p.k : p.m, ta ? p.m : p.k, p.lda));
  GRASS_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16BF, tb ? p.n : p.k, tb ? p.k : p.n, p.ldb));
  GRASS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, p.c_type, p.m, p.n, p.ldc));

  cublasLtMatmulPreference_t pref = nullptr;
  GRASS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  set_preference(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(ctx.lt_workspace_bytes));
  set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p.align_a);
  set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p.align_b);
  set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p.align_c);
  set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p.align_c);  // C's layout
  // Split-K only with a separate reduction pass over a workspace: an in-place reduction adds the
  // partial sums into the output in an order that need not repeat (determinism), and in bf16
  // outputs it would add them in bf16, so bf16 keeps fp32 partials alone (OUTPUT_TYPE would
  // store them in bf16). The mask filters split-K kernels only: a kernel without split-K
  // (CUBLASLT_REDUCTION_SCHEME_NONE) passes any mask.
  set_preference(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                 p.c_type == CUDA_R_16BF
                     ? uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
                     : uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                                CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE));

  // The heuristic's best, or for D apart from C its best that takes it (the heuristic sees only
  // layouts, the same for both).
  constexpr int kCandidates = 8;
  cublasLtMatmulHeuristicResult_t results[kCandidates]{};
  int count = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(ctx.lt, plan.op, plan.a, plan.b, plan.c, plan.c, pref,
                                     p.out_of_place ? kCandidates : 1, results, &count);
  GRASS_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  // NOT_SUPPORTED means "no kernel for this configuration": the fallback's case, not a bug.
  if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED)
    fail_cuda("cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__, cublasGetStatusString(status));
  for (int i = 0; status == CUBLAS_STATUS_SUCCESS && i < count && !plan.lt_has_algo; i++)
    if (results[i].state == CUBLAS_STATUS_SUCCESS &&
        (!p.out_of_place || takes_out_of_place(results[i].algo))) {
      plan.algo = results[i].algo;
      plan.lt_has_algo = true;
    }
  if (!plan.lt_has_algo) {
    std::fprintf(stderr, "grass: cuBLASLt has no kernel for %s; using cublasGemmEx\n",
                 describe(p).c_str());
  }
  return plan;
}

// The plan of p, built on first use. Plans are never freed: a run has a few dozen distinct
// problems. std::map nodes do not move, so the reference stays valid after the lock is released.
const Plan& cached_plan(const Context& ctx, const Problem& p) {
  using Key = std::array<int64_t, 15>;
  static std::mutex mutex;
  static std::map<Key, Plan> plans;
  int device = 0;
  GRASS_CUDA_CHECK(cudaGetDevice(&device));
  const Key key{device, p.op_a, p.op_b, p.m, p.n, p.k, p.lda, p.ldb, p.ldc, p.c_type, p.align_a,
                p.align_b, p.align_c, p.out_of_place, int64_t(ctx.lt_workspace_bytes)};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, make_plan(ctx, p)).first;
  return it->second;
}

// Row-major C[M,N] = op(A)·op(B) as cuBLAS's column-major Cᵀ[N,M] = op(B)ᵀ·op(A)ᵀ: cuBLAS's A is
// our B and its B is our A (alignments left for the caller that asks cuBLASLt).
Problem column_major(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                     int64_t ldb, int64_t ldc, cudaDataType_t c_type) {
  Problem p{};
  p.op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  p.op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  p.m = N;
  p.n = M;
  p.k = K;
  p.lda = ldb;
  p.ldb = lda;
  p.ldc = ldc;
  p.c_type = c_type;
  return p;
}

// cuBLAS's classic GEMM on the Context's handle: for problems cuBLASLt has no kernel for, and for
// fp32 inputs (in_type).
void run_fallback(const Context& ctx, const Problem& p, const void* a, const void* b,
                  const float* alpha, const float* beta, void* c,
                  cudaDataType_t in_type = CUDA_R_16BF) {
  GRASS_CHECK(ctx.blas, "gemm: a problem cuBLASLt cannot run, and no cuBLAS handle to run it");
  GRASS_CHECK(p.m <= INT_MAX && p.n <= INT_MAX && p.k <= INT_MAX && p.lda <= INT_MAX &&
                  p.ldb <= INT_MAX && p.ldc <= INT_MAX,
              "gemm: a problem cuBLASLt cannot run is too large for cublasGemmEx");
  // cublasSetStream resets the workspace to cuBLAS's own pool (allocated by cublasCreate), so the
  // arena's workspace comes after it.
  GRASS_CUBLAS_CHECK(cublasSetStream(ctx.blas, ctx.stream));
  if (ctx.lt_workspace)
    GRASS_CUBLAS_CHECK(cublasSetWorkspace(ctx.blas, ctx.lt_workspace, ctx.lt_workspace_bytes));
  GRASS_CUBLAS_CHECK(cublasGemmEx(ctx.blas, p.op_a, p.op_b, int(p.m), int(p.n), int(p.k), alpha,
                                  a, in_type, int(p.lda), b, in_type, int(p.ldb), beta, c,
                                  p.c_type, int(p.ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  debug_sync("cublasGemmEx", __FILE__, __LINE__);
}

}  // namespace

cublasHandle_t create_gemm_fallback_handle() {
  cublasHandle_t handle = nullptr;
  GRASS_CUBLAS_CHECK(cublasCreate(&handle));
  // fp32 accumulation includes split-K: cuBLAS's default math mode lets a reduced-precision
  // output (bf16) sum its partial products in that precision.
  const cublasMath_t mode =
      cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
  GRASS_CUBLAS_CHECK(cublasSetMathMode(handle, mode));
  return handle;
}

void gemm_f32(const Context& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
              const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
              int64_t ldc) {
  GRASS_CHECK(M >= 0 && N >= 0 && K > 0, "gemm_f32: a dimension below 1 (K) or 0 (M, N)");
  GRASS_CHECK(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N,
              "gemm_f32: leading dimension shorter than a row");
  if (M == 0 || N == 0) return;
  const float alpha = 1.0f;
  run_fallback(ctx, column_major(trans_a, trans_b, M, N, K, lda, ldb, ldc, CUDA_R_32F), B, A,
               &alpha, &beta, C, CUDA_R_32F);
}

void gemm_bf16(const Context& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, const void* C,
               void* D, cudaDataType_t c_type, int64_t ldc) {
  GRASS_CHECK(c_type == CUDA_R_32F || c_type == CUDA_R_16BF,
              "gemm_bf16: output must be fp32 or bf16");
  GRASS_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_bf16: negative dimension");
  GRASS_CHECK(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N,
              "gemm_bf16: leading dimension shorter than a row");
  if (M == 0 || N == 0) return;  // nothing to write
  const int64_t c_bytes = c_type == CUDA_R_32F ? 4 : 2;
  const size_t row_bytes = size_t(N * c_bytes), pitch_bytes = size_t(ldc * c_bytes);
  if (C != D) {  // cuBLASLt reads C and writes D tile by tile: an overlap would read written tiles
    const auto c0 = reinterpret_cast<uintptr_t>(C), d0 = reinterpret_cast<uintptr_t>(D);
    const uintptr_t extent = (M - 1) * pitch_bytes + row_bytes;
    GRASS_CHECK(c0 + extent <= d0 || d0 + extent <= c0, "gemm_bf16: C overlaps D without being D");
  }
  // D = C before an in-place product: cublasGemmEx and an empty sum know only C = D
  auto copy_c_to_d = [&] {
    GRASS_CUDA_CHECK(cudaMemcpy2DAsync(D, pitch_bytes, C, pitch_bytes, row_bytes, size_t(M),
                                       cudaMemcpyDeviceToDevice, ctx.stream));
  };
  if (K == 0) {  // an empty sum (no tokens): D = beta·C, without asking cuBLASLt about k = 0
    GRASS_CHECK(beta == 0.0f || beta == 1.0f, "gemm_bf16: k = 0 with a beta other than 0 or 1");
    if (beta == 0.0f)
      GRASS_CUDA_CHECK(cudaMemset2DAsync(D, pitch_bytes, 0, row_bytes, size_t(M), ctx.stream));
    else if (C != D)
      copy_c_to_d();
    return;
  }
  Problem p = column_major(trans_a, trans_b, M, N, K, lda, ldb, ldc, c_type);
  p.align_a = alignment_bytes(B, ldb, 2);
  p.align_b = alignment_bytes(A, lda, 2);
  p.align_c = std::min(alignment_bytes(C, ldc, c_bytes), alignment_bytes(D, ldc, c_bytes));
  p.out_of_place = C != D;
  const Plan& plan = cached_plan(ctx, p);
  const float alpha = 1.0f;
  auto fallback = [&] {
    if (C != D && beta != 0.0f) copy_c_to_d();
    run_fallback(ctx, p, B, A, &alpha, &beta, D);
  };
  if (!plan.lt_has_algo) {
    fallback();
    return;
  }
  const cublasStatus_t status =
      cublasLtMatmul(ctx.lt, plan.op, &alpha, B, plan.a, A, plan.b, &beta, C, plan.c, D, plan.c,
                     &plan.algo, ctx.lt_workspace, ctx.lt_workspace_bytes, ctx.stream);
  if (status != CUBLAS_STATUS_SUCCESS) {  // refused at launch: nothing ran, D is as it was
    std::fprintf(stderr, "grass: cuBLASLt's kernel for %s failed to launch (%s); using "
                 "cublasGemmEx for it from now on\n", describe(p).c_str(),
                 cublasGetStatusString(status));
    plan.lt_has_algo = false;
    fallback();
    return;
  }
  debug_sync("cublasLtMatmul", __FILE__, __LINE__);
}

}  // namespace grass::cuda
