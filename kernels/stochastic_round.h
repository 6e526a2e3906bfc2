// Stochastic rounding of fp32 to bf16, shared by the CPU backend (which emulates bf16 storage)
// and the CUDA kernels, so both draw the same bits for the same store of the same element: one
// derivation of each store's stream (rounding_stream_seed), and the element's index in its buffer
// as the counter.
// A counter-based hash (no state): the same (seed, index) always rounds the same way, so two
// identical runs stay identical, and different elements and steps get independent draws.
#pragma once
#include <cstdint>

#include "src/core/rng.h"

#ifdef __CUDACC__
#define GRASS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define GRASS_HOST_DEVICE inline
#endif

namespace grass {

// The buffers an optimizer store rounds, each with a stream of its own.
enum RoundingStream : uint64_t { kRoundWeight = 0, kRoundFirstMoment = 1, kRoundSecondMoment = 2 };

// The seed of one buffer's stochastic-rounding stream in an optimizer's store at one step
// (SplitMix64's finaliser twice): buffers never share a draw, and the step is mixed in so that a
// caller passing the same seed every step still gets fresh draws each step.
GRASS_HOST_DEVICE uint64_t rounding_stream_seed(uint64_t seed, int64_t step,
                                                RoundingStream stream) {
  return mix64(mix64(seed + stream * kGoldenGamma) ^ uint64_t(step));
}

GRASS_HOST_DEVICE uint32_t rounding_hash(uint64_t seed, uint64_t index) {
  return uint32_t(mix64(seed ^ (index * kGoldenGamma)) >> 32);
}

// The bf16 bits of x (given as its fp32 bits) rounded up or down with probability proportional
// to the distance, so E[round(x)] = x: add 16 random bits below the kept mantissa, truncate.
// Infinities and NaN are returned truncated (NaN stays NaN: its high mantissa bit survives).
GRASS_HOST_DEVICE uint16_t stochastic_round_bits(uint32_t bits, uint64_t seed, uint64_t index) {
  if ((bits & 0x7f800000u) == 0x7f800000u) return uint16_t((bits >> 16) | ((bits & 0xffffu) ? 0x40u : 0u));
  return uint16_t((bits + (rounding_hash(seed, index) & 0xffffu)) >> 16);
}

}  // namespace grass
