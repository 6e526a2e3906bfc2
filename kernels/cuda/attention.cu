// Causal self-attention with grouped-query heads, flash-style: the T x T scores never exist in
// global memory. Matrix products run on bf16 tensor cores through WMMA (16x16x16 tiles, fp32
// accumulate; sm_80+), elementwise work on CUDA cores in fp32.
//
// Shapes: q[B,T,NH,HD], k,v[B,T,NKV,HD] (bf16, each at its row pitch: QkvRows, three buffers or
// one packed q, k, v), out[B,T,NH,HD] (bf16, row stride NH*HD), lse[B,NH,T] (fp32). Query head h
// reads kv head h / (NH/NKV) by indexing (no K/V copies).
// Scores s = q·k / sqrt(HD), query t sees keys 0..t. lse = ln Σ exp(s) over those keys.
//
// Tiling. Every kernel runs 256 threads (8 warps) on one tile of Br query rows or Bc key rows of
// one (batch, head), with HD padded to HDP (a multiple of 16) by zero columns and the tail of T by
// zero rows, so any T ≥ 1 and any HD that is a multiple of 8 up to 256 work. The q/k/v/dout tiles
// sit in shared memory as bf16; every product is split into 16x16 output tiles that go round the
// warps. WMMA fragments are touched only through load/store/mma (their element layout is
// unspecified), so everything elementwise happens on the fp32 copies in shared memory. In a "row
// pass" kTpr = 256/Br consecutive threads own one row of the score tile: they reduce it with
// shuffles and write its bf16 probabilities in place over the fp32 scores.
//
// Forward (grid: query blocks x NH x B): O[Br,HDP] (fp32, shared) and per-row running max m and
// sum l (registers of the row's threads); for each key block up to the diagonal:
//   S = Q·Kᵀ;  row pass: m' = max(m, rowmax S), P = 2^(S·log2e/√HD - m'), l = l·2^(m-m') + ΣP,
//   O *= 2^(m-m');  O += P·V.   Finally out = O / l, lse = (m + log2 l)·ln2.
// RoPE (optional, a table of cos and sin from rope_table()): q and k tiles are rotated as they are
// loaded (pairs (i, i + HD/2), HF's rotate-half), so q and k stay in memory as the projections
// wrote them; dq and dk are rotated back as they are stored.
// Backward, deterministic (no atomics; every sum in a fixed order):
//   1. D[b,h,t] = Σ dout·out over the head dim (one warp per row), into scratch.
//   2. dK, dV (grid: key blocks x NKV x B): the key block's K, V stay in shared memory and dK, dV
//      accumulate in WMMA registers over the query heads of the group and the query blocks at or
//      after the key block: S = Q·Kᵀ, dP = dO·Vᵀ, P = exp(S/√HD - lse) (causal), dS = P⊙(dP-D)/√HD;
//      dV += Pᵀ·dO, dK += dSᵀ·Q.
//   3. dQ (grid: query blocks x NH x B): the same S, dP, dS over the key blocks up to the diagonal,
//      dQ += dS·K in WMMA registers.
// Tile sizes shrink for HDP > 128 so shared memory stays under the sm_80 limit (163 KiB) and the
// register accumulators at 4 WMMA tiles per warp; see the launchers.
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "src/core/error.h"

namespace grass::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 16;        // WMMA tile: 16x16 outputs, 16 deep
constexpr int kMaxAccTiles = 4;  // WMMA accumulator tiles a warp keeps in registers (backward)
constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2 = 0.6931471805599453;

using Acc = wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float>;

// Where each tile lives in a kernel's dynamic shared memory (byte offsets from the base); the host
// sizes the launch from the same numbers. bf16 tiles of head-dim rows have row stride
// ld_hd = HDP + 8 elements and fp32 ones ld_f32 = HDP + 4 (the pads put consecutive rows 4 banks
// apart); the fp32 score tiles [Br,Bc] have stride ld_s = Bc + 4, and the bf16 probabilities
// overwrite them in place with stride 2·ld_s. Every offset is a multiple of 32 bytes, as WMMA
// loads and stores require. q and dout are adjacent (the dQ kernel's fp32 staging tile spans
// both), and so are k and v (the dK/dV kernel's).
struct SmemLayout {
  int ld_hd, ld_f32, ld_s;
  int k, v, q, dout, s, dp, o;  // dout, dp: backward only; o: forward only
  int bytes;
};

__host__ __device__ inline SmemLayout smem_layout(int Br, int Bc, int HDP, bool backward) {
  SmemLayout L;
  L.ld_hd = HDP + 8;
  L.ld_f32 = HDP + 4;
  L.ld_s = Bc + 4;
  const int q_bytes = Br * L.ld_hd * 2, kv_bytes = Bc * L.ld_hd * 2, s_bytes = Br * L.ld_s * 4;
  L.k = 0;
  L.v = L.k + kv_bytes;
  L.q = L.v + kv_bytes;
  L.dout = L.q + q_bytes;
  L.s = L.dout + (backward ? q_bytes : 0);
  L.dp = L.s + s_bytes;
  L.o = L.dp + (backward ? s_bytes : 0);
  L.bytes = L.o + (backward ? 0 : Br * L.ld_f32 * 4);
  return L;
}

