// Checkpoints: a resumed run continues bit for bit (losses, weights, optimizer state,
// metrics.jsonl), damaged checkpoints are caught by their manifest and skipped, interrupted writes
// leave nothing under a final name, and old checkpoints are pruned as configured.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/config/config.h"
#include "src/io/checkpoint.h"
#include "src/io/safetensors.h"
#include "src/train/checkpointing.h"
#include "src/train/metrics.h"
#include "src/train/run_resolution.h"
#include "src/train/trainer.h"
#include "src/train/training_state.h"
#include "tests/test_util.h"

using namespace grass;
using Catch::Matchers::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using test::read_bytes;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::vector<json> read_rows(const std::string& path) {
  std::vector<json> rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
  return rows;
}

// A small run on a random shard in `dir`: 2 micro-batches per step, shuffled, prefetching.
// "grass-lean": GRASS in pure bf16 with one micro-batch per step and per-layer checkpointing, so
// its updates are fused into the backward. "-padded": an ffn of 44 stored 48 wide (pad_ffn).
// "-proximal": the small-batch proximal method, inner loops of 3 steps (GRASS's refresh interval).
// "-q8": 8-bit moments in blocks of 64 on a model of width 64, so the embedding, lm_head and
// every GRASS target but k and v (32 x 64) are quantized (GRASS's per feature when lean); the
// smaller tensors keep the precision's moments. "-sampled": sampled activations at keep 0.4.
// "-batched": GaLore's randomized refresh with its refresh pass (svd_batch "layer").
json small_run(const test::TempDir& dir, const std::string& out, std::string optimizer) {
  const auto suffix = [&](const std::string& tail) {
    if (!optimizer.ends_with(tail)) return false;
    optimizer.resize(optimizer.size() - tail.size());
    return true;
  };
  const bool q8 = suffix("-q8");
  const bool sampled = suffix("-sampled");
  const bool proximal = suffix("-proximal");
  const bool padded = suffix("-padded");
  const bool batched = suffix("-batched");  // GaLore's refresh pass (svd_batch "layer")
  const bool lean = optimizer == "grass-lean";
  if (lean) optimizer = "grass";
  const std::string shard = dir.file("train.bin");
  if (!fs::exists(shard)) test::write_shard(shard, test::random_tokens(6000, 128, 11), {.vocab_size = 128});
  json run = {{"model", {{"hidden_size", 32}, {"intermediate_size", 40}, {"num_attention_heads", 4},
                         {"num_key_value_heads", 2}, {"num_hidden_layers", 2}, {"vocab_size", 128},
                         {"max_position_embeddings", 32}}},
              {"data", {{"train", shard}, {"val", shard}}},
              {"optimizer", {{"name", optimizer}, {"lr", 3e-3}, {"weight_decay", 0.1}}},
              {"schedule", {{"name", "cosine"}, {"warmup_steps", 2}}},
              {"micro_batch_size", 2}, {"total_batch_size", 4}, {"seq_len", 16}, {"steps", 9},
              {"eval_every", 3}, {"eval_tokens", 64}, {"log_every", 100},
              {"checkpoint_every", 2}, {"checkpoint_keep", 100},
              {"out_dir", dir.file(out)}};
  if (optimizer == "grass")
    run["optimizer"].update({{"rank", 4}, {"update_interval", 3}, {"selection", "multinomial"}});
  if (optimizer == "galore" || optimizer == "flora")  // an SVD at steps 0, 3, 6; FLORA resamples at 2, 5, 8
    run["optimizer"].update({{"rank", 4}, {"update_interval", 3}});
  if (lean)
    run.update({{"precision", "bf16"}, {"total_batch_size", 2}, {"activation_checkpointing", "layer"}});
  if (proximal) {
    run["optimizer"]["proximal"] = {{"lambda", 1e-3}};
    if (optimizer == "adamw") run["optimizer"]["proximal"]["inner_steps"] = 3;
  }
  if (q8) {
    run["optimizer"].update({{"state_dtype", "q8"}, {"state_block", 64}});
    run["model"].update({{"hidden_size", 64}, {"intermediate_size", 128}});
    if (optimizer == "grass") run["optimizer"]["state_blocking"] = lean ? "feature" : "flat";
    if (optimizer == "flora") run["optimizer"]["state_blocking"] = "feature";
  }
  if (sampled)  // draws on every step but GRASS's refreshes: resumed, the same rows again
    run["activations"] = {{"sample", optimizer == "grass" ? "wta-crs" : "bernoulli"}, {"keep", 0.4}};
  if (padded) {
    run["model"]["intermediate_size"] = 44;
    run["pad_ffn"] = "on";
  }
  if (batched) run["optimizer"].update({{"svd", "randomized"}, {"svd_batch", "layer"}});
  return run;
}

