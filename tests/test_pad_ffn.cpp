// An ffn width that is not a multiple of 8 stored padded to one (run config pad_ffn; the CUDA
// backend's default) is a layout only: the unpadded model's numbers (to the rounding of sums
// taken in another order, tests/pad_ffn_runs.h), a pad held at exactly zero, and Hugging Face's
// shapes in checkpoints and exports (tests/test_checkpoint.cpp resumes padded runs).
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>

#include "src/core/arena.h"
#include "src/io/checkpoint.h"
#include "src/io/safetensors.h"
#include "src/model/llama.h"
#include "src/train/checkpointing.h"
#include "src/train/hf_interop.h"
#include "src/train/trainer.h"
#include "tests/pad_ffn_runs.h"
#include "tests/test_util.h"

using namespace grass;

TEST_CASE("a padded ffn trains as the unpadded model does", "[pad]") {
  // Every optimizer in fp32 and bf16-mixed at ffn 341 (K = 341 against 344) and LLaMA-1B's 5461;
  // at ffn 13 under hidden 16, gate and up select (GRASS) or project (GaLore, FLORA) their padded
  // side, whose pad must never be chosen or reached; pure bf16 with its fused updates.
  using test::kPadReordered, test::kPadReorderedBf16Weights, test::kPadStochastic;
  const test::PadCase c = GENERATE(
      test::PadCase{"adamw", "fp32", 2, 341, kPadReordered},
      test::PadCase{"adamw", "bf16-mixed", 2, 341, kPadReorderedBf16Weights},
      test::PadCase{"grass", "fp32", 2, 341, kPadReordered},
      test::PadCase{"grass", "bf16-mixed", 2, 341, kPadReorderedBf16Weights},
      test::PadCase{"galore", "bf16-mixed", 2, 341, kPadReorderedBf16Weights},
      test::PadCase{"flora", "fp32", 2, 341, kPadReordered},
      test::PadCase{"grass", "fp32", 2, 13, kPadReordered},
      test::PadCase{"galore", "fp32", 2, 13, kPadReordered},
      test::PadCase{"flora", "bf16-mixed", 2, 13, kPadReorderedBf16Weights},
      test::PadCase{"adamw", "fp32", 2, 5461, kPadReordered},
      test::PadCase{"grass", "fp32", 2, 5461, kPadReordered},
      test::PadCase{"adamw", "bf16", 1, 341, kPadStochastic},
      test::PadCase{"grass", "bf16", 1, 5461, kPadStochastic},
      test::PadCase{"flora", "bf16", 1, 341, kPadStochastic});
  test::check_padding_changes_nothing(c, /*cuda=*/false, /*steps=*/5);
}

TEST_CASE("a padded model stores gate and up with zero rows and down with a wider pitch", "[pad]") {
  ModelConfig m = test::pad_ffn_run("adamw", "fp32", 1, 45, true).model;
  m.intermediate_size = 45;
  Arena arena;
  LlamaModel model(m, arena, 1, 8, {}, default_cpu_backend(), {.pad_ffn = true});
  model.init_weights(3);
  CHECK(model.ffn_stored() == 48);
  CHECK(model.num_params() == m.num_parameters());
  CHECK(model.num_stored_params() == m.num_parameters() + 3 * 3 * 16);
  const ParamTensor& gate = model.tensor("model.layers.0.mlp.gate_proj.weight");
  const ParamTensor& down = model.tensor("model.layers.0.mlp.down_proj.weight");
  CHECK(gate.shape == std::vector<int64_t>{48, 16});
  CHECK(gate.hf_shape == std::vector<int64_t>{45, 16});
  CHECK(down.shape == std::vector<int64_t>{16, 48});
  CHECK(down.hf_shape == std::vector<int64_t>{16, 45});
  // down's row i holds the Hugging Face row i, then 3 zeros; read_tensor gives the rows back
  const std::vector<float> hf = model.read_tensor(down);
  REQUIRE(hf.size() == 16 * 45);
  const float* stored = test::params(model) + down.offset;
  for (int i = 0; i < 16; i++) {
    INFO("row " << i);
    CHECK(std::equal(hf.begin() + i * 45, hf.begin() + (i + 1) * 45, stored + i * 48));
    CHECK(stored[i * 48 + 45] == 0.0f);
    CHECK(stored[i * 48 + 47] == 0.0f);
  }
  // what checkpoints and exports write: the same rows, cut out of the padded ones
  std::vector<std::vector<std::byte>> keep;
  const std::byte* bytes = model.weight_store().hf_bytes(down, keep);
  std::vector<float> written(hf.size());
  std::memcpy(written.data(), bytes, written.size() * sizeof(float));
  CHECK(written == hf);
  // the same draws as the unpadded model's: init takes each element's stream index in HF's layout
  Arena other;
  LlamaModel plain(m, other, 1, 8);
  plain.init_weights(3);
  CHECK(plain.read_tensor(plain.tensor(down.name)) == hf);
  std::vector<float> changed = hf;
  changed[45] = 1.5f;  // row 1, column 0
  model.write_tensor(down, changed.data());
  CHECK(stored[48] == 1.5f);
  CHECK(stored[45] == 0.0f);
}

TEST_CASE("a padded 5461 run writes and exports 5461 columns", "[pad]") {
  const test::TempDir dir("grass_test_pad_ffn");
  RunConfig cfg = test::pad_ffn_run("grass", "bf16-mixed", 1, 5461, true);
  cfg.train_files = {test::write_shard(dir.file("train.bin"), test::random_tokens(4000, 64, 3),
                                       {.vocab_size = 64})};
  cfg.steps = 3;
  cfg.checkpoint_every = 3;
  cfg.log_every = 100;
  cfg.out_dir = dir.file("out");
  REQUIRE(train(cfg).losses.size() == 3);
  const std::string step3 = checkpoint_root(cfg) + "/" + checkpoint_dir_name(3);
  const std::string down = "model.layers.0.mlp.down_proj.weight";
  const std::string gate = "model.layers.0.mlp.gate_proj.weight";
  CHECK(SafetensorsFile(step3 + "/model.safetensors").get(down).shape ==
        std::vector<int64_t>{16, 5461});
  const ExportResult r = export_hf(Checkpoint(step3), dir.file("hf"), /*bf16=*/false);
  CHECK(r.parameters == cfg.model.num_parameters());
  const SafetensorsFile exported(dir.file("hf") + "/model.safetensors");
  CHECK(exported.get(down).shape == std::vector<int64_t>{16, 5461});
  CHECK(exported.get(gate).shape == std::vector<int64_t>{5461, 16});
  // and the export loads back into an unpadded model, column for column
  Arena arena;
  LlamaModel plain(cfg.model, arena, 1, 16);
  load_hf_model(plain, dir.file("hf"));
  CHECK(plain.read_tensor(plain.tensor(down)) == exported.read_f32(down));
}
