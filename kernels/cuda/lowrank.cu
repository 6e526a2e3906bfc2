// GaLore and FLORA on the GPU (the methods: docs/lowrank.md; the reference:
// kernels/cpu/lowrank.cpp): the projected gradient straight from the activations (two GEMMs
// through a bf16 copy of P), FLORA's projection, FLORA's moment transfer and GaLore's Adam step,
// whose dense back-projection is one GEMM.
//
// Where the work runs:
//   galore_basis      not here: the randomized range finder in galore_basis.cu (cuSOLVER), or
//                     with optimizer.svd "exact" the host's LAPACK (ops::galore_basis<float>, the
//                     CPU backend's SVD bit for bit) in CudaBackend::galore_basis, at the cost of
//                     one out x in fp32 download (a wait) per target per refresh.
//   flora_projection  a kernel drawing core/rng.h's stream, so a FLORA step regenerates P with no
//                     host round trip. Its Box-Muller takes log and cos in double on the device,
//                     which may differ from the host's in the last bits of a double: P agrees
//                     with the CPU backend's to fp32 rounding, and every GPU run and rank draws
//                     the same bits.
//   the rest          kernels and cuBLASLt GEMMs (gemm.cuh) on ctx.stream.
//
// No atomics: every sum has a fixed order (the GEMMs' determinism: gemm.cu), so two identical
// calls give identical bits.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/quant8.cuh"
#include "src/core/error.h"
#include "src/core/rng.h"

namespace grass::cuda {

namespace {

constexpr int kThreads = 256;

// P[i] = normal(stream, i) / sqrt_r: FLORA's projection, one thread per element
__global__ void flora_projection_kernel(float* P, uint64_t stream, int64_t n, double sqrt_r) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) P[i] = float(normal(stream, uint64_t(i)) / sqrt_r);
}

int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

// The workspace regions (cuda_ops.h): Pt, the direction, the bound's Σ d², then pure bf16's
// fp32 chunk.
struct Workspace {
  bf16* Pt;              // [r, side]
  bf16* direction;       // [r, in] (rows) or [out, r] (cols)
  double* sum_squares;   // one double
  float* update;         // [update_rows, in]; null when none fits
  int64_t update_rows;
};
Workspace carve(void* workspace, int64_t workspace_bytes, int out, int in, int r) {
  const int64_t half = align16(2 * int64_t(r) * std::max(out, in));
  const int64_t prefix = 2 * half + 16;
  GRASS_CHECK(workspace != nullptr && workspace_bytes >= prefix,
              "lowrank: the workspace is smaller than lowrank_workspace_bytes' layout");
  char* base = static_cast<char*>(workspace);
  Workspace w;
  w.Pt = reinterpret_cast<bf16*>(base);
  w.direction = reinterpret_cast<bf16*>(base + half);
  w.sum_squares = reinterpret_cast<double*>(base + 2 * half);
  w.update_rows = std::min<int64_t>(out, (workspace_bytes - prefix) / (4 * int64_t(in)));
  // several chunks: each starts at a multiple of 8 rows (aligned rows where the pitch allows)
  if (w.update_rows < out && w.update_rows >= 8) w.update_rows -= w.update_rows % 8;
  w.update = w.update_rows > 0 ? reinterpret_cast<float*>(base + prefix) : nullptr;
  return w;
}

// Pt[j, i] = round-to-nearest(P[i, j]): P fp32 [side, r] -> Pt bf16 [r, side], the operand both
// GEMMs read as a weight. One thread per element of P (coalesced reads).
__global__ void transpose_to_bf16(bf16* Pt, const float* P, int side, int r) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(side) * r) return;
  const int64_t i = idx / r;
  const int j = int(idx % r);
  Pt[int64_t(j) * side + i] = __float2bfloat16_rn(P[idx]);
}

void write_Pt(const Context& ctx, bf16* Pt, const float* P, int side, int r) {
  const int64_t n = int64_t(side) * r;
  transpose_to_bf16<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(Pt, P, side, r);
  GRASS_LAUNCH_CHECK();
}

