// An Adam step over 8-bit moments on the GPU (kernels/quant8.h; the CPU's loop:
// kernels/cpu/quant8_step.h), shared by the optimizers' 8-bit kernels (AdamW's, GRASS's, GaLore's
// and FLORA's), built to be bound by memory rather than by latency (../shared/GPU_PERF.md §2.5):
// coalesced loads, many in flight, and no barrier between a block's loads and its encode.
//
// Each optimizer supplies an element op (AdamwQ8 in adamw.cu, GrassQ8 in grass.cu, LowRankQ8 in
// lowrank.cu), the CPU's step(i, m, v) split so the loads can be issued apart from the math:
//   void prepare()                    once per thread: reads the clip scale
//   bool reads_weight()               the step needs the weight before it (the proximal term)
//   void position(i, row&, col&)      (row, col) of flat element i of the state [rows, cols]
//                                     (GRASS finds its weight by them; the others ignore them)
//   float gradient(i), weight(i, row, col)        one element's inputs (weight: 0 if none)
//   float step(i, row, col, g, w0, m&, v&)        the new moments in place; returns the output
//   void put(i, row, col, out)                    writes the output (the weight, a direction)
// and, for the warp driver, whose ops keep their weights and outputs at the state's index
// (AdamW's weights, GaLore's direction; not GRASS's, scattered by σ):
//   gradient8, weight8, put8 (i0, x[8])          8 consecutive elements from a 16-byte aligned
//                                                 i0, as vector loads and stores
//
// Two drivers, each giving the CPU's codes, absmax and outputs bit for bit: the same decode, the
// same fp32 step, absmax a max (exact and order-free: the same bits in any order), 1/absmax by
// the same division once per block, and quant8_encode_pivoted, the same code as quant8_encode for
// every input.
//   warp          the flat layout in blocks of up to 256 (the default, and 64, 128): one warp per
//                 256 consecutive elements, each lane holding 8 (codes as one 8-byte load per
//                 moment, fp32 as two float4, bf16 as 16 bytes), a quantization block's absmax an
//                 xor-shuffle max among its block / 8 lanes, and the next 256 elements' loads
//                 issued before the current ones are encoded.
//   thread block  the rest: the per-feature layout (GRASS's and GaLore's default: one lane per
//                 column, the block's rows shared among 8 warps), flat blocks of 512 to 4,096,
//                 GRASS's flat layout, arrays not aligned for vector loads and a flat tail of
//                 under 256 elements (a thread block per block): two passes over the elements,
//                 coalesced, each thread loading 4 of its elements at once, the second pass
//                 recomputing the first's moments (quant8_block_step).
// Both keep the maps in shared memory (kQuant8Copies copies, a lane reading its own, so lanes
// whose searches meet the same bank in one copy mostly do not in theirs), load them once per
// thread block and walk their work grid-stride over about SMs x 8 thread blocks of 256 threads,
// within 64 registers (tools/ptxas_budget.json). Include only from .cu files.
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/quant8.h"

