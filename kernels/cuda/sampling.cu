// The row ops of a sampled weight gradient on the GPU (the CPU reference:
// kernels/cpu/sampling.cpp): the norms and the stored rows, one block per row, math in fp32, one
// rounding per store; and the draw of crs's and wta-crs's rows on the stream, in the exact integer
// arithmetic of kernels/row_draw.h, so the rows and scales are the CPU's bit for bit and the host
// never waits for them.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/row_draw.h"
#include "src/core/error.h"

namespace grass::cuda {

namespace {

constexpr int kThreads = 256;  // a multiple of 32 (block_sum)

// out[j, :] = scale[j] · x[rows[j], :]: block j copies one row
__global__ void gather_rows_kernel(bf16* out, const bf16* x, const int32_t* rows,
                                   const float* scale, int D) {
  const int64_t j = blockIdx.x;
  const float s = scale ? scale[j] : 1.0f;
  const bf16* src = x + int64_t(rows[j]) * D;
  for (int c = threadIdx.x; c < D; c += blockDim.x)
    out[j * D + c] = __float2bfloat16_rn(s * __bfloat162float(src[c]));
}

// norms[n] = ‖x[n, :]‖₂: block n sums one row's squares in a fixed order
__global__ void row_norms_kernel(float* norms, const bf16* x, int D) {
  const bf16* row = x + int64_t(blockIdx.x) * D;
  float sum = 0.0f;
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    const float v = __bfloat162float(row[c]);
    sum += v * v;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) norms[blockIdx.x] = sqrtf(sum);
}

// ---- the draw (kernels/row_draw.h has the arithmetic) -------------------------------------------
constexpr int kDrawThreads = 1024;  // the one-block kernels: a power of two (their trees)
constexpr int kRankThreads = 128;

struct DrawState {  // what the device finds before the draw
  int shift = 0;
  int uniform = 0;    // a weight not finite, or none > 0: every w = 1
  int winners = 0;
  uint64_t rest = 0;  // the pool's weight
};

// The workspace (draw_rows_workspace_bytes, kernels/backend_sizes.cpp): w [N] and cum [N] uint64,
// rank [N] and top [N] int32 (top's first k used), the state; each region 256-byte aligned.
struct DrawWorkspace {
  uint64_t* w;
  uint64_t* cum;
  int32_t* rank;
  int32_t* top;
  DrawState* state;
};
DrawWorkspace draw_workspace(void* workspace, int64_t N) {
  const auto region = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  char* p = static_cast<char*>(workspace);
  DrawWorkspace ws{};
  ws.w = reinterpret_cast<uint64_t*>(p), p += region(8 * N);
  ws.cum = reinterpret_cast<uint64_t*>(p), p += region(8 * N);
  ws.rank = reinterpret_cast<int32_t*>(p), p += region(4 * N);
  ws.top = reinterpret_cast<int32_t*>(p), p += region(4 * N);
  ws.state = reinterpret_cast<DrawState*>(p);
  return ws;
}

// Thread t's share [begin, end) of n items cut into blockDim.x contiguous chunks.
__device__ void chunk_of(int64_t n, int64_t* begin, int64_t* end) {
  const int64_t per = (n + blockDim.x - 1) / blockDim.x, first = int64_t(threadIdx.x) * per;
  *begin = first < n ? first : n;
  *end = *begin + per < n ? *begin + per : n;
}

// v's exclusive prefix over the block's threads in thread order, and the block's total: integers,
// so the bits do not depend on the tree. Every thread calls it; it may be called repeatedly.
__device__ uint64_t block_exclusive_scan(uint64_t v, uint64_t* total) {
  __shared__ uint64_t scan[2][kDrawThreads];
  const int t = threadIdx.x;
  int in = 0;
  scan[0][t] = v;
  __syncthreads();
  for (int offset = 1; offset < int(blockDim.x); offset *= 2) {  // Hillis-Steele, double-buffered
    scan[1 - in][t] = scan[in][t] + (t >= offset ? scan[in][t - offset] : 0);
    in = 1 - in;
    __syncthreads();
  }
  *total = scan[in][blockDim.x - 1];
  const uint64_t before = scan[in][t] - v;
  __syncthreads();  // the next call overwrites scan
  return before;
}

// One block: the largest norm and whether every norm is finite, so the shift (or uniform draws).
__global__ void draw_prepare_kernel(const float* norms, int64_t N, int L, DrawState* state) {
  __shared__ float largest[kDrawThreads];
  __shared__ int finite[kDrawThreads];
  const int t = threadIdx.x;
  float m = 0.0f;
  int ok = 1;
  for (int64_t i = t; i < N; i += blockDim.x) {
    const float v = norms[i];
    ok &= int(draw_finite(double(v)));
    m = v > m ? v : m;
  }
  largest[t] = m;
  finite[t] = ok;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (t < half) {
      largest[t] = largest[t + half] > largest[t] ? largest[t + half] : largest[t];
      finite[t] &= finite[t + half];
    }
    __syncthreads();
  }
  if (t == 0) {
    const bool uniform = !finite[0] || !(largest[0] > 0.0f);
    state->uniform = int(uniform);
    state->shift = uniform ? 0 : draw_shift(double(largest[0]), L);
  }
}

