// Counter-based random numbers: value i of stream `seed` is a pure function of (seed, i), so
// initialisation is identical whatever the thread count or the order tensors are created in.
#pragma once
#include <cmath>
#include <cstdint>

namespace grass {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1): 53 random bits, never exactly 0 (safe for log).
inline double uniform_open01(uint64_t seed, uint64_t i) {
  const uint64_t bits = splitmix64(splitmix64(seed) ^ i) >> 11;
  return (double(bits) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal number i of stream `seed` (Box-Muller on two independent uniforms).
inline double normal(uint64_t seed, uint64_t i) {
  const double u1 = uniform_open01(seed, 2 * i), u2 = uniform_open01(seed, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// A stream for a named purpose: seed derived from the run seed and a tag (e.g. tensor index).
inline uint64_t derive_seed(uint64_t seed, uint64_t tag) { return splitmix64(seed ^ splitmix64(tag)); }

}  // namespace grass
