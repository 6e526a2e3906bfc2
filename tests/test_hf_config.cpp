// config.json as Hugging Face transformers writes it, release by release. The fixtures in
// tests/fixtures/hf_configs are the files transformers 4.40, 4.57 and 5.x saved with the same tiny
// GQA model (tools/reference/make_hf_config_fixtures.py): 4.57 names the weights' dtype "dtype"
// where 4.40 wrote "torch_dtype", and 5.x keeps θ in "rope_parameters" and writes
// "pad_token_id": null. Each must give the same model, as a model config and as the config.json
// of a model directory that `grass eval --weights` and init_from load.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/data/loader.h"
#include "src/io/safetensors.h"
#include "src/model/llama.h"
#include "src/train/hf_interop.h"
#include "src/train/trainer.h"
#include "tests/test_util.h"

using namespace grass;
using Catch::Matchers::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = std::string(GRASS_SOURCE_DIR) + "/tests/fixtures/hf_configs";
const std::vector<std::string> kFixtureFiles = {"transformers_4.40.json", "transformers_4.57.json",
                                                "transformers_5.x.json"};

// The model make_hf_config_fixtures.py gave every release (TINY_GQA there), every field.
ModelConfig tiny_gqa() {
  ModelConfig m;
  m.hidden_size = 48;
  m.intermediate_size = 86;
  m.num_attention_heads = 6;
  m.num_key_value_heads = 2;
  m.num_hidden_layers = 2;
  m.vocab_size = 96;
  m.max_position_embeddings = 64;
  m.rms_norm_eps = 1e-5;
  m.rope_theta = 500000.0;
  m.tie_word_embeddings = false;
  m.initializer_range = 0.02;
  return m;
}

json fixture(const std::string& name) { return test::read_json(kFixtures + "/" + name); }

std::string model_error(const json& model) {
  return test::user_error_of([&] { parse_model_config(model, "config.json"); });
}

// A model directory as transformers saves one: the fixture as config.json and fresh random
// weights (norm gains near 1, the rest around 0) in three shards with their index. Returns the
// weights written, by tensor name.
std::map<std::string, std::vector<float>> write_model_dir(const std::string& dir,
                                                          const std::string& config_path,
                                                          uint64_t seed) {
  const ModelConfig mc = load_model_config(config_path);
  Arena planning(/*planning=*/true);
  const LlamaModel layout(mc, planning, 1, 1);  // names and shapes only
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::map<std::string, std::vector<float>> values;
  std::vector<SafetensorsWriter> shards(3);
  json weight_map = json::object();
  size_t next_shard = 0;
  for (const ParamTensor& t : layout.tensors()) {
    std::vector<float>& v = values[t.name];
    v.resize(size_t(t.hf_numel));
    for (float& x : v) x = (t.is_norm ? 1.0f : 0.0f) + normal(rng);
    const size_t shard = next_shard++ % shards.size();
    shards[shard].add(t.name, "F32", t.hf_shape, v.data(), v.size() * sizeof(float));
    weight_map[t.name] = "model-0000" + std::to_string(shard + 1) + "-of-00003.safetensors";
  }
  fs::create_directories(dir);
  for (size_t i = 0; i < shards.size(); i++)
    shards[i].write(dir + "/model-0000" + std::to_string(i + 1) + "-of-00003.safetensors");
  std::ofstream(dir + "/model.safetensors.index.json")
      << json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2);
  fs::copy_file(config_path, dir + "/config.json");
  return values;
}

}  // namespace

TEST_CASE("config.json of transformers 4.40, 4.57 and 5.x gives the same model", "[hf_config]") {
  for (const std::string& name : kFixtureFiles) {
    INFO(name);
    CHECK(load_model_config(kFixtures + "/" + name) == tiny_gqa());
  }
  // Each fixture holds the layout its release writes, so the reader is tested on all of them.
  const json v440 = fixture("transformers_4.40.json"), v457 = fixture("transformers_4.57.json"),
             v5 = fixture("transformers_5.x.json");
  CHECK(v440["transformers_version"].get<std::string>().starts_with("4.40."));
  CHECK(v440.contains("torch_dtype"));
  CHECK(v457["transformers_version"].get<std::string>().starts_with("4.57."));
  CHECK((v457.contains("dtype") && v457.contains("head_dim") && v457.contains("rope_theta")));
  CHECK(v5["transformers_version"].get<std::string>().starts_with("5."));
  CHECK((v5.contains("dtype") && v5.contains("rope_parameters") && !v5.contains("rope_theta")));
  CHECK((v5.contains("pad_token_id") && v5["pad_token_id"].is_null()));
}

