// The residual add on the GPU (the CPU reference: kernels/cpu/residual.cpp): elementwise,
// memory-bound. Each thread adds one pack of VEC bf16 values: 8 (16-byte loads and stores) when n
// is a multiple of 8 and every pointer is 16-byte aligned, else 1; the sum in fp32, one rounding
// to bf16 at the store. The forward's adds that an RMSNorm reads run fused with it
// (residual_rmsnorm_forward, kernels/cuda/rmsnorm.cu), with this kernel's bits.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "src/core/error.h"

namespace grass::cuda {

namespace {

constexpr int kThreads = 256;

// out[n] = a + b; out may alias a (each thread reads its pack before writing it).
template <int VEC>
__global__ void residual_forward_kernel(bf16* out, const bf16* a, const bf16* b, int64_t packs) {
  using Pack = BF16Pack<VEC>;
  const int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= packs) return;
  const Pack ap = reinterpret_cast<const Pack*>(a)[p];
  const Pack bp = reinterpret_cast<const Pack*>(b)[p];
  Pack op;
#pragma unroll
  for (int j = 0; j < VEC; j++)
    op.v[j] = __float2bfloat16_rn(__bfloat162float(ap.v[j]) + __bfloat162float(bp.v[j]));
  reinterpret_cast<Pack*>(out)[p] = op;
}

}  // namespace

void residual_forward(const Context& ctx, bf16* out, const bf16* a, const bf16* b, int64_t n) {
  GRASS_CHECK(n >= 0, "residual_forward: negative size");
  if (n == 0) return;
  if (vectorizable(n, out, a, b))
    residual_forward_kernel<8>
        <<<grid_for(n / 8, kThreads), kThreads, 0, ctx.stream>>>(out, a, b, n / 8);
  else
    residual_forward_kernel<1><<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(out, a, b, n);
  GRASS_LAUNCH_CHECK();
}

}  // namespace grass::cuda
