// RMSNorm on the GPU (HF LlamaRMSNorm): out = w * x * rstd, rstd = 1/sqrt(mean(x²) + eps).
//
// Forward: one warp per row, kWarps rows per block, when C % 8 == 0, C ≤ kWarpMaxC and every
// pointer allows 16-byte loads: each lane reads the packs of 8 bf16 lane, lane + 32, ... and keeps
// them in registers for the second pass; the row's sum of squares is the lane's own sum (its packs
// in order) then an xor butterfly across the warp, with no block barrier. Otherwise (C % 8 != 0,
// misaligned pointers, larger C) one block per row, the sum of squares a fixed-shape block
// reduction; both orders are functions of C alone, so the bits never depend on the launch.
// (The residual add before a norm is not here: the GEMM that makes o_proj's or down's output adds
// the stream in its epilogue, linear_residual_forward in kernels/cuda/linear.cu.)
// Backward: dx is per row, but dw[c] = Σ_n dout[n,c]·xhat[n,c] sums over every row. Instead of
// atomics, the rows are cut into at most kRowBlocks contiguous chunks (a function of N only, so
// the scratch size is known up front and the sum order never depends on the device): each block
// walks its chunk of rows, keeping per-channel partial sums in shared memory, and writes them to
// scratch[block, C]; a second kernel sums scratch's rows for each channel in a fixed order and adds
// the total into dw. Where the forward takes a warp per row, so does the backward's first stage:
// warp v of a block takes its chunk's rows v, v + warps, ... into its own partials, which are then
// summed in warp order (warps: a function of N and C); else one block walks the chunk's rows.
//
// The block-per-row kernels read packs of 8 too when C % 8 == 0 and the pointers allow it, else
// one value at a time; C is anything up to kMaxC (the backward's shared-memory partials).
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
// Backward: C fp32 partials plus block_sum's 32 floats fit in the default 48 KiB of shared memory
// (kernels/backend.h states it, for resolve() to refuse a wider GPU run).
constexpr int kMaxC = kCudaMaxHiddenSize;
// The dw column reduction: a tile of kReduceCols channels, kReduceLanes threads per channel.
constexpr int kReduceCols = 32;
constexpr int kReduceLanes = 16;
// The warp-per-row kernels: kWarps rows per block, C up to kWarpMaxC (LLaMA-70B's 8192). The
// forward holds the row in registers up to kHeldMaxC (24 packs a lane, LLaMA-13B's 5120 takes 20):
// nvcc issues the second pass's loads of w ahead, so a held pack costs about 8 registers, and
// 32 packs spilled.
constexpr int kWarps = 8;
constexpr int kWarpMaxC = 8192;
constexpr int kHeldMaxC = 24 * 32 * 8;
// The warp-per-row backward's partials, one row of C floats per warp, within the default 48 KiB.
constexpr int kWarpPartialBytes = 48 * 1024;

// Set only by the kernel lab (rmsnorm_force_block_kernels), to time the old kernels beside the new.
bool force_block_kernels = false;

// Sum of v over the warp, returned to every lane: an xor butterfly, so every lane adds the same
// two values at each step (fp32 addition commutes) and all hold the same bits.
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// out[N, C], rstd[N], x[N, C], w[C]; warp = one row, lane l = packs l, l + 32, ... With KP > 0
// the lane holds its (at most KP) packs in registers between the two passes; with KP = 0 (C
// above kHeldMaxC) its second pass reads them again, from L1 or L2.
template <int KP>
__global__ void rmsnorm_forward_warp_kernel(bf16* out, float* rstd, const bf16* x, const bf16* w,
                                            int64_t N, int C, float eps) {
  using Pack = BF16Pack<8>;
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= N) return;  // the whole warp: the butterfly below needs all 32 lanes
  // This lane's packs: [32·k] from its pointers, k < lane_packs.
  const int lane_packs = (C / 8 - lane + 31) / 32;
  const int64_t lane_at = row * C + lane * 8;
  const Pack* x_lane = reinterpret_cast<const Pack*>(x + lane_at);
  const Pack* w_lane = reinterpret_cast<const Pack*>(w + lane * 8);
  Pack* out_lane = reinterpret_cast<Pack*>(out + lane_at);

  float sum_sq = 0.0f;  // the lane's packs in order, then the butterfly: a function of C alone
  auto first_pass = [&](int k) {
    const Pack xp = x_lane[32 * k];
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const float xv = __bfloat162float(xp.v[j]);
      sum_sq += xv * xv;
    }
    return xp;
  };
  auto second_pass = [&](int k, const Pack& xp, float r) {
    const Pack wp = w_lane[32 * k];
    Pack op;
#pragma unroll
    for (int j = 0; j < 8; j++)
      op.v[j] = __float2bfloat16_rn(__bfloat162float(wp.v[j]) * (__bfloat162float(xp.v[j]) * r));
    out_lane[32 * k] = op;
  };

  if constexpr (KP > 0) {
    Pack xs[KP];
#pragma unroll
    for (int k = 0; k < KP; k++)
      if (k < lane_packs) xs[k] = first_pass(k);
    const float r = 1.0f / sqrtf(warp_sum(sum_sq) / float(C) + eps);
    if (lane == 0) rstd[row] = r;
#pragma unroll
    for (int k = 0; k < KP; k++)
      if (k < lane_packs) second_pass(k, xs[k], r);
  } else {
    for (int k = 0; k < lane_packs; k++) first_pass(k);
    const float r = 1.0f / sqrtf(warp_sum(sum_sq) / float(C) + eps);
    if (lane == 0) rstd[row] = r;
    for (int k = 0; k < lane_packs; k++) second_pass(k, x_lane[32 * k], r);
  }
}

