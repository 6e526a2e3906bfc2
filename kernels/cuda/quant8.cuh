// An Adam step over 8-bit moments on the GPU (kernels/quant8.h; the CPU's loop:
// kernels/cpu/quant8_step.h), shared by the optimizers' 8-bit kernels (AdamW's, GRASS's). One
// thread block of kQuant8Threads threads takes quantization blocks in turn (grid-stride, so the
// maps are copied to shared memory once per thread block); thread t owns elements t,
// t + kQuant8Threads, ... of a block, at most kQuant8PerThread (blocks of at most 4,096), kept in
// registers between the step and the requantization. Include only from .cu files.
#pragma once
#include <cstdint>

#include "kernels/quant8.h"

namespace grass::cuda {

constexpr int kQuant8Threads = 256;
constexpr int kQuant8PerThread = 4096 / kQuant8Threads;
// Thread blocks of an 8-bit step: enough to fill an H100 several times over; each copies the
// maps (4 KiB) once.
constexpr int64_t kQuant8MaxGrid = 2048;

// The shared memory of one thread block: both maps and the warps' partial maxima.
struct Quant8Shared {
  Quant8Map m, v;
  float warp_max[kQuant8Threads / 32];
};

__device__ inline void load_quant8_maps(Quant8Shared& sh, const Quant8Map& m, const Quant8Map& v) {
  for (int c = threadIdx.x; c < 256; c += blockDim.x) {
    sh.m.value[c] = m.value[c];
    sh.v.value[c] = v.value[c];
    if (c < 255) {
      sh.m.bound[c] = m.bound[c];
      sh.v.bound[c] = v.bound[c];
    }
  }
  if (threadIdx.x == 0) {
    sh.m.zero = m.zero;
    sh.v.zero = v.zero;
  }
  __syncthreads();
}

// The largest of every thread's x (x ≥ 0, so the order of the max does not matter).
__device__ inline float quant8_block_max(float x, float* warp_max) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  __syncthreads();  // the previous call's readers are done with warp_max
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = x;
  __syncthreads();
  float all = 0.0f;
  for (int w = 0; w < kQuant8Threads / 32; w++) all = fmaxf(all, warp_max[w]);
  return all;
}

// Block b of the layout: step(i, m, v) updates state element i's decoded moments in place (and
// writes what else it owns), then the block's absmax and codes are taken from the new moments.
// Every thread of the block calls it.
template <typename Step>
__device__ void quant8_adam_block(const Quant8Layout& layout, int64_t b, const Quant8Moments& s,
                                  Quant8Shared& sh, Step&& step) {
  const float old_m = s.absmax_m[b], old_v = s.absmax_v[b];
  float m[kQuant8PerThread], v[kQuant8PerThread];
  float max_m = 0.0f, max_v = 0.0f;
#pragma unroll
  for (int e = 0; e < kQuant8PerThread; e++) {
    const int k = threadIdx.x + e * kQuant8Threads;
    const int64_t i = k < layout.block ? layout.index(b, k) : -1;
    m[e] = v[e] = 0.0f;
    if (i < 0) continue;
    m[e] = quant8_decode(sh.m, s.m[i], old_m);
    v[e] = quant8_decode(sh.v, s.v[i], old_v);
    step(i, m[e], v[e]);
    max_m = fmaxf(max_m, fabsf(m[e]));
    max_v = fmaxf(max_v, v[e]);
  }
  max_m = quant8_block_max(max_m, sh.warp_max);
  max_v = quant8_block_max(max_v, sh.warp_max);
  if (threadIdx.x == 0) {
    s.absmax_m[b] = max_m;
    s.absmax_v[b] = max_v;
  }
#pragma unroll
  for (int e = 0; e < kQuant8PerThread; e++) {
    const int k = threadIdx.x + e * kQuant8Threads;
    const int64_t i = k < layout.block ? layout.index(b, k) : -1;
    if (i < 0) continue;
    s.m[i] = quant8_encode(sh.m, m[e], max_m);
    s.v[i] = quant8_encode(sh.v, v[e], max_v);
  }
}

// Finite (neither NaN nor ±Inf): the 8-bit steps' test for a gradient they can use.
__device__ __forceinline__ bool quant8_finite(float x) { return fabsf(x) <= 3.402823466e38f; }

}  // namespace grass::cuda