// C[i, j] = Σ_k P_old[k, i]·P_new[k, j] in fp32, k in order: C = P_oldᵀ·P_new [r, r], from
// P_old, P_new [side, r]. One thread per element of C.
__global__ void projection_gram(float* C, const float* P_old, const float* P_new, int side, int r) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(r) * r) return;
  const int i = int(idx / r), j = int(idx % r);
  float sum = 0.0f;
  for (int k = 0; k < side; k++)
    sum = fmaf(P_old[int64_t(k) * r + i], P_new[int64_t(k) * r + j], sum);
  C[idx] = sum;
}

// copy[n] = float(m[n]): the old moment, read while m is rewritten.
template <typename S>
__global__ void state_to_f32(float* copy, const S* m, int64_t n) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < n) copy[idx] = to_f32(m[idx]);
}

// rows: m[i, c] = Σ_k C[k, i]·copy[k, c]  (m = Cᵀ·copy, [r, in]);
// cols: m[o, j] = Σ_k copy[o, k]·C[k, j]  (m = copy·C, [out, r]).
// One thread per element of m, k in order, fp32; the store rounds stochastically in bf16.
template <typename S>
__global__ void transfer_moment(S* m, const float* C, const float* copy, int out, int in, int r,
                                bool rows, uint64_t seed) {
  const int64_t n = int64_t(r) * (rows ? in : out);
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  float sum = 0.0f;
  if (rows) {
    const int i = int(idx / in), c = int(idx % in);
    for (int k = 0; k < r; k++) sum = fmaf(C[int64_t(k) * r + i], copy[int64_t(k) * in + c], sum);
  } else {
    const int64_t o = idx / r;
    const int j = int(idx % r);
    for (int k = 0; k < r; k++) sum = fmaf(copy[o * r + k], C[int64_t(k) * r + j], sum);
  }
  store_state(m + idx, sum, seed, uint64_t(idx));
}

// The scalars of one step of ops::lowrank_adam_update (adam_scalars()), narrowed where the CPU
// narrows them.
struct LowRankStep {
  double grad_scale;   // with *clip (the clipping coefficient, device memory) when set
  const double* clip;
  float beta1, beta2, eps;
  float one_minus_beta1, one_minus_beta2;  // computed in double, then narrowed
  float scale;                             // -lr·sqrt(1-b2^t)/(1-b1^t)·alpha·decay
  float decay;                             // 1 - lr·weight_decay
  uint64_t seed_param, seed_m, seed_v;     // stochastic rounding streams (pure bf16 only)
};

// Adam on R·grad_scale; m, v in their storage (S = float: bf16-mixed, S = bf16: pure bf16 with
// stochastic rounding), and direction[n] = bf16(scale·m / (sqrt(v) + eps)) from the unrounded
// moments, for the back-projection GEMM. R, m, v, direction: [r, in] or [out, r].
template <typename S>
__global__ void lowrank_adam_direction(bf16* direction, const S* R, S* m, S* v, int64_t n,
                                       LowRankStep k) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const float g = to_f32(R[idx]) * float(grad_scale_of(k.grad_scale, k.clip));
  const float mi = k.beta1 * to_f32(m[idx]) + k.one_minus_beta1 * g;
  const float vi = k.beta2 * to_f32(v[idx]) + k.one_minus_beta2 * g * g;
  store_state(m + idx, mi, k.seed_m, uint64_t(idx));
  store_state(v + idx, vi, k.seed_v, uint64_t(idx));
  direction[idx] = __float2bfloat16_rn(k.scale * (mi / (sqrtf(vi) + k.eps)));
}

// The same from 8-bit moments: the element op of kernels/cuda/quant8.cuh, whose output is the
// direction; a non-finite g leaves a zero direction and zero moments. S: R's storage.
template <typename S>
struct LowRankQ8 {
  bf16* direction;
  const S* R;
  LowRankStep k;
  float grad_scale = 0;  // prepare(): with the clipping coefficient, read once

