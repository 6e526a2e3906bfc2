// The kernels of tests/gpu/mma_ptx_kernels.h, on kernels/cuda/mma_ptx.cuh's instructions.
#include "tests/gpu/mma_ptx_kernels.h"

#include <cstdint>

#include "kernels/cuda/mma_ptx.cuh"

namespace grass::gputest::mma_ptx {

using grass::cuda::cp_async_cg_16;
using grass::cuda::cp_async_commit;
using grass::cuda::cp_async_wait;
using grass::cuda::ldmatrix_x1;
using grass::cuda::ldmatrix_x1_trans;
using grass::cuda::ldmatrix_x2;
using grass::cuda::ldmatrix_x2_trans;
using grass::cuda::ldmatrix_x4;
using grass::cuda::ldmatrix_x4_trans;
using grass::cuda::mma_m16n8k16_bf16;
using grass::cuda::pack_bf16x2;

namespace {

// Two bf16 of shared memory as one fragment register (p[0] in the low half).
__device__ uint32_t pair_at(const bf16* p) { return pack_bf16x2(float(p[0]), float(p[1])); }

// One warp. Shared memory: A 16 x 16, B as [n][k] 8 x 16, B as [k][n] 16 x 8 (1 KiB).
__global__ void mma_16x8x16_kernel(const bf16* a, const bf16* b_nk, const bf16* b_kn, const float* c,
                                   float* d, FragmentLoad load) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sa = reinterpret_cast<bf16*>(smem);
  bf16* sb_nk = sa + 16 * 16;
  bf16* sb_kn = sb_nk + 8 * 16;
  const int lane = threadIdx.x;
  cp_async_cg_16(sa + 8 * lane, a + 8 * lane);  // 32 chunks of 16 bytes
  if (lane < 16) {
    cp_async_cg_16(sb_nk + 8 * lane, b_nk + 8 * lane);
    cp_async_cg_16(sb_kn + 8 * lane, b_kn + 8 * lane);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  const int g = lane / 4, t = lane % 4;
  uint32_t af[4], bf[2];
  float acc[4];
  for (int i = 0; i < 4; i++) acc[i] = c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
  switch (load) {
    case FragmentLoad::by_index:
      for (int h = 0; h < 4; h++) af[h] = pair_at(sa + (g + 8 * (h % 2)) * 16 + 2 * t + 8 * (h / 2));
      for (int h = 0; h < 2; h++) bf[h] = pair_at(sb_nk + g * 16 + 2 * t + 8 * h);
      break;
    case FragmentLoad::x4_x2:
      ldmatrix_x4(af, sa + (lane % 16) * 16 + 8 * (lane / 16));
      ldmatrix_x2(bf, sb_nk + (lane % 8) * 16 + 8 * (lane / 8 % 2));
      break;
    case FragmentLoad::x4_x2_trans:
      ldmatrix_x4(af, sa + (lane % 16) * 16 + 8 * (lane / 16));
      ldmatrix_x2_trans(bf, sb_kn + (lane % 16) * 8);
      break;
    case FragmentLoad::x1:
      for (int h = 0; h < 4; h++) ldmatrix_x1(&af[h], sa + (lane % 8 + 8 * (h % 2)) * 16 + 8 * (h / 2));
      for (int h = 0; h < 2; h++) ldmatrix_x1(&bf[h], sb_nk + (lane % 8) * 16 + 8 * h);
      break;
    case FragmentLoad::x2_x1_trans:
      for (int h = 0; h < 2; h++) ldmatrix_x2(&af[2 * h], sa + (lane % 16) * 16 + 8 * h);
      for (int h = 0; h < 2; h++) ldmatrix_x1_trans(&bf[h], sb_kn + (8 * h + lane % 8) * 8);
      break;
  }
  mma_m16n8k16_bf16(acc, af, bf);
  for (int i = 0; i < 4; i++) d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = acc[i];
}

// 4 warps, warp w computing rows 16w .. 16w+15 as 8 tiles of 16 x 8. Shared memory: A and B,
// 64 x 64 bf16 each (16 KiB), both row-major with rows of 128 bytes.
__global__ void gemm_64x64x64_kernel(const bf16* a, const bf16* b, bool b_is_kn, float* d) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sa = reinterpret_cast<bf16*>(smem);
  bf16* sb = sa + 64 * 64;
  for (int chunk = threadIdx.x; chunk < 64 * 64 / 8; chunk += blockDim.x) {
    cp_async_cg_16(sa + 8 * chunk, a + 8 * chunk);
    cp_async_cg_16(sb + 8 * chunk, b + 8 * chunk);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int m = lane / 8, r = lane % 8;  // the matrix and row this lane addresses for ldmatrix.x4
  float acc[8][4] = {};
  for (int kk = 0; kk < 64; kk += 16) {
    uint32_t af[4];
    ldmatrix_x4(af, sa + (16 * warp + lane % 16) * 64 + kk + 8 * (lane / 16));
    for (int n0 = 0; n0 < 64; n0 += 16) {
      // b[0], b[1] of the tile at n0, then of the tile at n0 + 8
      uint32_t bq[4];
      if (b_is_kn)
        ldmatrix_x4_trans(bq, sb + (kk + r + 8 * (m % 2)) * 64 + n0 + 8 * (m / 2));
      else
        ldmatrix_x4(bq, sb + (n0 + r + 8 * (m / 2)) * 64 + kk + 8 * (m % 2));
      mma_m16n8k16_bf16(acc[n0 / 8], af, bq);
      mma_m16n8k16_bf16(acc[n0 / 8 + 1], af, bq + 2);
    }
  }
  const int g = lane / 4, t = lane % 4;
  for (int nt = 0; nt < 8; nt++)
    for (int i = 0; i < 4; i++) d[(16 * warp + g + 8 * (i / 2)) * 64 + 8 * nt + 2 * t + i % 2] = acc[nt][i];
}

__global__ void cp_async_pipeline_kernel(const float* x, int tiles, float* out, bool wait) {
  __shared__ uint4 stages[2 * kPipelineThreads];  // two tiles of 512 floats
  const int i = threadIdx.x;
  const float* src = x + int64_t(blockIdx.x) * tiles * kPipelineTile;
  cp_async_cg_16(&stages[i], src + 4 * i);
  cp_async_commit();
  float sum = 0.0f;
  for (int tile = 0; tile < tiles; tile++) {
    if (tile + 1 < tiles)
      cp_async_cg_16(&stages[(tile + 1) % 2 * kPipelineThreads + i], src + (tile + 1) * kPipelineTile + 4 * i);
    cp_async_commit();  // empty at the last tile: one group in flight still means this tile landed
    if (wait) cp_async_wait<1>();
    __syncthreads();  // every thread's copies of this tile have landed
    const float* stage = reinterpret_cast<const float*>(&stages[tile % 2 * kPipelineThreads]);
    for (int j = 0; j < 4; j++) sum += stage[kPipelineTile - 1 - 4 * i - j];
    __syncthreads();  // read by all before tile + 2 is copied over it
  }
  out[blockIdx.x * kPipelineThreads + i] = sum;
}

// Stage k's 16 bytes of this lane, as 4 floats, into out.
__device__ void read_stages(const uint4* stages, float* out) {
  const int lane = threadIdx.x;
  for (int k = 0; k < 4; k++) {
    const float* s = reinterpret_cast<const float*>(&stages[k * 32 + lane]);
    for (int j = 0; j < 4; j++) out[k * 128 + 4 * lane + j] = s[j];
  }
}

__global__ void cp_async_groups_kernel(const float* x, float* out) {
  __shared__ uint4 stages[4 * 32];
  const int lane = threadIdx.x;
  for (int k = 0; k < 4; k++) {
    cp_async_cg_16(&stages[k * 32 + lane], x + k * 128 + 4 * lane);
    if (k < 3) cp_async_commit();
  }
  cp_async_wait<2>();
  read_stages(stages, out);
  cp_async_wait<1>();
  read_stages(stages, out + 512);
  cp_async_wait<0>();
  read_stages(stages, out + 1024);
}

__global__ void misuse_kernel(Misuse kind, bf16* global_tile) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x % 32;
  uint32_t af[4] = {pack_bf16x2(1.0f, 2.0f), pack_bf16x2(3.0f, 4.0f), 0u, 0u};
  uint32_t bf[2] = {pack_bf16x2(5.0f, 6.0f), 0u};
  float acc[4] = {};
  switch (kind) {
    case Misuse::mma_half_warp:
      if (lane < 16) mma_m16n8k16_bf16(acc, af, bf);
      break;
    case Misuse::mma_short_warp:
      mma_m16n8k16_bf16(acc, af, bf);
      break;
    case Misuse::ldmatrix_and_mma:
      if (lane < 16)
        ldmatrix_x4(af, smem + 16 * lane);
      else
        mma_m16n8k16_bf16(acc, af, bf);
      break;
    case Misuse::ldmatrix_unaligned:
      ldmatrix_x4(af, smem + 16 * lane + 8);
      break;
    case Misuse::ldmatrix_global:
      ldmatrix_x4(af, global_tile + 8 * lane);
      break;
    case Misuse::cp_async_unaligned:
      cp_async_cg_16(smem + 16 * lane + 8, global_tile + 8 * lane);
      break;
    case Misuse::cp_async_global_dst:
      cp_async_cg_16(global_tile + 8 * (lane % 16), global_tile + 8 * (lane % 16 + 16));
      break;
  }
  cp_async_commit();
  cp_async_wait<0>();
  // keep the results live: a lane that read an all-NaN fragment writes NaN
  if (acc[0] != acc[0] || af[0] == 0xFFFFFFFFu) global_tile[lane] = bf16(0.0f);
}

}  // namespace