TEST_CASE("rope_parameters: plain RoPE only, and one rope_theta", "[hf_config][config]") {
  const json v5 = fixture("transformers_5.x.json");

  json model = v5;
  model["rope_parameters"] = {{"rope_type", "llama3"},
                              {"rope_theta", 500000.0},
                              {"factor", 8.0},
                              {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 8192}};
  CHECK(model_error(model) ==
        "config.json: rope_parameters.rope_type: \"llama3\" is not supported; grass implements "
        "\"default\" (plain RoPE without scaling)");
  model["rope_parameters"] = {{"type", "linear"}, {"factor", 2.0}};  // the legacy spelling
  CHECK(model_error(model) ==
        "config.json: rope_parameters.type: \"linear\" is not supported; grass implements "
        "\"default\" (plain RoPE without scaling)");
  model["rope_parameters"] = {{"rope_type", "default"}, {"factor", 2.0}};
  CHECK_THAT(model_error(model), Contains("config.json: rope_parameters.factor: unknown key"));
  model["rope_parameters"] = "default";
  CHECK(model_error(model) == "config.json: rope_parameters: expected an object, got string "
                              "\"default\"");

  model = v5;
  model["rope_theta"] = 10000.0;
  CHECK(model_error(model) ==
        "config.json: rope_parameters.rope_theta: 500000 conflicts with rope_theta 10000 (two "
        "places for one setting: keep one)");
  model["rope_theta"] = 500000;
  CHECK(parse_model_config(model, "") == tiny_gqa());

  // θ from whichever names it; transformers' 10000 when neither does.
  model = v5;
  model["rope_parameters"] = {{"rope_type", "default"}};
  CHECK(parse_model_config(model, "").rope_theta == 10000.0);
  model["rope_theta"] = 250000.0;
  CHECK(parse_model_config(model, "").rope_theta == 250000.0);
  model["rope_parameters"] = nullptr;
  CHECK(parse_model_config(model, "").rope_theta == 250000.0);

  model = v5;
  model["rope_parameters"]["rope_theta"] = 0;
  CHECK(model_error(model) == "config.json: rope_parameters.rope_theta: must be positive, got 0");
  model = v5;
  model.erase("rope_parameters");
  model["rope_theta"] = -1;
  CHECK(model_error(model) == "config.json: rope_theta: must be positive, got -1");
}

TEST_CASE("keys transformers writes by default: accepted as written, refused where they change "
          "the model",
          "[hf_config][config]") {
  json model = fixture("transformers_5.x.json");
  for (const json& pad : {json(nullptr), json(0), json(-1)}) {
    model["pad_token_id"] = pad;
    CHECK(parse_model_config(model, "") == tiny_gqa());
  }
  model["dtype"] = "bfloat16";  // how the weights were saved: grass reads F32 and BF16 alike
  model["pretraining_tp"] = 2;  // transformers 4's sliced projections: the same sums
  model["attention_dropout"] = 0;
  CHECK(parse_model_config(model, "") == tiny_gqa());

  model["attention_dropout"] = 0.1;
  CHECK(model_error(model) == "config.json: attention_dropout: 0.1 is not supported; grass "
                              "implements 0.0 (attention without dropout)");
  model = fixture("transformers_5.x.json");
  model["mlp_bias"] = true;
  CHECK(model_error(model) == "config.json: mlp_bias: true is not supported; grass implements "
                              "false (MLP projections without bias)");
  model = fixture("transformers_5.x.json");
  model["head_dim"] = 16;
  CHECK(model_error(model) ==
        "config.json: head_dim: 16 is not supported; grass uses hidden_size / "
        "num_attention_heads = 8");
}

TEST_CASE("a model directory saved by each transformers loads as eval --weights and init_from "
          "load it",
          "[hf_config][init_from]") {
  uint64_t seed = 11;
  for (const std::string& name : kFixtureFiles) {
    INFO(name);
    const test::TempDir dir("grass_test_hf_config");
    const std::string config_path = kFixtures + "/" + name, hf = dir.file("hf_model");
    const auto written = write_model_dir(hf, config_path, seed++);
    const std::string shard = test::write_shard(dir.file("train.bin"),
                                                test::random_tokens(2000, 96, seed),
                                                {.vocab_size = 96});
    // The fixture is also the run's model config, as a path.
    const RunConfig cfg = parse_run_config({{"model", config_path},
                                            {"data", {{"train", shard}}},
                                            {"micro_batch_size", 2},
                                            {"seq_len", 16},
                                            {"steps", 1},
                                            {"init_from", hf},
                                            {"out_dir", dir.file("out")}},
                                           "");
    REQUIRE(cfg.model == tiny_gqa());

    // `grass eval --weights <dir>`: the directory's weights, every tensor as written.
    Arena arena;
    LlamaModel model(cfg.model, arena, cfg.micro_batch_size, cfg.seq_len);
    load_hf_model(model, hf);
    for (const ParamTensor& t : model.tensors()) {
      INFO(t.name);
      CHECK(model.read_tensor(t) == written.at(t.name));
    }

    // init_from: the run's first loss is those weights' loss on its first batch.
    const TrainResult result = train(cfg);
    REQUIRE(result.losses.size() == 1);
    TokenLoader loader(cfg.train_files, cfg.micro_batch_size, cfg.seq_len,
                       {.shuffle = cfg.shuffle, .seed = cfg.seed});
    std::vector<int32_t> inputs(2 * 16), targets(2 * 16);
    loader.next_batch(inputs.data(), targets.data());
    CHECK(result.losses[0] == model.forward(inputs.data(), targets.data(), cfg.micro_batch_size));
  }
}