  __device__ void prepare() { grad_scale = float(grad_scale_of(k.grad_scale, k.clip)); }
  __device__ bool reads_weight() const { return false; }
  __device__ void position(int64_t, int64_t& row, int64_t& col) const { row = col = 0; }
  __device__ float gradient(int64_t i) const { return to_f32(R[i]); }
  __device__ float weight(int64_t, int64_t, int64_t) const { return 0.0f; }
  __device__ float step(int64_t, int64_t, int64_t, float g, float, float& m, float& v) const {
    g *= grad_scale;
    adam_moments_rn(m, v, g, k.beta1, k.one_minus_beta1, k.beta2, k.one_minus_beta2);
    float d = k.scale * (m / (sqrtf(v) + k.eps));
    if (!quant8_finite(g) || !quant8_finite(v)) m = v = d = 0.0f;
    return d;
  }
  __device__ void put(int64_t i, int64_t, int64_t, float d) const {
    direction[i] = __float2bfloat16_rn(d);
  }
  __device__ void gradient8(int64_t i0, float (&x)[8]) const { load8(R + i0, x); }
  __device__ void weight8(int64_t, float (&x)[8]) const {
    for (float& w : x) w = 0.0f;
  }
  __device__ void put8(int64_t i0, const float (&d)[8]) const { store8(direction + i0, d); }
};

// The step on quant8.cuh's drivers: the warp driver (elements [0, n), whole spans of 256) and the
// thread-block driver (from element `from` on, or the per-feature layout).
template <typename S>
__global__ void __launch_bounds__(kQuant8Threads, 4)
    lowrank_adam_direction_q8(LowRankQ8<S> op, Quant8Moments q, int64_t n, const Quant8Map map_m,
                              const Quant8Map map_v) {
  quant8_warp_step(op, q, n, map_m, map_v);
}
template <typename S>
__global__ void __launch_bounds__(kQuant8Threads, 4)
    lowrank_adam_direction_q8_block(LowRankQ8<S> op, Quant8Moments q, Quant8Layout layout,
                                    int64_t from, const Quant8Map map_m, const Quant8Map map_v) {
  quant8_block_step(op, q, layout, from, map_m, map_v);
}

template <typename S>
void launch_lowrank_adam_q8(const Context& ctx, const LowRankQ8<S>& op, const Quant8Moments& q,
                            const Quant8Layout& layout) {
  const Quant8Map& qm = quant8_map(true);
  const Quant8Map& qv = quant8_map(false);
  const bool aligned = quant8_codes_aligned(q) && aligned16(op.R) && aligned16(op.direction);
  const int64_t end = quant8_warp_end(layout, aligned);
  if (end > 0) {
    lowrank_adam_direction_q8<<<quant8_warp_grid(end), kQuant8Threads, 0, ctx.stream>>>(op, q, end,
                                                                                       qm, qv);
    GRASS_LAUNCH_CHECK();
  }
  if (end < layout.rows * layout.cols) {
    lowrank_adam_direction_q8_block<<<quant8_block_grid(layout, end), kQuant8Threads, 0,
                                      ctx.stream>>>(op, q, layout, end, qm, qv);
    GRASS_LAUNCH_CHECK();
  }
}

// The update's RMS bound on the direction d[n] = scale·N (scale < 0 or = 0): with *sum_squares =
// Σ d², RMS(d) = sqrt(Σ d² / n) against limit = max_rms·|scale|·(1-b1^t)/sqrt(1-b2^t), the bound on
// RMS(N̂) carried to d; d *= limit / RMS(d) where it exceeds the limit, so a bf16 d is rounded
// twice only on a bounded step. One thread per element, each deriving the factor.
__global__ void bound_direction_rms(bf16* direction, int64_t n, const double* sum_squares,
                                    double limit) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const double rms = sqrt(*sum_squares / double(n));
  if (rms <= limit) return;
  direction[idx] = __float2bfloat16_rn(__bfloat162float(direction[idx]) * float(limit / rms));
}

// Pure bf16: param[first + i] = SR(decay·param[first + i] + update[i]) for the n elements of one
// chunk of whole rows (update fp32 [rows_c, in]); the counter is the element's index in w.
__global__ void apply_update_pure(bf16* param, const float* update, int64_t first, int64_t n,
                                  float decay, uint64_t seed) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t e = first + i;
  const float w = decay * __bfloat162float(param[e]) + update[i];
  param[e] = stochastic_round_bf16(w, seed, uint64_t(e));
}

