// bfloat16 <-> float conversion on the host. bf16 is the top 16 bits of an IEEE float32, so
// widening is exact; narrowing rounds to nearest, ties to even, and keeps NaN a NaN.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace grass {

inline float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

inline uint16_t float_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  // NaN: plain rounding could carry the payload into the exponent and yield infinity.
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  // Adding 0x7fff plus the lowest kept bit rounds to nearest with ties to even; overflow past
  // the largest finite value correctly becomes infinity.
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// The spacing of bf16 values around x (normal range, x != 0): 2^(e - 8) for |x| in [2^(e-1), 2^e),
// bf16 keeping 8 significant bits. A store that rounds to nearest lands within half of it.
inline double bf16_spacing(double x) {
  int e = 0;
  std::frexp(x, &e);
  return std::ldexp(1.0, e - 8);
}

}  // namespace grass