// RoPE as the kernels apply it (rope_table() in rope.cu): cos and sin [T, HD/2] of the angle of
// position t and pair i, or none (cos null) for a tile that is not rotated (v, dout, dv).
struct Rotation {
  const float* cos = nullptr;
  const float* sin = nullptr;
};

// dst[rows, HDP] (bf16, row stride ld) = rows [0, valid_rows) of src (HD columns, row stride
// src_stride elements), row r rotated by RoPE at position t0 + r when rot has a table; the other
// rows and columns HD..HDP are zero, so they add nothing to any product. Unrotated: 16-byte
// loads (HD is a multiple of 8 and the tensors 16-byte aligned). Rotated: pairs (i, i + HD/2) of
// 2 channels each, rope_rotate's arithmetic (rope.cu's kernel's bits), one rounding to bf16.
__device__ __forceinline__ void load_rows(bf16* dst, int ld, const bf16* src, int64_t src_stride,
                                          int valid_rows, int rows, int HD, int HDP,
                                          Rotation rot = {}, int t0 = 0) {
  if (!rot.cos) {
    const int chunks = HDP / 8;
    for (int i = threadIdx.x; i < rows * chunks; i += kThreads) {
      const int r = i / chunks, c = (i % chunks) * 8;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (r < valid_rows && c < HD) val = *reinterpret_cast<const uint4*>(src + r * src_stride + c);
      *reinterpret_cast<uint4*>(dst + r * ld + c) = val;
    }
    return;
  }
  const int half = HD / 2, pairs = half / 2;
  for (int i = threadIdx.x; i < rows * pairs; i += kThreads) {
    const int r = i / pairs, c = (i % pairs) * 2;
    float2 y1 = make_float2(0.0f, 0.0f), y2 = y1;
    if (r < valid_rows) {
      const float2 x1 = __bfloat1622float2(
          *reinterpret_cast<const __nv_bfloat162*>(src + r * src_stride + c));
      const float2 x2 = __bfloat1622float2(
          *reinterpret_cast<const __nv_bfloat162*>(src + r * src_stride + half + c));
      const int64_t at = int64_t(t0 + r) * half + c;
      const float c0 = rot.cos[at], c1 = rot.cos[at + 1], s0 = rot.sin[at], s1 = rot.sin[at + 1];
      const float2 a = rope_rotate(x1.x, x2.x, c0, s0), b = rope_rotate(x1.y, x2.y, c1, s1);
      y1 = make_float2(a.x, b.x);
      y2 = make_float2(a.y, b.y);
    }
    *reinterpret_cast<__nv_bfloat162*>(dst + r * ld + c) = __floats2bfloat162_rn(y1.x, y1.y);
    *reinterpret_cast<__nv_bfloat162*>(dst + r * ld + half + c) = __floats2bfloat162_rn(y2.x, y2.y);
  }
  const int pad_chunks = (HDP - HD) / 8;  // 0 or 1: HD is a multiple of 8, HDP of 16
  for (int i = threadIdx.x; i < rows * pad_chunks; i += kThreads)
    *reinterpret_cast<uint4*>(dst + (i / pad_chunks) * ld + HD + (i % pad_chunks) * 8) =
        make_uint4(0, 0, 0, 0);
}

// Rows [0, valid_rows) of dst (HD columns, bf16, row stride dst_stride) = src[., HDP] (fp32, row
// stride ld), rounded to nearest; with a table, row r is first rotated back (the transpose of
// RoPE at position t0 + r: the gradient of the unrotated q or k) in fp32.
__device__ __forceinline__ void store_rows(bf16* dst, int64_t dst_stride, const float* src, int ld,
                                           int valid_rows, int HD, Rotation rot = {}, int t0 = 0) {
  if (!rot.cos) {
    const int pairs = HD / 2;
    for (int i = threadIdx.x; i < valid_rows * pairs; i += kThreads) {
      const int r = i / pairs, c = (i % pairs) * 2;
      *reinterpret_cast<__nv_bfloat162*>(dst + r * dst_stride + c) =
          __floats2bfloat162_rn(src[r * ld + c], src[r * ld + c + 1]);
    }
    return;
  }
  const int half = HD / 2;
  for (int i = threadIdx.x; i < valid_rows * half; i += kThreads) {
    const int r = i / half, c = i % half;
    const float x1 = src[r * ld + c], x2 = src[r * ld + half + c];
    const int64_t at = int64_t(t0 + r) * half + c;
    const float2 y = rope_rotate(x1, x2, rot.cos[at], -rot.sin[at]);  // the transpose rotation
    dst[r * dst_stride + c] = __float2bfloat16_rn(y.x);
    dst[r * dst_stride + half + c] = __float2bfloat16_rn(y.y);
  }
}

