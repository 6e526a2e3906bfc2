// GaLore's randomized refresh on the device: ops::galore_basis_randomized
// (kernels/cpu/galore_basis.cpp, the reference; docs/lowrank.md, the method) with fp32 GEMMs,
// cuSOLVER, cuBLAS's trsm and small kernels, so a refresh neither downloads the gradient nor
// leaves the GPU idle for a host SVD.
//
// Layout. cuSOLVER is column-major, the engine row-major. The tall matrices are kept transposed,
// row-major [k, m] = column-major [m, k], which is what geqrf and orgqr factor in place:
//   A = G[out, in] (rows: m = out, n = in) or Gᵀ (cols: m = in, n = out)
//   Ωt[k, n]: Ωt[c][a] = normal(seed, a·k + c), the CPU's Ω[n, k] (same seed, same test matrix)
//   Qt[k, m] = Ωt·Aᵀ;  power_iters times: chol(Qt), Zt[k, n] = Qt·A, chol(Zt), Qt = Zt·Aᵀ;  orth(Qt)
//   B = Zt = Qt·A [k, n];  S = B·Bᵀ [k, k];  syevd(S): λ ascending, eigenvector j in S's row j
//   W[k, r]: W[i][c] = S[k-1-c][i] (the top r, descending);  P[m, r] = Qtᵀ·W;  signs as the CPU's
// orth: geqrf + orgqr (Householder), for the basis Rayleigh-Ritz reads. chol: the CPU's shifted
// CholeskyQR2, twice S = YᵀY (gemm_f32, into S's region, free until Rayleigh-Ritz), S += s·I with
// s = kGalorePotrfShift·ε·trace(S) (shift_diagonal_kernel), potrf (upper: S = RᵀR), Y := Y·R⁻¹
// (cublasStrsm); each potrf's info is kept at once (status[3]: it shares one info int).
// Every product is fp32 (gemm_f32: CUBLAS_COMPUTE_32F, no TF32).
//
// GRASS_GALORE_TIMERS=1 times the phases with events (refresh_phase_times reads them).
//
// The workspace (galore_basis_workspace_bytes, kernels/backend_sizes.cpp), regions 256-byte
// aligned, sized for either side being projected (D = max(out, in)):
//   Ωt then Zt [k, D] | Qt [k, D] | S [k, k] | W [k, r] | λ [k] | τ [k] | 4 ints: cuSOLVER's info |
//   cuSOLVER's work space, galore_solver_work_floats(D, k) floats
#include <cublas_v2.h>
#include <cusolverDn.h>

#include <algorithm>
#include <cfloat>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.cuh"
#include "kernels/lowrank_ops.h"
#include "src/core/error.h"
#include "src/core/format.h"
#include "src/core/rng.h"

#define GRASS_CUSOLVER_CHECK(call)                                                               \
  do {                                                                                           \
    const cusolverStatus_t status_ = (call);                                                     \
    GRASS_CHECK(status_ == CUSOLVER_STATUS_SUCCESS,                                              \
                std::string(#call) + " failed: cuSOLVER status " + std::to_string(int(status_))); \
  } while (0)

namespace grass::cuda {

namespace {

constexpr int kThreads = 256;

// Ωt[c][a] = normal(seed, a·k + c): element (a, c) of the CPU's row-major Ω[n, k]
__global__ void test_matrix_kernel(float* omega_t, uint64_t seed, int n, int k) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(n) * k) return;
  const int64_t c = i / n, a = i % n;
  omega_t[i] = float(normal(seed, uint64_t(a * k + c)));
}

// W[i][c] = S[k-1-c][i]: syevd's eigenvectors (rows of S, ascending) as the top r columns
__global__ void top_vectors_kernel(float* W, const float* S, int k, int r) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(k) * r) return;
  const int64_t row = i / r, c = i % r;
  W[i] = S[int64_t(k - 1 - c) * k + row];
}

