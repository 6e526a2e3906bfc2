// Token embedding on the GPU: a row gather forward, a grouped row sum backward.
//
// The backward never adds floats atomically: the host sorts the batch's positions by token into
// groups (cuda_ops.h says how), so every row of dtable that changes belongs to exactly one
// group, and the block that owns a group sums its positions in ascending order before one store.
// The result is the same bits on every run, whatever the scheduling.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "src/core/error.h"

namespace grass::cuda {

namespace {

constexpr int kMaxThreads = 256;

// out[N, C] = table[tokens[n], :]; one block per row, each thread copies packs of VEC channels.
template <int VEC>
__global__ void embedding_forward_kernel(bf16* out, const int32_t* tokens, const bf16* table,
                                         int C) {
  const int64_t row = blockIdx.x;
  const BF16Pack<VEC>* src =
      reinterpret_cast<const BF16Pack<VEC>*>(table + int64_t(tokens[row]) * C);
  BF16Pack<VEC>* dst = reinterpret_cast<BF16Pack<VEC>*>(out + row * C);
  for (int p = threadIdx.x; p < C / VEC; p += blockDim.x) dst[p] = src[p];
}

// Block (g, y) owns channels [y·blockDim, (y+1)·blockDim) of group g's row of dtable; each thread
// sums one channel over the group's positions, in the order the host gave them.
//   dtable[V, C], dout[N, C], positions[N], group_start[G + 1], group_token[G]
template <typename GradT>
__global__ void embedding_backward_kernel(GradT* dtable, const bf16* dout, const int32_t* positions,
                                          const int32_t* group_start, const int32_t* group_token,
                                          int C) {
  const int group = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int begin = group_start[group], end = group_start[group + 1];
  float sum = 0.0f;
#pragma unroll 4
  for (int i = begin; i < end; i++) sum += __bfloat162float(dout[int64_t(positions[i]) * C + c]);
  accumulate_grad(dtable + int64_t(group_token[group]) * C + c, sum);
}

// The same sums, 8 channels a thread: 16-byte loads of dout's rows and one 16-byte (bf16) or two
// (fp32) read-modify-writes of dtable's. A group is mostly one or two positions, so the kernel
// above is bound by its 2-byte loads' latency (4% of DRAM bandwidth on an H100, GPU_PERF.md 2.8).
// Each channel adds the group's positions in the same order as there, then meets dtable by the
// same accumulate_grad: the same bits. Block (g, y) owns packs [y·blockDim, (y+1)·blockDim).
template <typename GradT>
__global__ void embedding_backward_pack_kernel(GradT* dtable, const bf16* dout,
                                               const int32_t* positions, const int32_t* group_start,
                                               const int32_t* group_token, int C) {
  const int group = blockIdx.x;
  const int p = blockIdx.y * blockDim.x + threadIdx.x;  // channels 8p .. 8p + 7
  if (p >= C / 8) return;
  const int begin = group_start[group], end = group_start[group + 1];
  float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (int i = begin; i < end; i++) {
    const BF16Pack<8> x =
        reinterpret_cast<const BF16Pack<8>*>(dout + int64_t(positions[i]) * C)[p];
#pragma unroll
    for (int e = 0; e < 8; e++) sum[e] += __bfloat162float(x.v[e]);
  }
  GradT* row = dtable + int64_t(group_token[group]) * C + 8 * p;
  if constexpr (std::is_same_v<GradT, float>) {
    float4* r = reinterpret_cast<float4*>(row);
    float4 a = r[0], b = r[1];
    accumulate_grad(&a.x, sum[0]);
    accumulate_grad(&a.y, sum[1]);
    accumulate_grad(&a.z, sum[2]);
    accumulate_grad(&a.w, sum[3]);
    accumulate_grad(&b.x, sum[4]);
    accumulate_grad(&b.y, sum[5]);
    accumulate_grad(&b.z, sum[6]);
    accumulate_grad(&b.w, sum[7]);
    r[0] = a;
    r[1] = b;
  } else {
    BF16Pack<8>* r = reinterpret_cast<BF16Pack<8>*>(row);
    BF16Pack<8> g = *r;
#pragma unroll
    for (int e = 0; e < 8; e++) accumulate_grad(&g.v[e], sum[e]);
    *r = g;
  }
}


}  // namespace

void embedding_forward(const Context& ctx, bf16* out, const int32_t* tokens, const bf16* table,
                       int64_t N, int C) {
  GRASS_CHECK(N >= 0 && N <= INT32_MAX && C > 0, "embedding_forward: bad shape");
  if (N == 0) return;
  // 16-byte copies when every row starts on a 16-byte boundary.
  const bool vec = C % 8 == 0 && aligned16(out) && aligned16(table);
  const int packs = vec ? C / 8 : C;
  const int threads = int(std::min<int64_t>(kMaxThreads, ceil_div(packs, 32) * 32));
  if (vec)
    embedding_forward_kernel<8><<<unsigned(N), threads, 0, ctx.stream>>>(out, tokens, table, C);
  else
    embedding_forward_kernel<1><<<unsigned(N), threads, 0, ctx.stream>>>(out, tokens, table, C);
  GRASS_LAUNCH_CHECK();
}

void embedding_backward(const Context& ctx, void* dtable, GradType gtype, const bf16* dout,
                        const int32_t* positions, const int32_t* group_start,
                        const int32_t* group_token, int num_groups, int C) {
  GRASS_CHECK(num_groups >= 0 && C > 0, "embedding_backward: bad shape");
  if (num_groups == 0) return;
  // packs of 8 where every row of dout and dtable starts on a 16-byte boundary
  if (C % 8 == 0 && aligned16(dout) && aligned16(dtable)) {
    const int packs = C / 8;
    const int threads = int(std::min<int64_t>(kMaxThreads, ceil_div(packs, 32) * 32));
    const dim3 grid(unsigned(num_groups), unsigned(ceil_div(packs, threads)));
    if (gtype == GradType::F32)
      embedding_backward_pack_kernel<<<grid, threads, 0, ctx.stream>>>(
          static_cast<float*>(dtable), dout, positions, group_start, group_token, C);
    else
      embedding_backward_pack_kernel<<<grid, threads, 0, ctx.stream>>>(
          static_cast<bf16*>(dtable), dout, positions, group_start, group_token, C);
    GRASS_LAUNCH_CHECK();
    return;
  }
  const dim3 grid(unsigned(num_groups), unsigned(ceil_div(C, kMaxThreads)));
  if (gtype == GradType::F32)
    embedding_backward_kernel<<<grid, kMaxThreads, 0, ctx.stream>>>(
        static_cast<float*>(dtable), dout, positions, group_start, group_token, C);
  else
    embedding_backward_kernel<<<grid, kMaxThreads, 0, ctx.stream>>>(
        static_cast<bf16*>(dtable), dout, positions, group_start, group_token, C);
  GRASS_LAUNCH_CHECK();
}

}  // namespace grass::cuda
