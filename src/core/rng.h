// Counter-based random numbers: value i of stream `seed` is a pure function of (seed, i), so
// initialisation is identical whatever the thread count or the order tensors are created in.
// The CUDA kernels draw from the same streams (FLORA's projections: kernels/cuda/lowrank.cu).
#pragma once
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define GRASS_RNG_FN __host__ __device__ inline
#else
#define GRASS_RNG_FN inline
#endif

namespace grass {

// SplitMix64's finaliser: a bijection of 64 bits whose every output bit depends on every input
// bit. The one copy of it: the streams below, stochastic rounding and its streams
// (kernels/stochastic_round.h) and the synthetic shards use it.
GRASS_RNG_FN uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ull;  // SplitMix64's increment

GRASS_RNG_FN uint64_t splitmix64(uint64_t x) { return mix64(x + kGoldenGamma); }

// Uniform in (0, 1): 53 random bits, never exactly 0 (safe for log).
GRASS_RNG_FN double uniform_open01(uint64_t seed, uint64_t i) {
  const uint64_t bits = splitmix64(splitmix64(seed) ^ i) >> 11;
  return (double(bits) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal number i of stream `seed` (Box-Muller on two independent uniforms).
GRASS_RNG_FN double normal(uint64_t seed, uint64_t i) {
  const double u1 = uniform_open01(seed, 2 * i), u2 = uniform_open01(seed, 2 * i + 1);
  return ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2);
}

// A stream for a named purpose: seed derived from the run seed and a tag (e.g. tensor index).
GRASS_RNG_FN uint64_t derive_seed(uint64_t seed, uint64_t tag) { return splitmix64(seed ^ splitmix64(tag)); }

}  // namespace grass
