#include "src/model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "src/core/error.h"
#include "src/core/rng.h"

namespace grass {

int pick_token(std::span<const float> logits, const SamplingSettings& s, double u) {
  const int V = int(logits.size());
  GRASS_CHECK(V > 0, "pick_token: no logits");
  if (s.greedy) {
    int best = 0;
    for (int v = 1; v < V; v++)
      if (logits[size_t(v)] > logits[size_t(best)]) best = v;
    return best;
  }
  const int k = s.top_k > 0 ? std::min(s.top_k, V) : V;
  std::vector<int> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  // exp((l - max) / temperature): the largest weighs 1, so nothing overflows
  const double top = logits[size_t(order[0])];
  std::vector<double> weight(static_cast<size_t>(k));
  double total = 0;
  for (int i = 0; i < k; i++) {
    weight[size_t(i)] = std::exp((double(logits[size_t(order[size_t(i)])]) - top) / s.temperature);
    total += weight[size_t(i)];
  }
  const double target = u * total;
  double cumulative = 0;
  for (int i = 0; i < k; i++) {
    cumulative += weight[size_t(i)];
    if (target < cumulative) return order[size_t(i)];
  }
  return order[size_t(k - 1)];  // u within rounding of 1
}

std::vector<std::vector<int32_t>> generate(LlamaModel& model, const std::vector<int32_t>& prompt,
                                           int samples, const SamplingSettings& s,
                                           const GenerationLimits& limits) {
  const int T = model.seq_len();
  const int model_vocab = model.config().vocab_size;
  const int V = limits.vocab > 0 ? std::min(limits.vocab, model_vocab) : model_vocab;
  GRASS_CHECK(!prompt.empty() && samples >= 1, "generate: an empty prompt or no samples");
  for (int32_t id : prompt)
    GRASS_CHECK(id >= 0 && id < model_vocab, "generate: a prompt token outside the vocabulary");

  std::vector<std::vector<int32_t>> contexts(static_cast<size_t>(samples), prompt), made(static_cast<size_t>(samples));
  std::vector<bool> ended(static_cast<size_t>(samples), false);
  std::vector<int32_t> inputs(size_t(samples) * T), targets(inputs.size(), -1);
  std::vector<int64_t> last_rows(static_cast<size_t>(samples));
  const auto start = std::chrono::steady_clock::now();
  auto last_report = start;
  for (int i = 0; i < limits.max_new_tokens; i++) {
    // Every context has the same length (an ended sample repeats its stop token), so every
    // sample's window ends at the same position.
    const size_t length = prompt.size() + size_t(i);
    const size_t L = std::min(length, size_t(T));
    for (int b = 0; b < samples; b++) {
      const std::vector<int32_t>& c = contexts[size_t(b)];
      int32_t* row = inputs.data() + size_t(b) * T;
      std::copy(c.end() - std::ptrdiff_t(L), c.end(), row);
      std::fill(row + L, row + T, 0);  // after the window: causal attention never reads it
      last_rows[size_t(b)] = int64_t(b) * T + int64_t(L) - 1;
    }
    model.forward(inputs.data(), targets.data(), samples);
    const std::vector<float> logits = model.head_logits(last_rows);
    for (int b = 0; b < samples; b++) {
      std::vector<int32_t>& c = contexts[size_t(b)];
      if (ended[size_t(b)]) {
        c.push_back(c.back());
        continue;
      }
      const std::span<const float> row(logits.data() + size_t(b) * model_vocab, size_t(V));
      if (!std::all_of(row.begin(), row.end(), [](float x) { return std::isfinite(x); }))
        throw UserError("the model's logits for new token " + std::to_string(i + 1) + " of sample " +
                        std::to_string(b + 1) + " are not finite (NaN or inf): the weights do not "
                        "compute (a diverged run?)");
      const double u = uniform_open01(derive_seed(s.seed, uint64_t(b)), uint64_t(i));
      const int32_t token = pick_token(row, s, u);
      c.push_back(token);
      made[size_t(b)].push_back(token);
      ended[size_t(b)] = token == limits.stop_token;
    }
    if (std::all_of(ended.begin(), ended.end(), [](bool e) { return e; })) break;

    const auto now = std::chrono::steady_clock::now();
    if (now - last_report > std::chrono::seconds(5)) {
      const double seconds = std::chrono::duration<double>(now - start).count();
      std::fprintf(stderr, "sample: %d/%d tokens, %.1f tokens/s\n", i + 1, limits.max_new_tokens,
                   double(i + 1) * samples / seconds);
      last_report = now;
    }
  }
  return made;
}

}  // namespace grass
