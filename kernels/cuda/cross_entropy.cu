// Softmax cross-entropy fused with its backward, on a chunk of rows of the lm_head's bf16 logits:
// the loss per row, and the row overwritten in place with its gradient, so neither an fp32 copy
// of the logits nor the probabilities ever exist.
//
// One block per row. Pass 1 reads the row once with an online max/sum (each thread keeps the
// running max of its elements and the sum of exp(x - max), rescaled when the max grows); the
// block combines the threads' pairs in a fixed tree, so the result has the same bits every run.
// Pass 2 reads the row again and writes (softmax - onehot(target)) · dloss_scale.
//
// Loads and stores move 16 bytes (8 bf16) at a time. Any V works: a row of V = 32000 starts at
// a 16-byte boundary (the chunk is 256-byte aligned and 2V bytes is a multiple of 16), a row of
// V = 32001 at any even address, so each row is split where its own alignment says (split_row):
// a head of fewer than 8 elements up to the first 16-byte boundary, 8-element packs, and a tail
// of fewer than 8; threads take the packs in turn, and the head's and tail's elements one each.
// Each thread visits its elements in a fixed order, and the block combines in a fixed tree, so
// the bits repeat from run to run (they differ from a one-element-per-thread split's, which sums
// in another order).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "src/core/error.h"

namespace grass::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kVec = 8;  // bf16 per 16-byte pack
using Pack = BF16Pack<kVec>;

// A row cut for 16-byte accesses: [0, head) one element at a time, `packs` packs from head, and
// [tail, V) one element at a time. head and V - tail are under kVec, so under kThreads.
struct RowSplit {
  int head, packs, tail;
};
__device__ __forceinline__ RowSplit split_row(const bf16* row, int V) {
  const int misaligned = int(reinterpret_cast<uintptr_t>(row) / sizeof(bf16) % kVec);
  const int head = min(V, (kVec - misaligned) % kVec);
  const int packs = (V - head) / kVec;
  return {head, packs, head + packs * kVec};
}

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

// One element into a running MaxSum (online softmax normaliser). A -inf logit adds nothing
// (exp(-inf - max) is 0, and while max is -inf too the difference would be NaN); a NaN adds NaN,
// so the loss is NaN, as on the CPU.
__device__ __forceinline__ void add_one(MaxSum& t, float x) {
  if (x > t.max) {
    t.sum = t.sum * expf(t.max - x) + 1.0f;
    t.max = x;
  } else if (x != -INFINITY) {
    t.sum += expf(x - t.max);
  }
}

// A pack into a running MaxSum: rescaled once to the pack's max, then its 8 terms (fmaxf skips
// a NaN, whose term is NaN all the same). By value: nvcc loads it in one 16-byte load, where a
// reference to the row had it load the 8 elements one by one.
__device__ __forceinline__ void add_pack(MaxSum& t, Pack p) {
  float x[kVec], pack_max = -INFINITY;
#pragma unroll
  for (int k = 0; k < kVec; k++) {
    x[k] = __bfloat162float(p.v[k]);
    pack_max = fmaxf(pack_max, x[k]);
  }
  if (pack_max > t.max) {
    t.sum *= expf(t.max - pack_max);  // 0 while t is empty (max -inf)
    t.max = pack_max;
  }
#pragma unroll
  for (int k = 0; k < kVec; k++) t.sum += x[k] == -INFINITY ? 0.0f : expf(x[k] - t.max);
}

// logits[n, V] in, gradient out (in place); loss[n]; targets[n] (negative: ignored row; else < V).
__global__ void cross_entropy_fused_kernel(bf16* logits, float* loss, const int32_t* targets, int V,
                                           float dloss_scale) {
  bf16* row = logits + int64_t(blockIdx.x) * V;
  const RowSplit s = split_row(row, V);
  Pack* packs = reinterpret_cast<Pack*>(row + s.head);
  const int edge = s.tail + int(threadIdx.x);  // this thread's tail element, if < V
  const int32_t target = targets[blockIdx.x];
  if (target < 0) {  // the same for the whole block, so no barrier is skipped by some threads only
    const bf16 zero = __float2bfloat16_rn(0.0f);
    Pack zeros;
#pragma unroll
    for (int k = 0; k < kVec; k++) zeros.v[k] = zero;
    if (int(threadIdx.x) < s.head) row[threadIdx.x] = zero;
    for (int p = threadIdx.x; p < s.packs; p += kThreads) packs[p] = zeros;
    if (edge < V) row[edge] = zero;
    if (threadIdx.x == 0) loss[blockIdx.x] = 0.0f;
    return;
  }
  // Read before the barriers in block_combine: no thread writes the row until after them.
  const float target_logit = __bfloat162float(row[target]);

  MaxSum mine{-INFINITY, 0.0f};
  if (int(threadIdx.x) < s.head) add_one(mine, __bfloat162float(row[threadIdx.x]));
  for (int p = threadIdx.x; p < s.packs; p += kThreads) add_pack(mine, packs[p]);
  if (edge < V) add_one(mine, __bfloat162float(row[edge]));
  const MaxSum all = block_combine(mine);
  const float lse = all.max + logf(all.sum);
  if (threadIdx.x == 0) loss[blockIdx.x] = lse - target_logit;

  // (softmax - onehot(target)) · dloss_scale of element i, whose logit is x
  auto grad = [&](int i, float x) {
    const float p = expf(x - lse);
    return __float2bfloat16_rn((i == target ? p - 1.0f : p) * dloss_scale);
  };
  if (int(threadIdx.x) < s.head)
    row[threadIdx.x] = grad(threadIdx.x, __bfloat162float(row[threadIdx.x]));
  for (int p = threadIdx.x; p < s.packs; p += kThreads) {
    const Pack x = packs[p];
    const int i0 = s.head + p * kVec;
    Pack out;
#pragma unroll
    for (int k = 0; k < kVec; k++) out.v[k] = grad(i0 + k, __bfloat162float(x.v[k]));
    packs[p] = out;
  }
  if (edge < V) row[edge] = grad(edge, __bfloat162float(row[edge]));
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