RunConfig parse(const json& run) { return parse_run_config(run, ""); }

// The checkpoint directory of `step` in a run's out_dir.
std::string step_dir(const RunConfig& cfg, int64_t step) {
  return checkpoint_root(cfg) + "/" + checkpoint_dir_name(step);
}

}  // namespace

TEST_CASE("a resumed run continues bit for bit and so does metrics.jsonl", "[checkpoint][train]") {
  const std::string optimizer =
      GENERATE(as<std::string>{}, "adamw", "grass", "grass-lean", "galore", "flora",
               "adamw-padded", "grass-lean-padded", "adamw-proximal", "grass-proximal",
               "grass-lean-proximal", "adamw-q8", "adamw-proximal-q8", "grass-q8",
               "grass-lean-q8", "grass-proximal-q8", "galore-q8", "flora-q8", "adamw-sampled",
               "grass-sampled", "galore-batched");
  const test::TempDir dir("grass_test_checkpoint");
  const RunConfig whole = parse(small_run(dir, "whole", optimizer));
  CHECK(model_memory_options(whole, storage_for(whole.precision, false)).fused_update ==
        optimizer.starts_with("grass-lean"));
  const TrainResult uninterrupted = train(whole);
  REQUIRE(uninterrupted.losses.size() == 9);
  int64_t clipped_rows = 0;  // every step's row has its clipping coefficient; the result counts them
  for (const json& row : read_rows(whole.out_dir + "/metrics.jsonl")) {
    if (row.contains("eval")) continue;
    REQUIRE(row.contains("clip_coef"));
    CHECK(row["clip_coef"].get<double>() > 0);
    CHECK(row["clip_coef"].get<double>() <= 1);
    clipped_rows += row["clip_coef"].get<double>() < 1;
  }
  CHECK(clipped_rows == uninterrupted.clipped_steps);
  if (optimizer.ends_with("-q8")) {  // the codes and absmax are checkpointed buffers
    const SafetensorsFile buffers(step_dir(whole, 9) + "/state.safetensors");
    const std::vector<std::string> names = buffers.names();
    const auto holds = [&](const std::string& name) {
      return std::find(names.begin(), names.end(), name) != names.end();
    };
    CHECK(holds("adamw.m_q8"));
    CHECK(holds("adamw.v_absmax"));
    if (optimizer != "adamw-q8" && optimizer != "adamw-proximal-q8") {
      const std::string kind = optimizer.substr(0, optimizer.find('-'));
      CHECK(holds("model.layers.1.mlp.down_proj.weight." + kind + ".v_q8"));
      CHECK(holds("model.layers.1.mlp.down_proj.weight." + kind + ".m_absmax"));
      CHECK(holds("model.layers.1.self_attn.k_proj.weight." + kind + ".m"));  // 2,048 elements
    }
  }
  if (optimizer.ends_with("-padded")) {  // the checkpoint holds Hugging Face's shapes, not the pad
    const SafetensorsFile weights(step_dir(whole, 9) + "/model.safetensors");
    CHECK(weights.get("model.layers.1.mlp.down_proj.weight").shape == std::vector<int64_t>{32, 44});
    CHECK(weights.get("model.layers.1.mlp.up_proj.weight").shape == std::vector<int64_t>{44, 32});
  }

  // Resume after step 4 (inside a GRASS selection interval of 3) and after step 6 (a refresh is
  // the next step), each in a fresh out_dir holding that checkpoint and the whole run's metrics,
  // as a crash after step 9 would leave them, plus a half-written row.
  for (const int64_t at : {4, 6}) {
    INFO(optimizer << ", resumed after step " << at);
    const RunConfig resumed = parse(small_run(dir, "resumed" + std::to_string(at), optimizer));
    fs::create_directories(checkpoint_root(resumed));
    fs::copy(step_dir(whole, at), step_dir(resumed, at));
    fs::copy_file(whole.out_dir + "/metrics.jsonl", resumed.out_dir + "/metrics.jsonl");
    std::ofstream(resumed.out_dir + "/metrics.jsonl", std::ios::app) << "{\"step\": 10, \"lo";

    const TrainResult rest = train(resumed);
    CHECK(rest.first_step == at);
    CHECK(rest.resumed_from == step_dir(resumed, at));
    REQUIRE(rest.losses.size() == size_t(9 - at));
    for (size_t i = 0; i < rest.losses.size(); i++) CHECK(rest.losses[i] == uninterrupted.losses[at + i]);
    for (const char* file : {"model.safetensors", "state.safetensors", "state.json"})
      CHECK(read_bytes(step_dir(resumed, 9) + "/" + file) == read_bytes(step_dir(whole, 9) + "/" + file));
    REQUIRE(rest.final_eval.has_value());
    CHECK(rest.final_eval->loss == uninterrupted.final_eval->loss);

    // The same rows, in the same order, with the same values (timings aside).
    const std::vector<json> a = read_rows(whole.out_dir + "/metrics.jsonl");
    const std::vector<json> b = read_rows(resumed.out_dir + "/metrics.jsonl");
    REQUIRE(a.size() == b.size());
    CHECK(a.size() == 9 + 3);  // a row per step and an evaluation every 3 steps
    for (size_t i = 0; i < a.size(); i++) {
      CHECK(a[i]["step"] == b[i]["step"]);
      for (const char* key : {"loss", "lr", "grad_norm", "clip_coef", "tokens", "val_loss", "eval"})
        CHECK(a[i].value(key, json()) == b[i].value(key, json()));
    }
  }
}

