// `grass mem`'s plan against what a run really allocates, and against the arithmetic of
// GRASS.md: weights, dense and compressed gradients, optimizer states.
#include <catch2/catch.hpp>

#include "config/config.h"
#include "core/arena.h"
#include "train/memory_plan.h"
#include "train/training_state.h"

using namespace grass;

namespace {

RunConfig small_run(const std::string& optimizer) {
  RunConfig c;
  c.model.hidden_size = 32;
  c.model.intermediate_size = 86;
  c.model.num_attention_heads = 4;
  c.model.num_key_value_heads = 2;
  c.model.num_hidden_layers = 2;
  c.model.vocab_size = 100;
  c.model.max_position_embeddings = 64;
  c.micro_batch_size = 2;
  c.seq_len = 16;
  c.optimizer.name = optimizer;
  c.optimizer.grass.rank = 4;
  c.optimizer.grass.targets = {"q", "v", "gate", "down"};
  return c;
}

}  // namespace

TEST_CASE("the memory plan equals what a run allocates, category by category", "[memory]") {
  for (const std::string optimizer : {"adamw", "grass"})
  for (const std::string precision : {"fp32", "bf16-mixed", "bf16"}) {
    INFO(optimizer << " " << precision);
    const RunConfig cfg = small_run(optimizer);
    const Storage cpu = storage_for(precision, false);
    const MemoryPlan plan = plan_memory(cfg, cpu);
    const std::unique_ptr<Backend> backend = make_cpu_backend(cpu);
    Arena real(false, *backend);
    build_training_state(cfg, real, *backend);
    for (int c = 0; c < kMemCategories; c++) {
      INFO(mem_category_name(MemCategory(c)));
      CHECK(plan.bytes[c] == real.bytes(MemCategory(c)));
    }
    CHECK(plan.total == real.total_bytes());
  }
}

TEST_CASE("planned weights and gradients and optimizer states follow GRASS.md's arithmetic",
          "[memory]") {
  const RunConfig cfg = small_run("grass");
  const MemoryPlan plan = plan_memory(cfg, storage_for("fp32", false));
  const int64_t P = cfg.model.num_parameters(), r = cfg.optimizer.grass.rank, L = 2;
  // auto selects the smaller side: q [32,32] rows (r x 32), v [16,32] rows (r x 32),
  // gate [86,32] columns (86 x r), down [32,86] rows (r x 86)
  const int64_t compressed_per_layer = r * 32 + r * 32 + 86 * r + r * 86;
  const int64_t target_params_per_layer = 32 * 32 + 16 * 32 + 86 * 32 + 32 * 86;
  const int64_t dense = P - L * target_params_per_layer;
  CHECK(plan.bytes[int(MemCategory::Weights)] == 4 * P);
  CHECK(plan.bytes[int(MemCategory::Gradients)] == 4 * dense);
  CHECK(plan.bytes[int(MemCategory::CompressedGradients)] == 4 * L * compressed_per_layer);
  // AdamW m, v on the dense tensors; GRASS m, v shaped like G_C, plus σ (int32) and ρ per target
  const int64_t targets = 4 * L;
  CHECK(plan.bytes[int(MemCategory::Optimizer)] ==
        8 * dense + 8 * L * compressed_per_layer + targets * (4 * r + 4 * r));
}

TEST_CASE("planning LLaMA-13B with GRASS allocates nothing and reports GRASS.md's figures",
          "[memory]") {
  RunConfig cfg;
  cfg.model = load_model_config(std::string(GRASS_SOURCE_DIR) + "/configs/models/llama_13b.json");
  cfg.micro_batch_size = 1;
  cfg.seq_len = 256;
  cfg.optimizer.name = "grass";
  cfg.optimizer.grass.rank = 256;
  const MemoryPlan plan = plan_memory(cfg, storage_for("fp32", false));
  CHECK(plan.bytes[int(MemCategory::Weights)] == 4 * int64_t(13015864320));
  // GRASS.md: r=256, auto: 634 M elements per moment (2.36 GiB bf16, 4.72 GiB fp32)
  const double moment_elements = double(plan.bytes[int(MemCategory::CompressedGradients)]) / 4;
  CHECK(moment_elements == Approx(634e6).epsilon(0.001));

  // Pure bf16 on the GPU (GRASS.md's memory arithmetic): 24.24 GiB of weights, bf16 moments,
  // no master copy; weights + gradients + optimizer states fit in 40 GB with room to spare.
  const MemoryPlan gpu = plan_memory(cfg, storage_for("bf16", true));
  const double GiB = 1024.0 * 1024 * 1024;
  CHECK(gpu.bytes[int(MemCategory::Weights)] == 2 * int64_t(13015864320));
  CHECK(gpu.bytes[int(MemCategory::Weights)] / GiB == Approx(24.24).epsilon(0.001));
  const double grass_moments = 2 * 634e6 * 2 / GiB, dense_moments = 2 * 327.68e6 * 2 / GiB;
  CHECK(gpu.bytes[int(MemCategory::Optimizer)] / GiB ==
        Approx(grass_moments + dense_moments).epsilon(0.01));
  const int64_t held = gpu.bytes[int(MemCategory::Weights)] +
                       gpu.bytes[int(MemCategory::Gradients)] +
                       gpu.bytes[int(MemCategory::CompressedGradients)] +
                       gpu.bytes[int(MemCategory::Optimizer)];
  CHECK(double(held) < 40e9);
}
