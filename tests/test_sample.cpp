// Sampling (model/generate.h): greedy picks, at every position, the token of least cross-entropy
// on the model's own forward/loss path (what grass eval scores), also once the window slides;
// top-k 1 is greedy; draws follow softmax(logits / temperature) over the top k; a fixed seed gives
// the same tokens and another seed others; a sample ends at its stop token.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "src/core/arena.h"
#include "src/model/generate.h"
#include "src/model/llama.h"
#include "tests/test_util.h"

using namespace grass::test;

namespace {

// configs/models/llama_quickstart.json's shapes (vocab 4096, the bundled tokenizer's), with large
// weights so the logits are far from uniform and a wrong position or row shows.
grass::ModelConfig quickstart_shapes() {
  grass::ModelConfig m;
  m.hidden_size = 128;
  m.intermediate_size = 344;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.num_hidden_layers = 4;
  m.vocab_size = 4096;
  m.max_position_embeddings = 256;
  m.initializer_range = 0.2;
  return m;
}

std::vector<int32_t> random_prompt(size_t n, int vocab, uint64_t seed) {
  const std::vector<uint32_t> tokens = random_tokens(n, uint32_t(vocab), seed);
  return {tokens.begin(), tokens.end()};
}

// The forward over `window` (at most T tokens) with `targets`; its mean loss.
double forward_window(grass::LlamaModel& model, const std::vector<int32_t>& window,
                      const std::vector<int32_t>& targets) {
  const int T = model.seq_len();
  std::vector<int32_t> inputs(size_t(T), 0), padded(size_t(T), -1);
  std::copy(window.begin(), window.end(), inputs.begin());
  std::copy(targets.begin(), targets.end(), padded.begin());
  return model.forward(inputs.data(), padded.data(), 1);
}

// Cross-entropy of each token at row t of the last forward's logits (the CPU's logits buffer).
std::vector<double> cross_entropies(const grass::LlamaModel& model, int t) {
  const int V = model.config().vocab_size;
  const float* row = logits(model) + size_t(t) * V;
  const double top = *std::max_element(row, row + V);
  double z = 0;
  for (int v = 0; v < V; v++) z += std::exp(double(row[v]) - top);
  std::vector<double> ce(static_cast<size_t>(V));
  for (int v = 0; v < V; v++) ce[size_t(v)] = top + std::log(z) - double(row[v]);
  return ce;
}

}  // namespace

