// The reductions behind gradient clipping on the GPU (the CPU reference: kernels/cpu/reduce.cpp):
// Σ x² of a gradient, Σ x (the head's loss), and the clipping coefficient from the squared norm
// (kernels/clip_rule.h), all on the device so that a step never waits for its norm.
//
// No sum adds floats atomically: a grid whose size depends on n alone writes one double per block
// to scratch, and one block adds those in a fixed tree; the same n and data give the same bits on
// every run and every device.
#include <algorithm>
#include <cstdint>

#include "kernels/clip_rule.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "src/core/error.h"

namespace grass::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kSumMaxBlocks = 1024;  // sum_squares' first stage: at most this many partials

__device__ __forceinline__ double square(float x) { return double(x) * double(x); }
__device__ __forceinline__ double square(bf16 x) { return square(__bfloat162float(x)); }

// Stage 1: partial[b] = Σ x[i]² (or Σ x[i] when !kSquare) over the grid-stride slice of block b
// (i ≡ thread's index).
//   partial[gridDim.x], x[n]
template <bool kSquare, typename T>
__global__ void sum_squares_partial_kernel(double* partial, const T* x, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  double sum = 0.0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if constexpr (kSquare)
      sum += square(x[i]);
    else
      sum += double(x[i]);
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// Stage 2, one block: *acc += Σ partial[0 .. num_partials), thread t taking t, t + blockDim, ...
__global__ void sum_squares_final_kernel(double* acc, const double* partial, int num_partials) {
  double sum = 0.0;
  for (int i = threadIdx.x; i < num_partials; i += blockDim.x) sum += partial[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) *acc += sum;
}

// Backend::clip on the device, one thread: the rule of kernels/clip_rule.h in fp64.
__global__ void clip_kernel(ClipScalars* s, double max_norm) { clip_gathered(s, max_norm); }

}  // namespace

int64_t sum_squares_scratch_doubles(int64_t n) {
  return std::min(kSumMaxBlocks, std::max<int64_t>(1, ceil_div(n, kThreads)));
}

void sum_squares(const Context& ctx, double* acc, const void* x, GradType gtype, int64_t n,
                 double* scratch) {
  GRASS_CHECK(n >= 0, "sum_squares: negative size");
  // At least one block even for n = 0: the stages run the same way for every n.
  const int blocks = int(sum_squares_scratch_doubles(n));
  if (gtype == GradType::F32)
    sum_squares_partial_kernel<true, float><<<blocks, kThreads, 0, ctx.stream>>>(
        scratch, static_cast<const float*>(x), n);
  else
    sum_squares_partial_kernel<true, bf16><<<blocks, kThreads, 0, ctx.stream>>>(
        scratch, static_cast<const bf16*>(x), n);
  GRASS_LAUNCH_CHECK();
  sum_squares_final_kernel<<<1, kThreads, 0, ctx.stream>>>(acc, scratch, blocks);
  GRASS_LAUNCH_CHECK();
}

void sum(const Context& ctx, double* acc, const float* x, int64_t n, double* scratch) {
  GRASS_CHECK(n >= 0, "sum: negative size");
  const int blocks = int(sum_squares_scratch_doubles(n));
  sum_squares_partial_kernel<false, float><<<blocks, kThreads, 0, ctx.stream>>>(scratch, x, n);
  GRASS_LAUNCH_CHECK();
  sum_squares_final_kernel<<<1, kThreads, 0, ctx.stream>>>(acc, scratch, blocks);
  GRASS_LAUNCH_CHECK();
}

void clip(const Context& ctx, ClipScalars* s, double max_norm) {
  clip_kernel<<<1, 1, 0, ctx.stream>>>(s, max_norm);
  GRASS_LAUNCH_CHECK();
}

}  // namespace grass::cuda