namespace grass::cuda {

constexpr int kQuant8Threads = 256;                     // 8 warps a thread block
constexpr int kQuant8Warps = kQuant8Threads / 32;
constexpr int kQuant8Lane = 8;                          // consecutive elements a lane holds (flat)
constexpr int kQuant8Span = 32 * kQuant8Lane;           // 256: what a warp holds at once (flat)
constexpr int kQuant8MaxBlock = 4096;
constexpr int kQuant8Rows = 4;  // elements a thread-block driver's thread loads at once
constexpr int kQuant8Copies = 4;
constexpr int kQuant8Stride = 264;  // ≡ 8 (mod 32): copy k's entry c sits in bank (c + 8k) % 32

// The 8-bit step's launch checks: the drivers take quantization blocks of a power of two from 8
// (one lane's 8 elements) to 4,096 (the config's range is 64 to 4,096).
inline void check_quant8_block(int block, const char* who) {
  GRASS_CHECK(block >= kQuant8Lane && block <= kQuant8MaxBlock && (block & (block - 1)) == 0,
              std::string(who) + ": a quantization block of " + std::to_string(block) +
                  " elements (a power of two from 8 to 4096)");
}

// Thread blocks for `needed` of them, at most SMs x 8: a few waves at 4 resident per SM (64
// registers a thread), each block loading the maps once.
inline unsigned quant8_grid(int64_t needed) {
  int device = 0, sms = 0;
  GRASS_CUDA_CHECK(cudaGetDevice(&device));
  GRASS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return unsigned(std::clamp<int64_t>(needed, 1, int64_t(sms) * 8));
}
// How a launcher splits a layout between the drivers: the warp driver takes the flat layout's
// elements [0, end), whole spans of 256, when its blocks are at most 256 and `aligned` (the codes
// 8-byte aligned, the op's arrays 16-byte aligned, for its vector loads); the thread-block driver
// the rest from `end` (the ragged tail) or all of it (end 0).
inline int64_t quant8_warp_end(const Quant8Layout& layout, bool aligned) {
  if (layout.columns || layout.block > kQuant8Span || !aligned) return 0;
  return layout.rows * layout.cols / kQuant8Span * kQuant8Span;
}
inline bool quant8_codes_aligned(const Quant8Moments& s) {
  return reinterpret_cast<uintptr_t>(s.m) % 8 == 0 && reinterpret_cast<uintptr_t>(s.v) % 8 == 0;
}
// Their grids: a warp per span of 256; a thread block per task (quant8_block_step).
inline unsigned quant8_warp_grid(int64_t end) {
  return quant8_grid(ceil_div(end / kQuant8Span, kQuant8Warps));
}
inline unsigned quant8_block_grid(const Quant8Layout& layout, int64_t from) {
  return quant8_grid(layout.columns ? ceil_div(layout.cols, 32) * layout.blocks_per_column()
                                    : layout.blocks() - from / layout.block);
}

// ---- the maps in shared memory ------------------------------------------------------------------

struct Quant8Table {
  float value[kQuant8Copies][kQuant8Stride];
  float bound[kQuant8Copies][kQuant8Stride];
};
struct Quant8Tables {
  Quant8Table m, v;
};

// One map as a thread reads it: its copy of the table (an index, not a pointer: shared memory's
// 32-bit addresses from one register for both maps), the search's first bounds, the zero code.
struct Quant8Lane {
  const Quant8Table& table;
  int copy;
  Quant8Pivots pivots;
  int zero;

