// Evaluation at a batch of its own (eval_batch_size): a forward-only model, beside the training
// model on its weights or alone with its own, scores the same windows as the training model to
// the rounding of another batch (the loss is a sum over the same targets in another grouping:
// 1e-6 relative in fp32), sees the training model's updates, and holds no gradient or backward
// buffer; "auto" picks the most that memory allows and the plan counts it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/core/arena.h"
#include "src/model/llama.h"
#include "src/train/evaluator.h"
#include "src/train/memory_plan.h"
#include "src/train/run_resolution.h"
#include "tests/test_util.h"

using namespace grass::test;

namespace {

// A vocabulary of 4096 and 1,200 rows a forward: the forward-only head takes its logits in two
// chunks (kForwardHeadElements / 4096 = 1,024 rows).
grass::ModelConfig model_config(bool tied) {
  grass::ModelConfig m;
  m.hidden_size = 16;
  m.intermediate_size = 24;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 1;
  m.num_hidden_layers = 3;  // odd: the residual stream ends in the buffer it did not start in
  m.vocab_size = 4096;
  m.max_position_embeddings = 64;
  m.initializer_range = 0.5;  // logits far from uniform, so a wrong row or chunk shows
  m.tie_word_embeddings = tied;
  return m;
}

bool relative_close(double a, double b, double bound) {
  return std::abs(a - b) <= bound * std::abs(b);
}

}  // namespace

TEST_CASE("a forward-only model scores the training model's windows, at any batch", "[eval]") {
  for (const bool tied : {false, true}) {
    CAPTURE(tied);
    TempDir dir("grass_test_eval_batch");
    const int T = 8, windows = 150, n = windows * T - 3;  // a partial last window
    const std::string val = write_shard(dir.file("val.bin"), random_tokens(n + 1, 4096, 31),
                                        {.vocab_size = 4096});
    const grass::Evaluator evaluator({val}, n);

    grass::Arena arena;
    grass::LlamaModel model(model_config(tied), arena, 2, T);
    model.init_weights(7);
    const int64_t before_view = arena.total_bytes();
    grass::LlamaModel view(model, arena, windows);
    // No weights, gradients or optimizer bytes of its own
    for (const grass::Arena::Block& b : arena.blocks())
      if (b.name.rfind("eval.", 0) == 0)
        CHECK((b.cat == grass::MemCategory::Activations || b.cat == grass::MemCategory::Workspace));
    CHECK(arena.total_bytes() > before_view);

    grass::Arena own_arena;
    grass::ModelMemoryOptions forward_only;
    forward_only.forward_only = true;
    grass::LlamaModel own(model_config(tied), own_arena, windows, T, {}, grass::default_cpu_backend(),
                          forward_only);
    own.init_weights(7);
    CHECK(own_arena.bytes(grass::MemCategory::Gradients) == 0);
    CHECK(own_arena.bytes(grass::MemCategory::Optimizer) == 0);

    const grass::EvalResult reference = evaluator.evaluate(model, 2);
    REQUIRE(reference.tokens == n);
    for (const int batch : {windows, 7, 1}) {
      CAPTURE(batch);
      const grass::EvalResult a = evaluator.evaluate(view, batch);
      const grass::EvalResult b = evaluator.evaluate(own, batch);
      CHECK(a.tokens == n);
      CHECK(b.tokens == n);
      CHECK(relative_close(a.loss, reference.loss, 1e-6));
      CHECK(relative_close(b.loss, reference.loss, 1e-6));
    }

    // The view reads the training model's weights as they are now.
    const grass::ParamTensor& norm = model.tensor("model.norm.weight");
    std::vector<float> gains(size_t(norm.hf_numel));
    for (size_t i = 0; i < gains.size(); i++) gains[i] = 0.5f + 0.1f * float(i % 7);
    model.write_tensor(norm, gains.data());
    const grass::EvalResult moved = evaluator.evaluate(model, 2);
    CHECK(!relative_close(moved.loss, reference.loss, 1e-3));
    CHECK(relative_close(evaluator.evaluate(view, windows).loss, moved.loss, 1e-6));
  }
}

