// RMSNorm on the GPU (HF LlamaRMSNorm): out = w * x * rstd, rstd = 1/sqrt(mean(x²) + eps).
//
// Forward: one block per row; the row's sum of squares is a fixed-shape block reduction in fp32.
// The same kernel also does the residual add before a norm (x = a + b, stored as the residual
// stream), so that x is not written by one kernel and read straight back by the next.
// Backward: dx is per row, but dw[c] = Σ_n dout[n,c]·xhat[n,c] sums over every row. Instead of
// atomics, the rows are cut into at most kRowBlocks contiguous chunks (a function of N only, so
// the scratch size is known up front and the sum order never depends on the device): each block
// walks its chunk of rows in order, keeping per-channel partial sums in shared memory, and writes
// them to scratch[block, C]; a second kernel sums scratch's rows for each channel in a fixed order
// and adds the total into dw.
//
// Rows are read in packs of 8 bf16 (16-byte loads) when C % 8 == 0 and the pointers allow it,
// else one value at a time; C is anything up to kMaxC (the backward's shared-memory partials).
#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "src/core/error.h"

namespace grass::cuda {

namespace {

constexpr int kMaxThreads = 256;
constexpr int64_t kRowBlocks = 1024;  // backward: at most this many chunks of rows
// Backward: C fp32 partials plus block_sum's 32 floats fit in the default 48 KiB of shared memory.
constexpr int kMaxC = (48 * 1024 - 32 * int(sizeof(float))) / int(sizeof(float));
// The dw column reduction: a tile of kReduceCols channels, kReduceLanes threads per channel.
constexpr int kReduceCols = 32;
constexpr int kReduceLanes = 16;


// out[N, C], rstd[N], x[N, C], w[C]; block = one row, thread t = packs t, t + blockDim, ...
// With ADD (residual_rmsnorm_forward) the row normalised is x + b[N, C], rounded to bf16 and
// stored to sum[N, C] as residual_forward stores it, then read in the same order as without ADD:
// the bits of residual_forward followed by rmsnorm_forward, without a second kernel reading sum.
template <int VEC, bool ADD>
__global__ void rmsnorm_forward_kernel(bf16* out, float* rstd, bf16* sum, const bf16* x,
                                       const bf16* b, const bf16* w, int C, float eps) {
  using Pack = BF16Pack<VEC>;
  const int64_t row = blockIdx.x;
  const Pack* x_row = reinterpret_cast<const Pack*>(x + row * C);
  const Pack* w_packs = reinterpret_cast<const Pack*>(w);
  Pack* out_row = reinterpret_cast<Pack*>(out + row * C);
  const int packs = C / VEC;

  float sum_sq = 0.0f;
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
    Pack xp = x_row[p];
    if constexpr (ADD) {
      const Pack bp = reinterpret_cast<const Pack*>(b + row * C)[p];
#pragma unroll
      for (int j = 0; j < VEC; j++)
        xp.v[j] = __float2bfloat16_rn(__bfloat162float(xp.v[j]) + __bfloat162float(bp.v[j]));
      reinterpret_cast<Pack*>(sum + row * C)[p] = xp;
    }
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      const float xv = __bfloat162float(xp.v[j]);
      sum_sq += xv * xv;
    }
  }
  const float r = 1.0f / sqrtf(block_sum(sum_sq) / float(C) + eps);
  if (threadIdx.x == 0) rstd[row] = r;

  // Second pass over the row: it was just read (or, with ADD, written: each thread reads back its
  // own packs) by this block, so it comes from L1/L2.
  const Pack* normed_row = reinterpret_cast<const Pack*>((ADD ? sum : x) + row * C);
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
    const Pack xp = normed_row[p], wp = w_packs[p];
    Pack op;
#pragma unroll
    for (int j = 0; j < VEC; j++)
      op.v[j] = __float2bfloat16_rn(__bfloat162float(wp.v[j]) * (__bfloat162float(xp.v[j]) * r));
    out_row[p] = op;
  }
}