// Column c of P[side, r] times the sign that makes its largest-magnitude entry (the first on
// ties) positive: one block per column, the (magnitude, index) maximum in a fixed tree order.
__global__ void sign_normalise_kernel(float* P, int side, int r) {
  __shared__ float best[kThreads];
  __shared__ int where[kThreads];
  const int c = blockIdx.x;
  float b = -1.0f;
  int w = side;
  for (int i = threadIdx.x; i < side; i += blockDim.x) {  // ascending: ties keep the first
    const float v = fabsf(P[int64_t(i) * r + c]);
    if (v > b) {
      b = v;
      w = i;
    }
  }
  best[threadIdx.x] = b;
  where[threadIdx.x] = w;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const float ob = best[threadIdx.x + half];
      const int ow = where[threadIdx.x + half];
      if (ob > best[threadIdx.x] || (ob == best[threadIdx.x] && ow < where[threadIdx.x])) {
        best[threadIdx.x] = ob;
        where[threadIdx.x] = ow;
      }
    }
    __syncthreads();
  }
  // one thread reads the peak's sign before any thread flips it (the peak is some thread's row)
  __shared__ bool flip;
  if (threadIdx.x == 0) flip = where[0] < side && P[int64_t(where[0]) * r + c] < 0.0f;
  __syncthreads();
  if (!flip) return;
  for (int i = threadIdx.x; i < side; i += blockDim.x) P[int64_t(i) * r + c] = -P[int64_t(i) * r + c];
}

// status[i] = info[i] where status[i] is still 0, for i < count: the first failure of each kind
// over the calls since the caller zeroed status.
__global__ void keep_status_kernel(int* status, const int* info, int count) {
  const int i = int(threadIdx.x);
  if (i < count && status[i] == 0) status[i] = info[i];
}

// S[k, k] += s·I, s = shift·trace(S) + FLT_MIN (the CPU's cholesky_qr2): one block, the trace
// summed in a fixed tree order. A non-finite trace (a non-finite Y) sets the diagonal to -1, so
// that potrf reports it whatever its NaN tests.
__global__ void shift_diagonal_kernel(float* S, int k, float shift) {
  __shared__ float part[kThreads];
  float sum = 0.0f;
  for (int i = threadIdx.x; i < k; i += blockDim.x) sum += S[int64_t(i) * k + i];
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  const float trace = part[0];
  const bool finite = fabsf(trace) <= FLT_MAX;  // false for NaN and ±inf
  const float s = shift * trace + FLT_MIN;
  for (int i = threadIdx.x; i < k; i += blockDim.x)
    S[int64_t(i) * k + i] = finite ? S[int64_t(i) * k + i] + s : -1.0f;
}

int64_t region(int64_t bytes) { return (bytes + 255) / 256 * 256; }

struct Workspace {
  float *z, *q, *s, *w, *lambda, *tau;
  int* info;
  float* work;
  int64_t work_floats;
};
Workspace carve(void* workspace, int64_t workspace_bytes, int64_t D, int64_t k, int64_t r) {
  char* p = static_cast<char*>(workspace);
  Workspace ws;
  const auto take = [&](int64_t bytes) {
    char* at = p;
    p += region(bytes);
    return at;
  };
  ws.z = reinterpret_cast<float*>(take(4 * k * D));
  ws.q = reinterpret_cast<float*>(take(4 * k * D));
  ws.s = reinterpret_cast<float*>(take(4 * k * k));
  ws.w = reinterpret_cast<float*>(take(4 * k * r));
  ws.lambda = reinterpret_cast<float*>(take(4 * k));
  ws.tau = reinterpret_cast<float*>(take(4 * k));
  ws.info = reinterpret_cast<int*>(take(16));
  ws.work_floats = galore_solver_work_floats(D, k);
  ws.work = reinterpret_cast<float*>(take(4 * ws.work_floats));
  GRASS_CHECK(workspace != nullptr && p - static_cast<char*>(workspace) <= workspace_bytes,
              "galore_basis: the workspace is smaller than galore_basis_workspace_bytes' layout");
  return ws;
}