TEST_CASE("metrics.jsonl is cut after the checkpoint's step", "[checkpoint]") {
  const test::TempDir dir("grass_test_checkpoint");
  const std::string path = dir.file("metrics.jsonl");
  write_bytes(path, "{\"step\":1,\"loss\":5}\n{\"step\":2,\"loss\":4}\n{\"step\":2,\"eval\":true}\n"
                    "{\"step\":3,\"loss\":3}\n{\"step\":4,\"loss\":2}\n{\"step\":5,\"lo");
  CHECK(truncate_metrics_after(path, 2) == 3);
  CHECK(read_bytes(path) == "{\"step\":1,\"loss\":5}\n{\"step\":2,\"loss\":4}\n{\"step\":2,\"eval\":true}\n");
  CHECK(truncate_metrics_after(path, 0) == 0);
  CHECK(read_bytes(path).empty());
  CHECK(truncate_metrics_after(dir.file("absent.jsonl"), 3) == 0);
  write_bytes(path, "{\"step\":1}\n{\"step\":2}");  // a last row cut short by a kill
  CHECK(truncate_metrics_after(path, 10) == 1);
  CHECK(read_bytes(path) == "{\"step\":1}\n");
}

TEST_CASE("damaged checkpoints are named and the previous complete one is used",
          "[checkpoint]") {
  const test::TempDir dir("grass_test_checkpoint");
  json run = small_run(dir, "out", "adamw");
  run["steps"] = 3;
  run["checkpoint_every"] = 1;
  const RunConfig cfg = parse(run);
  train(cfg);
  const std::string root = checkpoint_root(cfg);
  CHECK(newest_valid_checkpoint(root, false)->step() == 3);

  // A flipped byte: the checksum catches it, and the file is named.
  const std::string state3 = step_dir(cfg, 3) + "/state.safetensors";
  std::string bytes = read_bytes(state3);
  bytes[bytes.size() / 2] ^= 0x10;
  write_bytes(state3, bytes);
  CHECK_THAT(test::user_error_of([&] { Checkpoint c(step_dir(cfg, 3)); }),
             Contains(state3 + ": checksum mismatch"));
  CHECK(newest_valid_checkpoint(root, false)->step() == 2);
  // Named explicitly, a damaged checkpoint is an error, not a fallback.
  CHECK_THAT(test::user_error_of([&] { newest_valid_checkpoint(step_dir(cfg, 3), true); }),
             Contains(state3));

  // A truncated file.
  const std::string model2 = step_dir(cfg, 2) + "/model.safetensors";
  bytes = read_bytes(model2);
  write_bytes(model2, bytes.substr(0, bytes.size() - 100));
  CHECK_THAT(test::user_error_of([&] { Checkpoint c(step_dir(cfg, 2)); }),
             Contains(model2 + ": " + std::to_string(bytes.size() - 100) +
                      " bytes, but manifest.json records " + std::to_string(bytes.size())));

  // A training run resumes from the one complete checkpoint, and the warnings name the others.
  const TrainResult resumed = train(cfg);
  CHECK(resumed.first_step == 1);
  CHECK(resumed.losses.size() == 2);
  CHECK(newest_valid_checkpoint(root, false)->step() == 3);  // rewritten

  // No manifest: incomplete. When nothing verifies, the run stops rather than start afresh.
  for (int64_t s : {1, 2, 3}) fs::remove(step_dir(cfg, s) + "/manifest.json");
  CHECK_THAT(test::user_error_of([&] { Checkpoint c(step_dir(cfg, 1)); }),
             Contains("manifest.json: missing: the checkpoint is incomplete"));
  CHECK_THAT(test::user_error_of([&] { newest_valid_checkpoint(root, false); }),
             Contains(root + ": every checkpoint fails verification"));
  CHECK_THAT(test::user_error_of([&] { train(cfg); }), Contains("every checkpoint fails verification"));
}