// The backward's first stage, a warp per row. Block b owns rows [b·rows_per_block,
// min(N, (b+1)·rows_per_block)); its warp v takes rows v, v + warps, ... of them. Per row, as in
// rmsnorm_backward_rows_kernel: dx += rstd·(g - xhat·mean(g·xhat)), and Σ_rows dout·xhat per
// channel into the warp's partials in shared memory; then dw_partial[b, :] = the warps' partials
// summed in warp order. The second pass reads the row again (L1 or L2: this warp just read it)
// rather than holding it: the partials take the shared memory, and x and dout at C = 5120 would
// take 160 registers.
//   dx[N, C] (accumulated), dw_partial[gridDim.x, C], dout[N, C], x[N, C], w[C], rstd[N]
__global__ void rmsnorm_backward_warp_kernel(bf16* dx, float* dw_partial, const bf16* dout,
                                             const bf16* x, const bf16* w, const float* rstd,
                                             int64_t N, int C, int64_t rows_per_block) {
  using Pack = BF16Pack<8>;
  // Warp v's channel p·8 + j lives at dw_acc[v·C + j·packs + p]: its lanes hit consecutive banks.
  extern __shared__ float dw_acc[];
  const int warps = int(blockDim.x / 32), lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int packs = C / 8;
  const Pack* w_packs = reinterpret_cast<const Pack*>(w);
  float* acc = dw_acc + int64_t(warp) * C;
  // Each lane only ever touches its own packs' entries, so no barrier is needed until the end.
  for (int p = lane; p < packs; p += 32)
#pragma unroll
    for (int j = 0; j < 8; j++) acc[j * packs + p] = 0.0f;

  const int64_t row_begin = blockIdx.x * rows_per_block;
  const int64_t row_end = row_begin + rows_per_block < N ? row_begin + rows_per_block : N;
  for (int64_t row = row_begin + warp; row < row_end; row += warps) {
    const Pack* x_row = reinterpret_cast<const Pack*>(x + row * C);
    const Pack* dout_row = reinterpret_cast<const Pack*>(dout + row * C);
    Pack* dx_row = reinterpret_cast<Pack*>(dx + row * C);
    const float r = rstd[row];

    float dot = 0.0f;  // Σ_c dout·w·x  (= Σ_c g·xhat / rstd)
    for (int p = lane; p < packs; p += 32) {
      const Pack xp = x_row[p], dp = dout_row[p], wp = w_packs[p];
#pragma unroll
      for (int j = 0; j < 8; j++)
        dot += __bfloat162float(dp.v[j]) * __bfloat162float(wp.v[j]) * __bfloat162float(xp.v[j]);
    }
    const float mean_dot = warp_sum(dot) * r / float(C);  // mean(g·xhat)

    for (int p = lane; p < packs; p += 32) {
      const Pack xp = x_row[p], dp = dout_row[p], wp = w_packs[p];
      Pack dxp = dx_row[p];
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const float d = __bfloat162float(dp.v[j]);
        const float xhat = __bfloat162float(xp.v[j]) * r;
        const float dx_v = r * (d * __bfloat162float(wp.v[j]) - xhat * mean_dot);
        dxp.v[j] = __float2bfloat16_rn(__bfloat162float(dxp.v[j]) + dx_v);
        acc[j * packs + p] += d * xhat;
      }
      dx_row[p] = dxp;
    }
  }

  __syncthreads();  // the sum below reads every warp's partials
  float* partial_row = dw_partial + int64_t(blockIdx.x) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const int at = (c % 8) * packs + c / 8;
    float total = 0.0f;
    for (int v = 0; v < warps; v++) total += dw_acc[int64_t(v) * C + at];
    partial_row[c] = total;
  }
}


