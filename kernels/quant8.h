// 8-bit blockwise dynamic quantization of optimizer states (issue 27; ../shared/MEMORY_TIERS.md
// §2.1): bitsandbytes' format. A tensor's n values are cut into blocks of `block` consecutive
// elements (the last may be shorter); each block stores its absmax (fp32) and one byte per value,
// an index into a 256-entry map of fractions of the absmax:
//   x ≈ map[code] · absmax
// The maps are bitsandbytes' "dynamic" ones (create_dynamic_map: a decimal exponent and a linear
// fraction, fine near 0 and coarse near 1): signed for the first moment, unsigned for the second.
// dynamic_quant8_map rebuilds them with torch's float32 arithmetic, and
// tests/fixtures/quant8_ref holds bitsandbytes' own values to check every bit.
//
// The rounding is bitsandbytes' portable definition (its backends/default/ops.py), the same on the
// CPU and the GPU (correctly rounded steps, so no fast math here):
//   s = x · (1 / absmax), clamped to [-1, 1]; the code is the number of bounds below s,
//   bound[c] = (map[c] + map[c+1]) / 2 in float: the nearest value, a tie to the lower one
//   (torch.bucketize). bitsandbytes' native CPU kernel approximates it: on the fixture's 2,404
//   values it gives other codes for 562, all but one below 1e-3 of their absmax (it codes 0 as
//   131 of the signed map, not 127, the 0) and an all-zero block as code 0 (the map's -0.99);
// and one rule of the engine's for optimizer states: a nonzero x whose nearest value is 0 or of
// the other sign moves one code outwards, so a nonzero state never decodes to 0 or flips sign.
// For v it is the zero-point guard (a v decoded as 0 would step m/eps); for m it is
// bitsandbytes' Adam kernel's sign rule made symmetric (its kernel keeps a tiny positive m at 0
// and moves only a tiny negative one);
//   absmax 0 (an all-zero block, as a GRASS or GaLore refresh leaves it): every code is the map's
//   0 and nothing is divided (bitsandbytes' portable path gets there by clamping absmax to 1e-38).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/stochastic_round.h"  // GRASS_HOST_DEVICE

namespace grass {

struct Quant8Map {
  float value[256];  // ascending
  float bound[255];  // bound[c] = (value[c] + value[c+1]) / 2
  uint8_t zero;      // the code whose value is 0
};

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits = 7, total_bits = 8): for exponent
// e = 0..6, the midpoints of torch.linspace(0.1, 1, 2^e + 1) (signed: with both signs) or of
// linspace(0.1, 1, 2^(e+1) + 1) (unsigned), times 10^(e-6); then 0 and 1; sorted.
inline Quant8Map dynamic_quant8_map(bool is_signed) {
  float values[256];
  int n = 0;
  for (int e = 0; e < 7; e++) {
    const int points = (is_signed ? (1 << e) : (1 << (e + 1))) + 1;
    // torch.linspace in float32: the first half counts up from the start, the rest down from the end
    const float start = 0.1f, end = 1.0f, step = (end - start) / float(points - 1);
    float b[129];
    for (int i = 0; i < points; i++)
      b[i] = i < points / 2 ? start + step * float(i) : end - step * float(points - 1 - i);
    const float scale = float(std::pow(10.0, double(e - 6)));  // a Python float, made float32
    for (int i = 0; i + 1 < points; i++) {
      const float mean = (b[i] + b[i + 1]) / 2.0f;
      values[n++] = scale * mean;
      if (is_signed) values[n++] = -scale * mean;
    }
  }
  values[n++] = 0.0f;
  values[n++] = 1.0f;
  std::sort(values, values + n);
  Quant8Map map{};
  for (int c = 0; c < 256; c++) {
    map.value[c] = values[c];
    if (values[c] == 0.0f) map.zero = uint8_t(c);
  }
  for (int c = 0; c < 255; c++) map.bound[c] = (map.value[c] + map.value[c + 1]) / 2.0f;
  return map;
}

