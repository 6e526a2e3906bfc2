// GRASS on the GPU (the method: docs/grass.md; the reference: kernels/cpu/grass.cpp):
// the compressed gradient straight from the activations (a gather, then one GEMM), the slice
// norms and the gather that choose and fill it at a refresh, and the fused Adam step with the
// sparse update of the weight.
//
// No atomics anywhere: σ is sorted, so the copies of a repeated slice sit next to each other,
// and one thread per element of a slice walks all of them in j order. Norms sum in double in a
// fixed order. Two identical calls give identical bits.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/quant8.cuh"
#include "src/core/error.h"

namespace grass::cuda {

namespace {

constexpr int kThreads = 256;

// scratch[n, j] = ρ_j · source[n, σ_j]: the selected columns of source[N, width], in bf16 for the
// GEMM. One thread per element of scratch[N, r]. Index: uint32_t where N·r fits (a 32-bit / and
// % per element; 64-bit ones are a few dozen instructions each), else int64_t.
template <typename Index>
__global__ void gather_scaled_columns(bf16* scratch, const bf16* source, const int32_t* sigma,
                                      const float* rho, Index total, int width, int r) {
  const Index idx = Index(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const Index n = idx / Index(r);
  const int j = int(idx % Index(r));
  scratch[idx] = __float2bfloat16_rn(__bfloat162float(source[int64_t(n) * width + sigma[j]]) * rho[j]);
}

// norms_sq[i] = Σ_c g[i, c]² for one row per block: each thread sums a fixed stride of the row,
// then a fixed tree adds the threads' sums.
__global__ void row_norms_sq(double* norms_sq, const float* g, int in) {
  __shared__ double partial[kThreads];
  const float* row = g + int64_t(blockIdx.x) * in;
  double sum = 0;
  for (int c = threadIdx.x; c < in; c += kThreads) {
    const double value = row[c];
    sum += value * value;
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) norms_sq[blockIdx.x] = partial[0];
}

// norms_sq[c] = Σ_i g[i, c]² (+ norms_sq[c] when accumulating a chunk of rows) for a tile of
// kColTile columns per block: each of kRowLanes lanes sums every kRowLanes-th row (reads
// coalesced along the row), then lane 0 adds the lanes in order.
constexpr int kColTile = 32, kRowLanes = 8;
__global__ void col_norms_sq(double* norms_sq, const float* g, int out, int in, bool accumulate) {
  __shared__ double partial[kRowLanes][kColTile];
  const int c = blockIdx.x * kColTile + threadIdx.x;
  double sum = 0;
  if (c < in)
    for (int i = threadIdx.y; i < out; i += kRowLanes) {
      const double value = g[int64_t(i) * in + c];
      sum += value * value;
    }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= in) return;
  double total = 0;
  for (int lane = 0; lane < kRowLanes; lane++) total += partial[lane][threadIdx.x];
  norms_sq[c] = accumulate ? norms_sq[c] + total : total;
}

// The scalars of one Adam step, prepared on the host (adam_scalars()).
struct AdamStep {
  double grad_scale;   // with *clip (the clipping coefficient, device memory) when set
  const double* clip;
  float beta1, beta2, eps;
  float one_minus_beta1, one_minus_beta2;
  float bias_correction1;               // 1 - beta1^step
  float bias_correction2_sqrt;          // sqrt(1 - beta2^step)
  float step_size;                      // lr · alpha
  float decay;                          // 1 - lr · weight_decay
  bool apply_decay;                     // weight_decay > 0
  ProximalTerm proximal;                // its anchor S-typed like gc
  uint64_t seed_param, seed_m, seed_v;  // stochastic rounding streams (pure bf16 only)
};

// One thread per element e of one slice occurrence j (rows: e = column of w, grid.y = j;
// cols: e = row of w, flat index e·r + j). The thread of the first occurrence of σ_j owns the
// weight element: it applies the decay once, then for every occurrence j' of the same slice (in
// j order) updates m, v at (j', e) and subtracts lr·alpha·ρ_j'·Δ. Threads of later occurrences
// exit: their m, v were updated by the owner.
//   S = float: mixed storage (master is the weight, param its bf16 copy);
//   S = bf16:  pure bf16 storage (param is the weight, master is null).
template <typename S>
__global__ void grass_adam_kernel(bf16* param, float* master, const S* gc, S* m, S* v,
                                  const int32_t* sigma, const float* rho, int out, int in, int r,
                                  bool rows, AdamStep k) {
  constexpr bool kPure = std::is_same_v<S, bf16>;
  int j, e;
  if (rows) {
    j = blockIdx.y;
    e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= in) return;
  } else {  // out·r < 2^32 (checked at the launch): 32-bit / and %
    const unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= unsigned(out) * unsigned(r)) return;
    e = int(idx / unsigned(r));
    j = int(idx % unsigned(r));
  }
  const int32_t slice = sigma[j];
  if (j > 0 && sigma[j - 1] == slice) return;  // not the first occurrence

