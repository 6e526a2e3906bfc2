// cuda_emu: __nv_bfloat16 with CUDA's conversions (round to nearest even; NaN to the canonical
// 0x7FFF). See cuda_runtime.h beside this file for what the emulator is.
#pragma once
#include <cstdint>
#include <cstring>

#include "cuda_runtime.h"

struct __nv_bfloat16_raw {
  unsigned short x;
};
struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f);
  __nv_bfloat16(__nv_bfloat16_raw r) : __x(r.x) {}
  operator __nv_bfloat16_raw() const { return {__x}; }
  operator float() const {
    const uint32_t bits = uint32_t(__x) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
};
struct alignas(4) __nv_bfloat162 {  // CUDA aligns the pair to 4 bytes (__CUDA_ALIGN__(4))
  __nv_bfloat16 x, y;
};

inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
  __nv_bfloat16 b;
  b.__x = u;
  return b;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return __ushort_as_bfloat16(0x7fff);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return __ushort_as_bfloat16(uint16_t(bits >> 16));
}
inline __nv_bfloat16::__nv_bfloat16(float f) : __x(__float2bfloat16_rn(f).__x) {}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return float(b); }
inline float2 __bfloat1622float2(__nv_bfloat162 b) { return {float(b.x), float(b.y)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
