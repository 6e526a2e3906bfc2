// Evaluator: the perplexity over the first N targets of the validation stream equals a hand
// computation from the model's own logits; exactly N targets count (a partial last window
// included); the stream is read in order, whatever the batch; training evaluates every
// eval_every steps and at the end, logging rows marked "eval".
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/core/arena.h"
#include "src/core/rng.h"
#include "src/model/llama.h"
#include "src/train/evaluator.h"
#include "src/train/trainer.h"
#include "tests/test_util.h"

using Catch::Matchers::Contains;
using namespace grass::test;

namespace {

grass::ModelConfig tiny_model() {
  grass::ModelConfig m;
  m.hidden_size = 16;
  m.intermediate_size = 24;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 1;
  m.num_hidden_layers = 1;
  m.vocab_size = 50;
  m.max_position_embeddings = 64;
  m.initializer_range = 0.5;  // large weights: logits far from uniform, so mistakes show
  return m;
}

// Mean cross-entropy of targets 1..n of `stream`, from the logits of whole windows of T tokens
// fed one at a time, with the log-softmax done here in double.
double hand_mean_loss(grass::LlamaModel& model, const std::vector<uint32_t>& stream, int n) {
  const int T = model.seq_len(), V = model.config().vocab_size;
  double sum = 0;
  for (int offset = 0; offset < n; offset += T) {
    std::vector<int32_t> inputs(T), targets(T);
    for (int t = 0; t < T; ++t) {
      inputs[t] = static_cast<int32_t>(stream[offset + t]);
      targets[t] = static_cast<int32_t>(stream[offset + t + 1]);
    }
    model.forward(inputs.data(), targets.data(), 1);
    for (int t = 0; t < T && offset + t < n; ++t) {
      const float* logits = grass::test::logits(model) + static_cast<size_t>(t) * V;
      double max_logit = logits[0];
      for (int v = 1; v < V; ++v) max_logit = std::max(max_logit, double(logits[v]));
      double z = 0;
      for (int v = 0; v < V; ++v) z += std::exp(double(logits[v]) - max_logit);
      sum += max_logit + std::log(z) - double(logits[targets[t]]);
    }
  }
  return sum / n;
}

}  // namespace

TEST_CASE("eval perplexity equals a hand computation over exactly N targets", "[eval]") {
  TempDir dir("grass_test_evaluator");
  const std::vector<uint32_t> stream = random_tokens(200, 50, 21);
  // Two shards: the evaluator reads them as one stream.
  const std::vector<uint32_t> head(stream.begin(), stream.begin() + 70);
  const std::vector<uint32_t> tail(stream.begin() + 70, stream.end());
  const std::vector<std::string> files = {write_shard(dir.file("a.bin"), head, {.vocab_size = 50}),
                                          write_shard(dir.file("b.bin"), tail, {.vocab_size = 50})};
  grass::Arena arena;
  const int T = 8, max_batch = 3;
  grass::LlamaModel model(tiny_model(), arena, max_batch, T);
  model.init_weights(7);

  // 37 = 4 whole windows of 8 and one of 5; 40 = exactly 5 windows; 8 = one; 1 = a single target.
  for (const int n : {37, 40, 8, 1, 150}) {
    const double expected = hand_mean_loss(model, stream, n);
    const grass::Evaluator evaluator(files, n);
    for (const int batch : {1, 2, 3}) {
      CAPTURE(n, batch);
      const grass::EvalResult result = evaluator.evaluate(model, batch);
      CHECK(result.tokens == n);
      CHECK(result.loss == Approx(expected).epsilon(1e-5));
      CHECK(result.perplexity == Approx(std::exp(expected)).epsilon(1e-5));
    }
  }
  // One target more changes the answer: the count is exact, not rounded to windows.
  const grass::Evaluator evaluator_37(files, 37), evaluator_38(files, 38);
  CHECK(evaluator_37.evaluate(model, 3).loss != evaluator_38.evaluate(model, 3).loss);
  // Reading twice gives the same number (nothing shuffled, nothing carried over).
  CHECK(evaluator_37.evaluate(model, 2).loss == evaluator_37.evaluate(model, 2).loss);
}