// C[rows_c, in] (+)= back(direction) for rows [o0, o0 + rows_c) of w, as one GEMM:
//   rows: P[o0:, :]·dir[r, in], P[o0:, :] = (Pt[:, o0:])ᵀ (ld out);
//   cols: dir[o0:, :][rows_c, r]·Pt[r, in].
void back_project(const Context& ctx, void* C, cudaDataType_t c_type, float beta, const bf16* Pt,
                  const bf16* direction, int64_t o0, int64_t rows_c, int out, int in, int r,
                  bool rows) {
  if (rows)
    gemm_bf16(ctx, true, false, rows_c, in, r, Pt + o0, out, direction, in, beta, C, c_type, in);
  else
    gemm_bf16(ctx, false, false, rows_c, in, r, direction + o0 * r, r, Pt, in, beta, C, c_type, in);
}

}  // namespace

int64_t lowrank_workspace_prefix_bytes(int out, int in, int r) {
  return 2 * align16(2 * int64_t(r) * std::max(out, in)) + 16;
}

void lowrank_compressed_grad(const Context& ctx, void* R, GradType gtype, bf16* scratch,
                             void* workspace, int64_t workspace_bytes, const bf16* dy,
                             const bf16* x, const float* P, int64_t N, int in, int out, int r,
                             bool rows) {
  GRASS_CHECK(N >= 0 && r >= 1 && out >= 1 && in >= 1, "lowrank_compressed_grad: bad shape");
  if (N == 0) return;  // nothing to add
  const Workspace ws = carve(workspace, workspace_bytes, out, in, r);
  const int side = rows ? out : in;
  write_Pt(ctx, ws.Pt, P, side, r);  // Pt bf16 [r, side]
  if (rows) {
    // scratch[N, r] = dy[N, out]·P[out, r] = dy·Ptᵀ
    linear_forward(ctx, scratch, dy, ws.Pt, N, out, r);
    // R[r, in] += scratch[N, r]ᵀ·x[N, in]
    linear_backward_dw(ctx, R, gtype, scratch, x, N, in, r);
  } else {
    // scratch[N, r] = x[N, in]·P[in, r] = x·Ptᵀ
    linear_forward(ctx, scratch, x, ws.Pt, N, in, r);
    // R[out, r] += dy[N, out]ᵀ·scratch[N, r]
    linear_backward_dw(ctx, R, gtype, dy, scratch, N, r, out);
  }
}

void flora_projection(const Context& ctx, float* P, uint64_t seed, int64_t tensor, int64_t refresh,
                      int side, int r) {
  // P [side, r]: element i is normal number i of the stream of (seed, refresh, tensor), over
  // sqrt(r), as ops::flora_projection draws it
  const int64_t n = int64_t(side) * r;
  if (n == 0) return;
  const uint64_t stream = derive_seed(derive_seed(seed, uint64_t(refresh)), uint64_t(tensor));
  flora_projection_kernel<<<unsigned(ceil_div(n, kThreads)), kThreads, 0, ctx.stream>>>(
      P, stream, n, std::sqrt(double(r)));
  GRASS_LAUNCH_CHECK();
}

void flora_transfer(const Context& ctx, void* m, GradType stype, float* scratch,
                    const float* P_old, const float* P_new, int out, int in, int r, bool rows,
                    uint64_t seed) {
  GRASS_CHECK(r >= 1 && out >= 1 && in >= 1, "flora_transfer: bad shape");
  const int side = rows ? out : in;
  const int64_t n = int64_t(r) * (rows ? in : out);  // numel(m)
  float* C = scratch;                                 // [r, r]
  float* copy = scratch + int64_t(r) * r;             // m's old value, [r, in] or [out, r]
  projection_gram<<<grid_for(int64_t(r) * r, kThreads), kThreads, 0, ctx.stream>>>(C, P_old, P_new,
                                                                                   side, r);
  GRASS_LAUNCH_CHECK();
  const uint64_t stream_seed = rounding_stream_seed(seed, 0, kRoundFirstMoment);
  if (stype == GradType::F32) {
    float* mf = static_cast<float*>(m);
    GRASS_CUDA_CHECK(cudaMemcpyAsync(copy, mf, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice,
                                     ctx.stream));
    transfer_moment<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(mf, C, copy, out, in, r,
                                                                        rows, stream_seed);
  } else {
    bf16* mb = static_cast<bf16*>(m);
    state_to_f32<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(copy, mb, n);
    GRASS_LAUNCH_CHECK();
    transfer_moment<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(mb, C, copy, out, in, r,
                                                                        rows, stream_seed);
  }
  GRASS_LAUNCH_CHECK();
}