// Qt[k, m] (column-major m x k) := the Q of its QR, in place
void orthonormalise(cusolverDnHandle_t solver, float* Qt, int m, int k, const Workspace& ws) {
  GRASS_CUSOLVER_CHECK(cusolverDnSgeqrf(solver, m, k, Qt, m, ws.tau, ws.work, int(ws.work_floats),
                                        ws.info));
  GRASS_CUSOLVER_CHECK(cusolverDnSorgqr(solver, m, k, k, Qt, m, ws.tau, ws.work,
                                        int(ws.work_floats), ws.info + 1));
}

// Yt[k, m] (column-major m x k) := Y·R⁻¹ twice (shifted CholeskyQR2), potrf's info kept in
// status[3] after each factorisation.
void cholesky_qr2(const Context& ctx, cusolverDnHandle_t solver, float* Yt, int m, int k,
                  const Workspace& ws, int* status) {
  const float shift = float(ops::kGalorePotrfShift) * FLT_EPSILON;
  const float one = 1.0f;
  for (int pass = 0; pass < 2; pass++) {
    gemm_f32(ctx, false, true, k, k, m, Yt, m, Yt, m, 0.0f, ws.s, k);  // S = YᵀY
    shift_diagonal_kernel<<<1, kThreads, 0, ctx.stream>>>(ws.s, k, shift);
    GRASS_LAUNCH_CHECK();
    GRASS_CUSOLVER_CHECK(cusolverDnSpotrf(solver, CUBLAS_FILL_MODE_UPPER, k, ws.s, k, ws.work,
                                          int(ws.work_floats), ws.info + 3));
    keep_status_kernel<<<1, 32, 0, ctx.stream>>>(status + 3, ws.info + 3, 1);
    GRASS_LAUNCH_CHECK();
    GRASS_CUBLAS_CHECK(cublasSetStream(ctx.blas, ctx.stream));
    GRASS_CUBLAS_CHECK(cublasStrsm(ctx.blas, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N,
                                   CUBLAS_DIAG_NON_UNIT, m, k, &one, ws.s, k, Yt, m));
  }
}

// GRASS_GALORE_TIMERS=1: an event at each phase's start on the refresh's stream; the marks of a
// refresh are read (one wait) by refresh_phase_times. Events are pooled across refreshes.
struct PhaseTimers {
  std::vector<cudaEvent_t> events;  // the pool; the first `used` are this refresh's marks
  std::vector<int> phases;          // the phase each mark starts (-1: an end)
  size_t used = 0;
  int targets = 0;
  void mark(cudaStream_t stream, int phase) {
    if (used == events.size()) {
      events.emplace_back();
      GRASS_CUDA_CHECK(cudaEventCreateWithFlags(&events.back(), cudaEventDefault));
    }
    GRASS_CUDA_CHECK(cudaEventRecord(events[used], stream));
    if (phases.size() <= used) phases.resize(used + 1);
    phases[used++] = phase;
  }
};
PhaseTimers& phase_timers() {
  static PhaseTimers timers;
  return timers;
}

}  // namespace

cusolverDnHandle_t create_solver_handle(cudaStream_t stream) {
  cusolverDnHandle_t solver = nullptr;
  GRASS_CUSOLVER_CHECK(cusolverDnCreate(&solver));
  GRASS_CUSOLVER_CHECK(cusolverDnSetStream(solver, stream));
  return solver;
}

void destroy_solver_handle(cusolverDnHandle_t solver) {
  if (solver) cusolverDnDestroy(solver);
}

int64_t batched_eig_work_bytes(cusolverDnHandle_t solver, cusolverDnParams_t params, int k,
                               int count, size_t* host_bytes) {
  size_t device = 0, host = 0;
  GRASS_CUSOLVER_CHECK(cusolverDnXsyevBatched_bufferSize(
      solver, params, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, k, CUDA_R_32F, nullptr, k,
      CUDA_R_32F, nullptr, CUDA_R_32F, &device, &host, count));
  if (host_bytes) *host_bytes = host;
  return int64_t(device);
}