// The maps, built once (host code; a kernel takes them by value).
inline const Quant8Map& quant8_map(bool is_signed) {
  static const Quant8Map signed_map = dynamic_quant8_map(true);
  static const Quant8Map unsigned_map = dynamic_quant8_map(false);
  return is_signed ? signed_map : unsigned_map;
}

// One Adam moment update with every rounding written out (fmaf, so no compiler contracts it
// differently on the CPU and the GPU): the 8-bit steps' new moments, and so their codes, are the
// same bits on both.  m = β1·m + (1 − β1)·g,  v = β2·v + ((1 − β2)·g)·g.
GRASS_HOST_DEVICE void adam_moments_rn(float& m, float& v, float g, float b1, float c1, float b2,
                                       float c2) {
  m = fmaf(b1, m, c1 * g);
  v = fmaf(b2, v, (c2 * g) * g);
}

// bitsandbytes' min_8bit_size: a tensor with fewer elements keeps its moments unquantized (an
// RMSNorm gain; its absmax would cost more than the codes save).
constexpr int64_t kQuant8MinElements = 4096;

// The two Adam moments of n elements in 8 bits: m with the signed map, v with the unsigned one,
// each block of `block` consecutive elements (the last may be shorter) with its absmax.
struct Quant8Moments {
  uint8_t* m = nullptr;         // [n]
  uint8_t* v = nullptr;         // [n]
  float* absmax_m = nullptr;    // [ceil(n / block)]
  float* absmax_v = nullptr;    // [ceil(n / block)]
  int block = 256;
};

// How a state of [rows, cols] (row-major) is cut into blocks of at most `block` elements:
//   flat     bitsandbytes' blocks: runs of `block` consecutive elements of the flat array (the
//            last may be shorter);
//   columns  blocks run down one column, `block` rows at a time: a projected state's per-feature
//            blocks (GRASS rows mode [r, in]: one input feature's r entries; cols mode [out, r]:
//            `block` consecutive outputs of one selected column), so an outlier feature's
//            absmax does not flatten its neighbours'.
struct Quant8Layout {
  int64_t rows = 0, cols = 0;
  int block = 256;
  bool columns = false;

  GRASS_HOST_DEVICE int64_t blocks_per_column() const { return (rows + block - 1) / block; }
  GRASS_HOST_DEVICE int64_t blocks() const {
    return columns ? cols * blocks_per_column() : (rows * cols + block - 1) / block;
  }
  // The flat index of element k of block b, or -1 past the block's (shorter) end.
  GRASS_HOST_DEVICE int64_t index(int64_t b, int k) const {
    if (!columns) {
      const int64_t i = b * block + k;
      return i < rows * cols ? i : -1;
    }
    const int64_t per = blocks_per_column();
    const int64_t row = (b % per) * block + k;
    return row < rows ? row * cols + b / per : -1;
  }
};

// A projected optimizer's state of w[out, in] at rank r: [r, in] (rows) or [out, r] (cols).
GRASS_HOST_DEVICE Quant8Layout projected_quant8_layout(int out, int in, int r, bool rows,
                                                              int block, bool by_columns) {
  return {.rows = rows ? r : out, .cols = rows ? in : r, .block = block, .columns = by_columns};
}

// The number of bounds below s: the nearest value's code, ties to the lower (0 for a NaN).
// Eight halving steps of fixed length and no branch on the data (a select), so neither a CPU's
// branch predictor nor a warp's divergence pays for the unpredictable comparisons.
GRASS_HOST_DEVICE int quant8_nearest(const float* bound, float s) {
  int c = 0;  // bound[0 .. c-1] < s
  for (int step = 128; step > 0; step /= 2) c += bound[c + step - 1] < s ? step : 0;
  return c;
}