  __device__ __forceinline__ float decode(uint64_t codes, int e, float absmax) const {
    return table.value[copy][(codes >> (8 * e)) & 0xFF] * absmax;  // quant8_decode
  }
  __device__ __forceinline__ uint64_t encode(float x, int e, float absmax, float inv) const {
    return uint64_t(quant8_encode_pivoted(pivots, table.bound[copy], zero, x, absmax, inv))
           << (8 * e);
  }
};

// Copies both maps (kernel arguments) into `sh` once per thread block; every thread calls it.
__device__ inline void load_quant8_tables(Quant8Tables& sh, const Quant8Map& m,
                                          const Quant8Map& v) {
  for (int c = threadIdx.x; c < 256; c += blockDim.x) {
    const float mv = m.value[c], vv = v.value[c];
    const float mb = c < 255 ? m.bound[c] : 0.0f, vb = c < 255 ? v.bound[c] : 0.0f;
#pragma unroll
    for (int k = 0; k < kQuant8Copies; k++) {
      sh.m.value[k][c] = mv;
      sh.v.value[k][c] = vv;
      if (c < 255) {
        sh.m.bound[k][c] = mb;
        sh.v.bound[k][c] = vb;
      }
    }
  }
  __syncthreads();
}

__device__ __forceinline__ Quant8Lane quant8_lane(const Quant8Table& t, const Quant8Map& map) {
  return {t, int(threadIdx.x % kQuant8Copies), quant8_pivots(map), map.zero};
}

// ---- 8 consecutive elements as one or two 16-byte accesses (16-byte aligned) --------------------

__device__ __forceinline__ void load8(const float* p, float (&x)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
__device__ __forceinline__ void load8(const bf16* p, float (&x)[8]) {
  const BF16Pack<8> pack = *reinterpret_cast<const BF16Pack<8>*>(p);
#pragma unroll
  for (int e = 0; e < 8; e++) x[e] = __bfloat162float(pack.v[e]);
}
__device__ __forceinline__ void store8(float* p, const float (&x)[8]) {
  reinterpret_cast<float4*>(p)[0] = {x[0], x[1], x[2], x[3]};
  reinterpret_cast<float4*>(p)[1] = {x[4], x[5], x[6], x[7]};
}
// rounded to nearest
__device__ __forceinline__ void store8(bf16* p, const float (&x)[8]) {
  BF16Pack<8> pack;
#pragma unroll
  for (int e = 0; e < 8; e++) pack.v[e] = __float2bfloat16_rn(x[e]);
  *reinterpret_cast<BF16Pack<8>*>(p) = pack;
}

// Finite (neither NaN nor ±Inf): the 8-bit steps' test for a gradient they can use.
__device__ __forceinline__ bool quant8_finite(float x) { return fabsf(x) <= 3.402823466e38f; }

// ---- the warp driver ----------------------------------------------------------------------------

// What one lane reads for its 8 elements i0 .. i0 + 7.
struct Quant8Loads {
  uint64_t m, v;             // the codes, element e in byte e
  float absmax_m, absmax_v;  // of their quantization block
  float g[kQuant8Lane], w[kQuant8Lane];
};

// The largest of x over each aligned group of `lanes` lanes (a power of two up to 32), in every
// lane of the group. Every lane of the warp calls it.
__device__ __forceinline__ float quant8_group_max(float x, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// A lane's 8 elements from i0 (shift: log2(s.block)).
template <typename Op>
__device__ __forceinline__ void quant8_load(const Op& op, const Quant8Moments& s, int shift,
                                            int64_t i0, Quant8Loads& in) {
  in.absmax_m = s.absmax_m[i0 >> shift];
  in.absmax_v = s.absmax_v[i0 >> shift];
  in.m = *reinterpret_cast<const uint64_t*>(s.m + i0);
  in.v = *reinterpret_cast<const uint64_t*>(s.v + i0);
  op.gradient8(i0, in.g);
  op.weight8(i0, in.w);
}

// The flat layout's elements [0, n) (n a multiple of 256, the blocks at most 256: whole blocks), a
// warp holding 256 consecutive elements: 256 / block quantization blocks of block / 8 lanes each.
// The codes 8-byte aligned and the op's arrays 16-byte aligned (the launcher checks). Every
// thread of the thread block (kQuant8Threads) calls it.
template <typename Op>
__device__ void quant8_warp_step(Op op, const Quant8Moments& s, int64_t n, const Quant8Map& map_m,
                                 const Quant8Map& map_v) {
  __shared__ Quant8Tables tables;
  GRASS_SHARED_DECLARED(tables);
  load_quant8_tables(tables, map_m, map_v);
  const Quant8Lane qm = quant8_lane(tables.m, map_m), qv = quant8_lane(tables.v, map_v);
  op.prepare();
  const int lane = threadIdx.x % 32, lanes = s.block / kQuant8Lane;
  int shift = 0;  // the block a power of two: its index a shift, no 64-bit division
  while ((1 << shift) < s.block) shift++;
  // the lane's elements i0 .. i0 + 7 of its warp's span i0 - offset, the spans striding over the
  // grid's warps from `first`
  const int offset = lane * kQuant8Lane;
  const int64_t stride = int64_t(gridDim.x) * (blockDim.x / 32) * kQuant8Span;
  const int64_t first = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32 * kQuant8Span;
  Quant8Loads now;
  if (first < n) quant8_load(op, s, shift, first + offset, now);
  for (int64_t i0 = first + offset; i0 - offset < n; i0 += stride) {
    float m[kQuant8Lane], v[kQuant8Lane], out[kQuant8Lane], max_m = 0.0f, max_v = 0.0f;
#pragma unroll
    for (int e = 0; e < kQuant8Lane; e++) {
      m[e] = qm.decode(now.m, e, now.absmax_m);
      v[e] = qv.decode(now.v, e, now.absmax_v);
      out[e] = op.step(i0 + e, 0, 0, now.g[e], now.w[e], m[e], v[e]);
      max_m = fmaxf(max_m, fabsf(m[e]));
      max_v = fmaxf(max_v, v[e]);
    }
    op.put8(i0, out);
    max_m = quant8_group_max(max_m, lanes);
    max_v = quant8_group_max(max_v, lanes);
    const float inv_m = 1.0f / max_m, inv_v = 1.0f / max_v;  // quant8_encode's, once per block
    // the next span's loads in flight while this one's codes are found
    Quant8Loads next;
    if (i0 - offset + stride < n) quant8_load(op, s, shift, i0 + stride, next);
    uint64_t cm = 0, cv = 0;
#pragma unroll
    for (int e = 0; e < kQuant8Lane; e++) {
      cm |= qm.encode(m[e], e, max_m, inv_m);
      cv |= qv.encode(v[e], e, max_v, inv_v);
    }
    *reinterpret_cast<uint64_t*>(s.m + i0) = cm;
    *reinterpret_cast<uint64_t*>(s.v + i0) = cv;
    if (lane % lanes == 0) {
      s.absmax_m[i0 >> shift] = max_m;
      s.absmax_v[i0 >> shift] = max_v;
    }
    now = next;
  }
}

// ---- the thread-block driver --------------------------------------------------------------------

// The layouts a warp cannot hold a block of, one task at a time per thread block, each thread
// taking its share of elements (consecutive threads, consecutive elements), kQuant8Rows of them
// loaded at once, in two passes: the step for the block's absmax alone, then the step again (the
// same function of the same inputs: the same moments) with the writes and the encode, its reads
// mostly from L2.
//   columns (layout.columns): block b is rows [(b % per)·block, +block) of column b / per, per =
//     layout.blocks_per_column(); a task is 32 columns of one block of rows, lane l column l,
//     warp w rows w, w + 8, ...: 32 blocks, each the maxima of the 8 warps' lanes l.
//   flat: the blocks from element `from` (a multiple of the block: the warp driver's end) to
//     the end, all of them where the warp driver cannot take the tensor (blocks of 512 to 4,096,
//     GRASS's weights, arrays not aligned for vector loads); a task is one block, thread t its
//     elements t, t + 256, ...: a warp's maxima by shuffles, then the 8 warps'.
// Every thread of the thread block (kQuant8Threads) calls it.
template <typename Op>
__device__ void quant8_block_step(Op op, const Quant8Moments& s, const Quant8Layout& layout,
                                  int64_t from, const Quant8Map& map_m, const Quant8Map& map_v) {
  __shared__ Quant8Tables tables;
  GRASS_SHARED_DECLARED(tables);
  // each thread's maxima, two sets used in turn, so one barrier a task suffices
  __shared__ float partial[2][2][kQuant8Threads];
  GRASS_SHARED_DECLARED(partial);
  load_quant8_tables(tables, map_m, map_v);
  const Quant8Lane qm = quant8_lane(tables.m, map_m), qv = quant8_lane(tables.v, map_v);
  op.prepare();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool columns = layout.columns, step_reads_weight = op.reads_weight();
  const int64_t n = layout.rows * layout.cols, groups = (layout.cols + 31) / 32;
  const int64_t per = layout.blocks_per_column();
  const int64_t first_block = from / layout.block;
  const int64_t tasks =
      columns ? groups * per : (n + layout.block - 1) / layout.block - first_block;
  // this thread's elements k = first_k, first_k + stride, ... < here of its block
  const int64_t first_k = columns ? warp : threadIdx.x;
  const int64_t stride = columns ? kQuant8Warps : kQuant8Threads;
  int turn = 0;
  for (int64_t t = blockIdx.x; t < tasks; t += gridDim.x, turn ^= 1) {
    int64_t b, col = 0, row0 = 0, start = 0, here;
    if (columns) {
      col = (t % groups) * 32 + lane;
      row0 = (t / groups) * layout.block;
      b = col * per + t / groups;
      const int64_t left = layout.rows - row0;
      here = col >= layout.cols ? 0 : left < layout.block ? left : layout.block;
    } else {
      b = first_block + t;
      start = b * layout.block;
      here = n - start < layout.block ? n - start : layout.block;
    }
    const bool live = here > 0;
    // element k of the block: index i, at (row, col) of the state
    auto locate = [&](int64_t k, int64_t& i, int64_t& row, int64_t& c) {
      if (columns) {
        row = row0 + k;
        c = col;
        i = row * layout.cols + col;
      } else {
        i = start + k;
        op.position(i, row, c);
      }
    };
    // the inputs of this thread's elements k0, k0 + stride, ... (kQuant8Rows of them at most, all
    // loads issued before any is used)
    struct Rows {
      uint32_t m = 0, v = 0;  // the codes, element u in byte u
      float g[kQuant8Rows], w[kQuant8Rows];
    };
    auto load = [&](int64_t k0, bool weights, Rows& in) {
#pragma unroll
      for (int u = 0; u < kQuant8Rows; u++) {
        if (k0 + u * stride >= here) break;
        int64_t i, row, c;
        locate(k0 + u * stride, i, row, c);
        in.m |= uint32_t(s.m[i]) << (8 * u);
        in.v |= uint32_t(s.v[i]) << (8 * u);
        in.g[u] = op.gradient(i);
        in.w[u] = weights ? op.weight(i, row, c) : 0.0f;
      }
    };
    const float old_m = live ? s.absmax_m[b] : 0.0f, old_v = live ? s.absmax_v[b] : 0.0f;
    float max_m = 0.0f, max_v = 0.0f;
    for (int64_t k0 = first_k; k0 < here; k0 += kQuant8Rows * stride) {
      Rows in;
      load(k0, step_reads_weight, in);
#pragma unroll
      for (int u = 0; u < kQuant8Rows; u++) {
        if (k0 + u * stride >= here) break;
        int64_t i, row, c;
        locate(k0 + u * stride, i, row, c);
        float m = qm.decode(in.m, u, old_m), v = qv.decode(in.v, u, old_v);
        op.step(i, row, c, in.g[u], in.w[u], m, v);
        max_m = fmaxf(max_m, fabsf(m));
        max_v = fmaxf(max_v, v);
      }
    }
    max_m = quant8_group_max(max_m, columns ? 1 : 32);
    max_v = quant8_group_max(max_v, columns ? 1 : 32);
    partial[turn][0][threadIdx.x] = max_m;
    partial[turn][1][threadIdx.x] = max_v;
    __syncthreads();
    for (int w = 0; w < kQuant8Warps; w++) {
      max_m = fmaxf(max_m, partial[turn][0][w * 32 + lane]);
      max_v = fmaxf(max_v, partial[turn][1][w * 32 + lane]);
    }
    const float inv_m = 1.0f / max_m, inv_v = 1.0f / max_v;  // quant8_encode's, once per block
    for (int64_t k0 = first_k; k0 < here; k0 += kQuant8Rows * stride) {
      Rows in;
      load(k0, true, in);
#pragma unroll
      for (int u = 0; u < kQuant8Rows; u++) {
        if (k0 + u * stride >= here) break;
        int64_t i, row, c;
        locate(k0 + u * stride, i, row, c);
        float m = qm.decode(in.m, u, old_m), v = qv.decode(in.v, u, old_v);
        op.put(i, row, c, op.step(i, row, c, in.g[u], in.w[u], m, v));
        s.m[i] = uint8_t(qm.encode(m, 0, max_m, inv_m));
        s.v[i] = uint8_t(qv.encode(v, 0, max_v, inv_v));
      }
    }
    // every thread read the old absmax before the barrier
    if (live && (columns ? warp == 0 : threadIdx.x == 0)) {
      s.absmax_m[b] = max_m;
      s.absmax_v[b] = max_v;
    }
  }
}

}  // namespace grass::cuda