// out[N, C], rstd[N], x[N, C], w[C]; block = one row, thread t = packs t, t + blockDim, ...
template <int VEC>
__global__ void rmsnorm_forward_kernel(bf16* out, float* rstd, const bf16* x, const bf16* w, int C,
                                       float eps) {
  using Pack = BF16Pack<VEC>;
  const int64_t row = blockIdx.x;
  const Pack* x_row = reinterpret_cast<const Pack*>(x + row * C);
  const Pack* w_packs = reinterpret_cast<const Pack*>(w);
  Pack* out_row = reinterpret_cast<Pack*>(out + row * C);
  const int packs = C / VEC;

  float sum_sq = 0.0f;
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
    const Pack xp = x_row[p];
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      const float xv = __bfloat162float(xp.v[j]);
      sum_sq += xv * xv;
    }
  }
  const float r = 1.0f / sqrtf(block_sum(sum_sq) / float(C) + eps);
  if (threadIdx.x == 0) rstd[row] = r;

  // Second pass over the row: it was just read by this block, so it comes from L1/L2.
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
    const Pack xp = x_row[p], wp = w_packs[p];
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

// Whether a row of C channels goes to the warp-per-row kernels; `packed`: C % 8 == 0 and every
// pointer 16-byte aligned.
bool warp_per_row(bool packed, int C) { return packed && C <= kWarpMaxC && !force_block_kernels; }

// The warp-per-row forward: the row held in the fewest registers that take a lane's packs, or,
// above kHeldMaxC, read twice.
void launch_forward_warp(const Context& ctx, bf16* out, float* rstd, const bf16* x, const bf16* w,
                         int64_t N, int C, float eps) {
  const unsigned grid = unsigned(ceil_div(N, kWarps));
  const int lane_packs = int(ceil_div(C / 8, 32));
  auto kernel = C > kHeldMaxC        ? rmsnorm_forward_warp_kernel<0>
                : lane_packs <= 4  ? rmsnorm_forward_warp_kernel<4>
                : lane_packs <= 8  ? rmsnorm_forward_warp_kernel<8>
                : lane_packs <= 16 ? rmsnorm_forward_warp_kernel<16>
                                   : rmsnorm_forward_warp_kernel<24>;
  kernel<<<grid, kWarps * 32, 0, ctx.stream>>>(out, rstd, x, w, N, C, eps);
}

}  // namespace

void rmsnorm_force_block_kernels(bool on) { force_block_kernels = on; }

void rmsnorm_forward(const Context& ctx, bf16* out, float* rstd, const bf16* x, const bf16* w,
                     int64_t N, int C, float eps) {
  GRASS_CHECK(N >= 0 && N <= INT32_MAX && C > 0, "rmsnorm_forward: bad shape");
  if (N == 0) return;
  const bool packed = C % 8 == 0 && aligned16(out) && aligned16(x) && aligned16(w);
  if (warp_per_row(packed, C))
    launch_forward_warp(ctx, out, rstd, x, w, N, C, eps);
  else if (packed)
    rmsnorm_forward_kernel<8><<<unsigned(N), row_threads(C / 8), 0, ctx.stream>>>(out, rstd, x, w,
                                                                                   C, eps);
  else
    rmsnorm_forward_kernel<1><<<unsigned(N), row_threads(C), 0, ctx.stream>>>(out, rstd, x, w, C,
                                                                              eps);
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
  const bool packed = C % 8 == 0 && aligned16(dx) && aligned16(dout) && aligned16(x) && aligned16(w);
  if (warp_per_row(packed, C)) {
    // Warps per block: a function of N and C (the partials' sum order), at most one per row.
    const int64_t fit = kWarpPartialBytes / (int64_t(C) * int64_t(sizeof(float)));
    const int warps = int(std::min<int64_t>({kWarps, chunk, fit}));
    rmsnorm_backward_warp_kernel<<<unsigned(blocks), warps * 32,
                                   size_t(warps) * size_t(C) * sizeof(float), ctx.stream>>>(
        dx, scratch, dout, x, w, rstd, N, C, chunk);
  } else {
    const size_t shared_bytes = size_t(C) * sizeof(float);
    if (packed)
      rmsnorm_backward_rows_kernel<8>
          <<<unsigned(blocks), row_threads(C / 8), shared_bytes, ctx.stream>>>(
              dx, scratch, dout, x, w, rstd, N, C, chunk);
    else
      rmsnorm_backward_rows_kernel<1>
          <<<unsigned(blocks), row_threads(C), shared_bytes, ctx.stream>>>(dx, scratch, dout, x, w,
                                                                           rstd, N, C, chunk);
  }
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