  const int64_t w_index = rows ? int64_t(slice) * in + e : int64_t(e) * in + slice;
  float w;
  if constexpr (kPure)
    w = __bfloat162float(param[w_index]);
  else
    w = master[w_index];
  const float w_before = w;  // what the proximal term reads
  if (k.apply_decay) w *= k.decay;
  for (int jj = j; jj < r && sigma[jj] == slice; jj++) {
    const int64_t s_index = rows ? int64_t(jj) * in + e : int64_t(e) * r + jj;  // into gc, m, v
    const float g = k.proximal.apply<S>(
        to_f32(gc[s_index]) * float(grad_scale_of(k.grad_scale, k.clip)), w_before, s_index);
    const float mi = k.beta1 * to_f32(m[s_index]) + k.one_minus_beta1 * g;
    const float vi = k.beta2 * to_f32(v[s_index]) + k.one_minus_beta2 * g * g;
    store_state(m + s_index, mi, k.seed_m, uint64_t(s_index));
    store_state(v + s_index, vi, k.seed_v, uint64_t(s_index));
    const float delta = (mi / k.bias_correction1) / (sqrtf(vi) / k.bias_correction2_sqrt + k.eps);
    w -= (k.step_size * rho[jj]) * delta;
  }
  if constexpr (kPure) {
    param[w_index] = stochastic_round_bf16(w, k.seed_param, uint64_t(w_index));
  } else {
    master[w_index] = w;
    param[w_index] = __float2bfloat16_rn(w);
  }
}

// The 8-bit step's element op (ops::grass_adam_update_q8; kernels/cuda/quant8.cuh): state
// element (row, col) of gc [r, in] (rows) or [out, r] (cols) is slice j = row or col of the
// weight element at σ_j; σ distinct, so each weight element has one state element. S as in
// grass_adam_kernel.
template <typename S>
struct GrassQ8 {
  static constexpr bool kPure = std::is_same_v<S, bf16>;
  bf16* param;
  float* master;
  const S* gc;
  const int32_t* sigma;
  const float* scale;
  int in, r;
  bool rows;
  AdamStep k;
  float grad_scale = 0;  // prepare(): with the clipping coefficient, read once

  __device__ int64_t weight_index(int64_t row, int64_t col) const {
    return rows ? int64_t(sigma[row]) * in + col : row * in + sigma[col];
  }
  __device__ void prepare() { grad_scale = float(grad_scale_of(k.grad_scale, k.clip)); }
  __device__ bool reads_weight() const { return k.proximal.anchor != nullptr; }
  // 32-bit: the launcher checks the state has fewer than 2^32 elements
  __device__ void position(int64_t i, int64_t& row, int64_t& col) const {
    const uint32_t cols = rows ? uint32_t(in) : uint32_t(r), q = uint32_t(i) / cols;
    row = q;
    col = uint32_t(i) - q * cols;
  }
  __device__ float gradient(int64_t i) const { return to_f32(gc[i]); }
  __device__ float weight(int64_t, int64_t row, int64_t col) const {
    const int64_t w = weight_index(row, col);
    return kPure ? __bfloat162float(param[w]) : master[w];
  }
  __device__ float step(int64_t i, int64_t row, int64_t col, float g, float w0, float& m,
                        float& v) const {
    g = k.proximal.apply<S>(g * grad_scale, w0, i);
    adam_moments_rn(m, v, g, k.beta1, k.one_minus_beta1, k.beta2, k.one_minus_beta2);
    if (!quant8_finite(g) || !quant8_finite(v)) {
      m = v = 0.0f;  // a non-finite gradient leaves the weight and zeroes the moments
      return w0;
    }
    const float delta = (m / k.bias_correction1) / (sqrtf(v) / k.bias_correction2_sqrt + k.eps);
    return fmaf(-(k.step_size * scale[rows ? row : col]), delta, k.apply_decay ? w0 * k.decay : w0);
  }
  __device__ void put(int64_t, int64_t row, int64_t col, float w) const {
    const int64_t e = weight_index(row, col);
    if constexpr (kPure) {
      param[e] = stochastic_round_bf16(w, k.seed_param, uint64_t(e));
    } else {
      master[e] = w;
      param[e] = __float2bfloat16_rn(w);
    }
  }
};