TEST_CASE("a checkpoint of another model or optimizer is refused naming what differs",
          "[checkpoint]") {
  const test::TempDir dir("grass_test_checkpoint");
  json run = small_run(dir, "out", "grass");
  run["steps"] = 2;
  train(parse(run));

  // Rerun into its out_dir, another config is another run (train/out_dir.h); resumed from the
  // checkpoint by name, the checkpoint's contents are what refuses it.
  const TrainOptions resume_out{.resume = dir.file("out")};
  json other = run;
  other["model"]["intermediate_size"] = 48;
  CHECK_THAT(test::user_error_of([&] { train(parse(other)); }),
             Contains("out_dir holds another run (model.intermediate_size is 40 there, 48 here)"));
  CHECK_THAT(test::user_error_of([&] { train(parse(other), resume_out); }),
             Contains("model.safetensors: tensor model.layers.0.mlp.gate_proj.weight is F32 [40, "
                      "32], this run needs F32 [48, 32]") &&
                 Contains("does not fit this run"));
  json adamw = run;
  adamw["optimizer"] = {{"name", "adamw"}};
  CHECK_THAT(test::user_error_of([&] { train(parse(adamw), resume_out); }),
             Contains("state.safetensors: buffer adamw.m is U8") && Contains("does not fit"));
  json adamw_q8 = adamw;
  adamw_q8["optimizer"]["state_dtype"] = "q8";
  adamw_q8["out_dir"] = dir.file("q8");
  train(parse(adamw_q8));
  json adamw_fp32 = adamw_q8;
  adamw_fp32["optimizer"].erase("state_dtype");
  CHECK_THAT(test::user_error_of([&] { train(parse(adamw_fp32), {.resume = dir.file("q8")}); }),
             Contains("state.json: holds q8 (blocks of 256; tensors under 4096 elements: fp32) "
                      "optimizer states, this run's are fp32"));
  json fewer_targets = run;
  fewer_targets["optimizer"]["targets"] = {"q", "k"};
  CHECK_THAT(test::user_error_of([&] { train(parse(fewer_targets), resume_out); }),
             Contains("state.safetensors") && Contains("does not fit"));
}

