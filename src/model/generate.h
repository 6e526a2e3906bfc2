// Text generation, to look at what a model learned (`grass sample`, docs/sampling.md). Each new
// token runs the model's forward over the whole context again (no KV cache: simple, and fast
// enough for reading samples), and is chosen from the logits of the context's last position:
// their argmax (greedy), or a draw from softmax(logits / temperature) over the top k of them.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "src/model/llama.h"

namespace grass {

struct SamplingSettings {
  bool greedy = false;       // the argmax; temperature, top_k and seed are not used
  double temperature = 1.0;  // > 0
  int top_k = 0;             // draw from the k largest logits; 0: from the whole vocabulary
  uint64_t seed = 0;         // sample b's draw for its new token i: uniform_open01(
                             // derive_seed(seed, b), i) (core/rng.h), the same on any machine
};

// The token chosen from `logits` (finite): greedy, the index of the largest (the lowest index
// among equal ones); else where u in (0, 1) falls in the cumulative distribution of
// softmax(logits / temperature) over the top_k largest logits, taken largest first (equal ones
// lowest index first), so top_k 1 is greedy.
int pick_token(std::span<const float> logits, const SamplingSettings& s, double u);

struct GenerationLimits {
  int max_new_tokens = 64;
  int stop_token = -1;  // a sample ends with this token (EOS) when it draws it; -1: none
  int vocab = 0;        // draw from tokens 0 .. vocab-1 only (the tokenizer's); 0: the model's
};

// Continues `prompt` (not empty, ids below the model's vocab_size) in `samples` samples at once
// (at most the micro-batch the model was built for), each up to max_new_tokens new tokens. The
// model reads the last seq_len() tokens of a context: past that, the window slides. Returns each
// sample's new tokens, the stop token included. UserError when logits are not finite.
std::vector<std::vector<int32_t>> generate(LlamaModel& model, const std::vector<int32_t>& prompt,
                                           int samples, const SamplingSettings& s,
                                           const GenerationLimits& limits);

}  // namespace grass
