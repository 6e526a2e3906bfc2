// A learnable token stream for training tests, held in memory (no shard): 16 random 6-grams over
// 64 tokens, concatenated in random order. A model that learns them predicts 5 of every 6 tokens;
// guessing uniformly costs ln 64 = 4.16 nats. Shared by the CPU and the GPU tests.
#pragma once
#include <cstdint>
#include <vector>

#include "src/core/rng.h"

namespace grass::test {

struct NgramBatches {
  static constexpr int V = 64, K = 16, L = 6;
  std::vector<int32_t> stream;
  NgramBatches() {
    std::vector<int32_t> ngrams(K * L);
    for (int i = 0; i < K * L; i++) ngrams[i] = int32_t(uniform_open01(77, i) * V);
    for (int i = 0; i < 4000; i++) {
      const int k = int(uniform_open01(78, i) * K);
      stream.insert(stream.end(), ngrams.begin() + k * L, ngrams.begin() + (k + 1) * L);
    }
  }
  // batch `step`: B rows of T inputs and their next-token targets
  void batch(int64_t step, int B, int T, std::vector<int32_t>& in, std::vector<int32_t>& tg) const {
    in.resize(size_t(B) * T);
    tg.resize(in.size());
    for (int b = 0; b < B; b++) {
      const size_t start = size_t((step * B + b) * 37 % (stream.size() - T - 1));
      for (int t = 0; t < T; t++) {
        in[size_t(b) * T + t] = stream[start + t];
        tg[size_t(b) * T + t] = stream[start + t + 1];
      }
    }
  }
};

}  // namespace grass::test