TEST_CASE("eval_batch_size auto takes what memory allows, and the plan counts it", "[eval][memory]") {
  const nlohmann::json run = {
      {"model", "configs/models/llama_tiny.json"},
      {"data", {{"train", "train.bin"}, {"val", "val.bin"}}},
      {"micro_batch_size", 2}, {"seq_len", 32}, {"steps", 3}, {"eval_tokens", 32 * 500},
      {"out_dir", "unused"}};
  grass::RunConfig cfg = grass::parse_run_config(run, "");
  const grass::Storage cpu = grass::storage_for(grass::PrecisionChoice::Auto, false);
  const grass::Storage gpu = grass::storage_for(grass::PrecisionChoice::Auto, true);
  const int windows = 500;

  // The CPU without a limit: the most that fits in the training plan's activations and workspace
  // or kEvalBudgetBytes, whichever is more.
  {
    const grass::MemoryPlan base = grass::plan_memory(cfg, cpu);
    const int64_t budget = std::max(base.bytes[int(grass::MemCategory::Activations)] +
                                        base.bytes[int(grass::MemCategory::Workspace)],
                                    grass::kEvalBudgetBytes);
    const int batch = grass::resolve_eval_batch(cfg, cpu, cfg.eval_tokens, false);
    CHECK(batch > cfg.micro_batch_size);
    CHECK(batch <= windows);
    CHECK(grass::eval_model_bytes(cfg, cpu, batch, false) <= budget);
    if (batch < windows) CHECK(grass::eval_model_bytes(cfg, cpu, batch + 1, false) > budget);
    // and grass eval alone: what the run would train in, and the budget more
    const int alone = grass::resolve_eval_batch(cfg, cpu, cfg.eval_tokens, true);
    CHECK(grass::eval_model_bytes(cfg, cpu, alone, true) <= base.total + grass::kEvalBudgetBytes);
    if (alone < windows)
      CHECK(grass::eval_model_bytes(cfg, cpu, alone + 1, true) > base.total + grass::kEvalBudgetBytes);
  }
  // The GPU without a limit: the training model evaluates.
  CHECK(grass::resolve_eval_batch(cfg, gpu, cfg.eval_tokens, false) == cfg.micro_batch_size);
  // Under a limit: the largest batch whose plan leaves the allowance (GPU) free.
  for (const grass::Storage& storage : {cpu, gpu}) {
    CAPTURE(storage.cuda);
    const int64_t base = grass::plan_memory(cfg, storage).total;
    const int64_t allowance = grass::beyond_plan_bytes(storage);
    cfg.memory_limit = base + allowance + grass::eval_model_bytes(cfg, storage, 40, false);
    const int batch = grass::resolve_eval_batch(cfg, storage, cfg.eval_tokens, false);
    CHECK(batch == 40);
    const grass::MemoryPlan plan = grass::plan_memory(cfg, storage, batch);
    CHECK(plan.total == base + grass::eval_model_bytes(cfg, storage, batch, false));
    CHECK(plan.total + allowance <= cfg.memory_limit);
    CHECK(grass::plan_memory(cfg, storage, batch + 1).total + allowance > cfg.memory_limit);
    cfg.memory_limit = 0;
  }
  // An explicit size, capped at the windows; none without validation data.
  cfg.eval_batch_size = 7;
  CHECK(grass::resolve_eval_batch(cfg, cpu, cfg.eval_tokens, false) == 7);
  CHECK(grass::resolve_eval_batch(cfg, cpu, 3 * 32, false) == 3);
  cfg.eval_batch_size = 0;
  cfg.val_files.clear();
  CHECK(grass::resolve_eval_batch(cfg, cpu, cfg.eval_tokens, false) == cfg.micro_batch_size);
}