// The code of x in a block of absmax `absmax` (the map decides signed or unsigned).
GRASS_HOST_DEVICE uint8_t quant8_encode(const Quant8Map& map, float x, float absmax) {
  if (!(absmax > 0.0f)) return map.zero;
  const float s = fminf(1.0f, fmaxf(-1.0f, x * (1.0f / absmax)));
  int c = quant8_nearest(map.bound, s);
  // x, not s: s underflows to 0 where |x| is below 2^-149 of the absmax
  if (x > 0.0f && map.value[c] <= 0.0f) c += 1;
  else if (x < 0.0f && map.value[c] >= 0.0f) c -= 1;  // never for the unsigned map: x ≥ 0
  return uint8_t(c);
}

GRASS_HOST_DEVICE float quant8_decode(const Quant8Map& map, uint8_t code, float absmax) {
  return map.value[code] * absmax;
}

// quant8_encode as the GPU's 8-bit steps run it (kernels/cuda/quant8.cuh), the same code for every
// x: the same comparisons in the same order, the first three halving steps against seven bounds
// held apart (warp-uniform registers there), the last five against `bound` (a lane's copy of the
// map in shared memory there); inv = 1.0f / absmax comes from the caller, which divides once per
// block; and the sign rule by code, since value[c] ≤ 0 exactly where c ≤ zero (the maps ascend
// through one 0). tests/gpu/test_gpu_quant8.cpp compares it with quant8_encode at every bound.
struct Quant8Pivots {
  float b127, b63, b191, b31, b95, b159, b223;  // bound[c]: step 1, step 2's two, step 3's four
};

GRASS_HOST_DEVICE Quant8Pivots quant8_pivots(const Quant8Map& map) {
  const float* b = map.bound;
  return {b[127], b[63], b[191], b[31], b[95], b[159], b[223]};
}

GRASS_HOST_DEVICE int quant8_nearest_pivoted(const Quant8Pivots& p, const float* bound, float s) {
  int c = p.b127 < s ? 128 : 0;
  c += (c != 0 ? p.b191 : p.b63) < s ? 64 : 0;
  const float third = c >= 128 ? (c >= 192 ? p.b223 : p.b159) : (c >= 64 ? p.b95 : p.b31);
  c += third < s ? 32 : 0;
  for (int step = 16; step > 0; step /= 2) c += bound[c + step - 1] < s ? step : 0;
  return c;
}

GRASS_HOST_DEVICE uint8_t quant8_encode_pivoted(const Quant8Pivots& p, const float* bound,
                                                int zero, float x, float absmax, float inv) {
  if (!(absmax > 0.0f)) return uint8_t(zero);
  const float s = fminf(1.0f, fmaxf(-1.0f, x * inv));
  int c = quant8_nearest_pivoted(p, bound, s);
  if (x > 0.0f && c <= zero) c += 1;
  else if (x < 0.0f && c >= zero) c -= 1;
  return uint8_t(c);
}

namespace ops {
// The CPU reference (kernels/cpu/quant8.cpp; the GPU's: kernels/cuda/quant8.cu):
// x[n] -> codes[n], absmax[ceil(n / block)], blocks of `block` consecutive values, the last one
// shorter when block does not divide n; absmax is the largest |x| of the block (a NaN is passed
// over, as fmaxf passes it).
void quantize_blockwise(const Quant8Map& map, const float* x, int64_t n, int block, uint8_t* codes,
                        float* absmax);
// x[n] = map[codes[i]] · absmax[i / block]
void dequantize_blockwise(const Quant8Map& map, const uint8_t* codes, const float* absmax,
                          int64_t n, int block, float* x);
// The same for the blocks of a layout: x[rows·cols] -> codes, absmax[layout.blocks()], and back.
void quantize_layout(const Quant8Map& map, const float* x, const Quant8Layout& layout,
                     uint8_t* codes, float* absmax);
void dequantize_layout(const Quant8Map& map, const uint8_t* codes, const float* absmax,
                       const Quant8Layout& layout, float* x);
}  // namespace ops

}  // namespace grass