TEST_CASE("eval needs N + 1 tokens of validation data", "[eval]") {
  TempDir dir("grass_test_evaluator");
  const std::string path = write_shard(dir.file("val.bin"), random_tokens(100, 50, 22),
                                       {.vocab_size = 50});
  const grass::Evaluator all(std::vector<std::string>{path}, 99);  // every target of the stream
  CHECK(all.tokens() == 99);
  CHECK_THAT(user_error_of([&] { grass::Evaluator too_many(std::vector<std::string>{path}, 100); }),
             Contains(path + ": 100 tokens hold 99 targets, fewer than the 100 to evaluate") &&
                 Contains("lower eval_tokens"));
}

TEST_CASE("training evaluates every eval_every steps and after the last", "[eval][train]") {
  TempDir dir("grass_test_evaluator");
  // 8 random 4-grams over 32 tokens in random order: learnable, so validation loss must fall.
  const int V = 32, K = 8, L = 4;
  std::vector<uint32_t> ngrams(K * L), stream;
  for (int i = 0; i < K * L; i++) ngrams[i] = uint32_t(grass::uniform_open01(31, i) * V);
  for (int i = 0; i < 6000; i++) {
    const int k = int(grass::uniform_open01(32, i) * K);
    stream.insert(stream.end(), ngrams.begin() + k * L, ngrams.begin() + (k + 1) * L);
  }
  const std::vector<uint32_t> train_part(stream.begin(), stream.begin() + 20000);
  const std::vector<uint32_t> val_part(stream.begin() + 20000, stream.end());
  const std::string train = write_shard(dir.file("train.bin"), train_part, {.vocab_size = 32});
  const std::string val = write_shard(dir.file("val.bin"), val_part, {.vocab_size = 32});
  const nlohmann::json run = {
      {"model", {{"hidden_size", 32}, {"intermediate_size", 64}, {"num_attention_heads", 2},
                 {"num_hidden_layers", 1}, {"vocab_size", 32}, {"max_position_embeddings", 32}}},
      {"data", {{"train", train}, {"val", val}}},
      {"optimizer", {{"name", "adamw"}, {"lr", 1e-2}}},
      {"micro_batch_size", 4}, {"seq_len", 16}, {"steps", 50}, {"eval_every", 20},
      {"eval_tokens", 1000}, {"out_dir", dir.file("out")}, {"log_every", 50}};
  const grass::RunConfig cfg = grass::parse_run_config(run, "");

  grass::Arena arena;
  grass::LlamaModel untrained(cfg.model, arena, cfg.micro_batch_size, cfg.seq_len);
  untrained.init_weights(cfg.seed);
  const grass::EvalResult before = grass::Evaluator({val}, 1000).evaluate(untrained, 4);

  const grass::TrainResult result = grass::train(cfg);
  REQUIRE(result.final_eval.has_value());
  CHECK(result.final_eval->tokens == 1000);
  CHECK(result.final_eval->loss < 0.8 * before.loss);

  std::ifstream metrics(dir.file("out") + "/metrics.jsonl");
  std::vector<int64_t> eval_steps;
  int64_t last_step = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.value("eval", false)) {
      last_step = j["step"];
      continue;
    }
    CHECK(j["step"] == last_step);  // written right after its step's row
    CHECK(j["val_tokens"] == 1000);
    CHECK(j["val_perplexity"].get<double>() ==
          Approx(std::exp(j["val_loss"].get<double>())).epsilon(1e-12));
    eval_steps.push_back(j["step"]);
    if (j["step"] == 50) CHECK(j["val_loss"].get<double>() == result.final_eval->loss);
  }
  CHECK(eval_steps == std::vector<int64_t>{20, 40, 50});
}
