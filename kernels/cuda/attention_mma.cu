// Causal GQA attention forward, FA2-style (issue 45, ../shared/GPU_PERF.md §2.1): the `attention:
// "mma"` kernels. The same contract as attention_forward without RoPE (cuda_ops.h): q and k come
// rotated (the backend rotates them in place with rope_forward first, as for cuDNN), out[B,T,NH,HD]
// and lse[B,NH,T] (natural log) as the old kernel writes them, so the old backward takes over.
//
// One CTA of 4 warps per (query block of 64 rows, head, batch), the longest rows first. Warp w owns
// query rows 16w .. 16w+15 of the block and keeps everything of them in registers
// (kernels/cuda/mma_ptx.cuh's fragment layouts; g = lane / 4, t = lane % 4, so a lane holds rows
// g and g + 8):
//   - Q as mma A fragments, loaded once (cp.async into shared memory, then ldmatrix.x4);
//   - per key block of 64, S = Q·Kᵀ as 8 m16n8 fp32 tiles by mma.sync.m16n8k16, K's B fragments by
//     ldmatrix.x4 from K stored [key][hd];
//   - the online softmax on those accumulators: the row max over the quad that shares a row (two
//     __shfl_xor), p = 2^(s·log2(e)/√HD − m) in fp32 (one fmaf, then exp2f), each lane's partial
//     row sum l rescaled with O (the quad's partials are summed once, at the end);
//   - P rounded to bf16 straight into the A fragments of P·V (an m16n8 C tile pair is one
//     m16n8k16 A fragment), V's B fragments by ldmatrix.x4.trans from V stored [key][hd];
//   - O as HD/8 m16n8 fp32 tiles, rescaled in registers.
// K and V stream through a two-stage cp.async ring: block j+1 is copied while block j is computed,
// with one __syncthreads per key block (after the wait for block j, which also frees block j-1's
// stage). Causal: the last key block of a query block is always its diagonal block (Br = Bc), the
// only one masked; blocks above the diagonal are never loaded. Rows past T are zero in shared
// memory (K and V: so a masked P of 0 never meets a NaN), computed, and never stored.
// Epilogue: O/l staged as bf16 through the warp's own rows of Q's shared memory, then 16-byte
// coalesced stores; lse = (m + log2 l)·ln 2.
//
// Shared memory rows are HD + 8 elements (16 bytes of pad): the 8 rows an ldmatrix phase reads then
// start 4 banks apart, conflict-free, as an XOR swizzle would be, for every HD taken. Taken: HD 16,
// 32, 64, 128; any other HD runs the old forward (attention.cu), which has the same contract.
// Every sum runs in a fixed order: the results repeat bit for bit, whatever the blocks' order.
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/mma_ptx.cuh"
#include "src/core/error.h"

