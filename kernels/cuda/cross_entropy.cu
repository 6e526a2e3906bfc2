// Softmax cross-entropy fused with its backward, on a chunk of rows of the lm_head's bf16 logits:
// the loss per row, and the row overwritten in place with its gradient, so neither an fp32 copy
// of the logits nor the probabilities ever exist.
//
// One block per row. Pass 1 reads the row once with an online max/sum (each thread keeps the
// running max of its elements and the sum of exp(x - max), rescaled when the max grows); the
// block combines the threads' pairs in a fixed tree, so the result has the same bits every run.
// Pass 2 reads the row again and writes (softmax - onehot(target)) · dloss_scale. Any V works:
// threads stride over the row one element at a time (rows of an odd V start at 2-byte
// boundaries, so no vector loads).
#include <cmath>

#include "core/error.h"
#include "cuda/common.cuh"
#include "cuda/cuda_ops.h"

namespace grass::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

// A part of a row's softmax normaliser: Σ exp(x - max) over its elements.
struct MaxSum {
  float max;
  float sum;
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float max = fmaxf(a.max, b.max);
  if (max == -INFINITY) return {max, 0.0f};  // both empty: avoid (-inf) - (-inf)
  return {max, a.sum * expf(a.max - max) + b.sum * expf(b.max - max)};
}

__device__ __forceinline__ MaxSum warp_combine(MaxSum t) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, t.max, offset),
                       __shfl_xor_sync(0xffffffffu, t.sum, offset)};
    t = combine(t, other);
  }
  return t;
}

// The whole block's MaxSum, as thread 0 computes it, handed to every thread.
__device__ MaxSum block_combine(MaxSum t) {
  __shared__ MaxSum warp_parts[kWarps];
  __shared__ MaxSum total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  t = warp_combine(t);
  if (lane == 0) warp_parts[warp] = t;
  __syncthreads();
  if (warp == 0) {
    t = warp_combine(lane < kWarps ? warp_parts[lane] : MaxSum{-INFINITY, 0.0f});
    if (lane == 0) total = t;
  }
  __syncthreads();
  return total;
}

// logits[n, V] in, gradient out (in place); loss[n]; targets[n] (negative: ignored row; else < V).
__global__ void cross_entropy_fused_kernel(bf16* logits, float* loss, const int32_t* targets, int V,
                                           float dloss_scale) {
  bf16* row = logits + int64_t(blockIdx.x) * V;
  const int32_t target = targets[blockIdx.x];
  if (target < 0) {  // the same for the whole block, so no barrier is skipped by some threads only
    for (int i = threadIdx.x; i < V; i += kThreads) row[i] = __float2bfloat16_rn(0.0f);
    if (threadIdx.x == 0) loss[blockIdx.x] = 0.0f;
    return;
  }
  // Read before the barriers in block_combine: no thread writes the row until after them.
  const float target_logit = __bfloat162float(row[target]);

  MaxSum mine{-INFINITY, 0.0f};
  for (int i = threadIdx.x; i < V; i += kThreads) {
    const float x = __bfloat162float(row[i]);
    if (x > mine.max) {
      mine.sum = mine.sum * expf(mine.max - x) + 1.0f;
      mine.max = x;
    } else {
      mine.sum += expf(x - mine.max);
    }
  }
  const MaxSum all = block_combine(mine);
  const float lse = all.max + logf(all.sum);
  if (threadIdx.x == 0) loss[blockIdx.x] = lse - target_logit;

  for (int i = threadIdx.x; i < V; i += kThreads) {
    const float p = expf(__bfloat162float(row[i]) - lse);
    row[i] = __float2bfloat16_rn((i == target ? p - 1.0f : p) * dloss_scale);
  }
}

}  // namespace

void cross_entropy_fused(const Context& ctx, bf16* logits, float* loss, const int32_t* targets,
                         int64_t n, int V, float dloss_scale) {
  GRASS_CHECK(n <= INT32_MAX, "cross_entropy_fused: too many rows for one launch");
  GRASS_CHECK(V > 0, "cross_entropy_fused: empty vocabulary");
  if (n == 0) return;
  cross_entropy_fused_kernel<<<unsigned(n), kThreads, 0, ctx.stream>>>(logits, loss, targets, V,
                                                                       dloss_scale);
  GRASS_LAUNCH_CHECK();
}

}  // namespace grass::cuda