cusolverDnParams_t create_solver_params() {
  cusolverDnParams_t params = nullptr;
  GRASS_CUSOLVER_CHECK(cusolverDnCreateParams(&params));
  return params;
}

void destroy_solver_params(cusolverDnParams_t params) {
  if (params) cusolverDnDestroyParams(params);
}

int64_t solver_work_floats(cusolverDnHandle_t solver, int m, int k) {
  // The queries read only the shapes; cuSOLVER's documentation has them take the pointers too.
  int geqrf = 0, orgqr = 0, syevd = 0, potrf = 0;
  GRASS_CUSOLVER_CHECK(cusolverDnSgeqrf_bufferSize(solver, m, k, nullptr, m, &geqrf));
  GRASS_CUSOLVER_CHECK(cusolverDnSorgqr_bufferSize(solver, m, k, k, nullptr, m, nullptr, &orgqr));
  GRASS_CUSOLVER_CHECK(cusolverDnSsyevd_bufferSize(solver, CUSOLVER_EIG_MODE_VECTOR,
                                                   CUBLAS_FILL_MODE_LOWER, k, nullptr, k, nullptr,
                                                   &syevd));
  GRASS_CUSOLVER_CHECK(cusolverDnSpotrf_bufferSize(solver, CUBLAS_FILL_MODE_UPPER, k, nullptr, k,
                                                   &potrf));
  return std::max({int64_t(geqrf), int64_t(orgqr), int64_t(syevd), int64_t(potrf)});
}

namespace {

// GRASS_GALORE_TIMERS=1: the start of a phase (an end: -1), and a refresh's end for `targets`
void mark(cudaStream_t stream, int phase) {
  if (ops::galore_timers_enabled()) phase_timers().mark(stream, phase);
}
void mark_end(cudaStream_t stream, int targets) {
  if (!ops::galore_timers_enabled()) return;
  phase_timers().mark(stream, -1);
  phase_timers().targets += targets;
}

// The range finder of one target up to Rayleigh-Ritz: Qt[k, m] (orthonormal) into Qt and
// S = B·Bᵀ [k, k] into S, the QRs' infos kept in status[0..1].
void sketch(const Context& ctx, cusolverDnHandle_t solver, float* Qt, float* S, const float* G,
            int out, int in, int r, bool rows, uint64_t seed, int power_iters, int oversample,
            const Workspace& ws, int* status) {
  const int m = rows ? out : in, n = rows ? in : out;
  GRASS_CHECK(r >= 1 && r <= std::min(m, n), "galore_basis: rank outside [1, min(out, in)]");
  GRASS_CHECK(power_iters >= 0 && oversample >= 0, "galore_basis: negative parameters");
  const int k = ops::galore_sketch_columns(out, in, r, oversample);
  // both sides are orthonormalised: an m x k and an n x k QR
  GRASS_CHECK(std::max(solver_work_floats(solver, m, k), solver_work_floats(solver, n, k)) <=
                  ws.work_floats,
              "galore_basis: cuSOLVER asks for more work space than galore_solver_work_floats "
              "plans for " + std::to_string(m) + " x " + std::to_string(n) + ", k = " +
                  std::to_string(k));
  // op(G) for A (Zt = Qt·A) and Aᵀ (Qt = Zt·Aᵀ): G[out, in] is A for rows, Aᵀ for cols
  const auto times_a = [&](const float* Qt, float* Zt) {  // Zt[k, n] = Qt[k, m]·A[m, n]
    gemm_f32(ctx, false, !rows, k, n, m, Qt, m, G, in, 0.0f, Zt, n);
  };
  const auto times_at = [&](const float* Zt, float* Qt) {  // Qt[k, m] = Zt[k, n]·Aᵀ[n, m]
    gemm_f32(ctx, false, rows, k, m, n, Zt, n, G, in, 0.0f, Qt, m);
  };
  const auto phase = [&](ops::GalorePhase p) { mark(ctx.stream, int(p)); };
  phase(ops::GalorePhase::TestMatrix);
  test_matrix_kernel<<<unsigned(ceil_div(int64_t(n) * k, kThreads)), kThreads, 0, ctx.stream>>>(
      ws.z, seed, n, k);
  GRASS_LAUNCH_CHECK();
  phase(ops::GalorePhase::Gemm);
  times_at(ws.z, Qt);
  for (int it = 0; it < power_iters; it++) {
    phase(ops::GalorePhase::Qr);
    cholesky_qr2(ctx, solver, Qt, m, k, ws, status);
    phase(ops::GalorePhase::Gemm);
    times_a(Qt, ws.z);
    phase(ops::GalorePhase::Qr);
    cholesky_qr2(ctx, solver, ws.z, n, k, ws, status);
    phase(ops::GalorePhase::Gemm);
    times_at(ws.z, Qt);
  }
  phase(ops::GalorePhase::Qr);
  orthonormalise(solver, Qt, m, k, ws);
  // Rayleigh-Ritz: B = Zt = Qt·A, S = B·Bᵀ
  phase(ops::GalorePhase::Gemm);
  times_a(Qt, ws.z);
  gemm_f32(ctx, false, true, k, k, n, ws.z, n, ws.z, n, 0.0f, S, k);
  keep_status_kernel<<<1, 32, 0, ctx.stream>>>(status, ws.info, 2);
  GRASS_LAUNCH_CHECK();
}

// P[m, r] from Qt[k, m] and S[k, k] holding the eigenvectors: W = the top r, P = Qtᵀ·W, signs
void vectors_to_p(const Context& ctx, float* P, const float* Qt, const float* S, int m, int k,
                  int r, const Workspace& ws) {
  top_vectors_kernel<<<unsigned(ceil_div(int64_t(k) * r, kThreads)), kThreads, 0, ctx.stream>>>(
      ws.w, S, k, r);
  GRASS_LAUNCH_CHECK();
  gemm_f32(ctx, true, false, m, r, k, Qt, m, ws.w, r, 0.0f, P, r);  // P[m, r] = Qtᵀ·W
  sign_normalise_kernel<<<unsigned(r), kThreads, 0, ctx.stream>>>(P, m, r);
  GRASS_LAUNCH_CHECK();
}

}  // namespace