namespace {

// The scalars as ops::lowrank_adam_update computes them (double, then narrowed).
LowRankStep lowrank_step(const AdamArgs& a, double alpha, uint64_t seed) {
  const AdamScalars s = adam_scalars(a);
  const double step_size = s.lr * s.bias_correction2_sqrt / s.bias_correction1;
  LowRankStep k;
  k.grad_scale = a.grad_scale;
  k.clip = a.clip;
  k.beta1 = float(s.beta1);
  k.beta2 = float(s.beta2);
  k.eps = float(s.eps);
  k.one_minus_beta1 = float(s.one_minus_beta1);
  k.one_minus_beta2 = float(s.one_minus_beta2);
  k.scale = float(-step_size * alpha * s.decay);
  k.decay = float(s.decay);
  k.seed_param = rounding_stream_seed(seed, a.step, kRoundWeight);
  k.seed_m = rounding_stream_seed(seed, a.step, kRoundFirstMoment);
  k.seed_v = rounding_stream_seed(seed, a.step, kRoundSecondMoment);
  return k;
}

// After the direction: its RMS bound (max_rms > 0) and the back-projection into the weight.
void apply_direction(const Context& ctx, const Workspace& ws, const LowRankStep& k, bf16* param,
                     float* master, double* reduce_scratch, const float* P, int out, int in, int r,
                     bool rows, double alpha, double max_rms, const AdamArgs& a) {
  const int side = rows ? out : in;
  const int64_t n = int64_t(r) * (rows ? in : out);
  if (max_rms > 0) {  // the RMS bound, on the device: Σ d², then d scaled where it exceeds
    GRASS_CHECK(reduce_scratch != nullptr, "lowrank_adam_update: the RMS bound needs reduce_scratch");
    GRASS_CUDA_CHECK(cudaMemsetAsync(ws.sum_squares, 0, sizeof(double), ctx.stream));
    sum_squares(ctx, ws.sum_squares, ws.direction, GradType::BF16, n, reduce_scratch);
    const AdamScalars s = adam_scalars(a);
    const double step_size = s.lr * s.bias_correction2_sqrt / s.bias_correction1;
    const double limit = max_rms * std::abs(step_size * alpha * s.decay) * s.bias_correction1 /
                         s.bias_correction2_sqrt;
    bound_direction_rms<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(
        ws.direction, n, ws.sum_squares, limit);
    GRASS_LAUNCH_CHECK();
  }
  write_Pt(ctx, ws.Pt, P, side, r);  // Pt bf16 [r, side]

  if (master) {
    // master[out, in] = decay·master + back(direction): one GEMM with β = decay, then the bf16
    // compute copy param[out, in] = round-to-nearest(master).
    back_project(ctx, master, CUDA_R_32F, k.decay, ws.Pt, ws.direction, 0, out, out, in, r, rows);
    f32_to_bf16(ctx, param, master, int64_t(out) * in);
    return;
  }
  // Pure bf16, chunks of whole rows: update[rows_c, in] = back(direction) rows [o0, o0+rows_c)
  // in fp32, then param = SR(decay·param + update).
  for (int64_t o0 = 0; o0 < out; o0 += ws.update_rows) {
    const int64_t rows_c = std::min<int64_t>(ws.update_rows, out - o0);
    back_project(ctx, ws.update, CUDA_R_32F, 0.0f, ws.Pt, ws.direction, o0, rows_c, out, in, r,
                 rows);
    const int64_t chunk = rows_c * in;
    apply_update_pure<<<grid_for(chunk, kThreads), kThreads, 0, ctx.stream>>>(
        param, ws.update, o0 * in, chunk, k.decay, k.seed_param);
    GRASS_LAUNCH_CHECK();
  }
}

}  // namespace