// The backward's first stage. Block b owns rows [b·rows_per_block, min(N, (b+1)·rows_per_block)).
// With xhat = x·rstd and g = dout·w, per row:  dx += rstd·(g - xhat·mean(g·xhat));  and per
// channel the block accumulates Σ_rows dout·xhat in shared memory, then writes it to
// dw_partial[b, :].
//   dx[N, C] (accumulated), dw_partial[gridDim.x, C], dout[N, C], x[N, C], w[C], rstd[N]
template <int VEC>
__global__ void rmsnorm_backward_rows_kernel(bf16* dx, float* dw_partial, const bf16* dout,
                                             const bf16* x, const bf16* w, const float* rstd,
                                             int64_t N, int C, int64_t rows_per_block) {
  using Pack = BF16Pack<VEC>;
  // Channel p·VEC + j lives at dw_acc[j·packs + p]: consecutive threads hit consecutive banks.
  extern __shared__ float dw_acc[];
  const int packs = C / VEC;
  const Pack* w_packs = reinterpret_cast<const Pack*>(w);
  // Each thread only ever touches its own packs' entries, so no barrier is needed until the end.
  for (int p = threadIdx.x; p < packs; p += blockDim.x)
#pragma unroll
    for (int j = 0; j < VEC; j++) dw_acc[j * packs + p] = 0.0f;

  const int64_t row_begin = blockIdx.x * rows_per_block;
  const int64_t row_end = row_begin + rows_per_block < N ? row_begin + rows_per_block : N;
  for (int64_t row = row_begin; row < row_end; row++) {
    const Pack* x_row = reinterpret_cast<const Pack*>(x + row * C);
    const Pack* dout_row = reinterpret_cast<const Pack*>(dout + row * C);
    Pack* dx_row = reinterpret_cast<Pack*>(dx + row * C);
    const float r = rstd[row];

    float dot = 0.0f;  // Σ_c dout·w·x  (= Σ_c g·xhat / rstd)
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      const Pack xp = x_row[p], dp = dout_row[p], wp = w_packs[p];
#pragma unroll
      for (int j = 0; j < VEC; j++)
        dot += __bfloat162float(dp.v[j]) * __bfloat162float(wp.v[j]) * __bfloat162float(xp.v[j]);
    }
    const float mean_dot = block_sum(dot) * r / float(C);  // mean(g·xhat)

    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      const Pack xp = x_row[p], dp = dout_row[p], wp = w_packs[p];
      Pack dxp = dx_row[p];
#pragma unroll
      for (int j = 0; j < VEC; j++) {
        const float d = __bfloat162float(dp.v[j]);
        const float xhat = __bfloat162float(xp.v[j]) * r;
        const float dx_v = r * (d * __bfloat162float(wp.v[j]) - xhat * mean_dot);
        dxp.v[j] = __float2bfloat16_rn(__bfloat162float(dxp.v[j]) + dx_v);
        dw_acc[j * packs + p] += d * xhat;
      }
      dx_row[p] = dxp;
    }
  }

  __syncthreads();  // the coalesced store below reads other threads' entries
  float* partial_row = dw_partial + int64_t(blockIdx.x) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    partial_row[c] = dw_acc[(c % VEC) * packs + c / VEC];
}

// The backward's second stage: dw[c] += Σ_b dw_partial[b, c], b = 0 .. num_partials-1.
// Block = kReduceCols channels × kReduceLanes lanes; lane y sums b = y, y + kReduceLanes, ... in
// order, then lane 0 adds the kReduceLanes sums in lane order. A fixed order, any scheduling.
//   dw[C], dw_partial[num_partials, C]
template <typename GradT>
__global__ void rmsnorm_dw_reduce_kernel(GradT* dw, const float* dw_partial, int64_t num_partials,
                                         int C) {
  __shared__ float lane_sums[kReduceLanes][kReduceCols + 1];  // +1: no bank conflicts
  const int c = blockIdx.x * kReduceCols + threadIdx.x;
  float sum = 0.0f;
  if (c < C)
    for (int64_t b = threadIdx.y; b < num_partials; b += kReduceLanes) sum += dw_partial[b * C + c];
  lane_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  float total = 0.0f;
  for (int y = 0; y < kReduceLanes; y++) total += lane_sums[y][threadIdx.x];
  accumulate_grad(dw + c, total);
}


// Threads for a row of `packs` packs: whole warps, at most kMaxThreads.
int row_threads(int packs) { return int(std::min<int64_t>(kMaxThreads, ceil_div(packs, 32) * 32)); }

// The backward's row chunks: a function of N alone (scratch is sized from it).
int64_t rows_per_block(int64_t N) { return std::max<int64_t>(1, ceil_div(N, kRowBlocks)); }
int64_t num_row_blocks(int64_t N) { return N == 0 ? 0 : ceil_div(N, rows_per_block(N)); }

}  // namespace