namespace grass::cuda {

namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kBr = 64;        // query rows a CTA, 16 a warp
constexpr int kBc = 64;        // key rows a block; == kBr, so the last block is the diagonal one
constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2 = 0.6931471805599453;

template <int HD>
constexpr int kRowElements = HD + 8;  // a shared-memory row: HD and 16 bytes of pad
// Q, then K's two stages, then V's two: [64][HD + 8] bf16 each.
template <int HD>
constexpr int forward_smem_bytes() {
  return 5 * kBr * kRowElements<HD> * int(sizeof(bf16));
}
// sm_80's opt-in limit a block (163 KiB; sm_90's is 227 KiB): 85 KiB at HD 128, two CTAs an SM
static_assert(forward_smem_bytes<128>() <= 163 * 1024, "attention (mma): shared memory over sm_80's");

// dst[64][HD + 8] = rows [0, valid_rows) of src (HD columns at a pitch of `pitch` elements) by
// 16-byte cp.async into this thread's open group, and zeros (plain stores) for the rows past them.
template <int HD>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* src, int64_t pitch,
                                          int valid_rows) {
  constexpr int kChunks = HD / 8;
  for (int i = threadIdx.x; i < kBr * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    bf16* d = dst + r * kRowElements<HD> + c;
    if (r < valid_rows)
      cp_async_cg_16(d, src + r * pitch + c);
    else
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
  }
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    attention_forward_mma_kernel(bf16* out, float* lse, QkvRows<const bf16*> qkv, int T, int NH,
                                 int NKV, float scale_log2) {
  constexpr int kLd = kRowElements<HD>;
  constexpr int kKSteps = HD / 16;  // k steps of Q·Kᵀ
  constexpr int kOTiles = HD / 8;   // m16n8 tiles of O
  constexpr int kSTiles = kBc / 8;  // m16n8 tiles of S
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kBr;  // the longest rows first
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (NH / NKV);
  const int64_t row0 = int64_t(b) * T;  // the batch's first row
  const bf16* kg = qkv.k + row0 * qkv.ldk + kvh * HD;  // [T,HD] at pitch ldk
  const bf16* vg = qkv.v + row0 * qkv.ldv + kvh * HD;

  extern __shared__ __align__(128) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);  // [64][kLd]; O's staging at the end
  bf16* k_s = q_s + kBr * kLd;                // 2 stages of [64][kLd]
  bf16* v_s = k_s + 2 * kBc * kLd;            // 2 stages of [64][kLd]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int kv_end = min(T, q0 + kBr);  // the block's queries see keys [0, kv_end)
  const int blocks = (kv_end + kBc - 1) / kBc;
  load_tile<HD>(q_s, qkv.q + (row0 + q0) * qkv.ldq + h * HD, qkv.ldq, T - q0);
  load_tile<HD>(k_s, kg, qkv.ldk, T);
  load_tile<HD>(v_s, vg, qkv.ldv, T);
  cp_async_commit();

  uint32_t qf[kKSteps][4];  // this warp's 16 rows of Q as A fragments
  float o[kOTiles][4];      // O, unnormalised
#pragma unroll
  for (int n = 0; n < kOTiles; n++)
#pragma unroll
    for (int i = 0; i < 4; i++) o[n][i] = 0.0f;
  // Per row r of the lane's two (g, g + 8): the running max m (log2 units) and this lane's part of
  // Σ 2^(s - m). Every row sees key 0 in the first block, so m is finite from then on.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int row_in_block = 16 * warp + g;  // the lane's first row; the second is 8 further

  for (int j = 0; j < blocks; j++) {
    const int k0 = j * kBc;
    cp_async_wait<0>();
    // Block j has landed for every thread, and every warp is done with block j-1's stage, which
    // block j+1 now overwrites.
    __syncthreads();
    if (j + 1 < blocks) {
      const int stage = (j + 1) % 2;
      load_tile<HD>(k_s + stage * kBc * kLd, kg + (k0 + kBc) * qkv.ldk, qkv.ldk, T - k0 - kBc);
      load_tile<HD>(v_s + stage * kBc * kLd, vg + (k0 + kBc) * qkv.ldv, qkv.ldv, T - k0 - kBc);
    }
    cp_async_commit();
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < kKSteps; kk++)
        ldmatrix_x4(qf[kk], q_s + (16 * warp + lane % 16) * kLd + 16 * kk + 8 * (lane / 16));
    }
    const bf16* ks = k_s + (j % 2) * kBc * kLd;
    const bf16* vs = v_s + (j % 2) * kBc * kLd;

    // S = Q·Kᵀ: lane 8m + r addresses row r of matrix m, which is b[m % 2] of the n tile n0 + 8(m/2).
    float s[kSTiles][4];
#pragma unroll
    for (int n = 0; n < kSTiles; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) s[n][i] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; kk++)
#pragma unroll
      for (int n0 = 0; n0 < kBc; n0 += 16) {
        uint32_t kb[4];
        ldmatrix_x4(kb, ks + (n0 + lane % 8 + 8 * (lane / 16)) * kLd + 16 * kk + 8 * (lane / 8 % 2));
        mma_m16n8k16_bf16(s[n0 / 8], qf[kk], kb);
        mma_m16n8k16_bf16(s[n0 / 8 + 1], qf[kk], kb + 2);
      }
    if (j == blocks - 1) {  // the diagonal block (k0 = q0): key k0 + c is visible to q0 + r iff c ≤ r
#pragma unroll
      for (int n = 0; n < kSTiles; n++)
#pragma unroll
        for (int i = 0; i < 4; i++)
          if (8 * n + 2 * t + i % 2 > row_in_block + 8 * (i / 2)) s[n][i] = -INFINITY;
    }

    // The online softmax on the accumulators: s[n][0..1] are row g's, s[n][2..3] row g + 8's.
    float rescale[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kSTiles; n++) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // scale_log2 > 0, and rounding is monotone: max(s)·c is max(s·c), bit for bit
      const float m_new = fmaxf(m[r], mx * scale_log2);
      rescale[r] = exp2f(m[r] - m_new);
      m[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kSTiles; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          s[n][2 * r + e] = exp2f(fmaf(s[n][2 * r + e], scale_log2, -m_new));
          sum += s[n][2 * r + e];
        }
      l[r] = l[r] * rescale[r] + sum;
    }
#pragma unroll
    for (int n = 0; n < kOTiles; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) o[n][i] *= rescale[i / 2];

    // O += P·V, 16 keys a step: S tiles 2kk and 2kk + 1 are the A fragment of keys 16kk .. +15.