namespace {

// What `run` writes to stderr (fd 2), its own writes and the process's alike.
std::string stderr_of(const std::function<void()>& run, const std::string& file) {
  std::fflush(stderr);
  const int saved = dup(2);
  const int to = open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE((saved >= 0 && to >= 0));
  dup2(to, 2);
  close(to);
  try {
    run();
  } catch (...) {
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    throw;
  }
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  return test::read_bytes(file);
}

}  // namespace

TEST_CASE("a checkpoint records the attention kernels, and a resume on others warns",
          "[checkpoint]") {
  const test::TempDir dir("grass_test_checkpoint");
  json run = small_run(dir, "out", "adamw");
  run["steps"] = 2;
  run["eval_every"] = 0;
  const RunConfig cfg = parse(run);
  train(cfg);  // the CPU: the engine's kernels (its reference)
  const Checkpoint made(step_dir(cfg, 2));
  const json state = made.read_json("state.json");
  CHECK(state["attention"] == json{{"kernel", "grass"}});
  CHECK(made.read_json("config.json")["attention"] == "auto");  // as given
  for (const json& row : read_rows(cfg.out_dir + "/metrics.jsonl"))
    if (row.contains("grad_norm")) CHECK(row["attention"] == "grass");

  std::mt19937_64 rng(std::random_device{}());
  const int64_t v1 = 90000 + int64_t(rng() % 2000), v2 = v1 + 1 + int64_t(rng() % 100);
  const AttentionInUse engine{}, cudnn1{AttentionKernel::Cudnn, v1, ""},
      cudnn2{AttentionKernel::Cudnn, v2, ""};
  CHECK(attention_resume_warning(made, state, engine).empty());
  CHECK(attention_resume_warning(made, state, cudnn1) ==
        "resuming on cuDNN " + cudnn_version_name(v1) + "'s attention, but checkpoint " +
            made.dir() + " was made on the engine's attention kernels: the two compute other "
            "bits, so the run will not match an uninterrupted one");
  json on_cudnn = state;
  on_cudnn["attention"] = {{"kernel", "cudnn"}, {"cudnn_version", v1}};
  CHECK(attention_resume_warning(made, on_cudnn, cudnn1).empty());
  CHECK_THAT(attention_resume_warning(made, on_cudnn, cudnn2),
             Contains("resuming on cuDNN " + cudnn_version_name(v2) + "'s attention") &&
                 Contains("was made on cuDNN " + cudnn_version_name(v1) + "'s attention"));
  CHECK_THAT(attention_resume_warning(made, on_cudnn, engine),
             Contains("resuming on the engine's attention kernels"));
  json on_mma = state;
  on_mma["attention"] = {{"kernel", "mma"}};
  const AttentionInUse mma{AttentionKernel::Mma, 0, ""};
  CHECK(attention_resume_warning(made, on_mma, mma).empty());
  CHECK_THAT(attention_resume_warning(made, on_mma, engine),
             Contains("was made on the engine's FA2-style (mma) attention"));
  // Before the record, the kernels config.json named ("auto" there says nothing: unknown)
  json unrecorded = state;
  unrecorded.erase("attention");
  CHECK(attention_resume_warning(made, unrecorded, cudnn1).empty());
  // and a record that is not one is no record (state.json is a file anyone may edit)
  unrecorded["attention"] = {{"kernel", 7}};
  CHECK(attention_resume_warning(made, unrecorded, cudnn1).empty());

  // The head's chunk: the CPU's head takes the micro-batch's rows at once; a GPU's chunk
  // (memory_limit may choose it) sums lm_head's gradient in its own order
  const int64_t rows = cfg.micro_batch_size * int64_t(cfg.seq_len);
  CHECK(state["head_rows"] == rows);
  CHECK(head_rows_resume_warning(made, state, rows).empty());
  CHECK(head_rows_resume_warning(made, state, rows + 1) ==
        "resuming with the head's logits " + std::to_string(rows + 1) + " rows at a time, but "
        "checkpoint " + made.dir() + " was made with " + std::to_string(rows) +
        " (memory_limit chooses it on a GPU): lm_head's gradient sums in another order, so the "
        "run will not match an uninterrupted one");
  json no_record = state;
  no_record.erase("head_rows");
  CHECK(head_rows_resume_warning(made, no_record, rows + 1).empty());

  // A resume from a checkpoint made on cuDNN's kernels onto the engine's warns and trains on
  const std::string root = dir.file("from_cudnn/checkpoints");
  {
    CheckpointWriter writer(root, 2);
    for (const std::string file : {"model.safetensors", "state.safetensors", "config.json"})
      writer.copy_file(file, made.path(file));
    writer.write_json("state.json", on_cudnn);
    writer.commit();
  }
  json resumed = run;
  resumed["steps"] = 3;
  resumed["out_dir"] = dir.file("resumed");
  TrainResult result;
  const std::string err = stderr_of(
      [&] { result = train(parse(resumed), {.resume = dir.file("from_cudnn")}); },
      dir.file("stderr.txt"));
  CHECK(result.first_step == 2);
  CHECK(result.losses.size() == 1);
  CHECK_THAT(err, Contains("warning: resuming on the engine's attention kernels, but checkpoint " +
                           root + "/step_00000002 was made on cuDNN " + cudnn_version_name(v1) +
                           "'s attention: the two compute other bits"));
  // and none where they are the same
  resumed["out_dir"] = dir.file("resumed_same");
  const std::string same = stderr_of(
      [&] { train(parse(resumed), {.resume = step_dir(cfg, 2)}); }, dir.file("stderr2.txt"));
  CHECK_THAT(same, !Contains("attention"));
}