__global__ void draw_weights_kernel(uint64_t* w, const float* norms, int64_t N,
                                    const DrawState* state) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  w[i] = state->uniform ? 1 : draw_weight(double(norms[i]), state->shift);
}

// wta-crs's order: row i's rank is the number of keys above its own (keys are distinct), and the
// k first rows go to top in that order. O(N) a thread, for any N, with no atomics.
__global__ void draw_rank_kernel(int32_t* rank, int32_t* top, const uint64_t* w, int64_t N, int L,
                                 int k) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  const uint64_t key = draw_key(w[i], i, L);
  int64_t r = 0;
  for (int64_t j = 0; j < N; j++) r += draw_key(w[j], j, L) > key;
  rank[i] = int32_t(r);
  if (r < k) top[r] = int32_t(i);
}

// One block: T = Σ w; wta-crs's winner count c (each thread the least score of its run of c, then
// a tree, ties to the lower c); then the pool's inclusive scan cum, in row order.
__global__ void draw_pool_kernel(uint64_t* cum, DrawState* state, const uint64_t* w,
                                 const int32_t* rank, const int32_t* top, int64_t N, int k,
                                 bool winners) {
  const int t = threadIdx.x;
  int64_t begin = 0, end = 0;
  chunk_of(N, &begin, &end);
  uint64_t part = 0, total = 0;
  for (int64_t i = begin; i < end; i++) part += w[i];
  block_exclusive_scan(part, &total);
  int c = 0;
  if (winners) {
    __shared__ int64_t best_c[kDrawThreads];
    __shared__ uint64_t best_rest[kDrawThreads];
    int64_t c_begin = 0, c_end = 0;
    chunk_of(k, &c_begin, &c_end);
    uint64_t top_part = 0, ignored = 0;
    for (int64_t cc = c_begin; cc < c_end; cc++) top_part += w[top[cc]];
    uint64_t S = block_exclusive_scan(top_part, &ignored);  // S_c at c_begin
    int64_t mine = -1;
    uint64_t mine_rest = 0;
    for (int64_t cc = c_begin; cc < c_end; cc++) {
      const uint64_t rest = total - S;
      if (mine < 0 || draw_score_less(rest, k - cc, mine_rest, k - mine)) mine = cc, mine_rest = rest;
      S += w[top[cc]];
    }
    best_c[t] = mine;
    best_rest[t] = mine_rest;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
      if (t < half && best_c[t + half] >= 0) {
        const int64_t a = best_c[t], b = best_c[t + half];
        const uint64_t ra = best_rest[t], rb = best_rest[t + half];
        const bool b_wins = a < 0 || draw_score_less(rb, k - b, ra, k - a) ||
                            (!draw_score_less(ra, k - a, rb, k - b) && b < a);
        if (b_wins) best_c[t] = b, best_rest[t] = rb;
      }
      __syncthreads();
    }
    c = int(best_c[0]);
  }
  part = 0;
  for (int64_t i = begin; i < end; i++) part += c > 0 && rank[i] < c ? 0 : w[i];
  uint64_t rest = 0;
  uint64_t run = block_exclusive_scan(part, &rest);
  for (int64_t i = begin; i < end; i++) cum[i] = run += c > 0 && rank[i] < c ? 0 : w[i];
  if (t == 0) {
    state->winners = c;
    state->rest = rest;
  }
}