// The step on quant8.cuh's thread-block driver, in either layout (the warp driver's vector
// loads and stores do not fit weights scattered by σ).
template <typename S>
__global__ void __launch_bounds__(kQuant8Threads, 4)
    grass_adam_q8_kernel(GrassQ8<S> op, Quant8Moments q, Quant8Layout layout,
                         const Quant8Map map_m, const Quant8Map map_v) {
  quant8_block_step(op, q, layout, 0, map_m, map_v);
}

// The kernels' scalars from the step's arguments (adam_scalars(), narrowed to fp32).
AdamStep adam_step_of(const AdamArgs& a, double alpha, uint64_t seed) {
  const AdamArgs narrowed = narrowed_to_f32(a);
  const AdamScalars s = adam_scalars(narrowed);
  AdamStep k;
  k.grad_scale = a.grad_scale;
  k.clip = a.clip;
  k.beta1 = float(s.beta1);
  k.beta2 = float(s.beta2);
  k.eps = float(s.eps);
  k.one_minus_beta1 = float(s.one_minus_beta1);
  k.one_minus_beta2 = float(s.one_minus_beta2);
  k.bias_correction1 = float(s.bias_correction1);
  k.bias_correction2_sqrt = float(s.bias_correction2_sqrt);
  k.step_size = float(s.lr * float(alpha));
  k.decay = float(s.decay);
  k.apply_decay = narrowed.weight_decay > 0;
  k.proximal = proximal_term(a);
  k.seed_param = rounding_stream_seed(seed, a.step, kRoundWeight);
  k.seed_m = rounding_stream_seed(seed, a.step, kRoundFirstMoment);
  k.seed_v = rounding_stream_seed(seed, a.step, kRoundSecondMoment);
  return k;
}

// Element e of the packed slices [count, in] (rows) or [out, count] (columns) and its place in
// w [out, in]; PACK copies w's into delta, else delta's into w.
template <bool PACK>
__global__ void slices_kernel(bf16* delta, bf16* w, const int32_t* sigma, int count, int out,
                              int in, bool rows) {
  const int64_t total = int64_t(count) * (rows ? in : out);
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t at = rows ? int64_t(sigma[e / in]) * in + e % in
                            : (e / count) * in + sigma[e % count];
    if constexpr (PACK) delta[e] = w[at];
    else w[at] = delta[e];
  }
}

template <bool PACK>
void launch_slices(const Context& ctx, bf16* delta, bf16* w, const int32_t* sigma, int count,
                   int out, int in, bool rows) {
  const int64_t total = int64_t(count) * (rows ? in : out);
  if (total == 0) return;
  const int64_t blocks = std::min<int64_t>(ceil_div(total, kThreads), 4096);
  slices_kernel<PACK><<<int(blocks), kThreads, 0, ctx.stream>>>(delta, w, sigma, count, out, in,
                                                                rows);
  GRASS_LAUNCH_CHECK();
}

}  // namespace

void pack_slices(const Context& ctx, bf16* delta, const bf16* w, const int32_t* sigma, int count,
                 int out, int in, bool rows) {
  launch_slices<true>(ctx, delta, const_cast<bf16*>(w), sigma, count, out, in, rows);
}

void unpack_slices(const Context& ctx, bf16* w, const bf16* delta, const int32_t* sigma, int count,
                   int out, int in, bool rows) {
  launch_slices<false>(ctx, const_cast<bf16*>(delta), w, sigma, count, out, in, rows);
}

void grass_gather_columns(const Context& ctx, bf16* xs, const bf16* source, const int32_t* sigma,
                          const float* rho, int64_t N, int width, int r) {
  if (N == 0 || r == 0) return;
  const int64_t total = N * r;
  if (total <= int64_t(UINT32_MAX))
    gather_scaled_columns<uint32_t><<<ceil_div(total, kThreads), kThreads, 0, ctx.stream>>>(
        xs, source, sigma, rho, uint32_t(total), width, r);
  else
    gather_scaled_columns<int64_t><<<ceil_div(total, kThreads), kThreads, 0, ctx.stream>>>(
        xs, source, sigma, rho, total, width, r);
  GRASS_LAUNCH_CHECK();
}

void grass_selected_cols_grad(const Context& ctx, void* gc, GradType gtype, const bf16* dy,
                              int64_t ldy, const bf16* xs, int64_t N, int out, int r) {
  if (N == 0 || r == 0) return;
  gemm_bf16(ctx, true, false, out, r, N, dy, ldy, xs, r, 1.0f, gc, cuda_type(gtype), r);
}