TEST_CASE("resuming from an older checkpoint beside newer ones is refused", "[checkpoint]") {
  const test::TempDir dir("grass_test_checkpoint");
  json run = small_run(dir, "out", "adamw");
  run["steps"] = 4;
  const RunConfig cfg = parse(run);
  train(cfg);
  CHECK_THAT(test::user_error_of([&] { train(cfg, {.resume = step_dir(cfg, 2)}); }),
             Contains(step_dir(cfg, 4) + ": a later checkpoint than " + step_dir(cfg, 2)));
  // A finished run has nothing left to do, and says so.
  CHECK_THAT(test::user_error_of([&] { train(cfg); }),
             Contains(cfg.out_dir + ": out_dir holds this run, finished: its newest complete "
                      "checkpoint is at step 4 of steps 4"));
  // --resume from another run's checkpoint, into a fresh out_dir.
  run["out_dir"] = dir.file("branch");
  const TrainResult branch = train(parse(run), {.resume = step_dir(cfg, 2)});
  CHECK(branch.first_step == 2);
  CHECK(read_bytes(dir.file("branch/checkpoints/step_00000004/model.safetensors")) ==
        read_bytes(step_dir(cfg, 4) + "/model.safetensors"));
}

TEST_CASE("old checkpoints are pruned: the last k and every Nth forever", "[checkpoint]") {
  CHECK(checkpoints_to_prune({1, 2, 3, 4, 5}, 2, 0) == std::vector<int64_t>{3, 2, 1});
  CHECK(checkpoints_to_prune({10, 20, 30, 40, 50}, 1, 20) == std::vector<int64_t>{30, 10});
  CHECK(checkpoints_to_prune({5}, 3, 0).empty());

  const test::TempDir dir("grass_test_checkpoint");
  json run = small_run(dir, "out", "adamw");
  run["steps"] = 10;
  run["checkpoint_every"] = 1;
  run["checkpoint_keep"] = 2;
  run["checkpoint_keep_every"] = 4;
  const RunConfig cfg = parse(run);
  train(cfg);
  std::vector<int64_t> steps;
  for (const CheckpointEntry& e : list_checkpoints(checkpoint_root(cfg))) steps.push_back(e.step);
  CHECK(steps == std::vector<int64_t>{10, 9, 8, 4});
  for (const auto& entry : fs::directory_iterator(checkpoint_root(cfg)))
    CHECK(entry.path().filename().string().starts_with("step_"));  // no leftovers
}