void rmsnorm_forward(const Context& ctx, bf16* out, float* rstd, const bf16* x, const bf16* w,
                     int64_t N, int C, float eps) {
  GRASS_CHECK(N >= 0 && N <= INT32_MAX && C > 0, "rmsnorm_forward: bad shape");
  if (N == 0) return;
  if (C % 8 == 0 && aligned16(out) && aligned16(x) && aligned16(w))
    rmsnorm_forward_kernel<8, false><<<unsigned(N), row_threads(C / 8), 0, ctx.stream>>>(
        out, rstd, nullptr, x, nullptr, w, C, eps);
  else
    rmsnorm_forward_kernel<1, false><<<unsigned(N), row_threads(C), 0, ctx.stream>>>(
        out, rstd, nullptr, x, nullptr, w, C, eps);
  GRASS_LAUNCH_CHECK();
}

void residual_rmsnorm_forward(const Context& ctx, bf16* sum, bf16* out, float* rstd, const bf16* a,
                              const bf16* b, const bf16* w, int64_t N, int C, float eps) {
  GRASS_CHECK(N >= 0 && N <= INT32_MAX && C > 0, "residual_rmsnorm_forward: bad shape");
  if (N == 0) return;
  // The packing decides the order of the sums of squares: rmsnorm_forward's choice for x = sum.
  const bool packed = C % 8 == 0 && aligned16(out) && aligned16(sum) && aligned16(w);
  if (packed && !(aligned16(a) && aligned16(b))) {
    // a or b cannot be read in packs where the norm must be: the two kernels, the same bits.
    residual_forward(ctx, sum, a, b, N * C);
    rmsnorm_forward(ctx, out, rstd, sum, w, N, C, eps);
    return;
  }
  if (packed)
    rmsnorm_forward_kernel<8, true><<<unsigned(N), row_threads(C / 8), 0, ctx.stream>>>(
        out, rstd, sum, a, b, w, C, eps);
  else
    rmsnorm_forward_kernel<1, true><<<unsigned(N), row_threads(C), 0, ctx.stream>>>(
        out, rstd, sum, a, b, w, C, eps);
  GRASS_LAUNCH_CHECK();
}

int64_t rmsnorm_scratch_floats(int64_t N, int C) { return num_row_blocks(N) * C; }

void rmsnorm_backward(const Context& ctx, bf16* dx, void* dw, GradType gtype, const bf16* dout,
                      const bf16* x, const bf16* w, const float* rstd, float* scratch, int64_t N,
                      int C) {
  GRASS_CHECK(
      N >= 0 && C > 0 && C <= kMaxC,
      "rmsnorm_backward: C must be in 1.." + std::to_string(kMaxC) + ", got " + std::to_string(C));
  if (N == 0) return;
  const int64_t chunk = rows_per_block(N), blocks = num_row_blocks(N);
  const size_t shared_bytes = size_t(C) * sizeof(float);
  if (C % 8 == 0 && aligned16(dx) && aligned16(dout) && aligned16(x) && aligned16(w))
    rmsnorm_backward_rows_kernel<8>
        <<<unsigned(blocks), row_threads(C / 8), shared_bytes, ctx.stream>>>(dx, scratch, dout, x,
                                                                             w, rstd, N, C, chunk);
  else
    rmsnorm_backward_rows_kernel<1><<<unsigned(blocks), row_threads(C), shared_bytes, ctx.stream>>>(
        dx, scratch, dout, x, w, rstd, N, C, chunk);
  GRASS_LAUNCH_CHECK();

  const dim3 reduce_block(kReduceCols, kReduceLanes);
  const unsigned reduce_grid = unsigned(ceil_div(C, kReduceCols));
  if (gtype == GradType::F32)
    rmsnorm_dw_reduce_kernel<<<reduce_grid, reduce_block, 0, ctx.stream>>>(static_cast<float*>(dw),
                                                                           scratch, blocks, C);
  else
    rmsnorm_dw_reduce_kernel<<<reduce_grid, reduce_block, 0, ctx.stream>>>(static_cast<bf16*>(dw),
                                                                           scratch, blocks, C);
  GRASS_LAUNCH_CHECK();
}

}  // namespace grass::cuda