// acc += A[rows 16·tm.., 0:K] · B[0:K, cols 16·tn..], K a multiple of 16. A row_major: element
// (m,k) at a[m·lda + k]; col_major: at a[k·lda + m] (Aᵀ stored row-major). B row_major: (k,n) at
// b[k·ldb + n]; col_major: at b[n·ldb + k].
template <typename LayoutA, typename LayoutB>
__device__ __forceinline__ void mma_tile(Acc& acc, const bf16* a, int lda, const bf16* b, int ldb,
                                         int tm, int tn, int K) {
  wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, bf16, LayoutA> fa;
  wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, bf16, LayoutB> fb;
  // Unrolled by 2: the next tile's loads overlap this mma; full unrolling spills on sm_80.
#pragma unroll 2
  for (int kk = 0; kk < K; kk += kTile) {
    if constexpr (std::is_same_v<LayoutA, wmma::row_major>)
      wmma::load_matrix_sync(fa, a + tm * kTile * lda + kk, lda);
    else
      wmma::load_matrix_sync(fa, a + kk * lda + tm * kTile, lda);
    if constexpr (std::is_same_v<LayoutB, wmma::row_major>)
      wmma::load_matrix_sync(fb, b + kk * ldb + tn * kTile, ldb);
    else
      wmma::load_matrix_sync(fb, b + tn * kTile * ldb + kk, ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// c[M,N] (fp32 in shared memory, row stride ldc) = A·B (+= when accumulate), M, N, K multiples
// of 16; the output tiles go round the warps.
template <typename LayoutA, typename LayoutB>
__device__ __forceinline__ void gemm_smem(float* c, int ldc, bool accumulate, const bf16* a,
                                          int lda, const bf16* b, int ldb, int M, int N, int K) {
  const int warp = threadIdx.x / 32, tiles_n = N / kTile;
  for (int tile = warp; tile < (M / kTile) * tiles_n; tile += kWarps) {
    const int tm = tile / tiles_n, tn = tile % tiles_n;
    float* ct = c + tm * kTile * ldc + tn * kTile;
    Acc acc;
    if (accumulate)
      wmma::load_matrix_sync(acc, ct, ldc, wmma::mem_row_major);
    else
      wmma::fill_fragment(acc, 0.0f);
    mma_tile<LayoutA, LayoutB>(acc, a, lda, b, ldb, tm, tn, K);
    wmma::store_matrix_sync(ct, acc, ldc, wmma::mem_row_major);
  }
}

// A gradient tile [M,N] held in registers: warp w owns output tiles w, w + 8, w + 16, w + 24
// (the host keeps (M/16)·(N/16) ≤ 32). The loops unroll, so acc[] stays in registers.
__device__ __forceinline__ void acc_zero(Acc (&acc)[kMaxAccTiles]) {
#pragma unroll
  for (int i = 0; i < kMaxAccTiles; i++) wmma::fill_fragment(acc[i], 0.0f);
}

// acc += A·B over the warp's tiles of the [M,N] output (K a multiple of 16).
template <typename LayoutA, typename LayoutB>
__device__ __forceinline__ void gemm_acc(Acc (&acc)[kMaxAccTiles], const bf16* a, int lda,
                                         const bf16* b, int ldb, int M, int N, int K) {
  const int warp = threadIdx.x / 32, tiles_n = N / kTile, tiles = (M / kTile) * tiles_n;
#pragma unroll
  for (int i = 0; i < kMaxAccTiles; i++) {
    const int tile = warp + i * kWarps;
    if (tile < tiles)
      mma_tile<LayoutA, LayoutB>(acc[i], a, lda, b, ldb, tile / tiles_n, tile % tiles_n, K);
  }
}

// c[M,N] (fp32 in shared memory, row stride ldc) = the warp's tiles of acc.
__device__ __forceinline__ void store_acc(float* c, int ldc, const Acc (&acc)[kMaxAccTiles], int M,
                                          int N) {
  const int warp = threadIdx.x / 32, tiles_n = N / kTile, tiles = (M / kTile) * tiles_n;
#pragma unroll
  for (int i = 0; i < kMaxAccTiles; i++) {
    const int tile = warp + i * kWarps;
    if (tile < tiles)
      wmma::store_matrix_sync(c + (tile / tiles_n) * kTile * ldc + (tile % tiles_n) * kTile, acc[i],
                              ldc, wmma::mem_row_major);
  }
}

// Max and sum over the kTpr consecutive lanes that own a row. A butterfly: every lane ends with
// the same bits (each step combines the same two values, and + is commutative).
template <int kTpr>
__device__ __forceinline__ float row_max(float x) {
#pragma unroll
  for (int offset = kTpr / 2; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
template <int kTpr>
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int offset = kTpr / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// ---- forward ----------------------------------------------------------------------------------
// One block per (query block, head, batch). scale_log2 = log2(e)/sqrt(HD): scores in log2 units,
// so the exponentials are exp2f.
template <int Br, int Bc>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(bf16* out, float* lse, QkvRows<const bf16*> qkv, int T, int NH,
                             int NKV, int HD, int HDP, float scale_log2, Rotation rot) {
  constexpr int kTpr = kThreads / Br;  // threads per row in the row pass
  constexpr int kCols = Bc / kTpr;     // score columns per thread
  static_assert(kTpr <= 32 && kThreads % Br == 0 && Bc % kTpr == 0, "row pass tiling");
  // The longest rows (most key blocks) first, so they do not finish last.
  const int q0 = (gridDim.x - 1 - blockIdx.x) * Br;
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (NH / NKV);
  const int64_t row0 = int64_t(b) * T, o_stride = int64_t(NH) * HD;  // the batch's first row
  const bf16* qh = qkv.q + row0 * qkv.ldq + h * HD;    // [T,HD], row stride ldq
  const bf16* kg = qkv.k + row0 * qkv.ldk + kvh * HD;  // [T,HD], row stride ldk
  const bf16* vg = qkv.v + row0 * qkv.ldv + kvh * HD;
  bf16* oh = out + row0 * o_stride + h * HD;

  const SmemLayout L = smem_layout(Br, Bc, HDP, false);
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem + L.q);    // [Br,HDP]
  bf16* k_s = reinterpret_cast<bf16*>(smem + L.k);    // [Bc,HDP]
  bf16* v_s = reinterpret_cast<bf16*>(smem + L.v);    // [Bc,HDP]
  float* s_s = reinterpret_cast<float*>(smem + L.s);  // [Br,Bc] scores
  bf16* p_s = reinterpret_cast<bf16*>(smem + L.s);    // [Br,Bc] probabilities, over the scores
  float* o_s = reinterpret_cast<float*>(smem + L.o);  // [Br,HDP] unnormalised output

  load_rows(q_s, L.ld_hd, qh + q0 * qkv.ldq, qkv.ldq, T - q0, Br, HD, HDP, rot, q0);
  for (int i = threadIdx.x; i < Br * HDP; i += kThreads) o_s[(i / HDP) * L.ld_f32 + i % HDP] = 0.0f;

  // The row pass: this thread's row and its columns lane_in_row + kTpr·e of the score tile.
  const int row = threadIdx.x / kTpr, lane_in_row = threadIdx.x % kTpr;
  const int qi = q0 + row;  // ≥ T on the tail rows: computed like the others, never stored
  float m = -INFINITY;      // running max of the row's scores (log2 units)
  float l = 0.0f;           // running Σ 2^(s - m)
  const int kv_end = min(T, q0 + Br);  // the block's queries see keys [0, kv_end)
  for (int k0 = 0; k0 < kv_end; k0 += Bc) {
    load_rows(k_s, L.ld_hd, kg + k0 * qkv.ldk, qkv.ldk, T - k0, Bc, HD, HDP, rot, k0);
    load_rows(v_s, L.ld_hd, vg + k0 * qkv.ldv, qkv.ldv, T - k0, Bc, HD, HDP);
    __syncthreads();
    // S[Br,Bc] = Q·Kᵀ (K row-major is Kᵀ column-major)
    gemm_smem<wmma::row_major, wmma::col_major>(s_s, L.ld_s, false, q_s, L.ld_hd, k_s, L.ld_hd, Br,
                                                Bc, HDP);
    __syncthreads();
    float p[kCols];
    float block_max = -INFINITY;
#pragma unroll
    for (int e = 0; e < kCols; e++) {
      const int c = lane_in_row + e * kTpr, kj = k0 + c;
      p[e] = (kj > qi || kj >= T) ? -INFINITY : s_s[row * L.ld_s + c] * scale_log2;
      block_max = fmaxf(block_max, p[e]);
    }
    const float m_new = fmaxf(m, row_max<kTpr>(block_max));
    // A row with no visible key yet keeps m = -inf; measuring from 0 then gives P = 0, not NaN.
    const float m_base = m_new == -INFINITY ? 0.0f : m_new;
    const float rescale = exp2f(m - m_base);
    float block_sum = 0.0f;
#pragma unroll
    for (int e = 0; e < kCols; e++) {
      p[e] = exp2f(p[e] - m_base);
      block_sum += p[e];
    }
    l = l * rescale + row_sum<kTpr>(block_sum);
    m = m_new;
    __syncwarp();  // every score of the row is read before its probabilities overwrite them
#pragma unroll
    for (int e = 0; e < kCols; e++)
      p_s[row * 2 * L.ld_s + lane_in_row + e * kTpr] = __float2bfloat16_rn(p[e]);
    for (int c = lane_in_row; c < HDP; c += kTpr) o_s[row * L.ld_f32 + c] *= rescale;
    __syncthreads();
    // O[Br,HDP] += P·V
    gemm_smem<wmma::row_major, wmma::row_major>(o_s, L.ld_f32, true, p_s, 2 * L.ld_s, v_s, L.ld_hd,
                                                Br, HDP, Bc);
    __syncthreads();
  }
  // l ≥ 1 on every real row: its maximum contributes 2^0.
  const float inv_l = 1.0f / l;
  for (int c = lane_in_row; c < HDP; c += kTpr) o_s[row * L.ld_f32 + c] *= inv_l;
  if (lane_in_row == 0 && qi < T)
    lse[(int64_t(b) * NH + h) * T + qi] = (m + log2f(l)) * float(kLn2);
  __syncthreads();
  store_rows(oh + q0 * o_stride, o_stride, o_s, L.ld_f32, min(Br, T - q0), HD);
}

// ---- backward ---------------------------------------------------------------------------------
// d[B,NH,T] = Σ_c dout[b,t,h,c]·out[b,t,h,c]: one warp per row of [B·T·NH], fixed-order sums.
__global__ void __launch_bounds__(kThreads)
    attention_row_dot_kernel(float* d, const bf16* dout, const bf16* out, int B, int T, int NH,
                             int HD) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= int64_t(B) * T * NH) return;  // whole warps leave together
  float sum = 0.0f;
  for (int c = lane * 8; c < HD; c += 32 * 8) {
    const uint4 a = *reinterpret_cast<const uint4*>(dout + row * HD + c);
    const uint4 o = *reinterpret_cast<const uint4*>(out + row * HD + c);
    const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
    const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&o);
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const float2 af = __bfloat1622float2(a2[j]), of = __bfloat1622float2(o2[j]);
      sum += af.x * of.x + af.y * of.y;
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) {
    const int64_t b = row / (int64_t(T) * NH), t = (row / NH) % T, h = row % NH;
    d[(b * NH + h) * T + t] = sum;
  }
}

// dK, dV of one key block of one kv head: Σ over the group's query heads and the query blocks
// that reach the key block. scale = 1/sqrt(HD), scale_log2 = scale·log2(e).
template <int Br, int Bc>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkdv_kernel(QkvRows<bf16*> dqkv, const float* d, const bf16* dout,
                                   const float* lse, QkvRows<const bf16*> qkv, int T, int NH,
                                   int NKV, int HD, int HDP, float scale, float scale_log2,
                                   Rotation rot) {
  constexpr int kTpr = kThreads / Br;
  constexpr int kCols = Bc / kTpr;
  static_assert(kTpr <= 32 && kThreads % Br == 0 && Bc % kTpr == 0, "row pass tiling");
  const int k0 = blockIdx.x * Bc, kvh = blockIdx.y, b = blockIdx.z, group = NH / NKV;
  const int64_t row0 = int64_t(b) * T, o_stride = int64_t(NH) * HD;  // the batch's first row
  const int64_t key_row = row0 + k0;  // row k0 of k, v, dk, dv

  const SmemLayout L = smem_layout(Br, Bc, HDP, true);
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* k_s = reinterpret_cast<bf16*>(smem + L.k);      // [Bc,HDP]
  bf16* v_s = reinterpret_cast<bf16*>(smem + L.v);      // [Bc,HDP]
  bf16* q_s = reinterpret_cast<bf16*>(smem + L.q);      // [Br,HDP]
  bf16* do_s = reinterpret_cast<bf16*>(smem + L.dout);  // [Br,HDP]
  float* s_s = reinterpret_cast<float*>(smem + L.s);    // [Br,Bc] scores
  bf16* p_s = reinterpret_cast<bf16*>(smem + L.s);      // [Br,Bc] probabilities, over the scores
  float* dp_s = reinterpret_cast<float*>(smem + L.dp);  // [Br,Bc] dP
  bf16* ds_s = reinterpret_cast<bf16*>(smem + L.dp);    // [Br,Bc] dS, over dP
  float* stage = reinterpret_cast<float*>(smem + L.k);  // [Bc,HDP] fp32, over k and v at the end

  load_rows(k_s, L.ld_hd, qkv.k + key_row * qkv.ldk + kvh * HD, qkv.ldk, T - k0, Bc, HD, HDP, rot,
            k0);
  load_rows(v_s, L.ld_hd, qkv.v + key_row * qkv.ldv + kvh * HD, qkv.ldv, T - k0, Bc, HD, HDP);
  Acc dk_acc[kMaxAccTiles], dv_acc[kMaxAccTiles];  // this warp's tiles of dK, dV [Bc,HDP]
  acc_zero(dk_acc);
  acc_zero(dv_acc);

  const int row = threadIdx.x / kTpr, lane_in_row = threadIdx.x % kTpr;
  for (int h = kvh * group; h < (kvh + 1) * group; h++) {
    const bf16* qh = qkv.q + row0 * qkv.ldq + h * HD;  // row 0 of q, dout for head h
    const bf16* doh = dout + row0 * o_stride + h * HD;
    // The first query block holding a query ≥ k0; every later one, to the end of T.
    for (int q0 = k0 / Br * Br; q0 < T; q0 += Br) {
      load_rows(q_s, L.ld_hd, qh + q0 * qkv.ldq, qkv.ldq, T - q0, Br, HD, HDP, rot, q0);
      load_rows(do_s, L.ld_hd, doh + q0 * o_stride, o_stride, T - q0, Br, HD, HDP);
      const int qi = q0 + row;
      const bool real_row = qi < T;
      const float row_lse2 = real_row ? lse[(int64_t(b) * NH + h) * T + qi] * float(kLog2e) : 0.0f;
      const float row_d = real_row ? d[(int64_t(b) * NH + h) * T + qi] : 0.0f;
      __syncthreads();
      // S = Q·Kᵀ, dP = dO·Vᵀ  [Br,Bc]
      gemm_smem<wmma::row_major, wmma::col_major>(s_s, L.ld_s, false, q_s, L.ld_hd, k_s, L.ld_hd,
                                                  Br, Bc, HDP);
      gemm_smem<wmma::row_major, wmma::col_major>(dp_s, L.ld_s, false, do_s, L.ld_hd, v_s, L.ld_hd,
                                                  Br, Bc, HDP);
      __syncthreads();
      float p[kCols], ds[kCols];
#pragma unroll
      for (int e = 0; e < kCols; e++) {
        const int c = lane_in_row + e * kTpr, kj = k0 + c;
        const bool visible = real_row && kj <= qi;
        p[e] = visible ? exp2f(s_s[row * L.ld_s + c] * scale_log2 - row_lse2) : 0.0f;
        ds[e] = p[e] * (dp_s[row * L.ld_s + c] - row_d) * scale;
      }
      __syncwarp();  // the row's S and dP are all read before P and dS overwrite them
#pragma unroll
      for (int e = 0; e < kCols; e++) {
        const int c = lane_in_row + e * kTpr;
        p_s[row * 2 * L.ld_s + c] = __float2bfloat16_rn(p[e]);
        ds_s[row * 2 * L.ld_s + c] = __float2bfloat16_rn(ds[e]);
      }
      __syncthreads();
      // dV[Bc,HDP] += Pᵀ·dO, dK[Bc,HDP] += dSᵀ·Q (P, dS row-major are Pᵀ, dSᵀ column-major)
      gemm_acc<wmma::col_major, wmma::row_major>(dv_acc, p_s, 2 * L.ld_s, do_s, L.ld_hd, Bc, HDP,
                                                 Br);
      gemm_acc<wmma::col_major, wmma::row_major>(dk_acc, ds_s, 2 * L.ld_s, q_s, L.ld_hd, Bc, HDP,
                                                 Br);
      __syncthreads();
    }
  }
  const int valid_rows = min(Bc, T - k0);
  store_acc(stage, L.ld_f32, dv_acc, Bc, HDP);
  __syncthreads();
  store_rows(dqkv.v + key_row * dqkv.ldv + kvh * HD, dqkv.ldv, stage, L.ld_f32, valid_rows, HD);
  __syncthreads();
  store_acc(stage, L.ld_f32, dk_acc, Bc, HDP);
  __syncthreads();
  store_rows(dqkv.k + key_row * dqkv.ldk + kvh * HD, dqkv.ldk, stage, L.ld_f32, valid_rows, HD,
             rot, k0);
}

// dQ of one query block of one head: Σ over the key blocks up to the diagonal.
template <int Br, int Bc>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_kernel(QkvRows<bf16*> dqkv, const float* d, const bf16* dout,
                                 const float* lse, QkvRows<const bf16*> qkv, int T, int NH,
                                 int NKV, int HD, int HDP, float scale, float scale_log2,
                                 Rotation rot) {
  constexpr int kTpr = kThreads / Br;
  constexpr int kCols = Bc / kTpr;
  static_assert(kTpr <= 32 && kThreads % Br == 0 && Bc % kTpr == 0, "row pass tiling");
  const int q0 = (gridDim.x - 1 - blockIdx.x) * Br;  // the longest rows first
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (NH / NKV);
  const int64_t row0 = int64_t(b) * T, o_stride = int64_t(NH) * HD;  // the batch's first row
  const int64_t query_row = row0 + q0;  // row q0 of q, dout, dq
  const bf16* kg = qkv.k + row0 * qkv.ldk + kvh * HD;  // [T,HD], row stride ldk
  const bf16* vg = qkv.v + row0 * qkv.ldv + kvh * HD;

  const SmemLayout L = smem_layout(Br, Bc, HDP, true);
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* k_s = reinterpret_cast<bf16*>(smem + L.k);      // [Bc,HDP]
  bf16* v_s = reinterpret_cast<bf16*>(smem + L.v);      // [Bc,HDP]
  bf16* q_s = reinterpret_cast<bf16*>(smem + L.q);      // [Br,HDP]
  bf16* do_s = reinterpret_cast<bf16*>(smem + L.dout);  // [Br,HDP]
  float* s_s = reinterpret_cast<float*>(smem + L.s);    // [Br,Bc] scores
  float* dp_s = reinterpret_cast<float*>(smem + L.dp);  // [Br,Bc] dP
  bf16* ds_s = reinterpret_cast<bf16*>(smem + L.dp);    // [Br,Bc] dS, over dP
  float* stage = reinterpret_cast<float*>(smem + L.q);  // [Br,HDP] fp32, over q and dout at the end

  load_rows(q_s, L.ld_hd, qkv.q + query_row * qkv.ldq + h * HD, qkv.ldq, T - q0, Br, HD, HDP, rot,
            q0);
  load_rows(do_s, L.ld_hd, dout + query_row * o_stride + h * HD, o_stride, T - q0, Br, HD, HDP);
  const int row = threadIdx.x / kTpr, lane_in_row = threadIdx.x % kTpr;
  const int qi = q0 + row;
  const bool real_row = qi < T;
  const float row_lse2 = real_row ? lse[(int64_t(b) * NH + h) * T + qi] * float(kLog2e) : 0.0f;
  const float row_d = real_row ? d[(int64_t(b) * NH + h) * T + qi] : 0.0f;
  Acc dq_acc[kMaxAccTiles];  // this warp's tiles of dQ [Br,HDP]
  acc_zero(dq_acc);

  const int kv_end = min(T, q0 + Br);
  for (int k0 = 0; k0 < kv_end; k0 += Bc) {
    load_rows(k_s, L.ld_hd, kg + k0 * qkv.ldk, qkv.ldk, T - k0, Bc, HD, HDP, rot, k0);
    load_rows(v_s, L.ld_hd, vg + k0 * qkv.ldv, qkv.ldv, T - k0, Bc, HD, HDP);
    __syncthreads();
    // S = Q·Kᵀ, dP = dO·Vᵀ  [Br,Bc]
    gemm_smem<wmma::row_major, wmma::col_major>(s_s, L.ld_s, false, q_s, L.ld_hd, k_s, L.ld_hd, Br,
                                                Bc, HDP);
    gemm_smem<wmma::row_major, wmma::col_major>(dp_s, L.ld_s, false, do_s, L.ld_hd, v_s, L.ld_hd,
                                                Br, Bc, HDP);
    __syncthreads();
    float ds[kCols];
#pragma unroll
    for (int e = 0; e < kCols; e++) {
      const int c = lane_in_row + e * kTpr, kj = k0 + c;
      const bool visible = real_row && kj <= qi;
      const float p = visible ? exp2f(s_s[row * L.ld_s + c] * scale_log2 - row_lse2) : 0.0f;
      ds[e] = p * (dp_s[row * L.ld_s + c] - row_d) * scale;
    }
    __syncwarp();  // the row's dP is all read before dS overwrites it
#pragma unroll
    for (int e = 0; e < kCols; e++)
      ds_s[row * 2 * L.ld_s + lane_in_row + e * kTpr] = __float2bfloat16_rn(ds[e]);
    __syncthreads();
    // dQ[Br,HDP] += dS·K
    gemm_acc<wmma::row_major, wmma::row_major>(dq_acc, ds_s, 2 * L.ld_s, k_s, L.ld_hd, Br, HDP, Bc);
    __syncthreads();
  }
  store_acc(stage, L.ld_f32, dq_acc, Br, HDP);
  __syncthreads();
  store_rows(dqkv.q + query_row * dqkv.ldq + h * HD, dqkv.ldq, stage, L.ld_f32, min(Br, T - q0),
             HD, rot, q0);
}

// ---- host side ----------------------------------------------------------------------------------

// HD padded to the WMMA depth; throws unless the shapes are ones the kernels handle.
int padded_head_dim(int B, int T, int NH, int NKV, int HD) {
  if (!cuda_attention_takes_head_dim(HD))  // resolve() refuses such a run before it starts
    throw InternalError("attention (CUDA): head dim HD = " + std::to_string(HD) +
                        " unsupported; it must be a multiple of 8 in [8, " +
                        std::to_string(kCudaMaxHeadDim) + "]");
  GRASS_CHECK(
      B >= 1 && B <= 65535 && T >= 1 && NKV >= 1 && NH >= NKV && NH % NKV == 0 && NH <= 65535,
      "attention (CUDA): bad shape B=" + std::to_string(B) + " T=" + std::to_string(T) +
          " NH=" + std::to_string(NH) + " NKV=" + std::to_string(NKV));
  return int(ceil_div(HD, kTile) * kTile);
}

// 16-byte vector loads and stores need 16-byte aligned tensors (cudaMalloc gives 256).
void check_aligned(const void* p, const char* name) {
  GRASS_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0,
              std::string("attention (CUDA): ") + name + " is not 16-byte aligned");
}

