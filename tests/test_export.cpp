// Hugging Face interop. tools/reference/make_export_fixture.py ran `grass export`, loaded the
// result into the independent PyTorch reference as Hugging Face would, checked the engine's loss
// against the reference's (1e-5), and committed the exports with the reference's float64 loss on
// a fixed batch (tests/fixtures/export_ref). Here, without torch: those exports give the
// reference's loss in the engine, and exporting the same weights today gives model.safetensors
// byte for byte equal to the files the reference loaded. Then init_from: single and sharded
// weights, and the errors for weights of another architecture.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/data/loader.h"
#include "src/data/tokenizer.h"
#include "src/io/checkpoint.h"
#include "src/io/safetensors.h"
#include "src/model/llama.h"
#include "src/train/checkpointing.h"
#include "src/train/hf_interop.h"
#include "src/train/trainer.h"
#include "src/train/training_state.h"
#include "tests/test_util.h"

using namespace grass;
using Catch::Matchers::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kFixture = std::string(GRASS_SOURCE_DIR) + "/tests/fixtures/export_ref";

using test::read_bytes, test::read_json;

std::vector<int32_t> to_i32(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// A run of the fixture's model on a random shard in `dir`, for building checkpoints.
RunConfig fixture_run(const test::TempDir& dir, const std::string& tokenizer = "") {
  const std::string shard = dir.file("train.bin");
  if (!fs::exists(shard)) test::write_shard(shard, test::random_tokens(4000, 96, 5), {.vocab_size = 96});
  json run = {{"model", read_json(kFixture + "/hf_fp32/config.json")},
              {"data", {{"train", shard}}},
              {"micro_batch_size", 2},
              {"seq_len", 16},
              {"steps", 1},
              {"out_dir", dir.file("out")}};
  if (!tokenizer.empty()) run["data"]["tokenizer"] = tokenizer;
  return parse_run_config(run, "");
}

// Saves a checkpoint of the fixture's fp32 weights (as if after `step` steps) and returns it.
std::string checkpoint_of_fixture(const RunConfig& cfg, int64_t step) {
  Arena arena;
  TrainingState state = build_training_state(cfg, arena, default_cpu_backend());
  load_hf_model(*state.model, kFixture + "/hf_fp32");
  const TokenLoader loader(cfg.train_files, cfg.micro_batch_size, cfg.seq_len);
  return save_checkpoint(cfg, arena, state, loader, step, 0);
}

double fixture_loss(const std::string& hf_dir) {
  const SafetensorsFile expected(kFixture + "/expected.safetensors");
  const ModelConfig mc = load_model_config(hf_dir + "/config.json");
  const auto inputs = to_i32(expected.read_i64("input_ids"));
  const auto targets = to_i32(expected.read_i64("targets"));
  const int B = int(expected.get("input_ids").shape[0]), T = int(expected.get("input_ids").shape[1]);
  Arena arena;
  LlamaModel model(mc, arena, B, T);
  load_hf_model(model, hf_dir);
  return model.forward(inputs.data(), targets.data(), B);
}

// The keys of config.json that Hugging Face's LlamaConfig (and llama_ref.normalize_config) read.
const char* const kHfConfigKeys[] = {
    "architectures", "model_type",  "torch_dtype",         "hidden_size",
    "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
    "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
    "hidden_act", "attention_bias", "mlp_bias", "rope_scaling"};

}  // namespace

TEST_CASE("the exports the PyTorch reference loaded give its loss in the engine", "[export]") {
  const SafetensorsFile expected(kFixture + "/expected.safetensors");
  for (const std::string dtype : {"fp32", "bf16"}) {
    const double reference = expected.read_f64("loss_" + dtype)[0];
    const double engine = fixture_loss(kFixture + "/hf_" + dtype);
    INFO(dtype << ": engine " << engine << ", reference " << reference);
    CHECK(std::abs(engine - reference) / reference <= 1e-5);
  }
  // The fixture tells bf16 from fp32: its weights are rounded, so its loss differs measurably.
  CHECK(expected.read_f64("loss_fp32")[0] != expected.read_f64("loss_bf16")[0]);
}