cudaError_t mma_16x8x16(const bf16* a, const bf16* b_nk, const bf16* b_kn, const float* c, float* d,
                        FragmentLoad load) {
  mma_16x8x16_kernel<<<1, 32, 1024>>>(a, b_nk, b_kn, c, d, load);
  return cudaGetLastError();
}

cudaError_t gemm_64x64x64(const bf16* a, const bf16* b, bool b_is_kn, float* d) {
  gemm_64x64x64_kernel<<<1, 128, 2 * 64 * 64 * sizeof(bf16)>>>(a, b, b_is_kn, d);
  return cudaGetLastError();
}

cudaError_t cp_async_pipeline(const float* x, int blocks, int tiles, float* out, bool wait) {
  cp_async_pipeline_kernel<<<blocks, kPipelineThreads>>>(x, tiles, out, wait);
  return cudaGetLastError();
}

cudaError_t cp_async_groups(const float* x, float* out) {
  cp_async_groups_kernel<<<1, 32>>>(x, out);
  return cudaGetLastError();
}

cudaError_t misuse(Misuse kind, bf16* global_tile) {
  const int threads = kind == Misuse::mma_short_warp ? 16 : 32;
  misuse_kernel<<<1, threads, 1024>>>(kind, global_tile);
  return cudaGetLastError();
}

}  // namespace grass::gputest::mma_ptx
