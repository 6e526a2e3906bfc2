// End to end: a short training run on a learnable synthetic shard must cut the loss well below
// where it starts, and write its metrics.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "src/config/config.h"
#include "src/core/rng.h"
#include "src/data/shard.h"
#include "src/train/trainer.h"
#include "tests/test_util.h"

using namespace grass;

TEST_CASE("a short run on repeated n-grams learns them", "[train]") {
  const test::TempDir dir("grass_test_training");
  const std::string shard = dir.file("train.bin");
  {
    // 16 random 6-grams over 64 tokens, concatenated in random order: a model that learns them
    // predicts 5 of every 6 tokens; uniform guessing costs ln 64 = 4.16 nats.
    const int V = 64, K = 16, L = 6;
    std::vector<uint32_t> ngrams(K * L), stream;
    for (int i = 0; i < K * L; i++) ngrams[i] = uint32_t(uniform_open01(77, i) * V);
    for (int i = 0; i < 20000; i++) {
      const int k = int(uniform_open01(78, i) * K);
      stream.insert(stream.end(), ngrams.begin() + k * L, ngrams.begin() + (k + 1) * L);
    }
    ShardWriter writer(shard, {.vocab_size = V});
    writer.append(stream);
    writer.finish();
  }
  const nlohmann::json run = {
      {"model", {{"hidden_size", 32}, {"intermediate_size", 88}, {"num_attention_heads", 4},
                 {"num_key_value_heads", 2}, {"num_hidden_layers", 2}, {"vocab_size", 64},
                 {"max_position_embeddings", 64}}},
      {"data", {{"train", shard}}},
      {"optimizer", {{"name", "adamw"}, {"lr", 1e-2}, {"betas", {0.9, 0.95}}}},
      {"schedule", {{"name", "cosine"}, {"warmup_steps", 10}, {"min_lr_ratio", 0.1}}},
      {"micro_batch_size", 4}, {"total_batch_size", 8}, {"seq_len", 32}, {"steps", 80},
      {"out_dir", (dir.path / "out").string()}, {"log_every", 20}};
  const RunConfig cfg = parse_run_config(run, "");
  const TrainResult result = train(cfg);

  REQUIRE(result.losses.size() == 80);
  CHECK(result.losses.front() == Approx(std::log(64.0)).margin(0.3));
  const double final_loss = (result.losses[77] + result.losses[78] + result.losses[79]) / 3;
  INFO("first loss " << result.losses.front() << ", last loss " << final_loss);
  CHECK(final_loss < 0.5 * result.losses.front());

  std::ifstream metrics(dir.path / "out" / "metrics.jsonl");
  int rows = 0;
  for (std::string line; std::getline(metrics, line); rows++) {
    const auto j = nlohmann::json::parse(line);
    CHECK(j["step"] == rows + 1);
    CHECK(std::isfinite(j["loss"].get<double>()));
    CHECK(j.contains("lr"));
    CHECK(j.contains("grad_norm"));
    CHECK(j.contains("tokens_per_s"));
  }
  CHECK(rows == 80);
  CHECK(std::filesystem::exists(dir.path / "out" / "config.json"));
}