void lowrank_adam_update(const Context& ctx, bf16* param, float* master, const void* R, void* m,
                         void* v, void* workspace, int64_t workspace_bytes, double* reduce_scratch,
                         const float* P, int out, int in, int r, bool rows, double alpha,
                         double max_rms, const AdamArgs& a, uint64_t seed) {
  GRASS_CHECK(a.step >= 1, "lowrank_adam_update: step counts from 1");
  GRASS_CHECK(r >= 1 && out >= 1 && in >= 1, "lowrank_adam_update: bad shape");
  const Workspace ws = carve(workspace, workspace_bytes, out, in, r);
  GRASS_CHECK(master || ws.update_rows >= 1,
              "lowrank_adam_update: pure bf16 needs the workspace's fp32 back-projection rows");
  const int64_t n = int64_t(r) * (rows ? in : out);  // numel(R) = numel(m) = numel(v)
  const LowRankStep k = lowrank_step(a, alpha, seed);
  // Adam on R; the scaled direction goes to the workspace as bf16 [r, in] or [out, r].
  if (!master)
    lowrank_adam_direction<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(
        ws.direction, static_cast<const bf16*>(R), static_cast<bf16*>(m), static_cast<bf16*>(v),
        n, k);
  else
    lowrank_adam_direction<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(
        ws.direction, static_cast<const float*>(R), static_cast<float*>(m),
        static_cast<float*>(v), n, k);
  GRASS_LAUNCH_CHECK();
  apply_direction(ctx, ws, k, param, master, reduce_scratch, P, out, in, r, rows, alpha, max_rms, a);
}

void lowrank_adam_update_q8(const Context& ctx, bf16* param, float* master, const void* R,
                            const Quant8Moments& q, bool by_columns, void* workspace,
                            int64_t workspace_bytes, double* reduce_scratch, const float* P,
                            int out, int in, int r, bool rows, double alpha, double max_rms,
                            const AdamArgs& a, uint64_t seed) {
  GRASS_CHECK(a.step >= 1, "lowrank_adam_update_q8: step counts from 1");
  GRASS_CHECK(r >= 1 && out >= 1 && in >= 1, "lowrank_adam_update_q8: bad shape");
  check_quant8_block(q.block, "lowrank_adam_update_q8");
  const Workspace ws = carve(workspace, workspace_bytes, out, in, r);
  GRASS_CHECK(master || ws.update_rows >= 1,
              "lowrank_adam_update_q8: pure bf16 needs the workspace's fp32 back-projection rows");
  const LowRankStep k = lowrank_step(a, alpha, seed);
  const Quant8Layout layout = projected_quant8_layout(out, in, r, rows, q.block, by_columns);
  if (!master)
    launch_lowrank_adam_q8(ctx, LowRankQ8<bf16>{ws.direction, static_cast<const bf16*>(R), k}, q,
                           layout);
  else
    launch_lowrank_adam_q8(ctx, LowRankQ8<float>{ws.direction, static_cast<const float*>(R), k}, q,
                           layout);
  apply_direction(ctx, ws, k, param, master, reduce_scratch, P, out, in, r, rows, alpha, max_rms, a);
}

void flora_transfer_q8(const Context& ctx, const Quant8Moments& q, bool by_columns, float* scratch,
                       const float* P_old, const float* P_new, int out, int in, int r, bool rows) {
  GRASS_CHECK(r >= 1 && out >= 1 && in >= 1, "flora_transfer_q8: bad shape");
  const int side = rows ? out : in;
  const int64_t n = int64_t(r) * (rows ? in : out);  // numel(m)
  float* C = scratch;                                 // [r, r]
  float* copy = scratch + int64_t(r) * r;             // m's old value, decoded
  float* moved = copy + n;                            // the transferred m, before requantizing
  const Quant8Layout layout = projected_quant8_layout(out, in, r, rows, q.block, by_columns);
  projection_gram<<<grid_for(int64_t(r) * r, kThreads), kThreads, 0, ctx.stream>>>(C, P_old, P_new,
                                                                                   side, r);
  GRASS_LAUNCH_CHECK();
  dequantize_layout(ctx, quant8_map(true), q.m, q.absmax_m, layout, copy);
  transfer_moment<<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(moved, C, copy, out, in, r,
                                                                      rows, 0);
  GRASS_LAUNCH_CHECK();
  quantize_layout(ctx, quant8_map(true), moved, layout, q.m, q.absmax_m);
}

}  // namespace grass::cuda