#pragma unroll
    for (int kk = 0; kk < kBc / 16; kk++) {
      const uint32_t pa[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]),
                              pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int n0 = 0; n0 < HD; n0 += 16) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, vs + (16 * kk + lane % 8 + 8 * (lane / 8 % 2)) * kLd + n0 + 8 * (lane / 16));
        mma_m16n8k16_bf16(o[n0 / 8], pa, vb);
        mma_m16n8k16_bf16(o[n0 / 8 + 1], pa, vb + 2);
      }
    }
  }

  // The quad's partial sums (a butterfly: all four lanes get the same bits); l ≥ 1 on every row.
  float inv_l[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv_l[r] = 1.0f / l[r];
    const int qi = q0 + row_in_block + 8 * r;
    if (t == 0 && qi < T) lse[(int64_t(b) * NH + h) * T + qi] = (m[r] + log2f(l[r])) * float(kLn2);
  }
  // O/l into this warp's own rows of Q's shared memory (only this warp read them), then out.
#pragma unroll
  for (int n = 0; n < kOTiles; n++)
#pragma unroll
    for (int r = 0; r < 2; r++)
      *reinterpret_cast<uint32_t*>(q_s + (row_in_block + 8 * r) * kLd + 8 * n + 2 * t) =
          pack_bf16x2(o[n][2 * r] * inv_l[r], o[n][2 * r + 1] * inv_l[r]);
  __syncwarp();
  constexpr int kChunks = HD / 8;
  const int64_t o_stride = int64_t(NH) * HD;
  for (int i = lane; i < 16 * kChunks; i += 32) {
    const int r = 16 * warp + i / kChunks, c = (i % kChunks) * 8;
    if (q0 + r < T)
      *reinterpret_cast<uint4*>(out + (row0 + q0 + r) * o_stride + h * HD + c) =
          *reinterpret_cast<const uint4*>(q_s + r * kLd + c);
  }
}

template <int HD>
void launch_forward(const Context& ctx, bf16* out, float* lse, QkvRows<const bf16*> qkv, int B,
                    int T, int NH, int NKV) {
  constexpr int kBytes = forward_smem_bytes<HD>();
  int device = 0, max_bytes = 0;
  GRASS_CUDA_CHECK(cudaGetDevice(&device));
  GRASS_CUDA_CHECK(
      cudaDeviceGetAttribute(&max_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  GRASS_CHECK(kBytes <= max_bytes, "attention (mma): " + std::to_string(kBytes) +
                                       " bytes of shared memory, the device allows " +
                                       std::to_string(max_bytes));
  GRASS_CUDA_CHECK(cudaFuncSetAttribute(attention_forward_mma_kernel<HD>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
  const float scale_log2 = float(kLog2e / std::sqrt(double(HD)));
  const dim3 grid(unsigned(ceil_div(T, kBr)), unsigned(NH), unsigned(B));
  attention_forward_mma_kernel<HD>
      <<<grid, kThreads, kBytes, ctx.stream>>>(out, lse, qkv, T, NH, NKV, scale_log2);
  GRASS_LAUNCH_CHECK();
}

}  // namespace

bool attention_mma_takes(int HD) { return HD == 16 || HD == 32 || HD == 64 || HD == 128; }

void attention_forward_mma(const Context& ctx, bf16* out, float* lse, QkvRows<const bf16*> qkv,
                           int B, int T, int NH, int NKV, int HD) {
  if (!attention_mma_takes(HD)) {
    attention_forward(ctx, out, lse, qkv, B, T, NH, NKV, HD);  // checks the shape itself
    return;
  }
  GRASS_CHECK(
      B >= 1 && B <= 65535 && T >= 1 && NKV >= 1 && NH >= NKV && NH % NKV == 0 && NH <= 65535,
      "attention (mma): bad shape B=" + std::to_string(B) + " T=" + std::to_string(T) +
          " NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV));
  // cp.async and the 16-byte stores: every row of q, k, v and out 16-byte aligned
  GRASS_CHECK(aligned16(out) && aligned16(qkv.q) && aligned16(qkv.k) && aligned16(qkv.v) &&
                  qkv.ldq % 8 == 0 && qkv.ldk % 8 == 0 && qkv.ldv % 8 == 0,
              "attention (mma): q, k, v or out not 16-byte aligned, or a row pitch not a "
              "multiple of 8 elements");
  switch (HD) {
    case 16: launch_forward<16>(ctx, out, lse, qkv, B, T, NH, NKV); break;
    case 32: launch_forward<32>(ctx, out, lse, qkv, B, T, NH, NKV); break;
    case 64: launch_forward<64>(ctx, out, lse, qkv, B, T, NH, NKV); break;
    default: launch_forward<128>(ctx, out, lse, qkv, B, T, NH, NKV); break;
  }
}

}  // namespace grass::cuda