TEST_CASE("an interrupted checkpoint write leaves nothing under a final name", "[checkpoint]") {
  const test::TempDir dir("grass_test_checkpoint");
  const std::string root = dir.file("checkpoints");
  {
    CheckpointWriter done(root, 1);
    done.write_json("a.json", {{"x", 1}});
    done.commit();
  }
  {
    CheckpointWriter abandoned(root, 2);  // an exception before commit() unwinds through here
    abandoned.write_json("a.json", {{"x", 2}});
  }
  CHECK(!fs::exists(root + "/.tmp_step_00000002"));
  // What a kill leaves: a temporary directory, which listing ignores and the next run removes.
  fs::create_directories(root + "/.tmp_step_00000003");
  write_bytes(root + "/.tmp_step_00000003/a.json", "{\"x\"");
  fs::create_directories(root + "/.trash_step_00000000");
  REQUIRE(list_checkpoints(root).size() == 1);
  CHECK(list_checkpoints(root)[0].step == 1);
  CHECK(Checkpoint(root + "/step_00000001").read_json("a.json")["x"] == 1);
  remove_checkpoint_leftovers(root);
  CHECK(!fs::exists(root + "/.tmp_step_00000003"));
  CHECK(!fs::exists(root + "/.trash_step_00000000"));

  // A second checkpoint of one step replaces the first whole.
  {
    CheckpointWriter again(root, 1);
    again.write_json("b.json", {{"y", 3}});
    again.commit();
  }
  const Checkpoint replaced(root + "/step_00000001");
  CHECK(!replaced.has("a.json"));
  CHECK(replaced.read_json("b.json")["y"] == 3);
  CHECK(!fs::exists(root + "/step_00000001/a.json"));

  // Directory names: one spelling per step.
  CHECK(parse_checkpoint_dir_name("step_00000100") == 100);
  CHECK(parse_checkpoint_dir_name("step_123456789") == 123456789);
  CHECK(!parse_checkpoint_dir_name("step_0000100"));
  CHECK(!parse_checkpoint_dir_name("step_000000100"));
  CHECK(!parse_checkpoint_dir_name("step_0000010x"));
  CHECK(!parse_checkpoint_dir_name(".tmp_step_00000100"));
}

TEST_CASE("a manifest of another format or version is refused", "[checkpoint]") {
  const test::TempDir dir("grass_test_checkpoint");
  const std::string root = dir.file("checkpoints");
  {
    CheckpointWriter w(root, 7);
    w.write_json("a.json", json::object());
    w.commit();
  }
  const std::string manifest = root + "/step_00000007/manifest.json";
  json m = json::parse(read_bytes(manifest));
  m["version"] = 2;
  write_bytes(manifest, m.dump());
  CHECK_THAT(test::user_error_of([&] { Checkpoint c(root + "/step_00000007"); }),
             Contains(manifest + ": checkpoint format version 2 (this grass reads version 1)"));
  m["version"] = 1;
  m["step"] = 8;
  write_bytes(manifest, m.dump());
  CHECK_THAT(test::user_error_of([&] { Checkpoint c(root + "/step_00000007"); }),
             Contains("step 8 differs from the directory name step_00000007"));
  m["step"] = 7;
  m["files"][0]["name"] = "../a.json";
  write_bytes(manifest, m.dump());
  CHECK_THAT(test::user_error_of([&] { Checkpoint c(root + "/step_00000007"); }),
             Contains("files[0].name is not a plain file name"));
}
