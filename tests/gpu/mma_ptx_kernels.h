// Small kernels written with kernels/cuda/mma_ptx.cuh (mma.sync, ldmatrix, cp.async), for
// tests/gpu/test_gpu_mma_ptx.cpp: launchers on the default stream, each returning the launch's
// cudaGetLastError(). The kernels are in mma_ptx_kernels.cu, compiled by nvcc for
// grass_gpu_tests and translated for the CUDA emulator for grass_gpu_emu_tests.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace grass::gputest::mma_ptx {

using bf16 = __nv_bfloat16;

// How the 16 x 8 x 16 kernel forms its A and B fragments from shared memory.
enum class FragmentLoad {
  by_index,           // element by element, at the PTX ISA's positions (no ldmatrix)
  x4_x2,              // A by ldmatrix.x4, B by .x2 from B stored as [n][k]
  x4_x2_trans,        // A by .x4, B by .x2.trans from B stored as [k][n]
  x1,                 // A by four .x1, B by two .x1 from [n][k]
  x2_x1_trans,        // A by two .x2, B by two .x1.trans from [k][n]
};
constexpr FragmentLoad kFragmentLoads[] = {FragmentLoad::by_index, FragmentLoad::x4_x2,
                                           FragmentLoad::x4_x2_trans, FragmentLoad::x1,
                                           FragmentLoad::x2_x1_trans};

// d = a·b + c by one mma.sync.m16n8k16 in one warp: a 16 x 16 row-major, B given both as b_nk
// (8 x 16, [n][k]) and b_kn (16 x 8, [k][n]), c and d 16 x 8 row-major fp32. The operands go
// to shared memory by cp.async first.
cudaError_t mma_16x8x16(const bf16* a, const bf16* b_nk, const bf16* b_kn, const float* c, float* d,
                        FragmentLoad load);

// d = a·b for 64 x 64 tiles, by 4 warps of ldmatrix + mma.sync over k in 4 steps: a row-major
// [m][k]; b row-major [k][n] (b_is_kn, B's fragments by ldmatrix.x4.trans) or [n][k] (.x4).
cudaError_t gemm_64x64x64(const bf16* a, const bf16* b, bool b_is_kn, float* d);

// A two-stage cp.async pipeline: block i of `blocks` streams its `tiles` tiles of 512 floats
// (x + i·tiles·512 ...) through two shared-memory stages, each of its 128 threads summing the 4
// floats 511 - 4·thread - j (j = 0..3) of every tile, tile by tile, into out[i·128 + thread] (so
// each thread reads what another thread copied). wait = false drops the cp.async.wait_group,
// a bug the late copies mode must expose.
cudaError_t cp_async_pipeline(const float* x, int blocks, int tiles, float* out, bool wait);
constexpr int kPipelineThreads = 128;
constexpr int kPipelineTile = 512;

// cp.async's groups, in one warp: each lane copies 16 bytes of x into each of 4 shared stages
// (x and each stage 128 floats, lane l's at 4l), stages 0, 1 and 2 as a group each, committed in
// that order, stage 3 never committed; then after cp.async.wait_group 2, 1 and 0 in turn it reads
// all 4 stages back into out[r·512 + 128·stage + 4l ...] (r = 0, 1, 2). A lane reads only its own
// copies, which its own wait covers. For the emulator's late copies (on a GPU the stages not yet
// waited for are a race).
cudaError_t cp_async_groups(const float* x, float* out);

// Misuses the emulator must report, each by one launch of one warp (global_tile: 16 x 16 bf16 of
// device memory).
enum class Misuse {
  mma_half_warp,            // lanes 0-15 reach mma.sync, 16-31 return
  mma_short_warp,           // a block of 16 threads: no full warp
  ldmatrix_and_mma,         // lanes 0-15 at ldmatrix, 16-31 at mma.sync
  ldmatrix_unaligned,       // a row address 8 bytes into shared memory
  ldmatrix_global,          // a row address in device (global) memory
  cp_async_unaligned,       // a destination 8 bytes into shared memory
  cp_async_global_dst,      // a destination in device (global) memory
};
cudaError_t misuse(Misuse kind, bf16* global_tile);

}  // namespace grass::gputest::mma_ptx