// Every row of q, k and v (or their gradients) 16-byte aligned: the pointers, and pitches of a
// multiple of 8 elements.
template <typename P>
void check_rows(QkvRows<P> rows, const char* names) {
  check_aligned(rows.q, names);
  check_aligned(rows.k, names);
  check_aligned(rows.v, names);
  GRASS_CHECK(rows.ldq % 8 == 0 && rows.ldk % 8 == 0 && rows.ldv % 8 == 0,
              std::string("attention (CUDA): the row pitches of ") + names +
                  " are not multiples of 8 elements");
}

// Opts kernel in to `bytes` of dynamic shared memory (needed above 48 KiB); throws if the device
// has less.
template <typename Kernel>
void allow_smem(Kernel kernel, int bytes, const char* name) {
  int device = 0, max_bytes = 0;
  GRASS_CUDA_CHECK(cudaGetDevice(&device));
  GRASS_CUDA_CHECK(
      cudaDeviceGetAttribute(&max_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > max_bytes)
    throw InternalError(std::string("attention (CUDA): ") + name + " needs " +
                        std::to_string(bytes) + " bytes of shared memory, the device allows " +
                        std::to_string(max_bytes));
  GRASS_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

// The register accumulators of the backward hold (rows/16)·(HDP/16) tiles over 8 warps.
void check_acc_tiles(int rows, int HDP) {
  GRASS_CHECK((rows / kTile) * (HDP / kTile) <= kWarps * kMaxAccTiles,
              "attention (CUDA): accumulator tiling too small for HDP=" + std::to_string(HDP));
}

// The kernels' view of a RoPE table (none when rope.table is null).
Rotation rotation(RopeTable rope, int T, int HD) {
  if (!rope.table) return {};
  GRASS_CHECK(rope.T >= T, "attention (CUDA): a RoPE table of " + std::to_string(rope.T) +
                               " positions for T = " + std::to_string(T));
  return {rope.table, rope.table + int64_t(rope.T) * (HD / 2)};
}

template <int Br, int Bc>
void launch_forward(const Context& ctx, bf16* out, float* lse, QkvRows<const bf16*> qkv, int B,
                    int T, int NH, int NKV, int HD, int HDP, Rotation rot) {
  const int bytes = smem_layout(Br, Bc, HDP, false).bytes;
  allow_smem(attention_forward_kernel<Br, Bc>, bytes, "attention_forward_kernel");
  const float scale_log2 = float(kLog2e / std::sqrt(double(HD)));
  const dim3 grid(unsigned(ceil_div(T, Br)), unsigned(NH), unsigned(B));
  attention_forward_kernel<Br, Bc>
      <<<grid, kThreads, bytes, ctx.stream>>>(out, lse, qkv, T, NH, NKV, HD, HDP, scale_log2, rot);
  GRASS_LAUNCH_CHECK();
}

template <int BrKV, int BcKV, int BrQ, int BcQ>
void launch_backward(const Context& ctx, QkvRows<bf16*> dqkv, const float* d, const bf16* dout,
                     const float* lse, QkvRows<const bf16*> qkv, int B, int T, int NH, int NKV,
                     int HD, int HDP, Rotation rot) {
  check_acc_tiles(BcKV, HDP);
  check_acc_tiles(BrQ, HDP);
  const float scale = float(1.0 / std::sqrt(double(HD)));
  const float scale_log2 = float(kLog2e / std::sqrt(double(HD)));

  const int kv_bytes = smem_layout(BrKV, BcKV, HDP, true).bytes;
  allow_smem(attention_backward_dkdv_kernel<BrKV, BcKV>, kv_bytes,
             "attention_backward_dkdv_kernel");
  const dim3 kv_grid(unsigned(ceil_div(T, BcKV)), unsigned(NKV), unsigned(B));
  attention_backward_dkdv_kernel<BrKV, BcKV><<<kv_grid, kThreads, kv_bytes, ctx.stream>>>(
      dqkv, d, dout, lse, qkv, T, NH, NKV, HD, HDP, scale, scale_log2, rot);
  GRASS_LAUNCH_CHECK();

  const int q_bytes = smem_layout(BrQ, BcQ, HDP, true).bytes;
  allow_smem(attention_backward_dq_kernel<BrQ, BcQ>, q_bytes, "attention_backward_dq_kernel");
  const dim3 q_grid(unsigned(ceil_div(T, BrQ)), unsigned(NH), unsigned(B));
  attention_backward_dq_kernel<BrQ, BcQ><<<q_grid, kThreads, q_bytes, ctx.stream>>>(
      dqkv, d, dout, lse, qkv, T, NH, NKV, HD, HDP, scale, scale_log2, rot);
  GRASS_LAUNCH_CHECK();
}

}  // namespace

// Tile sizes: [Br query rows, Bc key rows] per block. Shared memory at HDP = 128 / 256:
// forward 64x64: 101 KiB / (64x32) 140 KiB; dK,dV 64x64: 102 KiB / (64x32) 117 KiB;
// dQ 64x64: 102 KiB / (32x64) 116 KiB — all under sm_80's 163 KiB.
void attention_forward(const Context& ctx, bf16* out, float* lse, QkvRows<const bf16*> qkv, int B,
                       int T, int NH, int NKV, int HD, RopeTable rope) {
  const int HDP = padded_head_dim(B, T, NH, NKV, HD);
  check_aligned(out, "out");
  check_rows(qkv, "q, k, v");
  const Rotation rot = rotation(rope, T, HD);
  if (HDP <= 128)
    launch_forward<64, 64>(ctx, out, lse, qkv, B, T, NH, NKV, HD, HDP, rot);
  else
    launch_forward<64, 32>(ctx, out, lse, qkv, B, T, NH, NKV, HD, HDP, rot);
}

// scratch holds D[B,NH,T]; dK and dV accumulate in registers, so they need none.
int64_t attention_scratch_floats(int B, int T, int NH, int /*NKV*/, int /*HD*/) {
  return int64_t(B) * NH * T;
}

void attention_backward(const Context& ctx, QkvRows<bf16*> dqkv, float* scratch, const bf16* dout,
                        const bf16* out, const float* lse, QkvRows<const bf16*> qkv, int B, int T,
                        int NH, int NKV, int HD, RopeTable rope) {
  const int HDP = padded_head_dim(B, T, NH, NKV, HD);
  const Rotation rot = rotation(rope, T, HD);
  check_rows(dqkv, "dq, dk, dv");
  check_aligned(dout, "dout");
  check_aligned(out, "out");
  check_rows(qkv, "q, k, v");
  float* d = scratch;  // [B,NH,T]
  const int64_t rows = int64_t(B) * T * NH;
  attention_row_dot_kernel<<<unsigned(ceil_div(rows, kWarps)), kThreads, 0, ctx.stream>>>(
      d, dout, out, B, T, NH, HD);
  GRASS_LAUNCH_CHECK();
  if (HDP <= 128)
    launch_backward<64, 64, 64, 64>(ctx, dqkv, d, dout, lse, qkv, B, T, NH, NKV, HD, HDP, rot);
  else
    launch_backward<64, 32, 32, 64>(ctx, dqkv, d, dout, lse, qkv, B, T, NH, NKV, HD, HDP, rot);
}

}  // namespace grass::cuda
