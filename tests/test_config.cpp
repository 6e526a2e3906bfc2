// Config parsing: shipped configs load, parameter counts match the published models, and every
// documented error message (docs/configs.md) appears as one line naming the file and key.
#include <catch2/catch.hpp>
#include <array>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "src/config/config.h"
#include "src/config/json_check.h"
#include "src/core/error.h"
#include "src/train/backend_choice.h"
#include "src/train/run_resolution.h"

using Catch::Matchers::Contains;
using nlohmann::json;

namespace {

const std::string kSource = GRASS_SOURCE_DIR;

// The UserError message `action` throws; fails the test when it throws none or spans lines.
template <class Action>
std::string user_error(Action&& action) {
  try {
    action();
  } catch (const grass::UserError& e) {
    const std::string message = e.what();
    CHECK(message.find('\n') == std::string::npos);
    return message;
  }
  FAIL("expected a grass::UserError");
  return {};
}

// Runs with the working directory set to `dir`, as `grass` runs from the repository root.
struct InDirectory {
  std::filesystem::path previous = std::filesystem::current_path();
  explicit InDirectory(const std::filesystem::path& dir) { std::filesystem::current_path(dir); }
  ~InDirectory() { std::filesystem::current_path(previous); }
};

std::string write_temp_file(const std::string& name, const std::string& text) {
  const std::filesystem::path dir = std::filesystem::path(GRASS_BINARY_DIR) / "test_config_tmp";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

json tiny_model() {
  return {{"hidden_size", 64},
          {"intermediate_size", 172},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"num_hidden_layers", 2},
          {"vocab_size", 512},
          {"max_position_embeddings", 256}};
}

json tiny_run() {
  return {{"model", tiny_model()},
          {"data", {{"train", "data/synthetic/train.bin"}}},
          {"micro_batch_size", 4},
          {"total_batch_size", 8},
          {"seq_len", 64}};
}

std::string model_error(const json& model) {
  return user_error([&] { grass::parse_model_config(model, "m.json"); });
}

std::string run_error(const json& run) {
  return user_error([&] { grass::parse_run_config(run, "run.json"); });
}

// Written out independently of ModelConfig::num_parameters, from the LLaMA layer list.
int64_t llama_parameters(int64_t d, int64_t ffn, int64_t layers, int64_t vocab) {
  const int64_t q_k_v_o = 4 * d * d, gate_up_down = 3 * d * ffn, norms = 2 * d;
  return vocab * d + layers * (q_k_v_o + gate_up_down + norms) + d + vocab * d;
}

}  // namespace

TEST_CASE("every shipped model config parses", "[config]") {
  for (const char* name : {"llama_tiny", "llama_60m", "llama_130m", "llama_350m", "llama_1b",
                           "llama_7b", "llama_13b"}) {
    INFO(name);
    const grass::ModelConfig m =
        grass::load_model_config(kSource + "/configs/models/" + name + ".json");
    CHECK(m.vocab_size > 0);
    CHECK(m.head_dim() % 2 == 0);
  }
  const grass::ModelConfig tiny =
      grass::load_model_config(kSource + "/configs/models/llama_tiny.json");
  CHECK(tiny.num_key_value_heads == 2);
  CHECK(tiny.max_position_embeddings == 256);
}

TEST_CASE("every shipped run config parses from the repository root", "[config]") {
  const InDirectory root(kSource);
  for (const char* name : {"quickstart", "bench_tiny", "bench_60m", "llama_60m_c4"}) {
    INFO(name);
    const grass::RunConfig run =
        grass::load_run_config(std::string("configs/runs/") + name + ".json");
    CHECK(!run.model_path.empty());
    CHECK(run.train_files.size() == 1);
  }
  const grass::RunConfig quick = grass::load_run_config("configs/runs/quickstart.json");
  CHECK(quick.source == "configs/runs/quickstart.json");
  CHECK(quick.model_path == "configs/models/llama_quickstart.json");
  CHECK(quick.model.hidden_size == 128);
  CHECK(quick.model.vocab_size == 4096);
  CHECK(quick.train_files[0] == "data/c4_sample/tokens/train_00000.bin");
  CHECK(quick.val_files == std::vector<std::string>{"data/c4_sample/tokens/val_00000.bin"});
  CHECK(quick.tokenizer == "data/c4_sample/tokenizer.model");
  CHECK(quick.shuffle);
  CHECK(quick.optimizer.lr == 3e-3);
  CHECK(quick.optimizer.beta2 == 0.95);
  CHECK(quick.schedule.warmup_steps == 30);
  CHECK(quick.grad_accum_steps() == 2);
  CHECK(quick.tokens_per_step() == 16 * 128);
  CHECK(quick.steps == 600);
  CHECK(quick.log_every == 25);
  CHECK(quick.eval_every == 200);
  CHECK(quick.eval_tokens == 65536);
}

TEST_CASE("data.val, data.tokenizer, data.shuffle, eval_every and eval_tokens", "[config][eval]") {
  const InDirectory root(kSource);
  const grass::RunConfig defaults = grass::load_run_config(
      "configs/runs/bench_tiny.json", {"data.val=[\"v1.bin\",\"v2.bin\"]"});
  CHECK(defaults.val_files == std::vector<std::string>{"v1.bin", "v2.bin"});
  CHECK(defaults.tokenizer.empty());
  CHECK(defaults.shuffle);
  CHECK(defaults.eval_every == 0);
  CHECK(defaults.eval_tokens == 10'000'000);
  const grass::RunConfig set = grass::load_run_config(
      "configs/runs/bench_tiny.json", {"data.shuffle=false", "eval_every=50", "eval_tokens=4096"});
  CHECK(set.val_files.empty());
  CHECK(!set.shuffle);
  CHECK(set.eval_every == 50);
  CHECK(set.eval_tokens == 4096);
  const auto error_of = [](const std::string& override_text) {
    return user_error([&] { grass::load_run_config("configs/runs/bench_tiny.json", {override_text}); });
  };
  // The data is opened by what reads it (test_data_sets.cpp), so a plan needs none of it here.
  CHECK(grass::load_run_config("configs/runs/bench_tiny.json",
                               {"data.tokenizer=no/such.model", "data.train=no/such_*.bin"})
            .tokenizer == "no/such.model");
  CHECK_THAT(error_of("data.val=[]"), Contains("data.val: expected a token shard path or a non-empty"));
  CHECK_THAT(error_of("eval_tokens=0"), Contains("eval_tokens"));
  CHECK_THAT(error_of("eval_every=-1"), Contains("eval_every"));
}