void galore_basis_randomized(const Context& ctx, cusolverDnHandle_t solver, float* P,
                             const float* G, int out, int in, int r, bool rows, uint64_t seed,
                             int power_iters, int oversample, void* workspace,
                             int64_t workspace_bytes, int* status) {
  const int m = rows ? out : in, k = ops::galore_sketch_columns(out, in, r, oversample);
  const Workspace ws = carve(workspace, workspace_bytes, std::max(out, in), k, r);
  sketch(ctx, solver, ws.q, ws.s, G, out, in, r, rows, seed, power_iters, oversample, ws, status);
  mark(ctx.stream, int(ops::GalorePhase::Eigensolver));
  GRASS_CUSOLVER_CHECK(cusolverDnSsyevd(solver, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER,
                                        k, ws.s, k, ws.lambda, ws.work, int(ws.work_floats),
                                        ws.info + 2));
  keep_status_kernel<<<1, 32, 0, ctx.stream>>>(status + 2, ws.info + 2, 1);
  GRASS_LAUNCH_CHECK();
  mark(ctx.stream, int(ops::GalorePhase::P));
  vectors_to_p(ctx, P, ws.q, ws.s, m, k, r, ws);
  mark_end(ctx.stream, 1);
}

void galore_sketch(const Context& ctx, cusolverDnHandle_t solver, const float* G, int out, int in,
                   int r, bool rows, uint64_t seed, int power_iters, int oversample, void* batch,
                   const GaloreBatchLayout& layout, int slot, void* workspace,
                   int64_t workspace_bytes, int* status) {
  const int k = ops::galore_sketch_columns(out, in, r, oversample);
  GRASS_CHECK(int64_t(k) * (rows ? out : in) <= layout.q_stride,
              "galore_sketch: the batch's slots are smaller than this target's Q");
  const Workspace ws = carve(workspace, workspace_bytes, std::max(out, in), k, r);
  const GaloreSlot at = galore_slot(batch, layout, slot, k);
  sketch(ctx, solver, at.Q, at.S, G, out, in, r, rows, seed, power_iters, oversample, ws, status);
  mark(ctx.stream, -1);
}