TEST_CASE("pick_token: greedy is the argmax, top-k 1 is greedy, draws follow the softmax",
          "[sample]") {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(300);
  for (float& x : logits) x = normal(rng);
  const int argmax = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
  grass::SamplingSettings greedy;
  greedy.greedy = true;
  CHECK(grass::pick_token(logits, greedy, 0.5) == argmax);

  logits[7] = logits[size_t(argmax)];  // a tie: the lower index wins, greedy or top-k 1
  const int tied = std::min(7, argmax);
  CHECK(grass::pick_token(logits, greedy, 0.5) == tied);
  grass::SamplingSettings top1;
  top1.top_k = 1;
  top1.temperature = 0.3;
  for (double u : {1e-9, 0.25, 0.5, 0.999999}) CHECK(grass::pick_token(logits, top1, u) == tied);

  // u on a fine grid through the inverse CDF: each of the top 5 tokens is picked in proportion to
  // exp(logit / temperature) among the five, within the grid's step; no other token is.
  grass::SamplingSettings top5;
  top5.top_k = 5;
  top5.temperature = 2.5;
  std::vector<int> order(logits.size());
  for (size_t i = 0; i < order.size(); i++) order[i] = int(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
  double z = 0;
  for (int i = 0; i < 5; i++) z += std::exp(double(logits[size_t(order[size_t(i)])]) / top5.temperature);
  const int grid = 100000;
  std::vector<int> picked(logits.size(), 0);
  for (int i = 0; i < grid; i++) picked[size_t(grass::pick_token(logits, top5, (i + 0.5) / grid))]++;
  for (int i = 0; i < 5; i++) {
    const int v = order[size_t(i)];
    const double p = std::exp(double(logits[size_t(v)]) / top5.temperature) / z;
    CHECK(std::abs(double(picked[size_t(v)]) / grid - p) <= 2.0 / grid);
  }
  int outside = 0;
  for (size_t i = 5; i < order.size(); i++) outside += picked[size_t(order[i])];
  CHECK(outside == 0);
}

TEST_CASE("greedy sampling picks the least cross-entropy of the forward's loss path", "[sample]") {
  grass::Arena arena;
  const int T = 24;
  grass::LlamaModel model(quickstart_shapes(), arena, 1, T);
  model.init_weights(5);
  const std::vector<int32_t> prompt = random_prompt(6, 4096, 8);
  grass::SamplingSettings greedy;
  greedy.greedy = true;
  grass::GenerationLimits limits;
  limits.max_new_tokens = T - int(prompt.size()) + 1;  // the window is full for the last token
  const std::vector<int32_t> made = grass::generate(model, prompt, 1, greedy, limits)[0];
  REQUIRE(made.size() == size_t(limits.max_new_tokens));

  // One forward over the prompt and the continuation, as grass eval runs it, with the
  // continuation as its targets: at each position the chosen token has the least cross-entropy,
  // and the loss the forward reports is the mean of those least cross-entropies.
  std::vector<int32_t> sequence = prompt;
  sequence.insert(sequence.end(), made.begin(), made.end());
  const std::vector<int32_t> window(sequence.begin(), sequence.begin() + T);
  std::vector<int32_t> targets(size_t(T), -1);
  const size_t first = prompt.size() - 1;  // the position that predicts the first new token
  for (size_t t = first; t < size_t(T); t++) targets[t] = sequence[t + 1];
  const double loss = forward_window(model, window, targets);
  double least_sum = 0;
  for (size_t t = first; t < size_t(T); t++) {
    const std::vector<double> ce = cross_entropies(model, int(t));
    const int least = int(std::min_element(ce.begin(), ce.end()) - ce.begin());
    INFO("position " << t);
    CHECK(sequence[t + 1] == least);
    least_sum += ce[size_t(least)];
  }
  CHECK(loss == Approx(least_sum / double(T - first)).epsilon(1e-6));
  // The continuation is not one token repeated: the positions matter.
  CHECK(std::count(made.begin(), made.end(), made[0]) < int(made.size()));
}

TEST_CASE("sampling slides its window past the model's context", "[sample]") {
  grass::Arena arena;
  const int T = 8;
  grass::LlamaModel model(quickstart_shapes(), arena, 1, T);
  model.init_weights(6);
  const std::vector<int32_t> prompt = random_prompt(5, 4096, 9);
  grass::SamplingSettings greedy;
  greedy.greedy = true;
  grass::GenerationLimits limits;
  limits.max_new_tokens = 12;
  const std::vector<int32_t> made = grass::generate(model, prompt, 1, greedy, limits)[0];
  REQUIRE(made.size() == 12);
  // Each new token is the argmax at the last position of the last T tokens before it.
  std::vector<int32_t> sequence = prompt;
  for (size_t i = 0; i < made.size(); i++) {
    const size_t L = std::min(sequence.size(), size_t(T));
    const std::vector<int32_t> window(sequence.end() - std::ptrdiff_t(L), sequence.end());
    forward_window(model, window, {});
    const std::vector<double> ce = cross_entropies(model, int(L) - 1);
    INFO("new token " << i);
    CHECK(made[i] == int(std::min_element(ce.begin(), ce.end()) - ce.begin()));
    sequence.push_back(made[i]);
  }
}

TEST_CASE("a fixed seed gives the same samples and another seed others, and top-k 1 is greedy",
          "[sample]") {
  grass::Arena arena;
  const int samples = 3, T = 20;
  grass::LlamaModel model(quickstart_shapes(), arena, samples, T);
  model.init_weights(7);
  const std::vector<int32_t> prompt = random_prompt(4, 4096, 10);
  grass::GenerationLimits limits;
  limits.max_new_tokens = 16;
  grass::SamplingSettings draw;
  draw.temperature = 1.0;
  draw.top_k = 0;
  draw.seed = 21;
  const auto first = grass::generate(model, prompt, samples, draw, limits);
  const auto again = grass::generate(model, prompt, samples, draw, limits);
  CHECK(first == again);
  CHECK(first[0] != first[1]);  // each sample draws from its own stream
  CHECK(first[1] != first[2]);
  draw.seed = 22;
  const auto other = grass::generate(model, prompt, samples, draw, limits);
  for (int b = 0; b < samples; b++) CHECK(other[size_t(b)] != first[size_t(b)]);

  grass::SamplingSettings greedy, top1;
  greedy.greedy = true;
  top1.top_k = 1;
  top1.temperature = 0.7;
  top1.seed = 3;
  const auto by_argmax = grass::generate(model, prompt, 1, greedy, limits);
  CHECK(grass::generate(model, prompt, 1, top1, limits) == by_argmax);

  // A sample ends with its stop token: here the first token greedy decoding draws.
  limits.stop_token = by_argmax[0][0];
  const auto stopped = grass::generate(model, prompt, 1, greedy, limits);
  CHECK(stopped[0] == std::vector<int32_t>{limits.stop_token});
}

TEST_CASE("head_logits are the rows of the head's logits", "[sample]") {
  grass::Arena arena;
  const int B = 2, T = 6;
  grass::LlamaModel model(quickstart_shapes(), arena, B, T);
  model.init_weights(8);
  const std::vector<int32_t> inputs = random_prompt(B * T, 4096, 12);
  std::vector<int32_t> targets(inputs.size(), -1);
  model.forward(inputs.data(), targets.data(), B);
  const int V = model.config().vocab_size;
  const std::vector<float> forward_logits(logits(model), logits(model) + size_t(B) * T * V);
  const std::vector<int64_t> rows = {T - 1, 2 * T - 1, 3};
  const std::vector<float> head = model.head_logits(rows);
  REQUIRE(head.size() == rows.size() * size_t(V));
  // One row's GEMM against the head's N-row GEMM: the same sums, perhaps in another order.
  double worst = 0, scale = 0;
  for (size_t i = 0; i < rows.size(); i++)
    for (int v = 0; v < V; v++) {
      const double want = forward_logits[size_t(rows[i]) * V + size_t(v)];
      worst = std::max(worst, std::abs(double(head[i * V + size_t(v)]) - want));
      scale = std::max(scale, std::abs(want));
    }
  REQUIRE(scale > 1.0);  // logits far from zero: a wrong row or column shows
  CHECK(worst <= 1e-6 * scale);
}