TEST_CASE("export writes byte for byte the model.safetensors the reference loaded", "[export]") {
  const test::TempDir dir("grass_test_export");
  const RunConfig cfg = fixture_run(dir);
  const Checkpoint checkpoint(checkpoint_of_fixture(cfg, 6));
  for (const std::string dtype : {"fp32", "bf16"}) {
    const std::string out = dir.file("hf_" + dtype);
    const ExportResult r = export_hf(checkpoint, out, dtype == "bf16");
    CHECK(r.parameters == cfg.model.num_parameters());
    CHECK(r.tokenizer.empty());
    CHECK(read_bytes(out + "/model.safetensors") ==
          read_bytes(kFixture + "/hf_" + dtype + "/model.safetensors"));
    const json mine = read_json(out + "/config.json");
    const json theirs = read_json(kFixture + "/hf_" + dtype + "/config.json");
    for (const char* key : kHfConfigKeys) {
      INFO(dtype << " config.json key " << key);
      CHECK(mine.value(key, json()) == theirs.value(key, json()));
    }
    CHECK(mine["torch_dtype"] == (dtype == "bf16" ? "bfloat16" : "float32"));
    CHECK(SafetensorsFile(out + "/model.safetensors").metadata() ==
          std::map<std::string, std::string>{{"format", "pt"}});
    CHECK(!fs::exists(out + "/tokenizer.model"));
    // No temporary file is left behind.
    for (const auto& entry : fs::directory_iterator(out))
      CHECK(!entry.path().string().ends_with(".tmp"));
  }
  // Never over the checkpoint itself, nor beside a sharded model that would shadow the export.
  CHECK_THAT(test::user_error_of([&] { export_hf(checkpoint, checkpoint.dir(), false); }),
             Contains("is the checkpoint itself"));
  std::ofstream(dir.file("hf_fp32/model.safetensors.index.json")) << "{}";
  CHECK_THAT(test::user_error_of([&] { export_hf(checkpoint, dir.file("hf_fp32"), false); }),
             Contains("holds model.safetensors.index.json"));
  CHECK(Checkpoint(checkpoint.dir()).step() == 6);  // still verifies
}

TEST_CASE("export includes the tokenizer the run trained with", "[export]") {
  const test::TempDir dir("grass_test_export");
  const std::string tokenizer_path = std::string(GRASS_SOURCE_DIR) + "/data/c4_sample/tokenizer.model";
  const Tokenizer tokenizer(tokenizer_path);
  // A model whose vocabulary covers the tokenizer's 4096 pieces.
  const std::string shard = dir.file("train.bin");
  test::write_shard(shard, test::random_tokens(2000, 4096, 3), {.vocab_size = 4096});
  const json run = {{"model", {{"hidden_size", 16}, {"intermediate_size", 24},
                               {"num_attention_heads", 2}, {"num_hidden_layers", 1},
                               {"vocab_size", 4096}, {"max_position_embeddings", 32}}},
                    {"data", {{"train", shard}, {"tokenizer", tokenizer_path}}},
                    {"seq_len", 8}, {"out_dir", dir.file("out")}};
  const RunConfig cfg = parse_run_config(run, "");
  Arena arena;
  TrainingState state = build_training_state(cfg, arena, default_cpu_backend());
  state.model->init_weights(1);
  const TokenLoader loader(cfg.train_files, 1, 8);
  const Checkpoint checkpoint(save_checkpoint(cfg, arena, state, loader, 1, 0));
  CHECK(checkpoint.has("tokenizer.model"));

  const std::string out = dir.file("hf");
  const ExportResult r = export_hf(checkpoint, out, true);
  CHECK(r.tokenizer == checkpoint.path("tokenizer.model"));
  CHECK(read_bytes(out + "/tokenizer.model") == read_bytes(tokenizer_path));
  const json tc = read_json(out + "/tokenizer_config.json");
  CHECK(tc["tokenizer_class"] == "LlamaTokenizer");
  CHECK(tc["bos_token"] == tokenizer.pieces({tokenizer.bos_id()})[0]);
  CHECK(tc["eos_token"] == tokenizer.pieces({tokenizer.eos_id()})[0]);
  CHECK(tc["unk_token"] == tokenizer.pieces({tokenizer.unk_id()})[0]);
  CHECK(tc["add_bos_token"] == true);
  const json config = read_json(out + "/config.json");
  CHECK(config["bos_token_id"] == tokenizer.bos_id());
  CHECK(config["eos_token_id"] == tokenizer.eos_id());
  CHECK(config["vocab_size"] == 4096);

  // A tokenizer with more pieces than the model has rows is refused, naming it.
  const test::TempDir small("grass_test_export");
  const Checkpoint tiny(checkpoint_of_fixture(fixture_run(small), 1));
  CHECK_THAT(test::user_error_of([&] { export_hf(tiny, small.file("hf"), false, tokenizer_path); }),
             Contains(tokenizer_path) && Contains("4096 pieces, more than the model's vocab_size 96"));
}