void grass_compressed_grad(const Context& ctx, void* gc, GradType gtype, bf16* scratch,
                           const bf16* dy, const bf16* x, const int32_t* sigma, const float* rho,
                           int64_t N, int in, int out, int r, bool rows) {
  if (N == 0 || r == 0) return;
  // scratch[N, r]: the selected columns of dy[N, out] (rows) or x[N, in] (cols), times ρ
  grass_gather_columns(ctx, scratch, rows ? dy : x, sigma, rho, N, rows ? out : in, r);
  if (rows)  // gc[r, in] += scratch[N, r]ᵀ · x[N, in]
    gemm_bf16(ctx, true, false, r, in, N, scratch, r, x, in, 1.0f, gc, cuda_type(gtype), in);
  else  // gc[out, r] += dy[N, out]ᵀ · scratch[N, r]
    grass_selected_cols_grad(ctx, gc, gtype, dy, out, scratch, N, out, r);
}

void grass_slice_norms(const Context& ctx, double* norms_sq, const float* g, int out, int in,
                       bool rows, bool accumulate) {
  if (out == 0 || in == 0) return;
  if (rows) {
    row_norms_sq<<<out, kThreads, 0, ctx.stream>>>(norms_sq, g, in);
  } else {
    const dim3 block(kColTile, kRowLanes);
    col_norms_sq<<<ceil_div(in, kColTile), block, 0, ctx.stream>>>(norms_sq, g, out, in,
                                                                  accumulate);
  }
  GRASS_LAUNCH_CHECK();
}

void grass_adam_update(const Context& ctx, bf16* param, float* master, const void* gc, void* m,
                       void* v, const int32_t* sigma, const float* rho, int out, int in, int r,
                       bool rows, double alpha, const AdamArgs& a, uint64_t seed) {
  GRASS_CHECK(a.step >= 1, "grass_adam_update: step counts from 1");
  if (r == 0 || (rows ? in : out) == 0) return;
  const AdamStep k = adam_step_of(a, alpha, seed);

  // rows: grid.y walks the r occurrences; cols: one flat index over gc[out, r].
  GRASS_CHECK(!rows || r <= 65535, "grass_adam_update: rank above the grid's y limit");
  GRASS_CHECK(rows || int64_t(out) * r <= int64_t(UINT32_MAX), "grass_adam_update: out x r above 2^32");
  const dim3 grid = rows ? dim3(unsigned(ceil_div(in, kThreads)), unsigned(r))
                         : dim3(unsigned(ceil_div(int64_t(out) * r, kThreads)));
  if (master)
    grass_adam_kernel<<<grid, kThreads, 0, ctx.stream>>>(
        param, master, static_cast<const float*>(gc), static_cast<float*>(m),
        static_cast<float*>(v), sigma, rho, out, in, r, rows, k);
  else
    grass_adam_kernel<<<grid, kThreads, 0, ctx.stream>>>(
        param, nullptr, static_cast<const bf16*>(gc), static_cast<bf16*>(m), static_cast<bf16*>(v),
        sigma, rho, out, in, r, rows, k);
  GRASS_LAUNCH_CHECK();
}

void grass_adam_update_q8(const Context& ctx, bf16* param, float* master, const void* gc,
                          const Quant8Moments& q, bool by_columns, const int32_t* sigma,
                          const float* scale, int out, int in, int r, bool rows, double alpha,
                          const AdamArgs& a, uint64_t seed) {
  GRASS_CHECK(a.step >= 1, "grass_adam_update_q8: step counts from 1");
  check_quant8_block(q.block, "grass_adam_update_q8");
  if (r == 0 || (rows ? in : out) == 0) return;
  const AdamStep k = adam_step_of(a, alpha, seed);
  const Quant8Layout layout = projected_quant8_layout(out, in, r, rows, q.block, by_columns);
  GRASS_CHECK(layout.rows * layout.cols <= int64_t(UINT32_MAX),
              "grass_adam_update_q8: a state of 2^32 elements or more");
  const Quant8Map& qm = quant8_map(true);
  const Quant8Map& qv = quant8_map(false);
  const unsigned grid = quant8_block_grid(layout, 0);
  if (master)
    grass_adam_q8_kernel<<<grid, kQuant8Threads, 0, ctx.stream>>>(
        GrassQ8<float>{param, master, static_cast<const float*>(gc), sigma, scale, in, r, rows, k},
        q, layout, qm, qv);
  else
    grass_adam_q8_kernel<<<grid, kQuant8Threads, 0, ctx.stream>>>(
        GrassQ8<bf16>{param, nullptr, static_cast<const bf16*>(gc), sigma, scale, in, r, rows, k},
        q, layout, qm, qv);
  GRASS_LAUNCH_CHECK();
}

}  // namespace grass::cuda