void galore_finish(const Context& ctx, cusolverDnHandle_t solver, cusolverDnParams_t params,
                   float* const* P, const int* sides, int count, int k, int r, void* batch,
                   const GaloreBatchLayout& layout, std::vector<char>& host_work, void* workspace,
                   int64_t workspace_bytes, int* status) {
  char* b = static_cast<char*>(batch);
  size_t host_bytes = 0;
  const int64_t device_bytes = batched_eig_work_bytes(solver, params, k, count, &host_bytes);
  GRASS_CHECK(device_bytes <= layout.work_bytes,
              "galore_finish: cuSOLVER asks for more batched eigensolver work space than the "
              "layout has (prepare_galore_batch checks it)");
  if (host_work.size() < host_bytes) host_work.resize(host_bytes);
  int max_side = 0;
  for (int i = 0; i < count; i++) max_side = std::max(max_side, sides[i]);
  const Workspace ws = carve(workspace, workspace_bytes, max_side, k, r);
  mark(ctx.stream, int(ops::GalorePhase::Eigensolver));
  int* info = reinterpret_cast<int*>(b + layout.info);
  GRASS_CUSOLVER_CHECK(cusolverDnXsyevBatched(
      solver, params, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, k, CUDA_R_32F,
      b + layout.s, k, CUDA_R_32F, b + layout.lambda, CUDA_R_32F, b + layout.work,
      size_t(layout.work_bytes), host_work.data(), host_bytes, info, count));
  mark(ctx.stream, int(ops::GalorePhase::P));
  for (int i = 0; i < count; i++) {
    keep_status_kernel<<<1, 32, 0, ctx.stream>>>(status + 2, info + i, 1);
    GRASS_LAUNCH_CHECK();
    const GaloreSlot at = galore_slot(batch, layout, i, k);
    vectors_to_p(ctx, P[i], at.Q, at.S, sides[i], k, r, ws);
  }
  mark_end(ctx.stream, count);
}

void check_batched_eig_work(cusolverDnHandle_t solver, cusolverDnParams_t params, int k,
                            int slots, const GaloreBatchLayout& layout) {
  for (int count = 1; count <= slots; count++) {
    const int64_t asked = batched_eig_work_bytes(solver, params, k, count);
    if (asked > layout.work_bytes)
      throw UserError("GaLore's batched refresh: cuSOLVER asks for " + format_bytes(asked) +
                      " of work space for " + std::to_string(count) + " eigenproblems of " +
                      std::to_string(k) + " x " + std::to_string(k) + ", the plan has " +
                      format_bytes(layout.work_bytes) +
                      " (galore_batch_layout, kernels/backend_sizes.cpp, is short: a bug); "
                      "optimizer.svd_batch \"none\" avoids it");
  }
}

ops::GaloreRefreshTimes refresh_phase_times() {
  PhaseTimers& timers = phase_timers();
  ops::GaloreRefreshTimes times;
  times.targets = timers.targets;
  if (timers.used > 0) GRASS_CUDA_CHECK(cudaEventSynchronize(timers.events[timers.used - 1]));
  for (size_t i = 0; i + 1 < timers.used; i++) {
    if (timers.phases[i] < 0) continue;
    float ms = 0;
    GRASS_CUDA_CHECK(cudaEventElapsedTime(&ms, timers.events[i], timers.events[i + 1]));
    times.ms[timers.phases[i]] += ms;
  }
  timers.used = 0;
  timers.targets = 0;
  return times;
}

}  // namespace grass::cuda
