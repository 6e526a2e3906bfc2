// Causal GQA attention, FA2-style (issue 45, ../shared/GPU_PERF.md §2.1): the `attention: "mma"`
// kernels. The same contracts as attention_forward and attention_backward without RoPE
// (cuda_ops.h): q and k come rotated (the backend rotates them in place with rope_forward first,
// as for cuDNN, and dq, dk back afterwards), out[B,T,NH,HD] and lse[B,NH,T] (natural log) as the
// old forward writes them, so either backward takes either forward's. The backward's two paths
// (A: one CTA per kv head; B: seqk- and seqq-parallel kernels) are further down.
//
// Forward: one CTA of 4 warps per (query block of 64 rows, head, batch), the longest rows first. Warp w owns
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

// Two m16n8 fp32 accumulator tiles side by side (16 columns of a C) as the bf16 A fragment of an
// m16n8k16 whose k runs over those columns: elements 0, 1 of a tile are row g's, 2, 3 row g + 8's
// (mma_ptx.cuh), and a0..a3 are rows g, g + 8 of k 0-7, then of k 8-15.
__device__ __forceinline__ void accumulators_as_a(uint32_t (&a)[4], const float (&lo)[4],
                                                  const float (&hi)[4]) {
  a[0] = pack_bf16x2(lo[0], lo[1]);
  a[1] = pack_bf16x2(lo[2], lo[3]);
  a[2] = pack_bf16x2(hi[0], hi[1]);
  a[3] = pack_bf16x2(hi[2], hi[3]);
}

// k step kk of two products of a warp's 16 rows, C1 += A1·B1ᵀ and C2 += A2·B2ᵀ (A1, A2 its A
// fragments), over the N rows of B1 and B2 from row `row` of their shared-memory tiles, stored
// [n][k]: the backward's Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (path A, path B's dK/dV), and S = Q·Kᵀ and
// dP = dO·Vᵀ (path B's dQ).
template <int HD, int N>
__device__ __forceinline__ void add_two_products_nk(float (&c1)[N / 8][4], float (&c2)[N / 8][4],
                                                    const uint32_t (&a1)[4],
                                                    const uint32_t (&a2)[4], const bf16* b1_s,
                                                    const bf16* b2_s, int row, int kk, int lane) {
#pragma unroll
  for (int n0 = 0; n0 < N; n0 += 16) {
    const int at = (row + n0 + lane % 8 + 8 * (lane / 16)) * kRowElements<HD> + 16 * kk +
                   8 * (lane / 8 % 2);
    uint32_t b1[4], b2[4];
    ldmatrix_x4(b1, b1_s + at);
    ldmatrix_x4(b2, b2_s + at);
    mma_m16n8k16_bf16(c1[n0 / 8], a1, b1);
    mma_m16n8k16_bf16(c1[n0 / 8 + 1], a1, b1 + 2);
    mma_m16n8k16_bf16(c2[n0 / 8], a2, b2);
    mma_m16n8k16_bf16(c2[n0 / 8 + 1], a2, b2 + 2);
  }
}

// dV += Pᵀ·dO and dK += dSᵀ·Q over the 16 queries from row q of the stage (Pᵀ and dSᵀ as the A
// fragments pa, sa); dO and Q stored [query][hd] are B as [k][n]: ldmatrix.trans.
template <int HD>
__device__ __forceinline__ void add_dv_dk(float (&dv)[HD / 8][4], float (&dk)[HD / 8][4],
                                          const uint32_t (&pa)[4], const uint32_t (&sa)[4],
                                          const bf16* q_s, const bf16* do_s, int q, int lane) {
#pragma unroll
  for (int n0 = 0; n0 < HD; n0 += 16) {
    const int at = (q + lane % 8 + 8 * (lane / 8 % 2)) * kRowElements<HD> + n0 + 8 * (lane / 16);
    uint32_t ob[4], qb[4];
    ldmatrix_x4_trans(ob, do_s + at);
    ldmatrix_x4_trans(qb, q_s + at);
    mma_m16n8k16_bf16(dv[n0 / 8], pa, ob);
    mma_m16n8k16_bf16(dv[n0 / 8 + 1], pa, ob + 2);
    mma_m16n8k16_bf16(dk[n0 / 8], sa, qb);
    mma_m16n8k16_bf16(dk[n0 / 8 + 1], sa, qb + 2);
  }
}

