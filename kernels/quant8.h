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
// and one rule of the engine's for optimizer states: a nonzero s whose nearest value is 0 or of
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

// The number of bounds below s: the nearest value's code, ties to the lower.
GRASS_HOST_DEVICE int quant8_nearest(const float* bound, float s) {
  int lo = 0, hi = 255;  // the answer lies in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (bound[mid] < s) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// The code of x in a block of absmax `absmax` (the map decides signed or unsigned).
GRASS_HOST_DEVICE uint8_t quant8_encode(const Quant8Map& map, float x, float absmax) {
  if (!(absmax > 0.0f)) return map.zero;
  const float s = fminf(1.0f, fmaxf(-1.0f, x * (1.0f / absmax)));
  int c = quant8_nearest(map.bound, s);
  if (s > 0.0f && map.value[c] <= 0.0f) c += 1;
  else if (s < 0.0f && map.value[c] >= 0.0f) c -= 1;  // never for the unsigned map: s ≥ 0
  return uint8_t(c);
}

GRASS_HOST_DEVICE float quant8_decode(const Quant8Map& map, uint8_t code, float absmax) {
  return map.value[code] * absmax;
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
}  // namespace ops

}  // namespace grass