// Row j of the draw: a winner (scale 1), or draw j − c of the s = k − c from the pool.
__global__ void draw_rows_kernel(int32_t* rows, float* scale, const uint64_t* w,
                                 const uint64_t* cum, const int32_t* top,
                                 const DrawState* state, int64_t N, int k, uint64_t stream) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k) return;
  const int c = state->winners;
  if (j < c) {
    rows[j] = top[j];
    scale[j] = 1.0f;
    return;
  }
  const uint64_t rest = state->rest;
  if (rest == 0) {  // the winners hold every row of weight > 0: exact
    rows[j] = int32_t(N - 1);
    scale[j] = 0.0f;
    return;
  }
  const int64_t row = draw_row(cum, N, draw_target(stream, j - c, rest));
  rows[j] = int32_t(row);
  scale[j] = draw_scale(rest, k - c, w[row]);
}

}  // namespace

void draw_rows(const Context& ctx, int32_t* rows, float* scale, const float* norms, int64_t N,
               int k, bool winners, uint64_t stream, void* workspace) {
  GRASS_CHECK(N >= 1 && N <= INT32_MAX && k >= 1 && k <= N, "draw_rows: bad size");
  const DrawWorkspace ws = draw_workspace(workspace, N);
  const int L = draw_index_bits(N);
  draw_prepare_kernel<<<1, kDrawThreads, 0, ctx.stream>>>(norms, N, L, ws.state);
  GRASS_LAUNCH_CHECK();
  draw_weights_kernel<<<grid_for(N, kThreads), kThreads, 0, ctx.stream>>>(ws.w, norms, N, ws.state);
  GRASS_LAUNCH_CHECK();
  if (winners) {
    draw_rank_kernel<<<grid_for(N, kRankThreads), kRankThreads, 0, ctx.stream>>>(ws.rank, ws.top,
                                                                                ws.w, N, L, k);
    GRASS_LAUNCH_CHECK();
  }
  draw_pool_kernel<<<1, kDrawThreads, 0, ctx.stream>>>(ws.cum, ws.state, ws.w, ws.rank, ws.top, N,
                                                       k, winners);
  GRASS_LAUNCH_CHECK();
  draw_rows_kernel<<<grid_for(k, kThreads), kThreads, 0, ctx.stream>>>(
      rows, scale, ws.w, ws.cum, ws.top, ws.state, N, k, stream);
  GRASS_LAUNCH_CHECK();
}

void gather_rows(const Context& ctx, bf16* out, const bf16* x, const int32_t* rows,
                 const float* scale, int64_t k, int D) {
  GRASS_CHECK(k >= 0 && k <= INT32_MAX && D >= 0, "gather_rows: bad size");
  if (k == 0 || D == 0) return;
  gather_rows_kernel<<<unsigned(k), kThreads, 0, ctx.stream>>>(out, x, rows, scale, D);
  GRASS_LAUNCH_CHECK();
}

void row_norms(const Context& ctx, float* norms, const bf16* x, int64_t N, int D) {
  GRASS_CHECK(N >= 0 && N <= INT32_MAX && D >= 0, "row_norms: bad size");
  if (N == 0) return;
  row_norms_kernel<<<unsigned(N), kThreads, 0, ctx.stream>>>(norms, x, D);
  GRASS_LAUNCH_CHECK();
}

}  // namespace grass::cuda