TEST_CASE("init_from loads single and sharded Hugging Face weights", "[export][init_from]") {
  const test::TempDir dir("grass_test_export");
  const ModelConfig mc = load_model_config(kFixture + "/hf_fp32/config.json");
  Arena arena;
  LlamaModel single(mc, arena, 1, 4), sharded(mc, arena, 1, 4);
  load_hf_model(single, kFixture + "/hf_fp32");

  // Two shards: the first layer and the embeddings in one, the rest in the other.
  const SafetensorsFile source(kFixture + "/hf_fp32/model.safetensors");
  SafetensorsWriter first, second;
  json weight_map = json::object();
  for (const std::string& name : source.names()) {
    const TensorEntry& e = source.get(name);
    const bool in_first = name.starts_with("model.layers.0.") || name.starts_with("model.embed");
    (in_first ? first : second).add(name, e.dtype, e.shape, e.bytes.data(), e.bytes.size());
    weight_map[name] = in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  const std::string hf = dir.file("sharded");
  fs::create_directories(hf);
  first.write(hf + "/model-00001-of-00002.safetensors");
  second.write(hf + "/model-00002-of-00002.safetensors");
  const json index = {{"metadata", {{"total_size", 1}}}, {"weight_map", weight_map}};
  std::ofstream(hf + "/model.safetensors.index.json") << index.dump();
  fs::copy_file(kFixture + "/hf_fp32/config.json", hf + "/config.json");
  load_hf_model(sharded, hf);
  CHECK(std::equal(test::params(single), test::params(single) + single.num_params(), test::params(sharded)));

  SECTION("an index entry outside the directory") {
    json bad = index;
    bad["weight_map"]["lm_head.weight"] = "../model-00002-of-00002.safetensors";
    std::ofstream(hf + "/model.safetensors.index.json") << bad.dump();
    CHECK_THAT(test::user_error_of([&] { load_hf_model(sharded, hf); }),
               Contains("model.safetensors.index.json") && Contains("is not a shard file name"));
  }
  SECTION("an index that places a tensor in the wrong shard") {
    json bad = index;
    bad["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors";
    std::ofstream(hf + "/model.safetensors.index.json") << bad.dump();
    CHECK_THAT(test::user_error_of([&] { load_hf_model(sharded, hf); }),
               Contains("places tensor lm_head.weight in model-00001-of-00002.safetensors, which "
                        "has no such tensor"));
  }
  SECTION("a tensor missing from every shard") {
    json bad = index;
    bad["weight_map"].erase("lm_head.weight");
    std::ofstream(hf + "/model.safetensors.index.json") << bad.dump();
    CHECK_THAT(test::user_error_of([&] { load_hf_model(sharded, hf); }),
               Contains(hf + ": tensor lm_head.weight is missing"));
  }
  SECTION("a missing shard file") {
    fs::remove(hf + "/model-00002-of-00002.safetensors");
    CHECK_THAT(test::user_error_of([&] { load_hf_model(sharded, hf); }),
               Contains("model-00002-of-00002.safetensors: cannot open"));
  }
}

TEST_CASE("init_from refuses weights of another architecture naming file and tensor",
          "[export][init_from]") {
  const test::TempDir dir("grass_test_export");
  const ModelConfig mc = load_model_config(kFixture + "/hf_fp32/config.json");
  const std::string file = kFixture + "/hf_fp32/model.safetensors";
  Arena arena;

  ModelConfig fewer_layers = mc;
  fewer_layers.num_hidden_layers = 1;
  LlamaModel shallow(fewer_layers, arena, 1, 4);
  CHECK_THAT(test::user_error_of([&] { load_hf_model(shallow, file); }),
             Contains(file + ": tensor model.layers.1.") && Contains("is not part of the run's model"));

  ModelConfig tied = mc;
  tied.tie_word_embeddings = true;
  LlamaModel tied_model(tied, arena, 1, 4);
  CHECK_THAT(test::user_error_of([&] { load_hf_model(tied_model, file); }),
             Contains("tensor lm_head.weight is not part of the run's model") && Contains("tied"));

  ModelConfig wider = mc;
  wider.intermediate_size = 88;
  LlamaModel wide(wider, arena, 1, 4);
  CHECK_THAT(test::user_error_of([&] { load_hf_model(wide, file); }),
             Contains(file + ": tensor model.layers.0.mlp.gate_proj.weight has shape [86, 48] but "
                             "the model config needs [88, 48]"));
  // With the directory, its config.json is compared first.
  CHECK_THAT(test::user_error_of([&] { load_hf_model(wide, kFixture + "/hf_fp32"); }),
             Contains("hf_fp32/config.json: intermediate_size is 86, but the run's model config "
                      "has 88"));
  ModelConfig other_rope = mc;
  other_rope.rope_theta = 500000;
  LlamaModel rope(other_rope, arena, 1, 4);
  CHECK_THAT(test::user_error_of([&] { load_hf_model(rope, kFixture + "/hf_fp32"); }),
             Contains("rope_theta is 10000.0, but the run's model config has 500000.0"));
  CHECK_THAT(test::user_error_of([&] { load_hf_model(rope, dir.file("nothing")); }),
             Contains(dir.file("nothing") + ": not found"));
  CHECK_THAT(test::user_error_of([&] { load_hf_model(rope, dir.path.string()); }),
             Contains("no model.safetensors or model.safetensors.index.json"));
}

TEST_CASE("a run with init_from starts from those weights", "[export][init_from][train]") {
  const test::TempDir dir("grass_test_export");
  RunConfig cfg = fixture_run(dir);
  cfg.init_from = kFixture + "/hf_fp32";
  const TrainResult result = train(cfg);
  REQUIRE(result.losses.size() == 1);

  // The same first batch through the fixture's weights, outside the trainer.
  TokenLoader loader(cfg.train_files, cfg.micro_batch_size, cfg.seq_len,
                     {.shuffle = cfg.shuffle, .seed = cfg.seed});
  std::vector<int32_t> inputs(2 * 16), targets(2 * 16);
  loader.next_batch(inputs.data(), targets.data());
  Arena arena;
  LlamaModel model(cfg.model, arena, cfg.micro_batch_size, cfg.seq_len);
  load_hf_model(model, cfg.init_from);
  CHECK(result.losses[0] == model.forward(inputs.data(), targets.data(), cfg.micro_batch_size));
}
