// 8-bit blockwise quantization on the GPU (kernels/quant8.h has the format and the rounding; the
// CPU reference: kernels/cpu/quant8.cpp), over the blocks of a layout (flat: bitsandbytes').
// One thread block per quantization block: its threads stride over the block's values for the
// absmax (a max, so its order cannot change the result; fmaxf passes over NaN as the CPU's fmax
// does), then encode with quant8_encode, the header's, so each code is the CPU's (correctly
// rounded 1/absmax and product, no fast math).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/quant8.h"

namespace grass::cuda {

namespace {

constexpr int kThreads = 256;

//   x[rows·cols] -> codes, absmax[layout.blocks()]; map: the 256 values and 255 bounds, by value
__global__ void quantize_layout_kernel(uint8_t* codes, float* absmax, const float* x,
                                       const Quant8Layout layout, const Quant8Map map) {
  __shared__ float partial[kThreads];
  const int64_t b = blockIdx.x;
  float a = 0.0f;
  for (int k = threadIdx.x; k < layout.block && layout.index(b, k) >= 0; k += blockDim.x)
    a = fmaxf(a, fabsf(x[layout.index(b, k)]));
  partial[threadIdx.x] = a;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + half]);
    __syncthreads();
  }
  a = partial[0];
  if (threadIdx.x == 0) absmax[b] = a;
  for (int k = threadIdx.x; k < layout.block && layout.index(b, k) >= 0; k += blockDim.x)
    codes[layout.index(b, k)] = quant8_encode(map, x[layout.index(b, k)], a);
}

//   x = map[codes] · the block's absmax, one thread block per quantization block
__global__ void dequantize_layout_kernel(float* x, const uint8_t* codes, const float* absmax,
                                         const Quant8Layout layout, const Quant8Map map) {
  const int64_t b = blockIdx.x;
  for (int k = threadIdx.x; k < layout.block && layout.index(b, k) >= 0; k += blockDim.x)
    x[layout.index(b, k)] = quant8_decode(map, codes[layout.index(b, k)], absmax[b]);
}

}  // namespace

void quantize_layout(const Context& ctx, const Quant8Map& map, const float* x,
                     const Quant8Layout& layout, uint8_t* codes, float* absmax) {
  if (layout.blocks() == 0) return;
  GRASS_CHECK(layout.blocks() <= INT32_MAX, "quantize_layout: too many blocks");
  quantize_layout_kernel<<<unsigned(layout.blocks()), kThreads, 0, ctx.stream>>>(codes, absmax, x,
                                                                                 layout, map);
  GRASS_LAUNCH_CHECK();
}

void dequantize_layout(const Context& ctx, const Quant8Map& map, const uint8_t* codes,
                       const float* absmax, const Quant8Layout& layout, float* x) {
  if (layout.blocks() == 0) return;
  GRASS_CHECK(layout.blocks() <= INT32_MAX, "dequantize_layout: too many blocks");
  dequantize_layout_kernel<<<unsigned(layout.blocks()), kThreads, 0, ctx.stream>>>(
      x, codes, absmax, layout, map);
  GRASS_LAUNCH_CHECK();
}

void quantize_blockwise(const Context& ctx, const Quant8Map& map, const float* x, int64_t n,
                        int block, uint8_t* codes, float* absmax) {
  quantize_layout(ctx, map, x, {.rows = 1, .cols = n, .block = block}, codes, absmax);
}

void dequantize_blockwise(const Context& ctx, const Quant8Map& map, const uint8_t* codes,
                          const float* absmax, int64_t n, int block, float* x) {
  dequantize_layout(ctx, map, codes, absmax, {.rows = 1, .cols = n, .block = block}, x);
}

}  // namespace grass::cuda
