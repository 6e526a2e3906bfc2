// 8-bit blockwise quantization on the GPU (kernels/quant8.h has the format and the rounding; the
// CPU reference: kernels/cpu/quant8.cpp). One thread block per quantization block: its threads
// stride over the block's values for the absmax (a max, so its order cannot change the result;
// fmaxf passes over NaN as the CPU's fmax does), then encode with quant8_encode, the header's,
// so each code is the CPU's (correctly rounded 1/absmax and product, no fast math).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/quant8.h"

namespace grass::cuda {

namespace {

constexpr int kThreads = 256;

//   x[n] -> codes[n], absmax[ceil(n / block)]; map: the 256 values and 255 bounds, by value
__global__ void quantize_blockwise_kernel(uint8_t* codes, float* absmax, const float* x, int64_t n,
                                          int block, const Quant8Map map) {
  __shared__ float partial[kThreads];
  const int64_t b0 = int64_t(blockIdx.x) * block;
  const int64_t b1 = b0 + block < n ? b0 + block : n;
  float a = 0.0f;
  for (int64_t i = b0 + threadIdx.x; i < b1; i += blockDim.x) a = fmaxf(a, fabsf(x[i]));
  partial[threadIdx.x] = a;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + half]);
    __syncthreads();
  }
  a = partial[0];
  if (threadIdx.x == 0) absmax[blockIdx.x] = a;
  for (int64_t i = b0 + threadIdx.x; i < b1; i += blockDim.x) codes[i] = quant8_encode(map, x[i], a);
}

//   x[n] = map[codes[i]] · absmax[i / block]
__global__ void dequantize_blockwise_kernel(float* x, const uint8_t* codes, const float* absmax,
                                            int64_t n, int block, const Quant8Map map) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = quant8_decode(map, codes[i], absmax[i / block]);
}

}  // namespace

void quantize_blockwise(const Context& ctx, const Quant8Map& map, const float* x, int64_t n,
                        int block, uint8_t* codes, float* absmax) {
  const int64_t blocks = ceil_div(n, block);
  if (blocks == 0) return;
  quantize_blockwise_kernel<<<unsigned(blocks), kThreads, 0, ctx.stream>>>(codes, absmax, x, n,
                                                                           block, map);
  GRASS_LAUNCH_CHECK();
}

void dequantize_blockwise(const Context& ctx, const Quant8Map& map, const uint8_t* codes,
                          const float* absmax, int64_t n, int block, float* x) {
  if (n == 0) return;
  dequantize_blockwise_kernel<<<unsigned(ceil_div(n, kThreads)), kThreads, 0, ctx.stream>>>(
      x, codes, absmax, n, block, map);
  GRASS_LAUNCH_CHECK();
}

}  // namespace grass::cuda