// A warp's dK and dV rows straight from the accumulators: keys key0 + g and key0 + g + 8 of kv
// head kvh, those before T.
template <int HD>
__device__ __forceinline__ void store_dk_dv(QkvRows<bf16*> dqkv, const float (&dk)[HD / 8][4],
                                            const float (&dv)[HD / 8][4], int64_t row0, int key0,
                                            int kvh, int T, int g, int t) {
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int key = key0 + g + 8 * r;
    if (key >= T) continue;
#pragma unroll
    for (int c = 0; c < HD / 8; c++) {
      *reinterpret_cast<uint32_t*>(dqkv.k + (row0 + key) * dqkv.ldk + kvh * HD + 8 * c + 2 * t) =
          pack_bf16x2(dk[c][2 * r], dk[c][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dqkv.v + (row0 + key) * dqkv.ldv + kvh * HD + 8 * c + 2 * t) =
          pack_bf16x2(dv[c][2 * r], dv[c][2 * r + 1]);
    }
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
      uint32_t pa[4];
      accumulators_as_a(pa, s[2 * kk], s[2 * kk + 1]);
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

// Opts kernel in to `bytes` of dynamic shared memory (needed above 48 KiB).
template <typename Kernel>
void allow_smem(Kernel kernel, int bytes) {
  int device = 0, max_bytes = 0;
  GRASS_CUDA_CHECK(cudaGetDevice(&device));
  GRASS_CUDA_CHECK(
      cudaDeviceGetAttribute(&max_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  GRASS_CHECK(bytes <= max_bytes, "attention (mma): " + std::to_string(bytes) +
                                      " bytes of shared memory, the device allows " +
                                      std::to_string(max_bytes));
  GRASS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <int HD>
void launch_forward(const Context& ctx, bf16* out, float* lse, QkvRows<const bf16*> qkv, int B,
                    int T, int NH, int NKV) {
  constexpr int kBytes = forward_smem_bytes<HD>();
  allow_smem(attention_forward_mma_kernel<HD>, kBytes);
  const float scale_log2 = float(kLog2e / std::sqrt(double(HD)));
  const dim3 grid(unsigned(ceil_div(T, kBr)), unsigned(NH), unsigned(B));
  attention_forward_mma_kernel<HD>
      <<<grid, kThreads, kBytes, ctx.stream>>>(out, lse, qkv, T, NH, NKV, scale_log2);
  GRASS_LAUNCH_CHECK();
}

// ---- backward, path A -------------------------------------------------------------------------
// One CTA of 4 warps per (kv head, batch), for HD ≤ 64 and T ≤ 256 (1B and 60M): key blocks j of 64
// on the outer loop, warp w owning keys 16w .. 16w+15 of the block with its dK_j, dV_j and its K
// and V rows (as A fragments) in registers; inside, every query head of the group and every query
// block i ≥ j, Q_i and dO_i streaming through a two-stage cp.async ring. Per (i, j), 5 MMAs:
//   Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (keys x queries, accumulators); Pᵀ = 2^(Sᵀ·log2(e)/√HD − lse·log2(e)),
//   0 above the diagonal; dSᵀ = Pᵀ ⊙ (dPᵀ − D)/√HD; dV += Pᵀ·dO and dK += dSᵀ·Q with Pᵀ and dSᵀ
//   straight from the accumulators as A fragments (dO and Q by ldmatrix.trans); dSᵀ to shared
//   memory, and dQ_i += dS·K with dS by ldmatrix.trans of it.
// dQ of the group's whole heads lives in shared memory as fp32, each element summed over j in
// ascending order, one warp at a time: deterministic, with no atomics and no second kernel.
// lse·log2(e) and D = rowsum(dO ⊙ O) of every query are formed in the prologue (no scratch).
// Shapes it does not take go to path B (attention_backward_mma_path_a_takes).
constexpr int kBwdMaxT = 256;
constexpr int kBwdMaxSmem = 160 * 1024;  // under sm_80's 163 KiB a block

struct BwdLayout {
  int T_pad, ld_dq;                        // dQ rows (T up to a multiple of 64), their fp32 stride
  int k, v, stages, ds, dq, lse2, d, bytes;  // byte offsets in dynamic shared memory
};
__host__ __device__ inline BwdLayout bwd_layout(int T, int group, int HD) {
  BwdLayout L;
  const int ld = HD + 8, tile = kBr * ld * 2;
  L.T_pad = (T + kBr - 1) / kBr * kBr;
  L.ld_dq = HD + 8;  // float2 accesses of a quad's rows land in distinct banks per half-warp
  L.k = 0;
  L.v = L.k + tile;
  L.stages = L.v + tile;             // 2 stages of Q then dO
  L.ds = L.stages + 4 * tile;        // dSᵀ [64 keys][64 + 8] bf16
  L.dq = L.ds + kBc * (kBr + 8) * 2;  // [group][T_pad][ld_dq] fp32
  L.lse2 = L.dq + group * L.T_pad * L.ld_dq * 4;
  L.d = L.lse2 + group * L.T_pad * 4;
  L.bytes = L.d + group * L.T_pad * 4;
  return L;
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    attention_backward_mma_kernel(QkvRows<bf16*> dqkv, const bf16* dout, const bf16* out,
                                  const float* lse, QkvRows<const bf16*> qkv, int T, int NH,
                                  int NKV, float scale, float scale_log2) {
  constexpr int kLd = kRowElements<HD>;
  constexpr int kLdS = kBr + 8;     // dSᵀ's row
  constexpr int kKSteps = HD / 16;  // k steps of Sᵀ and dPᵀ
  constexpr int kTiles = HD / 8;    // m16n8 tiles of dK, dV, dQ
  const int kvh = blockIdx.x, b = blockIdx.y, group = NH / NKV;
  const int blocks = (T + kBc - 1) / kBc;
  const int64_t row0 = int64_t(b) * T, o_stride = int64_t(NH) * HD;
  const BwdLayout L = bwd_layout(T, group, HD);
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* k_s = reinterpret_cast<bf16*>(smem + L.k);
  bf16* v_s = reinterpret_cast<bf16*>(smem + L.v);
  bf16* stages = reinterpret_cast<bf16*>(smem + L.stages);  // stage s: Q at 2s, dO at 2s + 1
  bf16* ds_s = reinterpret_cast<bf16*>(smem + L.ds);
  float* dq_s = reinterpret_cast<float*>(smem + L.dq);
  float* lse2_s = reinterpret_cast<float*>(smem + L.lse2);
  float* d_s = reinterpret_cast<float*>(smem + L.d);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

  // Prologue: per query row of the group's heads, lse·log2(e) and D (one warp a row, a fixed
  // butterfly); rows past T get lse +inf (so P = 0) and D 0. dQ starts at zero.
  for (int row = warp; row < group * L.T_pad; row += kThreads / 32) {
    const int hh = row / L.T_pad, tq = row % L.T_pad, h = kvh * group + hh;
    float sum = 0.0f;
    if (tq < T)
      for (int c = 2 * lane; c < HD; c += 64) {
        const float2 x = __bfloat1622float2(
            *reinterpret_cast<const __nv_bfloat162*>(dout + (row0 + tq) * o_stride + h * HD + c));
        const float2 y = __bfloat1622float2(
            *reinterpret_cast<const __nv_bfloat162*>(out + (row0 + tq) * o_stride + h * HD + c));
        sum += x.x * y.x + x.y * y.y;
      }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) {
      d_s[row] = sum;
      lse2_s[row] = tq < T ? lse[(int64_t(b) * NH + h) * T + tq] * float(kLog2e) : INFINITY;
    }
  }
  for (int i = threadIdx.x; i < group * L.T_pad * L.ld_dq; i += kThreads) dq_s[i] = 0.0f;

  for (int j = 0; j < blocks; j++) {
    const int k0 = j * kBc, later = blocks - j;  // query blocks j .. blocks-1 see key block j
    const int items = group * later;             // (query head, query block) pairs
    __syncthreads();  // every warp is done with key block j-1's tiles, its stages and dSᵀ
    load_tile<HD>(k_s, qkv.k + (row0 + k0) * qkv.ldk + kvh * HD, qkv.ldk, T - k0);
    load_tile<HD>(v_s, qkv.v + (row0 + k0) * qkv.ldv + kvh * HD, qkv.ldv, T - k0);
    // item n: query head kvh·group + n / later, query block j + n % later
    const auto load_item = [&](int n, int stage) {
      const int h = kvh * group + n / later, q0 = (j + n % later) * kBr;
      load_tile<HD>(stages + 2 * stage * kBr * kLd, qkv.q + (row0 + q0) * qkv.ldq + h * HD,
                    qkv.ldq, T - q0);
      load_tile<HD>(stages + (2 * stage + 1) * kBr * kLd, dout + (row0 + q0) * o_stride + h * HD,
                    o_stride, T - q0);
    };
    load_item(0, 0);
    cp_async_commit();
    float dk[kTiles][4], dv[kTiles][4];
#pragma unroll
    for (int n = 0; n < kTiles; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;
    uint32_t kf[kKSteps][4], vf[kKSteps][4];  // this warp's 16 keys of K and V as A fragments

    for (int n = 0; n < items; n++) {
      const int hh = n / later, i = j + n % later, q0 = i * kBr;
      cp_async_wait<0>();
      __syncthreads();  // item n has landed for every thread; item n-1's stage and dSᵀ are free
      if (n + 1 < items) load_item(n + 1, (n + 1) % 2);
      cp_async_commit();
      if (n == 0) {
#pragma unroll
        for (int kk = 0; kk < kKSteps; kk++) {
          const int at = (16 * warp + lane % 16) * kLd + 16 * kk + 8 * (lane / 16);
          ldmatrix_x4(kf[kk], k_s + at);
          ldmatrix_x4(vf[kk], v_s + at);
        }
      }
      const bf16* q_s = stages + 2 * (n % 2) * kBr * kLd;
      const bf16* do_s = q_s + kBr * kLd;

      // Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ: 16 keys x 64 queries, K and V as A fragments in registers
      float st[kBr / 8][4], dpt[kBr / 8][4];
#pragma unroll
      for (int c = 0; c < kBr / 8; c++)
#pragma unroll
        for (int e = 0; e < 4; e++) st[c][e] = dpt[c][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kKSteps; kk++)
        add_two_products_nk<HD, kBr>(st, dpt, kf[kk], vf[kk], q_s, do_s, 0, kk, lane);
      // Pᵀ over Sᵀ, dSᵀ over dPᵀ: element e of tile c is key 16w + g + 8(e/2), query 8c + 2t + e%2
#pragma unroll
      for (int c = 0; c < kBr / 8; c++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int key = 16 * warp + g + 8 * (e / 2), query = 8 * c + 2 * t + e % 2;
          const int at = hh * L.T_pad + q0 + query;
          const bool visible = i > j || key <= query;  // i == j: the diagonal block
          const float p = visible ? exp2f(fmaf(st[c][e], scale_log2, -lse2_s[at])) : 0.0f;
          st[c][e] = p;
          dpt[c][e] = p * (dpt[c][e] - d_s[at]) * scale;
        }
      // dV += Pᵀ·dO, dK += dSᵀ·Q, 16 queries a step (tiles 2kk, 2kk + 1 are one A fragment)
#pragma unroll
      for (int kk = 0; kk < kBr / 16; kk++) {
        uint32_t pa[4], sa[4];
        accumulators_as_a(pa, st[2 * kk], st[2 * kk + 1]);
        accumulators_as_a(sa, dpt[2 * kk], dpt[2 * kk + 1]);
        add_dv_dk<HD>(dv, dk, pa, sa, q_s, do_s, 16 * kk, lane);
        // this warp's rows of dSᵀ, as the A fragment holds them
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
          for (int half = 0; half < 2; half++)
            *reinterpret_cast<uint32_t*>(ds_s + (16 * warp + g + 8 * r) * kLdS + 16 * kk +
                                         8 * half + 2 * t) = sa[2 * half + r];
      }
      __syncthreads();  // every warp's dSᵀ rows are in

      // dQ_i += dS·K_j: warp w's 16 queries; dS by ldmatrix.x4.trans of dSᵀ, K stored [key][hd]
      // as B [k][n] by .trans; the sum starts from dQ's fp32 in shared memory.
      float* dq_rows = dq_s + (hh * L.T_pad + q0 + 16 * warp + g) * L.ld_dq;
      float dq[kTiles][4];
#pragma unroll
      for (int c = 0; c < kTiles; c++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
          const float2 x = *reinterpret_cast<const float2*>(dq_rows + 8 * r * L.ld_dq + 8 * c + 2 * t);
          dq[c][2 * r] = x.x;
          dq[c][2 * r + 1] = x.y;
        }
#pragma unroll
      for (int kk = 0; kk < kBc / 16; kk++) {
        uint32_t da[4];
        ldmatrix_x4_trans(da, ds_s + (16 * kk + lane % 8 + 8 * (lane / 16)) * kLdS + 16 * warp +
                                  8 * (lane / 8 % 2));
#pragma unroll
        for (int n0 = 0; n0 < HD; n0 += 16) {
          uint32_t kb[4];
          ldmatrix_x4_trans(kb, k_s + (16 * kk + lane % 8 + 8 * (lane / 8 % 2)) * kLd + n0 +
                                    8 * (lane / 16));
          mma_m16n8k16_bf16(dq[n0 / 8], da, kb);
          mma_m16n8k16_bf16(dq[n0 / 8 + 1], da, kb + 2);
        }
      }
#pragma unroll
      for (int c = 0; c < kTiles; c++)
#pragma unroll
        for (int r = 0; r < 2; r++)
          *reinterpret_cast<float2*>(dq_rows + 8 * r * L.ld_dq + 8 * c + 2 * t) =
              make_float2(dq[c][2 * r], dq[c][2 * r + 1]);
    }
    store_dk_dv<HD>(dqkv, dk, dv, row0, k0 + 16 * warp, kvh, T, g, t);  // dK_j, dV_j
  }
  __syncthreads();  // every warp's dQ adds are in
  // dQ of the group's heads, 8 elements (16 bytes) a thread a step
  constexpr int kChunks = HD / 8;
  for (int i = threadIdx.x; i < group * T * kChunks; i += kThreads) {
    const int hh = i / (T * kChunks), tq = i / kChunks % T, c = (i % kChunks) * 8;
    const float* x = dq_s + (hh * L.T_pad + tq) * L.ld_dq + c;
    const uint4 packed = make_uint4(pack_bf16x2(x[0], x[1]), pack_bf16x2(x[2], x[3]),
                                    pack_bf16x2(x[4], x[5]), pack_bf16x2(x[6], x[7]));
    *reinterpret_cast<uint4*>(dqkv.q + (row0 + tq) * dqkv.ldq + (kvh * group + hh) * HD + c) =
        packed;
  }
}

template <int HD>
void launch_backward(const Context& ctx, QkvRows<bf16*> dqkv, const bf16* dout, const bf16* out,
                     const float* lse, QkvRows<const bf16*> qkv, int B, int T, int NH, int NKV) {
  const int bytes = bwd_layout(T, NH / NKV, HD).bytes;
  allow_smem(attention_backward_mma_kernel<HD>, bytes);
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const float scale_log2 = float(kLog2e / std::sqrt(double(HD)));
  attention_backward_mma_kernel<HD><<<dim3(unsigned(NKV), unsigned(B)), kThreads, bytes,
                                      ctx.stream>>>(dqkv, dout, out, lse, qkv, T, NH, NKV, scale,
                                                    scale_log2);
  GRASS_LAUNCH_CHECK();
}

// ---- backward, path B -------------------------------------------------------------------------
// The shapes path A does not take: HD 128 (7B, 13B, 70B), T over 256, a group whose dQ overflows
// shared memory. Three kernels, every sum in a fixed order, no atomics:
//   1. D = rowsum(dO ⊙ O) [B,NH,T] fp32 into the scratch the old backward uses (one warp a row).
//   2. dK, dV, seqk-parallel: one CTA of 4 warps per (key block j of 64, kv head, batch), the key
//      blocks with the most queries first. Warp w owns keys 16w .. 16w+15 of the block with their
//      dK_j, dV_j in registers; every query head of the group and query block i ≥ j streams through
//      a two-stage cp.async ring with its rows' lse·log2(e) and D. Per (i, j), 4 MMAs: Sᵀ = K·Qᵀ,
//      dPᵀ = V·dOᵀ, dV += Pᵀ·dO, dK += dSᵀ·Q (Pᵀ and dSᵀ straight from the accumulators), as path A.
//      At HD 128 the 64 queries of an item go as two halves of 32, so Sᵀ and dPᵀ fit in registers
//      beside dK and dV.
//   3. dQ, seqq-parallel: one CTA of 4 warps per (query block i, head, batch), the longest rows
//      first. Warp w owns queries 16w .. 16w+15 with dQ in registers; key blocks j = 0 .. i stream
//      through a two-stage ring in ascending order. Per (i, j), 3 MMAs: S = Q·Kᵀ, dP = dO·Vᵀ,
//      dQ += dS·K_j with dS straight from the accumulators (a C tile pair is one A fragment).
// S and dP are formed twice, 7 MMAs a tile pair where path A needs 5. The design's alternatives
// keep the 5 and pay elsewhere: fp32 dQ partials per (i, j), summed in key order, take scratch of
// B·NH·(T/64)(T/64 + 1)/2 tiles of 64 x HD (200 MiB at 13B, 16 x 256; 10 GiB at T 2048), and dQ
// adds ordered between CTAs spin on flags that only the CTAs' co-residence keeps from deadlock.
// Both kernels evaluate P and dS by the same expressions from the same fp32 sums over the head dim.
constexpr int kStatFloats = 2 * kBr;  // a stage's lse·log2(e) and D of its 64 query rows

// D[b, h, t] = Σ_c dout·out, the row (b, t, h) to a warp, as path A's prologue sums it.
__global__ void __launch_bounds__(kThreads)
    attention_row_dot_mma_kernel(float* d, const bf16* dout, const bf16* out, int64_t rows, int T,
                                 int NH, int HD) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp leaves together
  float sum = 0.0f;
  for (int c = 2 * lane; c < HD; c += 64) {
    const float2 x = __bfloat1622float2(
        *reinterpret_cast<const __nv_bfloat162*>(dout + row * HD + c));
    const float2 y =
        __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(out + row * HD + c));
    sum += x.x * y.x + x.y * y.y;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const int64_t bt = row / NH;  // row = (b·T + t)·NH + h
  const int h = int(row % NH), t = int(bt % T);
  if (lane == 0) d[(bt / T * NH + h) * T + t] = sum;
}

template <int HD>
constexpr int dkdv_smem_bytes() {  // K, V, two stages of Q and dO, two stages' lse·log2(e) and D
  return 6 * kBr * kRowElements<HD> * int(sizeof(bf16)) + 2 * kStatFloats * int(sizeof(float));
}
template <int HD>
constexpr int dq_smem_bytes() {  // Q, dO, two stages of K and V
  return 6 * kBr * kRowElements<HD> * int(sizeof(bf16));
}
static_assert(dkdv_smem_bytes<128>() <= 163 * 1024 && dq_smem_bytes<128>() <= 163 * 1024,
              "attention (mma): path B's shared memory over sm_80's");

template <int HD>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_mma_kernel(QkvRows<bf16*> dqkv, const bf16* dout, const float* lse,
                              const float* d, QkvRows<const bf16*> qkv, int T, int NH, int NKV,
                              float scale, float scale_log2) {
  constexpr int kLd = kRowElements<HD>;
  constexpr int kKSteps = HD / 16;        // k steps of Sᵀ and dPᵀ
  constexpr int kTiles = HD / 8;          // m16n8 tiles of dK, dV
  constexpr int kQ = HD > 64 ? 32 : kBr;  // queries a pass: Sᵀ, dPᵀ are kQ/8 tiles each
  const int j = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, group = NH / NKV;
  const int blocks = (T + kBc - 1) / kBc, k0 = j * kBc;
  const int later = blocks - j, items = group * later;  // (query head, query block ≥ j) pairs
  const int64_t row0 = int64_t(b) * T, o_stride = int64_t(NH) * HD;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* k_s = reinterpret_cast<bf16*>(smem);
  bf16* v_s = k_s + kBc * kLd;
  bf16* stages = v_s + kBc * kLd;  // stage s: Q at 2s, dO at 2s + 1
  float* stats = reinterpret_cast<float*>(stages + 4 * kBr * kLd);  // stage s: lse2 at 2s, D at 2s+1
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

  load_tile<HD>(k_s, qkv.k + (row0 + k0) * qkv.ldk + kvh * HD, qkv.ldk, T - k0);
  load_tile<HD>(v_s, qkv.v + (row0 + k0) * qkv.ldv + kvh * HD, qkv.ldv, T - k0);
  // item n: query head kvh·group + n / later, query block j + n % later. Its rows' lse·log2(e) and
  // D by plain stores (rows past T: +inf, so P = 0, and 0), seen after the loop's next barrier.
  const auto load_item = [&](int n, int stage) {
    const int h = kvh * group + n / later, q0 = (j + n % later) * kBr;
    load_tile<HD>(stages + 2 * stage * kBr * kLd, qkv.q + (row0 + q0) * qkv.ldq + h * HD, qkv.ldq,
                  T - q0);
    load_tile<HD>(stages + (2 * stage + 1) * kBr * kLd, dout + (row0 + q0) * o_stride + h * HD,
                  o_stride, T - q0);
    for (int r = threadIdx.x; r < kBr; r += kThreads) {
      const int64_t at = (int64_t(b) * NH + h) * T + q0 + r;
      const bool inside = q0 + r < T;
      stats[stage * kStatFloats + r] = inside ? lse[at] * float(kLog2e) : INFINITY;
      stats[stage * kStatFloats + kBr + r] = inside ? d[at] : 0.0f;
    }
  };
  load_item(0, 0);
  cp_async_commit();
  float dk[kTiles][4], dv[kTiles][4];
#pragma unroll
  for (int n = 0; n < kTiles; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;

  for (int n = 0; n < items; n++) {
    const int q0 = (j + n % later) * kBr;
    cp_async_wait<0>();
    __syncthreads();  // item n has landed for every thread; item n-1's stage is free
    if (n + 1 < items) load_item(n + 1, (n + 1) % 2);
    cp_async_commit();
    const bf16* q_s = stages + 2 * (n % 2) * kBr * kLd;
    const bf16* do_s = q_s + kBr * kLd;
    const float* lse2_s = stats + (n % 2) * kStatFloats;
    const float* d_s = lse2_s + kBr;

    for (int qp = 0; qp < kBr; qp += kQ) {  // a pass over queries qp .. qp + kQ - 1 of the item
      // Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ: 16 keys x kQ queries, K and V as A fragments from shared memory
      float st[kQ / 8][4], dpt[kQ / 8][4];
#pragma unroll
      for (int c = 0; c < kQ / 8; c++)
#pragma unroll
        for (int e = 0; e < 4; e++) st[c][e] = dpt[c][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kKSteps; kk++) {
        uint32_t kf[4], vf[4];
        const int a_at = (16 * warp + lane % 16) * kLd + 16 * kk + 8 * (lane / 16);
        ldmatrix_x4(kf, k_s + a_at);
        ldmatrix_x4(vf, v_s + a_at);
        add_two_products_nk<HD, kQ>(st, dpt, kf, vf, q_s, do_s, qp, kk, lane);
      }
      // Pᵀ over Sᵀ, dSᵀ over dPᵀ: element e of tile c is key k0 + 16w + g + 8(e/2), query
      // q0 + qp + 8c + 2t + e%2; a key after its query is masked
#pragma unroll
      for (int c = 0; c < kQ / 8; c++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int row = qp + 8 * c + 2 * t + e % 2;
          const bool visible = k0 + 16 * warp + g + 8 * (e / 2) <= q0 + row;
          const float p = visible ? exp2f(fmaf(st[c][e], scale_log2, -lse2_s[row])) : 0.0f;
          st[c][e] = p;
          dpt[c][e] = p * (dpt[c][e] - d_s[row]) * scale;
        }
      // dV += Pᵀ·dO, dK += dSᵀ·Q, 16 queries a step (tiles 2kk, 2kk + 1 are one A fragment)
#pragma unroll
      for (int kk = 0; kk < kQ / 16; kk++) {
        uint32_t pa[4], sa[4];
        accumulators_as_a(pa, st[2 * kk], st[2 * kk + 1]);
        accumulators_as_a(sa, dpt[2 * kk], dpt[2 * kk + 1]);
        add_dv_dk<HD>(dv, dk, pa, sa, q_s, do_s, qp + 16 * kk, lane);
      }
    }
  }
  store_dk_dv<HD>(dqkv, dk, dv, row0, k0 + 16 * warp, kvh, T, g, t);  // dK_j, dV_j
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    attention_dq_mma_kernel(QkvRows<bf16*> dqkv, const bf16* dout, const float* lse,
                            const float* d, QkvRows<const bf16*> qkv, int T, int NH, int NKV,
                            float scale, float scale_log2) {
  constexpr int kLd = kRowElements<HD>;
  constexpr int kKSteps = HD / 16;  // k steps of S and dP
  constexpr int kTiles = HD / 8;    // m16n8 tiles of dQ
  constexpr int kSTiles = kBc / 8;  // m16n8 tiles of S and dP
  const int i = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (NH / NKV), q0 = i * kBr;
  const int64_t row0 = int64_t(b) * T, o_stride = int64_t(NH) * HD;
  const bf16* kg = qkv.k + row0 * qkv.ldk + kvh * HD;  // [T,HD] at pitch ldk
  const bf16* vg = qkv.v + row0 * qkv.ldv + kvh * HD;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* do_s = q_s + kBr * kLd;
  bf16* k_s = do_s + kBr * kLd;     // 2 stages of [64][kLd]
  bf16* v_s = k_s + 2 * kBc * kLd;  // 2 stages of [64][kLd]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

  load_tile<HD>(q_s, qkv.q + (row0 + q0) * qkv.ldq + h * HD, qkv.ldq, T - q0);
  load_tile<HD>(do_s, dout + (row0 + q0) * o_stride + h * HD, o_stride, T - q0);
  load_tile<HD>(k_s, kg, qkv.ldk, T);
  load_tile<HD>(v_s, vg, qkv.ldv, T);
  cp_async_commit();
  // The lane's two query rows (g and g + 8 of the warp's 16): lse·log2(e) and D; past T, +inf and 0
  const int row_in_block = 16 * warp + g;
  float lse2[2], dd[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int query = q0 + row_in_block + 8 * r;
    const int64_t at = (int64_t(b) * NH + h) * T + query;
    lse2[r] = query < T ? lse[at] * float(kLog2e) : INFINITY;
    dd[r] = query < T ? d[at] : 0.0f;
  }
  float dq[kTiles][4];
#pragma unroll
  for (int n = 0; n < kTiles; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) dq[n][e] = 0.0f;

  for (int j = 0; j <= i; j++) {
    const int k0 = j * kBc;
    cp_async_wait<0>();
    __syncthreads();  // block j has landed for every thread; block j-1's stage is free
    if (j < i) {
      const int stage = (j + 1) % 2;
      load_tile<HD>(k_s + stage * kBc * kLd, kg + (k0 + kBc) * qkv.ldk, qkv.ldk, T - k0 - kBc);
      load_tile<HD>(v_s + stage * kBc * kLd, vg + (k0 + kBc) * qkv.ldv, qkv.ldv, T - k0 - kBc);
    }
    cp_async_commit();
    const bf16* ks = k_s + (j % 2) * kBc * kLd;
    const bf16* vs = v_s + (j % 2) * kBc * kLd;

    // S = Q·Kᵀ, dP = dO·Vᵀ: 16 queries x 64 keys; Q and dO as A fragments, K and V stored
    // [key][hd] are B as [n][k]
    float s[kSTiles][4], dp[kSTiles][4];
#pragma unroll
    for (int c = 0; c < kSTiles; c++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[c][e] = dp[c][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; kk++) {
      uint32_t qa[4], oa[4];
      const int a_at = (16 * warp + lane % 16) * kLd + 16 * kk + 8 * (lane / 16);
      ldmatrix_x4(qa, q_s + a_at);
      ldmatrix_x4(oa, do_s + a_at);
      add_two_products_nk<HD, kBc>(s, dp, qa, oa, ks, vs, 0, kk, lane);
    }
    // P over S, dS over dP: element e of tile c is query q0 + 16w + g + 8(e/2), key
    // k0 + 8c + 2t + e%2; a key after its query is masked
#pragma unroll
    for (int c = 0; c < kSTiles; c++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const bool visible = k0 + 8 * c + 2 * t + e % 2 <= q0 + row_in_block + 8 * (e / 2);
        const float p = visible ? exp2f(fmaf(s[c][e], scale_log2, -lse2[e / 2])) : 0.0f;
        s[c][e] = p * (dp[c][e] - dd[e / 2]) * scale;
      }
    // dQ += dS·K_j, 16 keys a step (dS tiles 2kk, 2kk + 1 are one A fragment); K stored
    // [key][hd] is B as [k][n]: ldmatrix.trans
#pragma unroll
    for (int kk = 0; kk < kBc / 16; kk++) {
      uint32_t da[4];
      accumulators_as_a(da, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int n0 = 0; n0 < HD; n0 += 16) {
        uint32_t kb[4];
        ldmatrix_x4_trans(kb, ks + (16 * kk + lane % 8 + 8 * (lane / 8 % 2)) * kLd + n0 +
                                  8 * (lane / 16));
        mma_m16n8k16_bf16(dq[n0 / 8], da, kb);
        mma_m16n8k16_bf16(dq[n0 / 8 + 1], da, kb + 2);
      }
    }
  }
  // dQ: this warp's queries, straight from the accumulators
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int query = q0 + row_in_block + 8 * r;
    if (query >= T) continue;
#pragma unroll
    for (int c = 0; c < kTiles; c++)
      *reinterpret_cast<uint32_t*>(dqkv.q + (row0 + query) * dqkv.ldq + h * HD + 8 * c + 2 * t) =
          pack_bf16x2(dq[c][2 * r], dq[c][2 * r + 1]);
  }
}

template <int HD>
void launch_backward_b(const Context& ctx, QkvRows<bf16*> dqkv, float* d, const bf16* dout,
                       const bf16* out, const float* lse, QkvRows<const bf16*> qkv, int B, int T,
                       int NH, int NKV) {
  const int64_t rows = int64_t(B) * T * NH;
  attention_row_dot_mma_kernel<<<unsigned(ceil_div(rows, int64_t(kThreads / 32))), kThreads, 0,
                                 ctx.stream>>>(d, dout, out, rows, T, NH, HD);
  GRASS_LAUNCH_CHECK();
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const float scale_log2 = float(kLog2e / std::sqrt(double(HD)));
  const unsigned blocks = unsigned(ceil_div(T, kBr));
  constexpr int kDkdvBytes = dkdv_smem_bytes<HD>(), kDqBytes = dq_smem_bytes<HD>();
  allow_smem(attention_dkdv_mma_kernel<HD>, kDkdvBytes);
  attention_dkdv_mma_kernel<HD><<<dim3(blocks, unsigned(NKV), unsigned(B)), kThreads, kDkdvBytes,
                                  ctx.stream>>>(dqkv, dout, lse, d, qkv, T, NH, NKV, scale,
                                                scale_log2);
  GRASS_LAUNCH_CHECK();
  allow_smem(attention_dq_mma_kernel<HD>, kDqBytes);
  attention_dq_mma_kernel<HD><<<dim3(blocks, unsigned(NH), unsigned(B)), kThreads, kDqBytes,
                                ctx.stream>>>(dqkv, dout, lse, d, qkv, T, NH, NKV, scale,
                                              scale_log2);
  GRASS_LAUNCH_CHECK();
}

// cp.async and the 16-byte loads and stores: every row 16-byte aligned
template <typename P>
bool rows_aligned(QkvRows<P> r) {
  return aligned16(r.q) && aligned16(r.k) && aligned16(r.v) && r.ldq % 8 == 0 && r.ldk % 8 == 0 &&
         r.ldv % 8 == 0;
}

void check_shape(int B, int T, int NH, int NKV) {
  GRASS_CHECK(
      B >= 1 && B <= 65535 && T >= 1 && NKV >= 1 && NH >= NKV && NH % NKV == 0 && NH <= 65535,
      "attention (mma): bad shape B=" + std::to_string(B) + " T=" + std::to_string(T) +
          " NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV));
}

}  // namespace

bool attention_mma_takes(int HD) { return HD == 16 || HD == 32 || HD == 64 || HD == 128; }

void attention_forward_mma(const Context& ctx, bf16* out, float* lse, QkvRows<const bf16*> qkv,
                           int B, int T, int NH, int NKV, int HD) {
  if (!attention_mma_takes(HD)) {
    attention_forward(ctx, out, lse, qkv, B, T, NH, NKV, HD);  // checks the shape itself
    return;
  }
  check_shape(B, T, NH, NKV);
  GRASS_CHECK(aligned16(out) && rows_aligned(qkv),
              "attention (mma): q, k, v or out not 16-byte aligned, or a row pitch not a "
              "multiple of 8 elements");
  switch (HD) {
    case 16: launch_forward<16>(ctx, out, lse, qkv, B, T, NH, NKV); break;
    case 32: launch_forward<32>(ctx, out, lse, qkv, B, T, NH, NKV); break;
    case 64: launch_forward<64>(ctx, out, lse, qkv, B, T, NH, NKV); break;
    default: launch_forward<128>(ctx, out, lse, qkv, B, T, NH, NKV); break;
  }
}

bool attention_backward_mma_path_a_takes(int T, int NH, int NKV, int HD) {
  return (HD == 16 || HD == 32 || HD == 64) && T <= kBwdMaxT && NKV >= 1 && NH % NKV == 0 &&
         bwd_layout(T, NH / NKV, HD).bytes <= kBwdMaxSmem;
}

void attention_backward_mma(const Context& ctx, QkvRows<bf16*> dqkv, float* scratch,
                            const bf16* dout, const bf16* out, const float* lse,
                            QkvRows<const bf16*> qkv, int B, int T, int NH, int NKV, int HD,
                            MmaBackwardPath path) {
  if (!attention_mma_takes(HD)) {
    attention_backward(ctx, dqkv, scratch, dout, out, lse, qkv, B, T, NH, NKV, HD);
    return;
  }
  check_shape(B, T, NH, NKV);
  GRASS_CHECK(aligned16(dout) && aligned16(out) && rows_aligned(qkv) && rows_aligned(dqkv),
              "attention (mma): q, k, v, their gradients, out or dout not 16-byte aligned, or a "
              "row pitch not a multiple of 8 elements");
  const bool a_takes = attention_backward_mma_path_a_takes(T, NH, NKV, HD);
  GRASS_CHECK(path != MmaBackwardPath::A || a_takes,
              "attention (mma): path A does not take HD=" + std::to_string(HD) +
                  " T=" + std::to_string(T) + " with groups of " + std::to_string(NH / NKV));
  if (path == MmaBackwardPath::B || !a_takes) {
    switch (HD) {
      case 16: launch_backward_b<16>(ctx, dqkv, scratch, dout, out, lse, qkv, B, T, NH, NKV); break;
      case 32: launch_backward_b<32>(ctx, dqkv, scratch, dout, out, lse, qkv, B, T, NH, NKV); break;
      case 64: launch_backward_b<64>(ctx, dqkv, scratch, dout, out, lse, qkv, B, T, NH, NKV); break;
      default: launch_backward_b<128>(ctx, dqkv, scratch, dout, out, lse, qkv, B, T, NH, NKV); break;
    }
    return;
  }
  switch (HD) {
    case 16: launch_backward<16>(ctx, dqkv, dout, out, lse, qkv, B, T, NH, NKV); break;
    case 32: launch_backward<32>(ctx, dqkv, dout, out, lse, qkv, B, T, NH, NKV); break;
    default: launch_backward<64>(ctx, dqkv, dout, out, lse, qkv, B, T, NH, NKV); break;
  }
}

}  // namespace grass::cuda