TEST_CASE("parameter counts match the published model sizes", "[config]") {
  const auto params = [](const char* name) {
    return grass::load_model_config(kSource + "/configs/models/" + name + ".json").num_parameters();
  };
  CHECK(params("llama_60m") == llama_parameters(512, 1376, 8, 32000));
  CHECK(params("llama_60m") == 58'073'600);
  CHECK(params("llama_130m") == llama_parameters(768, 2048, 12, 32000));
  CHECK(params("llama_130m") == 134'105'856);
  CHECK(params("llama_350m") == llama_parameters(1024, 2736, 24, 32000));
  CHECK(params("llama_350m") == 367'969'280);
  // GaLore's 1B: 32 heads of 64 over 24 layers (24 heads would not divide 2048).
  CHECK(params("llama_1b") == llama_parameters(2048, 5461, 24, 32000));
  CHECK(params("llama_1b") == 1'339'082'752);
  CHECK(params("llama_7b") == 6'738'415'616);
  CHECK(params("llama_13b") == 13'015'864'320);

  SECTION("tied embeddings drop the lm_head, GQA shrinks k and v") {
    grass::ModelConfig m = grass::parse_model_config(tiny_model(), "");
    const int64_t untied = m.num_parameters();
    m.tie_word_embeddings = true;
    CHECK(m.num_parameters() == untied - 512 * 64);
    // 2 of 4 heads for k and v: each of those two projections is half of d x d.
    CHECK(untied == llama_parameters(64, 172, 2, 512) - 2 * 2 * (64 * 64 / 2));
  }
}

TEST_CASE("unknown keys name the dotted path and suggest the closest key", "[config]") {
  json model = tiny_model();
  model["hiden_size"] = 64;
  CHECK(model_error(model) == "m.json: hiden_size: unknown key (did you mean \"hidden_size\"?)");

  json run = tiny_run();
  run["optimizer"] = {{"weigth_decay", 0.1}};
  CHECK(run_error(run) ==
        "run.json: optimizer.weigth_decay: unknown key (did you mean \"weight_decay\"?)");

  run = tiny_run();
  run["schedule"] = {{"warmup", 10}};
  CHECK_THAT(run_error(run),
             Contains("schedule.warmup: unknown key (did you mean \"warmup_steps\"?)"));

  run = tiny_run();
  run["model"]["num_layers_total"] = 2;
  CHECK(run_error(run) ==
        "run.json: model.num_layers_total: unknown key "
        "(docs/configs.md lists the accepted keys)");

  run = tiny_run();
  run["banana"] = 1;
  CHECK_THAT(run_error(run), !Contains("did you mean"));

  // Hugging Face and GaLore bookkeeping keys are accepted and ignored.
  model = tiny_model();
  model.update({{"architectures", {"LLaMAForCausalLM"}},
                {"model_type", "llama"},
                {"torch_dtype", "float32"},
                {"transformers_version", "4.28.1"},
                {"use_cache", true},
                {"bos_token_id", 0},
                {"eos_token_id", 1},
                {"pad_token_id", -1},
                {"pretraining_tp", 1},
                {"attention_dropout", 0.0},
                {"_name_or_path", "x"}});
  CHECK(grass::parse_model_config(model, "m.json") == grass::parse_model_config(tiny_model(), ""));
}

TEST_CASE("closest_match suggests only reasonably close keys", "[config]") {
  using grass::json_check::closest_match;
  using grass::json_check::edit_distance;
  CHECK(edit_distance("weigth", "weight") == 1);  // a transposition is one slip
  CHECK(edit_distance("kitten", "sitting") == 3);
  const std::vector<std::string> keys = {"lr", "eps", "betas", "weight_decay", "name"};
  CHECK(closest_match("Weight_Decay", keys) == "weight_decay");
  CHECK(closest_match("weight", keys) == "weight_decay");
  CHECK(closest_match("beta", keys) == "betas");
  CHECK(closest_match("momentum", keys).empty());
  CHECK(closest_match("xyz", keys).empty());
}

TEST_CASE("wrong types name the path and the expected type and what was found", "[config]") {
  json run = tiny_run();
  run["optimizer"] = {{"lr", "fast"}};
  CHECK(run_error(run) == "run.json: optimizer.lr: expected a number, got string \"fast\"");

  run = tiny_run();
  run["steps"] = 2.5;
  CHECK(run_error(run) == "run.json: steps: expected an integer, got number 2.5");

  run = tiny_run();
  run["steps"] = 1e3;  // an integral number written as a float is an integer
  CHECK(grass::parse_run_config(run, "").steps == 1000);

  run = tiny_run();
  run["seed"] = -1;
  CHECK(run_error(run) == "run.json: seed: must be non-negative, got -1");

  run = tiny_run();
  run["model"]["hidden_size"] = "64";
  CHECK(run_error(run) == "run.json: model.hidden_size: expected an integer, got string \"64\"");

  run = tiny_run();
  run["model"]["tie_word_embeddings"] = "yes";
  CHECK_THAT(run_error(run), Contains("model.tie_word_embeddings: expected a boolean"));

  run = tiny_run();
  run["optimizer"] = {{"betas", 0.9}};
  CHECK(
      run_error(run) ==
      "run.json: optimizer.betas: expected an array of two numbers [beta1, beta2], got number 0.9");

  run = tiny_run();
  run["data"]["train"] = {"a.bin", 3};
  CHECK(run_error(run) == "run.json: data.train[1]: expected a string, got number 3");

  run = tiny_run();
  run["optimizer"] = "adamw";
  CHECK(run_error(run) == "run.json: optimizer: expected an object, got string \"adamw\"");

  CHECK(user_error([] { grass::parse_run_config(json::array(), ""); }) ==
        "expected an object, got array []");
}

TEST_CASE("value ranges and choices are checked", "[config]") {
  json run = tiny_run();
  run["optimizer"] = {{"betas", {0.9, 1.0}}};
  CHECK(run_error(run) == "run.json: optimizer.betas[1]: must be in [0, 1), got 1");

  run = tiny_run();
  run["optimizer"] = {{"eps", 0}};
  CHECK(run_error(run) == "run.json: optimizer.eps: must be positive, got 0");

  run = tiny_run();
  run["optimizer"] = {{"name", "adam"}};
  CHECK(run_error(run) ==
        "run.json: optimizer.name: unknown optimizer \"adam\" (supported: \"adamw\", \"grass\", "
        "\"galore\", \"flora\")");

  run = tiny_run();
  run["schedule"] = {{"name", "linear"}};
  CHECK(
      run_error(run) ==
      "run.json: schedule.name: unknown schedule \"linear\" (supported: \"cosine\", \"constant\")");

  run = tiny_run();
  run["schedule"] = {{"min_lr_ratio", 1.5}};
  CHECK(run_error(run) == "run.json: schedule.min_lr_ratio: must be in [0, 1], got 1.5");

  run = tiny_run();
  run["micro_batch_size"] = 0;
  CHECK(run_error(run) == "run.json: micro_batch_size: must be positive, got 0");

  run = tiny_run();
  run["precision"] = "fp16";
  CHECK(run_error(run) == "run.json: precision: \"fp16\" is not a precision (supported: "
                          "\"auto\", \"fp32\", \"bf16-mixed\", \"bf16\")");

  run = tiny_run();
  run["device"] = "gpu";
  CHECK(run_error(run) ==
        "run.json: device: \"gpu\" is not a device (supported: \"auto\", \"cpu\", \"cuda\")");
}

TEST_CASE("missing required keys are named", "[config]") {
  json run = tiny_run();
  run.erase("model");
  CHECK(run_error(run) == "run.json: model: required key is missing");

  run = tiny_run();
  run.erase("data");
  CHECK(run_error(run) == "run.json: data.train: required key is missing");

  json model = tiny_model();
  model.erase("vocab_size");
  CHECK(model_error(model) == "m.json: vocab_size: required key is missing");
}

TEST_CASE("model shapes: hidden by heads and heads by kv heads and even head_dim", "[config]") {
  json model = tiny_model();
  model["hidden_size"] = 66;
  CHECK(model_error(model) ==
        "m.json: hidden_size: 66 is not a multiple of num_attention_heads (4)");

  model = tiny_model();
  model["num_key_value_heads"] = 3;
  CHECK_THAT(model_error(model),
             Contains("m.json: num_key_value_heads: 3 does not divide num_attention_heads (4)"));

  model = tiny_model();
  model["hidden_size"] = 68;  // 68 / 4 = 17
  CHECK_THAT(model_error(model), Contains("m.json: num_attention_heads: head_dim = hidden_size / "
                                          "num_attention_heads = 68 / 4 = 17 is odd"));

  model = tiny_model();
  model["head_dim"] = 32;
  CHECK(model_error(model) ==
        "m.json: head_dim: 32 is not supported; grass uses hidden_size / num_attention_heads = 16");
  model["head_dim"] = 16;
  CHECK(grass::parse_model_config(model, "").head_dim() == 16);

  model = tiny_model();
  model["rms_norm_eps"] = 0;
  CHECK(model_error(model) == "m.json: rms_norm_eps: must be positive, got 0");

  model = tiny_model();
  model["num_hidden_layers"] = 0;
  CHECK(model_error(model) == "m.json: num_hidden_layers: must be positive, got 0");
  model["num_hidden_layers"] = 3000000000LL;
  CHECK(model_error(model) ==
        "m.json: num_hidden_layers: must be at most 2147483647, got 3000000000");
}

TEST_CASE("architecture variants are accepted only as implemented", "[config]") {
  json model = tiny_model();
  model["hidden_act"] = "gelu";
  CHECK(model_error(model) ==
        "m.json: hidden_act: \"gelu\" is not supported; grass implements "
        "\"silu\" (the SwiGLU MLP of LLaMA)");

  model = tiny_model();
  model["attention_bias"] = true;
  CHECK_THAT(model_error(model), Contains("attention_bias: true is not supported"));

  model = tiny_model();
  model["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  CHECK_THAT(model_error(model),
             Contains("rope_scaling: {\"factor\":2.0,\"type\":\"linear\"} is not supported"));

  model = tiny_model();
  model.update({{"hidden_act", "silu"},
                {"attention_bias", false},
                {"mlp_bias", false},
                {"rope_scaling", nullptr}});
  CHECK(grass::parse_model_config(model, "") == grass::parse_model_config(tiny_model(), ""));
}

TEST_CASE("GaLore max_sequence_length is max_position_embeddings", "[config]") {
  json model = tiny_model();
  model.erase("max_position_embeddings");
  model["max_sequence_length"] = 1024;
  CHECK(grass::parse_model_config(model, "").max_position_embeddings == 1024);

  model["max_position_embeddings"] = 1024;
  CHECK(grass::parse_model_config(model, "").max_position_embeddings == 1024);

  model["max_position_embeddings"] = 2048;
  CHECK_THAT(
      model_error(model),
      Contains("m.json: max_sequence_length: 1024 conflicts with max_position_embeddings 2048"));
}

TEST_CASE("run config checks batch sizes and sequence length", "[config]") {
  json run = tiny_run();
  run["micro_batch_size"] = 16;
  run["total_batch_size"] = 100;
  CHECK(run_error(run) ==
        "run.json: total_batch_size: 100 is not a multiple of "
        "micro_batch_size (16); nearest valid value: 96");

  run["total_batch_size"] = 8;
  CHECK_THAT(run_error(run), Contains("nearest valid value: 16"));

  run.erase("total_batch_size");  // absent: one micro-batch per step
  CHECK(grass::parse_run_config(run, "").total_batch_size == 16);

  run = tiny_run();
  run["seq_len"] = 512;
  CHECK(run_error(run) ==
        "run.json: seq_len: 512 exceeds the model's max_position_embeddings (256)");
}

TEST_CASE("overrides (set key=value) apply before validation", "[config]") {
  const std::string model_path = kSource + "/configs/models/llama_tiny.json";
  json base = tiny_run();
  base["model"] = model_path;
  const std::string path = write_temp_file("overrides.json", base.dump());

  const grass::RunConfig run = grass::load_run_config(
      path, {"optimizer.lr=3e-4", "steps=10", "data.train=shards/a.bin", "out_dir=runs/x",
             "optimizer.betas=[0.8,0.9]", "model=" + model_path});
  CHECK(run.optimizer.lr == 3e-4);
  CHECK(run.optimizer.beta1 == 0.8);
  CHECK(run.steps == 10);
  CHECK(run.train_files == std::vector<std::string>{"shards/a.bin"});
  CHECK(run.out_dir == "runs/x");

  CHECK(user_error([&] { grass::load_run_config(path, {"steps10"}); }) ==
        "--set \"steps10\": expected key=value with a dotted key, e.g. --set optimizer.lr=3e-4");
  CHECK_THAT(user_error([&] { grass::load_run_config(path, {"optimizer..lr=1"}); }),
             Contains("expected key=value"));
  CHECK(user_error([&] { grass::load_run_config(path, {"optimizer.weigth_decay=0.1"}); }) ==
        path + ": optimizer.weigth_decay: unknown key (did you mean \"weight_decay\"?)");
  CHECK(user_error([&] { grass::load_run_config(path, {"steps=fast"}); }) ==
        path + ": steps: expected an integer, got string \"fast\"");
  CHECK_THAT(user_error([&] { grass::load_run_config(path, {"model.hidden_size=32"}); }),
             Contains("--set \"model.hidden_size=32\": model is string"));
  CHECK_THAT(user_error([&] { grass::load_run_config(path, {"model.hidden_size=32"}); }),
             Contains("not an object"));
}

TEST_CASE("file errors name the file", "[config]") {
  const std::string broken = write_temp_file("broken.json", "{\n  \"steps\": 10,\n}\n");
  const std::string syntax = user_error([&] { grass::load_run_config(broken); });
  CHECK_THAT(syntax, Contains(broken + ": invalid JSON: parse error at line 3, column 1"));

  const std::string missing = user_error([] { grass::load_run_config("no/such/run.json"); });
  CHECK(missing == "no/such/run.json: file not found");

  json run = tiny_run();
  run["model"] = "no/such/model.json";
  CHECK(run_error(run) == "run.json: model: file not found: no/such/model.json (relative paths "
                          "resolve against the working directory, " +
                              std::filesystem::current_path().string() + ")");

  // A problem inside the model file names the model file, with keys relative to it.
  json model = tiny_model();
  model["hidden_act"] = "relu";
  run["model"] = write_temp_file("relu_model.json", model.dump());
  CHECK_THAT(run_error(run), Contains(run["model"].get<std::string>() + ": hidden_act: \"relu\""));
}

TEST_CASE("checkpoint keys and init_from are read and checked", "[config][checkpoint]") {
  const InDirectory root(kSource);
  const grass::RunConfig defaults = grass::load_run_config("configs/runs/bench_tiny.json");
  CHECK(defaults.checkpoint_every == 0);
  CHECK(defaults.checkpoint_keep == 3);
  CHECK(defaults.checkpoint_keep_every == 0);
  CHECK(defaults.init_from.empty());
  const grass::RunConfig set = grass::load_run_config(
      "configs/runs/bench_tiny.json",
      {"checkpoint_every=100", "checkpoint_keep=2", "checkpoint_keep_every=1000",
       "init_from=tests/fixtures/export_ref/hf_fp32"});
  CHECK(set.checkpoint_every == 100);
  CHECK(set.checkpoint_keep == 2);
  CHECK(set.checkpoint_keep_every == 1000);
  CHECK(set.init_from == "tests/fixtures/export_ref/hf_fp32");
  CHECK(grass::to_json(set)["init_from"] == "tests/fixtures/export_ref/hf_fp32");
  CHECK(!grass::to_json(defaults).contains("init_from"));
  const auto error_of = [](const std::string& override_text) {
    return user_error([&] { grass::load_run_config("configs/runs/bench_tiny.json", {override_text}); });
  };
  CHECK_THAT(error_of("checkpoint_every=-1"), Contains("bench_tiny.json: checkpoint_every"));
  CHECK_THAT(error_of("checkpoint_every=2.5"), Contains("checkpoint_every: expected an integer"));
  CHECK_THAT(error_of("checkpoint_keep=0"), Contains("bench_tiny.json: checkpoint_keep"));
  CHECK_THAT(error_of("checkpoint_keep_every=-5"), Contains("checkpoint_keep_every"));
  CHECK_THAT(error_of("checkpoint_kep=2"), Contains("did you mean \"checkpoint_keep\""));
  CHECK_THAT(error_of("init_from=no/such/dir"),
             Contains("bench_tiny.json: init_from: not found: no/such/dir") &&
                 Contains("(relative paths resolve against the working directory, " +
                          std::filesystem::current_path().string() + ")"));
  CHECK_THAT(error_of("init_from=[1]"), Contains("init_from: expected a string"));
}

TEST_CASE("layout and kernel keys: pad_ffn and attention", "[config]") {
  json run = tiny_run();
  grass::RunConfig c = grass::parse_run_config(run, "");
  CHECK(c.pad_ffn == grass::Switch::Auto);
  CHECK(c.attention == grass::AttentionChoice::Auto);
  CHECK(grass::to_json(c)["attention"] == "auto");  // config.json keeps the choice as given
  run["pad_ffn"] = "off";
  run["attention"] = "cudnn";
  c = grass::parse_run_config(run, "");
  CHECK(c.pad_ffn == grass::Switch::Off);
  CHECK(c.attention == grass::AttentionChoice::Cudnn);
  CHECK(grass::to_json(c)["attention"] == "cudnn");
  for (const std::string kernel : {"auto", "grass"}) {  // both run on the CPU too
    run["attention"] = kernel;
    run["device"] = "cpu";
    c = grass::parse_run_config(run, "");
    CHECK(grass::name_of(c.attention) == kernel);
    CHECK(grass::parse_run_config(grass::to_json(c), "").attention == c.attention);
  }
  // the kernels a run took are recorded apart (its checkpoints' state.json), so a resume or a
  // rerun into its out_dir with another choice is the same run
  CHECK_FALSE(grass::changes_results("attention"));

  run = tiny_run();
  run["attention"] = "flash";
  CHECK(run_error(run) == "run.json: attention: unknown kernel \"flash\" (supported: \"auto\", "
                          "\"grass\", \"cudnn\", \"mma\")");
  for (const std::string kernel : {"cudnn", "mma"}) {
    run["attention"] = kernel;
    run["device"] = "cpu";
    CHECK(run_error(run) == "run.json: attention: \"" + kernel +
                                "\" runs on the GPU; with device \"cpu\" use \"grass\"");
  }
  run = tiny_run();
  run["pad_ffn"] = true;
  CHECK_THAT(run_error(run), Contains("run.json: pad_ffn:"));
}

TEST_CASE("attention auto resolves to cuDNN's kernels only on the GPU, and a plan assumes them "
          "wherever it may take them",
          "[config]") {
  std::mt19937_64 rng(std::random_device{}());
  json run = tiny_run();
  const int micro = int(1 + rng() % 8);
  run["micro_batch_size"] = micro;
  run["total_batch_size"] = micro * int(1 + rng() % 3);
  const grass::RunConfig c = grass::parse_run_config(run, "");
  INFO("micro_batch_size " << micro);
  const grass::Storage gpu = grass::storage_for(grass::PrecisionChoice::Auto, true);
  const grass::Storage cpu = grass::storage_for(grass::PrecisionChoice::Auto, false);
  // the CPU computes with its reference, and says nothing about it
  const grass::AttentionRequest on_cpu_request = grass::attention_request(c, cpu);
  CHECK(on_cpu_request.kernel == grass::AttentionKernel::Grass);
  CHECK_FALSE(on_cpu_request.fall_back_to_grass);
  CHECK(on_cpu_request.why_not_cudnn.empty());
  CHECK(grass::planned_attention(c, cpu) == grass::AttentionChoice::Grass);
  CHECK(grass::model_memory_options(c, cpu).attention == grass::AttentionKernel::Grass);
  // the GPU: the backend is to try cuDNN's (resolve() asks it), and a plan assumes them
  const grass::AttentionRequest on_gpu = grass::attention_request(c, gpu);
  CHECK(on_gpu.kernel == grass::AttentionKernel::Cudnn);
  CHECK(on_gpu.fall_back_to_grass);
  CHECK(on_gpu.why_not_cudnn.empty());
  grass::RunConfig on_cuda = c;
  on_cuda.device = grass::DeviceChoice::Cuda;
  CHECK(grass::resolve(on_cuda, true).attention.fall_back_to_grass);
  CHECK(grass::planned_attention(c, gpu) == grass::AttentionChoice::Cudnn);
  // a model is built on the engine's kernels until a backend has settled them
  CHECK(grass::model_memory_options(c, gpu).attention == grass::AttentionKernel::Grass);
  for (const grass::AttentionKernel k :
       {grass::AttentionKernel::Grass, grass::AttentionKernel::Cudnn, grass::AttentionKernel::Mma}) {
    const grass::RunConfig settled = grass::with_attention(c, k);
    CHECK(grass::model_memory_options(settled, gpu).attention == k);
    CHECK(grass::model_memory_options(settled, cpu).attention == grass::AttentionKernel::Grass);
  }
  // explicit choices are asked for and planned as given, with no fallback
  for (const grass::AttentionChoice a :
       {grass::AttentionChoice::Grass, grass::AttentionChoice::Cudnn, grass::AttentionChoice::Mma}) {
    grass::RunConfig explicit_choice = c;
    explicit_choice.attention = a;
    CHECK(grass::planned_attention(explicit_choice, gpu) == a);
    const grass::AttentionRequest asked = grass::attention_request(explicit_choice, gpu);
    CHECK(grass::name_of(asked.kernel) == std::string(grass::name_of(a)));
    CHECK_FALSE(asked.fall_back_to_grass);
    CHECK(asked.why_not_cudnn.empty());
  }
  // An evaluation forward of more sequences than the micro-batch: cuDNN's graphs are built for
  // the micro-batch, so "auto" keeps the engine's and says why; without data.val it evaluates
  // nothing and may take them.
  grass::RunConfig wide = c;
  wide.eval_batch_size = micro + 1 + int(rng() % 8);
  CHECK(grass::attention_request(wide, gpu).fall_back_to_grass);
  wide.val_files = {"val.bin"};
  const grass::AttentionRequest kept = grass::attention_request(wide, gpu);
  CHECK(kept.kernel == grass::AttentionKernel::Grass);
  CHECK_FALSE(kept.fall_back_to_grass);
  CHECK(kept.why_not_cudnn == "eval_batch_size " + std::to_string(wide.eval_batch_size) +
                                  " is above micro_batch_size " + std::to_string(micro) +
                                  ", and cuDNN's graphs are built for the micro-batch");
  CHECK(grass::planned_attention(wide, gpu) == grass::AttentionChoice::Grass);
  wide.eval_batch_size = int(1 + rng() % micro);  // at most the micro-batch: served
  CHECK(grass::attention_request(wide, gpu).fall_back_to_grass);
  // A run on the CPU backend settles on the engine's kernels (its reference) without a word
  grass::RunConfig on_cpu = c;
  on_cpu.device = grass::DeviceChoice::Cpu;
  const std::unique_ptr<grass::Backend> backend = grass::choose_backend(on_cpu);
  const grass::AttentionInUse in_use = grass::prepare_attention(on_cpu, *backend);
  CHECK(in_use.kernel == grass::AttentionKernel::Grass);
  CHECK(in_use.cudnn_version == 0);
  CHECK(in_use.why_not_cudnn.empty());
}

TEST_CASE("the attention kernels in words: cuDNN's with its version, or the engine's and why",
          "[config]") {
  std::mt19937_64 rng(std::random_device{}());
  const int major = 9, minor = int(rng() % 20), patch = int(rng() % 10);
  const int64_t version = major * 10000 + minor * 100 + patch;  // cudnnGetVersion()'s form
  const std::string name =
      std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  CHECK(grass::cudnn_version_name(version) == name);
  const grass::AttentionInUse cudnn{grass::AttentionKernel::Cudnn, version, ""};
  CHECK(grass::describe_attention(grass::AttentionChoice::Cudnn, cudnn) ==
        "cuDNN " + name + "'s fused flash attention (RoPE applied to q, k in place)");
  CHECK(grass::describe_attention(grass::AttentionChoice::Auto, cudnn) ==
        "cuDNN " + name + "'s fused flash attention (RoPE applied to q, k in place), taken by "
        "\"auto\"");
  const grass::AttentionInUse fell_back{grass::AttentionKernel::Grass, 0, "libcudnn.so.9 is gone"};
  CHECK(grass::describe_attention(grass::AttentionChoice::Auto, fell_back) ==
        "the engine's kernels (\"auto\" did not take cuDNN's: libcudnn.so.9 is gone)");
  CHECK(grass::describe_attention(grass::AttentionChoice::Grass, {}) == "the engine's kernels");
  CHECK(std::string(grass::name_of(grass::AttentionKernel::Cudnn)) == "cudnn");
  CHECK(std::string(grass::name_of(grass::AttentionKernel::Grass)) == "grass");
  CHECK(grass::describe_attention(grass::AttentionChoice::Mma, {grass::AttentionKernel::Mma, 0, ""}) ==
        "the engine's FA2-style kernels (mma.sync; RoPE applied to q, k in place)");
  CHECK(std::string(grass::name_of(grass::AttentionKernel::Mma)) == "mma");
}

TEST_CASE("optimizer.state_dtype and state_block: read, printed back, checked against the precision",
          "[config][quant8]") {
  json run = tiny_run();
  grass::RunConfig c = grass::parse_run_config(run, "run.json");
  CHECK(c.optimizer.state_dtype == grass::StateDtype::Auto);
  CHECK(grass::to_json(c)["optimizer"].count("state_dtype") == 0);  // old checkpoints: no warning
  CHECK(grass::to_json(c)["optimizer"].count("state_block") == 0);
  run["optimizer"] = {{"name", "adamw"}, {"state_dtype", "q8"}, {"state_block", 2048}};
  c = grass::parse_run_config(run, "run.json");
  CHECK(c.optimizer.state_dtype == grass::StateDtype::Q8);
  CHECK(c.optimizer.state_block == 2048);
  CHECK(grass::parse_run_config(grass::to_json(c), "").optimizer == c.optimizer);
  run["optimizer"] = {{"name", "adamw"}, {"state_dtype", "q4"}};
  CHECK(run_error(run) == "run.json: optimizer.state_dtype: unknown state_dtype \"q4\" (supported: "
                          "\"auto\", \"fp32\", \"bf16\", \"q8\")");
  run["optimizer"] = {{"name", "adamw"}, {"state_block", 256}};
  CHECK(run_error(run) ==
        "run.json: optimizer.state_block: only q8 states (state_dtype \"q8\") have blocks");
  run["optimizer"] = {{"name", "adamw"}, {"state_dtype", "q8"}, {"state_block", 300}};
  CHECK(run_error(run) ==
        "run.json: optimizer.state_block: 300 is not a power of two (64, 128, ..., 4096)");
  run["optimizer"] = {{"name", "adamw"}, {"state_dtype", "q8"}, {"state_block", 8192}};
  CHECK_THAT(run_error(run), Contains("run.json: optimizer.state_block:"));
  run["optimizer"] = {{"name", "grass"}, {"rank", 8}, {"state_dtype", "q8"}};
  CHECK(grass::parse_run_config(run, "run.json").optimizer.state_blocking ==
        grass::StateBlocking::Feature);  // the default
  run["optimizer"]["state_blocking"] = "flat";
  c = grass::parse_run_config(run, "run.json");
  CHECK(c.optimizer.state_blocking == grass::StateBlocking::Flat);
  CHECK(grass::parse_run_config(grass::to_json(c), "").optimizer == c.optimizer);
  run["optimizer"]["state_blocking"] = "row";
  CHECK_THAT(run_error(run), Contains("run.json: optimizer.state_blocking: unknown state_blocking \"row\""));
  run["optimizer"] = {{"name", "adamw"}, {"state_dtype", "q8"}, {"state_blocking", "flat"}};
  CHECK(run_error(run) == "run.json: optimizer.state_blocking: only the projected optimizers' "
                          "states have features to block by");
  run["optimizer"] = {{"name", "grass"}, {"rank", 8}, {"state_blocking", "flat"}};
  CHECK(run_error(run) ==
        "run.json: optimizer.state_blocking: only q8 states (state_dtype \"q8\") have blocks");
  run["optimizer"] = {{"name", "galore"}, {"rank", 8}, {"state_dtype", "q8"}};
  CHECK(grass::parse_run_config(run, "run.json").optimizer.state_dtype == grass::StateDtype::Q8);

  // fp32 and bf16 are the precisions' own moments: the other pairing is refused at resolution
  run["optimizer"] = {{"name", "adamw"}, {"state_dtype", "bf16"}};
  run["precision"] = "bf16-mixed";
  c = grass::parse_run_config(run, "run.json");
  CHECK(user_error([&] { grass::resolve(c, true); }) ==
        "run.json: optimizer.state_dtype \"bf16\": a bf16-mixed run keeps fp32 moments; use "
        "\"auto\", \"fp32\" or \"q8\" (other pairings are not built)");
  run["precision"] = "bf16";
  CHECK(grass::resolve(grass::parse_run_config(run, "run.json"), true).storage.state_bytes == 2);
  run["optimizer"]["state_dtype"] = "fp32";
  CHECK_THAT(user_error([&] { grass::resolve(grass::parse_run_config(run, "run.json"), false); }),
             Contains("a bf16 run keeps bf16 moments"));
}

TEST_CASE("a GPU run with a shape its kernels do not take stops before it starts", "[config]") {
  CHECK(grass::cuda_attention_takes_head_dim(8));
  CHECK(grass::cuda_attention_takes_head_dim(128));
  CHECK(grass::cuda_attention_takes_head_dim(256));
  CHECK_FALSE(grass::cuda_attention_takes_head_dim(36));  // even: the CPU takes it
  CHECK_FALSE(grass::cuda_attention_takes_head_dim(4));
  CHECK_FALSE(grass::cuda_attention_takes_head_dim(264));
  json run = tiny_run();
  run["model"]["hidden_size"] = 144;  // 4 heads of 36
  run["model"]["num_attention_heads"] = 4;
  run["model"]["num_key_value_heads"] = 2;
  run["precision"] = "bf16-mixed";
  grass::RunConfig c = grass::parse_run_config(run, "run.json");
  REQUIRE(c.model.head_dim() == 36);
  c.device = grass::DeviceChoice::Cuda;
  CHECK(user_error([&] { grass::resolve(c, true); }) ==
        "run.json: model.num_attention_heads: head_dim = hidden_size / num_attention_heads = 144 "
        "/ 4 = 36; the CUDA backend's attention takes a multiple of 8 from 8 to 256 (the CPU "
        "backend any even one): change the heads, or run on the CPU (device \"cpu\")");
  c.model_path = "m.json";  // a model file: its own key named
  CHECK_THAT(user_error([&] { grass::resolve(c, true); }),
             Contains("m.json: num_attention_heads: head_dim = "));
  c.device = grass::DeviceChoice::Auto;  // a usable GPU takes bf16-mixed: refused the same way
  CHECK_THAT(user_error([&] { grass::resolve(c, true); }), Contains("= 36; the CUDA backend"));
  c.device = grass::DeviceChoice::Cpu;
  CHECK_FALSE(grass::resolve(c, true).storage.cuda);
  run["model"]["hidden_size"] = 128;  // 4 heads of 32
  c = grass::parse_run_config(run, "run.json");
  c.device = grass::DeviceChoice::Cuda;
  CHECK(grass::resolve(c, true).storage.cuda);
  // the RMSNorm backward's widest row: 70B's 8192 is taken, 12,288 (96 heads of 128) is not
  run["model"]["num_attention_heads"] = 64;
  run["model"]["num_key_value_heads"] = 8;
  run["model"]["hidden_size"] = 8192;
  c = grass::parse_run_config(run, "run.json");
  c.device = grass::DeviceChoice::Cuda;
  CHECK(grass::resolve(c, true).storage.cuda);
  run["model"]["num_attention_heads"] = 96;
  run["model"]["hidden_size"] = 12288;
  c = grass::parse_run_config(run, "run.json");
  c.device = grass::DeviceChoice::Cuda;
  CHECK(user_error([&] { grass::resolve(c, true); }) ==
        "run.json: model.hidden_size: 12288 is wider than the 12256 the CUDA backend's RMSNorm "
        "backward takes (a row's partials in 48 KiB of shared memory): use a narrower model, or "
        "run on the CPU (device \"cpu\")");
  c.device = grass::DeviceChoice::Cpu;
  CHECK_FALSE(grass::resolve(c, true).storage.cuda);
}

TEST_CASE("memory keys: checkpointing, fused updates and the memory limit", "[config][memory]") {
  json run = tiny_run();
  grass::RunConfig c = grass::parse_run_config(run, "");
  CHECK(c.activation_checkpointing == grass::Checkpointing::None);
  CHECK(c.fused_update == grass::Switch::Auto);
  CHECK(c.memory_limit == 0);

  run["activation_checkpointing"] = "layer";
  run["total_batch_size"] = run["micro_batch_size"];
  run["fused_update"] = "on";
  run["memory_limit"] = "40GiB";
  c = grass::parse_run_config(run, "");
  CHECK(c.activation_checkpointing == grass::Checkpointing::Layer);
  CHECK(c.fused_update == grass::Switch::On);
  CHECK(c.memory_limit == int64_t(40) << 30);

  run["activation_checkpointing"] = "elementwise";
  CHECK(grass::parse_run_config(run, "").activation_checkpointing == grass::Checkpointing::Elementwise);
  run["activation_checkpointing"] = "full";
  CHECK(run_error(run) == "run.json: activation_checkpointing: unknown mode \"full\" "
                          "(supported: \"none\", \"elementwise\", \"layer\")");
  run = tiny_run();
  run["micro_batch_size"] = 2;
  run["total_batch_size"] = 4;
  run["fused_update"] = "on";
  CHECK(run_error(run) ==
        "run.json: fused_update: \"on\" needs one micro-batch per step (total_batch_size 4 is 2 "
        "micro-batches of 2): the gradients of several micro-batches must be summed before they "
        "are applied");
  run["fused_update"] = "auto";  // auto simply stays off with accumulation
  CHECK(grass::parse_run_config(run, "").fused_update == grass::Switch::Auto);

  for (const char* bad : {"40 parsecs", "GiB", "-1GiB", "", "1e30GB"}) {
    run["memory_limit"] = bad;
    CHECK_THAT(run_error(run), Contains("run.json: memory_limit: expected a size such as"));
  }
}

TEST_CASE("sampled activations: the keys, their bounds, and checkpointing none only", "[config][sampled]") {
  json run = tiny_run();
  CHECK_FALSE(grass::parse_run_config(run, "").activations.on());
  run["activations"] = {{"sample", "wta-crs"}, {"keep", 0.3}};
  const grass::RunConfig c = grass::parse_run_config(run, "");
  CHECK(c.activations.sample == grass::ActivationSample::WtaCrs);
  CHECK(c.activations.keep == 0.3);
  run["activations"] = {{"sample", "bernoulli"}};
  CHECK(grass::parse_run_config(run, "").activations.keep == 0.5);
  run["activations"] = {{"sample", "rad"}};
  CHECK(run_error(run) == "run.json: activations.sample: unknown sampler \"rad\" (supported: "
                          "\"none\", \"crs\", \"wta-crs\", \"bernoulli\")");
  for (const double keep : {0.0, 1.0, 1.5, -0.2}) {
    run["activations"] = {{"sample", "crs"}, {"keep", keep}};
    CHECK_THAT(run_error(run), Contains("run.json: activations.keep: must be in (0, 1): the share "
                                        "of token rows stored, got"));
  }
  run["activations"] = {{"sample", "crs"}, {"ratio", 0.3}};
  CHECK_THAT(run_error(run), Contains("run.json: activations.ratio: unknown key"));
  run["activations"] = {{"sample", "crs"}};
  run["activation_checkpointing"] = "elementwise";
  CHECK(run_error(run) == "run.json: activations.sample: samples the inputs that only weight "
                          "gradients read, which activation_checkpointing \"elementwise\" does "
                          "not keep: sampling needs \"none\"");
  run["activations"]["sample"] = "none";  // off: any checkpointing
  CHECK(grass::parse_run_config(run, "").activation_checkpointing == grass::Checkpointing::Elementwise);
  run["memory_limit"] = 3.5;
  CHECK_THAT(run_error(run), Contains("got number 3.5"));
}

TEST_CASE("selected columns: the key, and \"on\" refused where nothing is kept",
          "[config][memory]") {
  json run = tiny_run();
  CHECK(grass::parse_run_config(run, "").activations.selected_columns == grass::Switch::Auto);
  run["activations"] = {{"selected_columns", "off"}};
  CHECK(grass::parse_run_config(run, "").activations.selected_columns == grass::Switch::Off);
  run["activations"] = {{"selected_columns", true}};
  CHECK_THAT(run_error(run), Contains("run.json: activations.selected_columns:"));
  run["activations"] = {{"selected_columns", "always"}};
  CHECK_THAT(run_error(run), Contains("run.json: activations.selected_columns: unknown mode"));
  // GRASS selecting gate's and up's input side (ffn > hidden under "auto"): n2 is kept so
  run["activations"] = {{"selected_columns", "on"}};
  run["optimizer"] = {{"name", "grass"}, {"rank", 4}, {"targets", {"gate", "up"}}};
  grass::RunConfig c = grass::parse_run_config(run, "run.json");
  CHECK(grass::inputs_kept_as_columns(c.model, grass::resolve(c, false).memory) ==
        std::array<bool, 3>{false, true, false});
  CHECK_THAT(grass::activations_kept(c.model, grass::resolve(c, false).memory),
             Contains("n2 (gate, up) as the GRASS targets' selected columns"));
  c.activations.selected_columns = grass::Switch::Auto;  // the same where it saves memory
  CHECK(grass::resolve(c, false).memory.columns.rank == 4);
  // ... and "on" is refused where it would keep nothing: up dense, rows, another optimizer
  for (const json& optimizer : {json{{"name", "grass"}, {"rank", 4}, {"targets", {"gate"}}},
                                json{{"name", "grass"}, {"rank", 4}, {"select_dim", "rows"}},
                                json{{"name", "galore"}, {"rank", 4}}}) {
    INFO(optimizer.dump());
    run["optimizer"] = optimizer;
    c = grass::parse_run_config(run, "run.json");
    CHECK_THAT(user_error([&] { grass::resolve(c, false); }),
               Contains("run.json: activations.selected_columns \"on\": no layer input of this "
                        "run is read only by GRASS targets that select columns"));
    c.activations.selected_columns = grass::Switch::Auto;  // auto: whole inputs, no error
    CHECK(grass::inputs_kept_as_columns(c.model, grass::resolve(c, false).memory) ==
          std::array<bool, 3>{});
  }
  run["optimizer"] = {{"name", "grass"}, {"rank", 4}, {"targets", {"gate", "up"}}};
  run["activation_checkpointing"] = "elementwise";
  c = grass::parse_run_config(run, "run.json");
  CHECK_THAT(user_error([&] { grass::resolve(c, false); }), Contains("needs optimizer"));
}

TEST_CASE("memory sizes parse and print back exactly", "[config][memory]") {
  using grass::format_memory_size;
  using grass::parse_memory_size;
  CHECK(parse_memory_size("40GiB") == int64_t(40) << 30);
  CHECK(parse_memory_size("40 GiB") == int64_t(40) << 30);
  CHECK(parse_memory_size("1.5TiB") == int64_t(3) << 39);
  CHECK(parse_memory_size("512MiB") == int64_t(512) << 20);
  CHECK(parse_memory_size("40GB") == int64_t(40'000'000'000));
  CHECK(parse_memory_size("4096") == 4096);
  CHECK(parse_memory_size("12 KB") == 12000);
  CHECK_FALSE(parse_memory_size("12 kb"));
  CHECK_FALSE(parse_memory_size("GiB"));
  CHECK(format_memory_size(int64_t(40) << 30) == "40GiB");
  CHECK(format_memory_size(int64_t(1536) << 20) == "1536MiB");
  CHECK(format_memory_size(40'000'000'000) == "39062500KiB");
  CHECK(format_memory_size(40'000'000'001) == "40000000001B");
  for (const int64_t bytes : {int64_t(1), int64_t(1000), int64_t(3) << 39, int64_t(12345) << 10})
    CHECK(parse_memory_size(format_memory_size(bytes)) == bytes);
}

TEST_CASE("to_json round-trips through parse_run_config", "[config]") {
  const InDirectory root(kSource);
  grass::RunConfig original = grass::load_run_config(
      "configs/runs/quickstart.json", {"data.train=[\"a.bin\",\"b.bin\"]", "seed=7",
                                       "schedule.min_lr_ratio=0.05", "optimizer.weight_decay=0.1"});
  original.model.tie_word_embeddings = true;
  original.model.rope_theta = 500000.0;
  original.checkpoint_every = 250;
  original.checkpoint_keep = 5;
  original.checkpoint_keep_every = 1000;
  original.activation_checkpointing = grass::Checkpointing::Layer;
  original.fused_update = grass::Switch::Off;
  original.memory_limit = int64_t(40) << 30;

  const json written = grass::to_json(original);
  CHECK(written["model"]["hidden_size"] == 128);  // the model is inline: config.json stands alone
  const std::string path = write_temp_file("config.json", written.dump(2));
  grass::RunConfig reloaded = grass::load_run_config(path);

  CHECK(reloaded.source == path);
  CHECK(reloaded.model_path.empty());
  reloaded.source = original.source;
  reloaded.model_path = original.model_path;
  CHECK(reloaded == original);
  CHECK(grass::to_json(reloaded) == written);

  original.activation_checkpointing = grass::Checkpointing::None;  // what sampling needs
  original.activations = {grass::ActivationSample::Bernoulli, 0.25};
  const std::string sampled = write_temp_file("config.json", grass::to_json(original).dump(2));
  CHECK(grass::load_run_config(sampled).activations == original.activations);
  original.activations = {};
  original.activations.selected_columns = grass::Switch::Off;
  const std::string whole = write_temp_file("config.json", grass::to_json(original).dump(2));
  CHECK(grass::load_run_config(whole).activations == original.activations);
}

TEST_CASE("grass optimizer keys are read and checked against the model", "[config]") {
  json run = tiny_run();
  run["optimizer"] = {{"name", "grass"},        {"rank", 16},         {"update_interval", 50},
                      {"scale", 0.5},           {"selection", "multinomial_nr"},
                      {"select_dim", "cols"},   {"targets", {"q", "down"}}};
  const grass::RunConfig c = grass::parse_run_config(run, "run.json");
  CHECK(c.optimizer.projection.rank == 16);
  CHECK(c.optimizer.projection.update_interval == 50);
  CHECK(c.optimizer.projection.scale == 0.5);
  CHECK(c.optimizer.projection.selection == grass::Selection::MultinomialNR);
  CHECK(c.optimizer.projection.targets ==
        std::vector<grass::ProjectionTarget>{grass::ProjectionTarget::Q, grass::ProjectionTarget::Down});
  CHECK(c.optimizer.projection.seed == c.seed);  // the selection seed defaults to the run's
  // the round trip keeps every grass key
  CHECK(grass::parse_run_config(grass::to_json(c), "") .optimizer == c.optimizer);

  // tiny model: q is 64 x 64, k and v 32 x 64, gate 172 x 64; auto selects the smaller side
  run["optimizer"] = {{"name", "grass"}, {"rank", 65}};
  CHECK(run_error(run) == "run.json: optimizer.rank: 65 exceeds the 32 selectable rows of target "
                          "k (32 x 64, select_dim auto), the narrowest target: a rank up to 32 fits "
                          "them all (--set optimizer.rank=32)");
  // a default rank that does not fit says it is the default
  run["optimizer"] = {{"name", "galore"}, {"targets", {"gate", "q"}}};
  run["model"]["hidden_size"] = 32;
  run["model"]["intermediate_size"] = 100;
  run["model"]["num_attention_heads"] = 2;
  run["model"]["num_key_value_heads"] = 2;
  CHECK(run_error(run) == "run.json: optimizer.rank: 128 (galore's default) exceeds the 32 "
                          "projected columns of target gate (100 x 32), the narrowest target: a rank "
                          "up to 32 fits them all (--set optimizer.rank=32)");
  run = tiny_run();
  run["optimizer"] = {{"name", "grass"}, {"rank", 100}, {"select_dim", "rows"}, {"targets", {"gate"}}};
  CHECK(grass::parse_run_config(run, "run.json").optimizer.projection.rank == 100);  // 172 rows
  run["optimizer"] = {{"name", "grass"}, {"targets", {"q", "mlp"}}};
  CHECK(run_error(run) == "run.json: optimizer.targets[1]: unknown target \"mlp\" (supported: "
                          "\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\")");
  run["optimizer"] = {{"name", "grass"}, {"selection", "topk"}};
  CHECK(run_error(run) == "run.json: optimizer.selection: unknown selection \"topk\" (supported: "
                          "\"top_r\", \"multinomial\", \"multinomial_nr\", \"uniform\", "
                          "\"uniform_nr\")");
  run["optimizer"] = {{"name", "adamw"}, {"rank", 8}};
  CHECK(run_error(run) ==
        "run.json: optimizer.rank: only the projected optimizers (grass, galore, flora) use this key");

  // target_lr_scale: AdamW's version of GRASS's learning-rate split
  run["optimizer"] = {{"name", "adamw"}, {"target_lr_scale", 0.25}};
  const grass::RunConfig split = grass::parse_run_config(run, "run.json");
  CHECK(split.optimizer.target_lr_scale == 0.25);
  CHECK(grass::parse_run_config(grass::to_json(split), "").optimizer == split.optimizer);
  run["optimizer"] = {{"name", "adamw"}};
  CHECK(grass::to_json(grass::parse_run_config(run, "run.json"))["optimizer"].count("target_lr_scale") == 0);
  run["optimizer"] = {{"name", "adamw"}, {"target_lr_scale", 0}};
  CHECK(run_error(run) == "run.json: optimizer.target_lr_scale: must be positive, got 0");
  run["optimizer"] = {{"name", "grass"}, {"target_lr_scale", 0.5}};
  CHECK(run_error(run) == "run.json: optimizer.target_lr_scale: only adamw uses this key (the "
                          "projected optimizers' `scale` sets their targets' learning rate)");

  // FLORA bounds its update's RMS as flora-opt does (clip_threshold 1), 0 turns it off
  run["optimizer"] = {{"name", "flora"}, {"rank", 8}};
  const grass::RunConfig flora = grass::parse_run_config(run, "run.json");
  CHECK(flora.optimizer.projection.max_update_rms == 1.0);
  CHECK(grass::parse_run_config(grass::to_json(flora), "").optimizer == flora.optimizer);
  run["optimizer"] = {{"name", "flora"}, {"rank", 8}, {"max_update_rms", 0}};
  CHECK(grass::parse_run_config(run, "run.json").optimizer.projection.max_update_rms == 0.0);
  run["optimizer"] = {{"name", "flora"}, {"rank", 8}, {"max_update_rms", -1}};
  CHECK(run_error(run) ==
        "run.json: optimizer.max_update_rms: must be non-negative (0: unbounded), got -1");
  run["optimizer"] = {{"name", "galore"}, {"rank", 8}, {"max_update_rms", 1}};
  CHECK(run_error(run) == "run.json: optimizer.max_update_rms: only the flora optimizer uses this key");
  run["optimizer"] = {{"name", "galore"}, {"rank", 8}};
  CHECK(grass::parse_run_config(run, "run.json").optimizer.projection.max_update_rms == 0.0);

  // GaLore's refresh: "auto" by default, its range finder's parameters, round trip; others refuse
  run["optimizer"] = {{"name", "galore"}, {"rank", 8}};
  CHECK(grass::parse_run_config(run, "run.json").optimizer.projection.svd == grass::GaloreSvd::Auto);
  run["optimizer"] = {{"name", "galore"}, {"rank", 8}, {"svd", "randomized"},
                      {"svd_power_iters", 3}, {"svd_oversample", 16}};
  const grass::RunConfig randomized = grass::parse_run_config(run, "run.json");
  CHECK(randomized.optimizer.projection.svd == grass::GaloreSvd::Randomized);
  CHECK(randomized.optimizer.projection.svd_power_iters == 3);
  CHECK(randomized.optimizer.projection.svd_oversample == 16);
  CHECK(grass::parse_run_config(grass::to_json(randomized), "").optimizer == randomized.optimizer);
  run["optimizer"] = {{"name", "galore"}, {"rank", 8}, {"svd", "qr"}};
  CHECK(run_error(run) ==
        "run.json: optimizer.svd: unknown svd \"qr\" (supported: \"auto\", \"exact\", \"randomized\")");
  run["optimizer"] = {{"name", "grass"}, {"rank", 8}, {"svd", "exact"}};
  CHECK(run_error(run) == "run.json: optimizer.svd: only the galore optimizer uses this key");
  // svd_batch: "none" by default, "layer" round-trips; not with the exact SVD, nor with streamed
  // layers (its refresh pass would fetch them once more)
  CHECK(randomized.optimizer.projection.svd_batch == grass::GaloreSvdBatch::None);
  run["optimizer"] = {{"name", "galore"}, {"rank", 8}, {"svd_batch", "layer"}};
  const grass::RunConfig batched = grass::parse_run_config(run, "run.json");
  CHECK(batched.optimizer.projection.svd_batch == grass::GaloreSvdBatch::Layer);
  CHECK(grass::parse_run_config(grass::to_json(batched), "").optimizer == batched.optimizer);
  run["optimizer"] = {{"name", "galore"}, {"rank", 8}, {"svd_batch", "all"}};
  CHECK(run_error(run) ==
        "run.json: optimizer.svd_batch: unknown svd_batch \"all\" (supported: \"none\", \"layer\")");
  run["optimizer"] = {{"name", "galore"}, {"rank", 8}, {"svd", "exact"}, {"svd_batch", "layer"}};
  CHECK(run_error(run) == "run.json: optimizer.svd_batch: \"layer\" batches the randomized "
                          "refresh's eigenproblems, and optimizer.svd \"exact\" has none: use "
                          "\"none\"");
  run["optimizer"] = {{"name", "galore"}, {"rank", 8}, {"svd_batch", "layer"}};
  run["precision"] = "bf16";
  run["offload"] = {{"layers", 1}};
  CHECK(run_error(run) == "run.json: offload.layers: does not stream with GaLore's "
                          "optimizer.svd_batch \"layer\" yet (its refresh pass would fetch every "
                          "streamed layer once more): use \"none\"");
  run.erase("precision");
  run.erase("offload");
  run["optimizer"] = {{"name", "grass"}, {"rank", 8}, {"svd_batch", "layer"}};
  CHECK(run_error(run) == "run.json: optimizer.svd_batch: only the galore optimizer uses this key");

  // refresh_stagger: GRASS's and GaLore's, round trip; FLORA and AdamW refuse it
  for (const char* name : {"grass", "galore"}) {
    run["optimizer"] = {{"name", name}, {"rank", 8}, {"refresh_stagger", true}};
    const grass::RunConfig staggered = grass::parse_run_config(run, "run.json");
    CHECK(staggered.optimizer.projection.refresh_stagger);
    CHECK(grass::parse_run_config(grass::to_json(staggered), "").optimizer == staggered.optimizer);
  }
  run["optimizer"] = {{"name", "flora"}, {"rank", 8}, {"refresh_stagger", true}};
  CHECK(run_error(run) ==
        "run.json: optimizer.refresh_stagger: only the grass and galore optimizers use this key");
  run["optimizer"] = {{"name", "adamw"}, {"refresh_stagger", false}};
  CHECK(run_error(run) ==
        "run.json: optimizer.refresh_stagger: only the grass and galore optimizers use this key");
  run["optimizer"] = {{"name", "galore"}, {"rank", 8}};

  // eps: galore_torch's 1e-6 for GaLore, torch's 1e-8 for the rest; a given eps wins
  CHECK(grass::parse_run_config(run, "run.json").optimizer.eps == 1e-6);
  run["optimizer"] = {{"name", "galore"}, {"rank", 8}, {"eps", 1e-8}};
  CHECK(grass::parse_run_config(run, "run.json").optimizer.eps == 1e-8);
  for (const char* name : {"adamw", "grass", "flora"}) {
    run["optimizer"] = {{"name", name}};
    if (std::string(name) != "adamw") run["optimizer"]["rank"] = 8;
    CHECK(grass::parse_run_config(run, "run.json").optimizer.eps == 1e-8);
  }

  // proximal: AdamW's inner loop is inner_steps, GRASS's its refresh interval; round trip
  run["optimizer"] = {{"name", "adamw"}, {"proximal", {{"lambda", 1e-4}, {"inner_steps", 10}}}};
  const grass::RunConfig prox = grass::parse_run_config(run, "run.json");
  CHECK(prox.optimizer.proximal == grass::ProximalConfig{1e-4, 10});
  CHECK(grass::parse_run_config(grass::to_json(prox), "").optimizer == prox.optimizer);
  run["optimizer"] = {{"name", "grass"}, {"rank", 8}, {"update_interval", 40},
                      {"proximal", {{"lambda", 1e-4}}}};
  const grass::RunConfig grass_prox = grass::parse_run_config(run, "run.json");
  CHECK(grass_prox.optimizer.proximal == grass::ProximalConfig{1e-4, 40});
  CHECK(grass::parse_run_config(grass::to_json(grass_prox), "").optimizer == grass_prox.optimizer);
  run["optimizer"]["proximal"]["inner_steps"] = 10;
  CHECK(run_error(run) == "run.json: optimizer.proximal.inner_steps: 10: GRASS's inner loop is its "
                          "refresh interval (update_interval 40); leave inner_steps out");
  run["optimizer"] = {{"name", "adamw"}, {"proximal", {{"lambda", 1e-4}}}};
  CHECK(run_error(run) == "run.json: optimizer.proximal.inner_steps: required key is missing");
  run["optimizer"] = {{"name", "adamw"}, {"proximal", {{"lambda", 0}, {"inner_steps", 10}}}};
  CHECK(run_error(run) == "run.json: optimizer.proximal.lambda: must be positive, got 0");
  run["optimizer"] = {{"name", "adamw"}, {"proximal", {{"lambda", 1}, {"inner", 10}}}};
  CHECK_THAT(run_error(run), Catch::Matchers::StartsWith("run.json: optimizer.proximal.inner: unknown key"));
  run["optimizer"] = {{"name", "galore"}, {"rank", 8}, {"proximal", {{"lambda", 1e-4}}}};
  CHECK(run_error(run) ==
        "run.json: optimizer.proximal: the proximal method is built for adamw and grass, not galore");
  run["optimizer"] = {{"name", "adamw"}};
  CHECK(!grass::parse_run_config(run, "run.json").optimizer.proximal.enabled());
  CHECK(grass::to_json(grass::parse_run_config(run, "run.json"))["optimizer"].count("proximal") == 0);
}
