// `grass mem`'s plan against what a run really allocates, and against the arithmetic of
// GRASS.md: weights, dense and compressed gradients, optimizer states.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "kernels/backend.h"

#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/core/error.h"
#include "src/core/format.h"
#include "src/train/memory_plan.h"
#include "src/train/run_resolution.h"
#include "src/train/training_state.h"
#include "tests/named_choice.h"

using namespace grass;
using Catch::Matchers::Contains;

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
  c.optimizer.kind = test::named<OptimizerKind>(optimizer);
  c.optimizer.projection.rank = 4;
  c.optimizer.projection.targets = test::named_targets({"q", "v", "gate", "down"});
  return c;
}

}  // namespace

TEST_CASE("the memory plan equals what a run allocates, category by category and place by place",
          "[memory]") {
  for (const std::string optimizer : {"adamw", "grass", "galore", "flora"})
  for (const std::string precision : {"fp32", "bf16-mixed", "bf16"})
  for (const std::string checkpointing :
       {"none", "elementwise", "layer", "layer, inputs host", "layer, inputs disk", "sampled"})
  for (const std::string fused : {"off", "on"})
  for (const bool offload : {false, true}) {
    INFO(optimizer << " " << precision << ", checkpointing " << checkpointing << ", fused " << fused
                   << (offload ? ", states offloaded" : ""));
    RunConfig cfg = small_run(optimizer);
    if (checkpointing == "sampled") {
      cfg.activations = {ActivationSample::Bernoulli, 0.3};
    } else if (checkpointing.starts_with("layer, inputs")) {  // layer 0's input leaves
      cfg.model.num_hidden_layers = 4;
      cfg.activation_checkpointing = Checkpointing::Layer;
      cfg.offload.activations = test::named<ActivationOffload>(checkpointing.substr(14));
      cfg.offload.disk_dir = std::filesystem::temp_directory_path().string();
    } else {
      cfg.activation_checkpointing = test::named<Checkpointing>(checkpointing);
    }
    cfg.fused_update = test::named<Switch>(fused);
    cfg.offload.optimizer_states = offload;
    const Storage cpu = storage_for(test::named<PrecisionChoice>(precision), false);
    const MemoryPlan plan = plan_memory(cfg, cpu);
    const std::unique_ptr<Backend> backend = make_cpu_backend(cpu);
    Arena real(false, *backend, &backend->host_tier());
    build_training_state(cfg, real, *backend);
    for (int c = 0; c < kMemCategories; c++) {
      INFO(mem_category_name(MemCategory(c)));
      CHECK(plan.bytes[c] == real.bytes(MemCategory(c)));
      CHECK(plan.host_bytes[c] == real.bytes(MemPlace::Host, MemCategory(c)));
    }
    CHECK(plan.total == real.total_bytes());
    CHECK(plan.host_total == real.total_bytes(MemPlace::Host));
    CHECK(plan.buffers == real.num_blocks());
    CHECK((plan.host_total > 0) == cfg.offload.any());
  }
}

TEST_CASE("elementwise recomputation keeps one n1, n2 and act for all layers", "[memory]") {
  for (const std::string precision : {"fp32", "bf16"}) {
    INFO(precision);
    RunConfig cfg = small_run("grass");
    const Storage storage = storage_for(test::named<PrecisionChoice>(precision), false);
    const MemoryPlan none = plan_memory(cfg, storage);
    cfg.activation_checkpointing = Checkpointing::Elementwise;
    const MemoryPlan elementwise = plan_memory(cfg, storage);
    const int64_t N = 2 * 16, C = 32, F = 86, L = 2;  // small_run's shapes
    for (int c = 0; c < kMemCategories; c++) {
      INFO(mem_category_name(MemCategory(c)));
      const int64_t saved = MemCategory(c) == MemCategory::Activations
                                ? (L - 1) * N * (2 * C + F) * storage.act_bytes : 0;
      CHECK(none.bytes[c] - elementwise.bytes[c] == saved);
    }
  }
}

TEST_CASE("sampled activations keep k rows of n1, n2 and act per layer but the last", "[memory]") {
  for (const std::string precision : {"fp32", "bf16"})
    for (const std::string optimizer : {"grass", "adamw"})
      for (const ActivationSample sampler : {ActivationSample::WtaCrs, ActivationSample::Bernoulli}) {
        INFO(precision << " " << name_of(sampler) << " " << optimizer);
        RunConfig cfg = small_run(optimizer);
        const Storage storage = storage_for(test::named<PrecisionChoice>(precision), false);
        cfg.activation_checkpointing = Checkpointing::Elementwise;
        const MemoryPlan elementwise = plan_memory(cfg, storage);
        cfg.activation_checkpointing = Checkpointing::None;
        cfg.activations = {sampler, 0.3};
        const MemoryPlan sampled = plan_memory(cfg, storage);
        const int64_t N = 2 * 16, C = 32, F = 86, L = 2, QD = 32, KVD = 16;  // small_run's shapes
        // k = round(0.3 N) = 10 rows; bernoulli's count is binomial: room for 8 deviations
        const int64_t k = sampler == ActivationSample::Bernoulli
                              ? std::min<int64_t>(N, int64_t(std::ceil(10 + 8 * std::sqrt(N * (10.0 / N) * (1 - 10.0 / N)))) + 1)
                              : 10;
        const int64_t kept = (L - 1) * (k * (2 * C + F) * storage.act_bytes + 3 * k * 4);
        // the widest dy whose rows are gathered: q's, k's and v's packed and gate's and up's
        // packed when each group is dense
        const bool dense = optimizer == "adamw";
        const int64_t dy_width = std::max({dense ? QD + 2 * KVD : QD, (dense ? 2 : 1) * F, C});
        const int64_t workspace = k * 4 + N * 4 + k * dy_width * storage.act_bytes;
        CHECK(sampled.bytes[int(MemCategory::Activations)] -
                  elementwise.bytes[int(MemCategory::Activations)] == kept);
        CHECK(sampled.bytes[int(MemCategory::Workspace)] -
                  elementwise.bytes[int(MemCategory::Workspace)] == workspace);
      }
}

TEST_CASE("planned weights and gradients and optimizer states follow GRASS.md's arithmetic",
          "[memory]") {
  const RunConfig cfg = small_run("grass");
  const MemoryPlan plan = plan_memory(cfg, storage_for(PrecisionChoice::F32, false));
  const int64_t P = cfg.model.num_parameters(), r = cfg.optimizer.projection.rank, L = 2;
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
  cfg.optimizer.kind = OptimizerKind::Grass;
  cfg.optimizer.projection.rank = 256;
  const MemoryPlan plan = plan_memory(cfg, storage_for(PrecisionChoice::F32, false));
  CHECK(plan.bytes[int(MemCategory::Weights)] == 4 * int64_t(13015864320));
  // GRASS.md: r=256, auto: 634 M elements per moment (2.36 GiB bf16, 4.72 GiB fp32)
  const double moment_elements = double(plan.bytes[int(MemCategory::CompressedGradients)]) / 4;
  CHECK(moment_elements == Approx(634e6).epsilon(0.001));

  // Pure bf16 on the GPU (GRASS.md's memory arithmetic): 24.24 GiB of weights, bf16 moments,
  // no master copy; weights + gradients + optimizer states fit in 40 GB with room to spare.
  const MemoryPlan gpu = plan_memory(cfg, storage_for(PrecisionChoice::Bf16, true));
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

TEST_CASE("per-layer checkpointing keeps each layer's input and one layer's activations",
          "[memory]") {
  RunConfig cfg = small_run("adamw");
  cfg.model.num_hidden_layers = 4;
  const Storage storage = storage_for(PrecisionChoice::Bf16, true);
  const MemoryPlan kept = plan_memory(cfg, storage);
  cfg.activation_checkpointing = Checkpointing::Layer;
  const MemoryPlan layer = plan_memory(cfg, storage);
  // a layer's set (all but x_in, [N, C] bf16) is held once instead of L times
  const int64_t N = int64_t(cfg.micro_batch_size) * cfg.seq_len, L = 4;
  RunConfig one_layer = small_run("adamw");
  one_layer.model.num_hidden_layers = 1;
  const int64_t per_layer = plan_memory(one_layer, storage).bytes[int(MemCategory::Activations)] -
                            [&] {
                              RunConfig none = one_layer;
                              none.model.num_hidden_layers = 0;
                              return plan_memory(none, storage).bytes[int(MemCategory::Activations)];
                            }();
  const int64_t x_in = N * cfg.model.hidden_size * 2;
  CHECK(kept.bytes[int(MemCategory::Activations)] - layer.bytes[int(MemCategory::Activations)] ==
        (L - 1) * (per_layer - x_in));
  for (int c = 0; c < kMemCategories; c++)
    if (MemCategory(c) != MemCategory::Activations) CHECK(kept.bytes[c] == layer.bytes[c]);
}

TEST_CASE("the 13B GRASS run plans under 32 GiB at 256 tokens and under 40 GiB at 2048",
          "[memory]") {
  // configs/runs/llama_13b_grass.json as `grass mem` reads it: pure bf16 on the GPU, GRASS r=256,
  // per-layer checkpointing, fused updates (pure bf16, one micro-batch).
  const RunConfig cfg =
      load_run_config(std::string(GRASS_SOURCE_DIR) + "/configs/runs/llama_13b_grass.json",
                      {"model=" + std::string(GRASS_SOURCE_DIR) + "/configs/models/llama_13b.json"});
  REQUIRE(cfg.micro_batch_size * cfg.seq_len == 256);
  REQUIRE(cfg.activation_checkpointing == Checkpointing::Layer);
  const Storage storage = planned_storage(cfg);
  REQUIRE(storage.pure_bf16());
  const double GiB = 1024.0 * 1024 * 1024;
  const MemoryPlan at256 = plan_memory(cfg, storage);
  CHECK(at256.total / GiB < 32.0);
  CHECK(at256.bytes[int(MemCategory::CompressedGradients)] < 16 << 20);  // one target's G_C
  RunConfig big = cfg;
  big.micro_batch_size = big.total_batch_size = 8;  // 2048 tokens
  CHECK(plan_memory(big, storage).total / GiB < 40.0);
  CHECK(largest_micro_batch(cfg, storage, int64_t(40) << 30) >= 8);
}

TEST_CASE("a memory limit refuses a run that does not fit, naming the largest micro-batch",
          "[memory]") {
  RunConfig cfg = small_run("grass");
  cfg.source = "run.json";
  cfg.micro_batch_size = cfg.total_batch_size = 8;
  const Storage storage = storage_for(PrecisionChoice::Bf16, true);
  const MemoryPlan plan = plan_memory(cfg, storage);
  cfg.memory_limit = plan.total;
  CHECK_NOTHROW(check_memory_limit(cfg, storage, plan));

  cfg.memory_limit = plan.total - 1;
  const int largest = largest_micro_batch(cfg, storage, cfg.memory_limit);
  REQUIRE(largest == 7);  // every micro-batch costs activations
  try {
    check_memory_limit(cfg, storage, plan);
    FAIL("expected a UserError");
  } catch (const UserError& e) {
    const std::string message = e.what();
    CHECK(message.find('\n') == std::string::npos);
    CHECK_THAT(message, Contains("run.json: memory_limit: the run plans " + format_bytes(plan.total) +
                                 ", over the limit of "));
    CHECK_THAT(message, Contains("the largest micro_batch_size that fits is 7 (112 tokens)"));
    CHECK_THAT(message, Contains("with activation_checkpointing \"elementwise\": "));
    CHECK_THAT(message, Contains("with activation_checkpointing \"layer\": "));
  }
  // the boundary is exact: the largest fits, one more does not
  for (const int64_t limit : {plan.total / 2, plan.total / 3, plan.total * 3}) {
    const int micro = largest_micro_batch(cfg, storage, limit);
    INFO("limit " << limit << ": " << micro);
    RunConfig c = cfg;
    c.micro_batch_size = c.total_batch_size = micro;
    if (micro > 0) CHECK(plan_memory(c, storage).total <= limit);
    c.micro_batch_size = c.total_batch_size = micro + 1;
    CHECK(plan_memory(c, storage).total > limit);
  }
  cfg.memory_limit = plan.bytes[int(MemCategory::Weights)];
  CHECK_THROWS_WITH(check_memory_limit(cfg, storage, plan),
                    Contains("not even micro_batch_size 1 fits"));
}

TEST_CASE("a GPU run's head takes 4096-row chunks where its plan has room, else 64 MiB ones",
          "[memory][head]") {
  // Vocabulary 16,384: the default chunk is 2,048 rows (64 MiB of bf16 logits), the larger
  // 4,096 (128 MiB); 300 x 16 tokens hold more than either.
  RunConfig cfg = small_run("adamw");
  cfg.model.vocab_size = 16384;
  cfg.micro_batch_size = cfg.total_batch_size = 300;
  const Storage gpu = storage_for(PrecisionChoice::Bf16Mixed, true);
  const int64_t MiB = int64_t(1) << 20;
  const MemoryPlan large = plan_memory(cfg, gpu);
  CHECK(model_memory_options(cfg, gpu).head_chunk_rows == 4096);
  CHECK_THAT(format_memory_plans(cfg, gpu), Contains("head logits 4096 rows at a time (128.0 MiB)\n"));
  CHECK(nlohmann::json::parse(memory_plan_json(cfg, gpu))["head_rows"] == 4096);

  // A card the larger chunk's plan is 1 byte over (memory_limit less what a card holds beyond
  // the plan): the default chunk, 64 MiB less, which fits.
  cfg.source = "run.json";
  const int64_t beyond = beyond_plan_bytes(gpu);
  CHECK(beyond > 0);
  cfg.memory_limit = large.total + beyond - 1;
  const MemoryPlan small = plan_memory(cfg, gpu);
  CHECK(model_memory_options(cfg, gpu).head_chunk_rows == 0);
  CHECK(large.total - small.total == 64 * MiB);
  CHECK(large.bytes[int(MemCategory::Activations)] - small.bytes[int(MemCategory::Activations)] ==
        64 * MiB);
  CHECK_NOTHROW(check_memory_limit(cfg, gpu, small));
  CHECK_THAT(format_memory_plans(cfg, gpu),
             Contains("head logits 2048 rows at a time (64.0 MiB); 4096 would not fit "
                      "memory_limit less the " + format_bytes(beyond) +
                      " a card holds beyond the plan"));
  // A limit under the larger plan's card but over its plan (what grass train's cap alone would
  // take): still the default chunk, so grass mem's verdict and offload "auto" keep the card's room.
  cfg.memory_limit = large.total;
  CHECK(model_memory_options(cfg, gpu).head_chunk_rows == 0);
  // exactly the larger plan's card: the larger chunk
  cfg.memory_limit = large.total + beyond;
  CHECK(model_memory_options(cfg, gpu).head_chunk_rows == 4096);
  CHECK(plan_memory(cfg, gpu).total == large.total);
  // the largest micro-batch under a limit counts the chunk each micro-batch would take
  const int micro = largest_micro_batch(cfg, gpu, small.total);
  CHECK(micro >= 300);
  RunConfig next = cfg;
  next.micro_batch_size = next.total_batch_size = micro + 1;
  next.memory_limit = small.total;
  CHECK(plan_memory(next, gpu).total > small.total);

  // The CPU computes the whole micro-batch's logits at once, whatever the limit.
  const Storage cpu = storage_for(PrecisionChoice::F32, false);
  CHECK(model_memory_options(cfg, cpu).head_chunk_rows == 0);
  CHECK(describe_head(cfg, cpu, model_memory_options(cfg, cpu)) ==
        "logits of the whole micro-batch at once (" + format_bytes(300 * 16 * 16384 * int64_t(4)) +
            ")");
}

TEST_CASE("cuDNN attention's workspace is planned by its formula, growing as T squared",
          "[memory]") {
  // LLaMA-1B's heads (32 of 64) at GaLore's micro-batch of 64 x 256: the deterministic backward's
  // dP path, 2·B·NH·pad64(T)·pad128(T) bytes, is 256 MiB of it (issue 25, B2: the old plan held
  // 160 MiB in all).
  const int64_t MiB = 1 << 20;
  const int64_t dp = 2 * 64 * 32 * int64_t(256) * 256, rows = 4 * 64 * 32 * 256,
                dq = 4 * int64_t(64) * 256 * 32 * 64;
  CHECK(cudnn_attention_workspace_bytes(64, 256, 32, 64) == dp + rows + dq + 4 * MiB);
  CHECK(dp == 256 * MiB);
  // T is padded to 64 and 128 in the dP term: 200 takes 256 x 256's
  CHECK(cudnn_attention_workspace_bytes(1, 200, 32, 64) - 4 * 32 * 200 * 65 ==
        2 * 32 * 256 * 256 + 4 * MiB);
  // doubling T quadruples the dP term
  const int64_t at1k = cudnn_attention_workspace_bytes(1, 1024, 16, 64);
  const int64_t at2k = cudnn_attention_workspace_bytes(1, 2048, 16, 64);
  CHECK(at2k - 4 * 16 * 2048 * 65 - 4 * MiB == 4 * (at1k - 4 * 16 * 1024 * 65 - 4 * MiB));

  // The GPU plan's workspace holds it, and `grass mem` names it
  RunConfig cfg = load_run_config(std::string(GRASS_SOURCE_DIR) + "/configs/runs/quickstart.json",
                                  {"model=" + std::string(GRASS_SOURCE_DIR) +
                                       "/configs/models/llama_1b.json",
                                   "device=cuda", "attention=cudnn", "micro_batch_size=64",
                                   "total_batch_size=64", "seq_len=256"});
  const Storage storage = planned_storage(cfg);
  const int64_t workspace = plan_memory(cfg, storage).bytes[int(MemCategory::Workspace)];
  CHECK(workspace > cudnn_attention_workspace_bytes(64, 256, 32, 64));
  CHECK_THAT(format_memory_plans(cfg, storage),
             Contains("cuDNN attention's workspace 390.0 MiB (grows as seq_len²)"));
  CHECK(nlohmann::json::parse(memory_plan_json(cfg, storage))["cudnn_workspace_bytes"] ==
        cudnn_attention_workspace_bytes(64, 256, 32, 64));
  // and the free memory the reservation leaves beside it (B7), on the GPU only, in the verdict
  CHECK_THAT(format_memory_plans(cfg, storage),
             Contains(" + 256.0 MiB the reservation leaves free beside it\n"));
  CHECK(nlohmann::json::parse(memory_plan_json(cfg, storage))["gpu_headroom_bytes"] ==
        kGpuHeadroomBytes);
  RunConfig cpu = cfg;
  cpu.device = DeviceChoice::Cpu;
  cpu.attention = AttentionChoice::Grass;
  CHECK_FALSE(nlohmann::json::parse(memory_plan_json(cpu, planned_storage(cpu))).contains("gpu_headroom_bytes"));
}

TEST_CASE("grass mem plans attention auto with cuDNN's workspace, the larger of the two, "
          "wherever auto may take cuDNN's kernels",
          "[memory]") {
  std::mt19937_64 rng(std::random_device{}());
  RunConfig cfg = small_run(rng() % 2 ? "adamw" : "grass");
  cfg.micro_batch_size = cfg.total_batch_size = int(1 + rng() % 16);
  cfg.seq_len = 16 * int(1 + rng() % 4);
  REQUIRE(cfg.attention == AttentionChoice::Auto);
  INFO(name_of(cfg.optimizer.kind) << ", " << cfg.micro_batch_size << " x " << cfg.seq_len);
  const Storage storage =
      storage_for(rng() % 2 ? PrecisionChoice::Bf16 : PrecisionChoice::Bf16Mixed, true);
  const auto planned = [&](const RunConfig& c) {
    return nlohmann::json::parse(memory_plan_json(c, storage));
  };
  const int64_t workspace = int(MemCategory::Workspace);
  const MemoryPlan engine = plan_memory(with_attention(cfg, AttentionKernel::Grass), storage);
  const MemoryPlan cudnn = plan_memory(with_attention(cfg, AttentionKernel::Cudnn), storage);
  // the two plans differ in their workspace alone, cuDNN's the larger
  CHECK(cudnn.bytes[size_t(workspace)] > engine.bytes[size_t(workspace)]);
  for (int c = 0; c < kMemCategories; c++)
    if (c != workspace) CHECK(cudnn.bytes[size_t(c)] == engine.bytes[size_t(c)]);
  // "auto": the larger; "grass": the engine's; "cudnn": cuDNN's
  const nlohmann::json automatic = planned(cfg);
  CHECK(automatic["total"] == std::max(engine.total, cudnn.total));
  CHECK(automatic["bytes"]["workspace"] == cudnn.bytes[size_t(workspace)]);
  CHECK(automatic["attention"] == "cudnn");
  CHECK(automatic["attention_choice"] == "auto");
  CHECK(automatic["cudnn_workspace_bytes"] ==
        cudnn_attention_workspace_bytes(cfg.micro_batch_size, cfg.seq_len, 4, 8));
  CHECK(memory_verdict(cfg, storage).planned == cudnn.total);
  CHECK_THAT(format_memory_plans(cfg, storage),
             Contains("attention \"auto\": cuDNN's where it loads on the GPU, planned with its "
                      "workspace, the larger: " +
                      format_bytes(cudnn_attention_workspace_bytes(cfg.micro_batch_size,
                                                                   cfg.seq_len, 4, 8))));
  RunConfig engine_only = cfg;
  engine_only.attention = AttentionChoice::Grass;
  CHECK(planned(engine_only)["total"] == engine.total);
  CHECK_FALSE(planned(engine_only).contains("cudnn_workspace_bytes"));
  CHECK_THAT(format_memory_plans(engine_only, storage), !Contains("cuDNN"));
  // plan_memory itself plans the kernels a run's backend has settled on: "auto" unsettled is the
  // engine's (a model built on a backend that tried nothing)
  CHECK(plan_memory(cfg, storage).total == engine.total);
  // offload "auto" under a limit chooses on the plan with cuDNN's workspace (and what a card
  // holds beyond it), and leaves the choice as given
  RunConfig limited = cfg;
  limited.offload.automatic = true;
  limited.memory_limit = cudnn.total + beyond_plan_bytes(storage);
  const OffloadChoice choice = choose_offload(limited, storage);
  CHECK(choice.cfg.attention == AttentionChoice::Auto);
  CHECK_THAT(choice.why, Contains("nothing moves off the device: the run fits memory_limit " +
                                  format_bytes(limited.memory_limit) + " (" +
                                  format_bytes(cudnn.total) + " for the plan, " +
                                  format_bytes(beyond_plan_bytes(storage)) +
                                  " for what a card holds beside it) as it is (" +
                                  format_bytes(cudnn.total) + ")"));
  limited.memory_limit = beyond_plan_bytes(storage) / 2;  // under what any run needs: said so
  CHECK_THAT(choose_offload(limited, storage).why,
             Contains("a card holds beyond any plan: no placement fits"));
  // where auto may not take cuDNN's (an evaluation batch above the micro-batch), the engine's
  RunConfig wide = cfg;
  wide.val_files = {"val.bin"};
  wide.eval_tokens = int64_t(cfg.seq_len) * 64;
  wide.eval_batch_size = cfg.micro_batch_size + 1;
  CHECK(planned(wide)["attention"] == "grass");
  CHECK_FALSE(planned(wide).contains("cudnn_workspace_bytes"));
  // and the CPU backend computes with its reference
  const Storage cpu = storage_for(PrecisionChoice::F32, false);
  CHECK(nlohmann::json::parse(memory_plan_json(cfg, cpu))["attention"] == "grass");
  CHECK(nlohmann::json::parse(memory_plan_json(cfg, cpu))["total"] == plan_memory(cfg, cpu).total);
}

namespace {

const int64_t GiB = int64_t(1) << 30;

RunConfig run_13b(std::vector<std::string> overrides = {}) {
  overrides.push_back("model=" + std::string(GRASS_SOURCE_DIR) + "/configs/models/llama_13b.json");
  return load_run_config(std::string(GRASS_SOURCE_DIR) + "/configs/runs/llama_13b_grass.json",
                         overrides);
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

TEST_CASE("grass mem's verdict: fits or not against the limit with what lies beyond the plan, "
          "and the largest micro-batch that fits",
          "[memory][verdict]") {
  std::random_device fresh;
  const uint64_t seed = (uint64_t(fresh()) << 32) | fresh();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (const bool cuda : {true, false}) {
    INFO((cuda ? "CUDA" : "CPU") << " backend");
    RunConfig cfg = small_run("grass");
    cfg.micro_batch_size = cfg.total_batch_size = 2 + int(rng() % 7);
    const Storage storage = storage_for(PrecisionChoice::Bf16, cuda);
    cfg.attention = planned_attention(cfg, storage);  // as grass mem plans "auto"
    const MemoryPlan plan = plan_memory(cfg, storage);
    const int64_t beyond = cuda ? kCudaOutsidePlanBytes + kGpuHeadroomBytes : 0;
    CHECK(beyond_plan_bytes(storage) == beyond);
    for (int trial = 0; trial < 6; trial++) {
      // limits around the run's need: over it, under it, and under what even one sequence needs
      cfg.memory_limit = plan.total + beyond + int64_t(rng() % 4096) - 3 * 1024 -
                         (trial == 5 ? plan.total / 2 : 0);
      INFO("micro-batch " << cfg.micro_batch_size << ", limit " << cfg.memory_limit);
      const MemoryVerdict v = memory_verdict(cfg, storage);
      const bool fits = plan.total + beyond <= cfg.memory_limit;
      CHECK(v.planned == plan.total);
      CHECK(v.needed == plan.total + beyond);
      CHECK(v.fits == fits);
      CHECK(v.exit_code() == (fits ? 0 : kExitDoesNotFit));
      CHECK(v.line.starts_with((fits ? "fits memory_limit " : "does not fit memory_limit ") +
                               format_bytes(cfg.memory_limit) + ": "));
      CHECK(v.line.find('\n') == std::string::npos);
      // the largest micro-batch is exact at the boundary, what lies beyond the plan counted
      REQUIRE(v.largest_micro_batch == largest_micro_batch(cfg, storage, cfg.memory_limit - beyond));
      RunConfig c = cfg;
      c.micro_batch_size = c.total_batch_size = v.largest_micro_batch;
      if (v.largest_micro_batch > 0) CHECK(plan_memory(c, storage).total + beyond <= cfg.memory_limit);
      c.micro_batch_size = c.total_batch_size = v.largest_micro_batch + 1;
      CHECK(plan_memory(c, storage).total + beyond > cfg.memory_limit);
      if (fits) CHECK(v.largest_micro_batch >= cfg.micro_batch_size);
      else CHECK(v.largest_micro_batch < cfg.micro_batch_size);
      if (v.largest_micro_batch > 0)
        CHECK_THAT(v.line, Contains("the largest micro_batch_size that fits is " +
                                    std::to_string(v.largest_micro_batch) + " (" +
                                    std::to_string(v.largest_micro_batch * 16) + " tokens)"));
      // the first line of the text is the verdict; the JSON carries it
      CHECK(first_line(format_memory_plans(cfg, storage)) == v.line);
      const nlohmann::json j = nlohmann::json::parse(memory_plan_json(cfg, storage))["verdict"];
      CHECK(j["line"] == v.line);
      CHECK(j["fits"] == fits);
      CHECK(j["needed_bytes"] == v.needed);
      CHECK(j["cuda_outside_plan_bytes"] == (cuda ? kCudaOutsidePlanBytes : 0));
      CHECK(j["exit_code"] == v.exit_code());
      CHECK(j["largest_micro_batch"] == v.largest_micro_batch);
    }
  }
}

TEST_CASE("grass mem names the weights as the floor when nothing fits: 13B under 24 GiB",
          "[memory][verdict]") {
  RunConfig cfg = run_13b({"memory_limit=24GiB"});
  const Storage storage = planned_storage(cfg);
  const MemoryVerdict v = memory_verdict(cfg, storage);
  CHECK_FALSE(v.fits);
  CHECK(v.exit_code() == kExitDoesNotFit);
  CHECK(v.largest_micro_batch == 0);
  CHECK(v.line.starts_with("does not fit memory_limit 24.00 GiB: LLaMA 13.016B, grass r=256, pure "
                           "bf16, 1 x 256 tokens, checkpointed per layer needs 29.66 GiB"));
  // streamed layers fit it: offload "auto" says with how many
  CHECK_THAT(v.line, Contains("offload \"auto\" fits it with optimizer states in the host tier, "
                              "7 layers' weights streamed from the host tier: "));
  CHECK(v.details.starts_with("  29.66 GiB = 28.40 GiB planned + 1.01 GiB the CUDA context and "
                              "libraries take outside the plan (measured on an H200) + 256.0 MiB"));
  // bf16-mixed: no layer streams (its fp32 master copy does not), so the weights are the floor
  RunConfig accumulating = run_13b({"memory_limit=24GiB", "precision=bf16-mixed"});
  const Storage mixed = planned_storage(accumulating);
  CHECK_THAT(memory_verdict(accumulating, mixed).line,
             Contains("the bf16 weights alone take 24.24 GiB: no placement trains this model under "
                      "24.00 GiB with every weight on the device: stream some layers' "
                      "(offload.layers, with precision \"bf16\" or \"fp32\")"));
  // over the weights but under them with what a card holds beyond the plan: both named
  accumulating.memory_limit = 25 * GiB;
  CHECK_THAT(memory_verdict(accumulating, mixed).line,
             Contains("the bf16 weights take 24.24 GiB and a card holds 1.26 GiB beyond the plan: "
                      "no placement trains this model under 25.00 GiB with every weight on the "
                      "device"));
  // under what a card holds beyond any plan, no model trains: that is said, not the weights
  RunConfig tiny = small_run("adamw");
  tiny.memory_limit = GiB;
  CHECK_THAT(memory_verdict(tiny, storage).line,
             Contains("(the CUDA context and libraries, the reservation's free memory): nothing "
                      "trains under 1.00 GiB on the GPU"));
  // under 27 GiB offloading the optimizer states is what fits (24.85 GiB planned on the device)
  cfg.memory_limit = 27 * GiB;
  const MemoryVerdict offloaded = memory_verdict(cfg, storage);
  CHECK_FALSE(offloaded.fits);
  CHECK_THAT(offloaded.line, Contains("not even micro_batch_size 1 fits; offload \"auto\" fits it "
                                      "with optimizer states in the host tier: 24.85 GiB on the device"));
  CHECK_THAT(offloaded.line, !Contains("weights alone"));
  // the plan alone under the cap (what grass train enforces) but not the card: both said
  cfg.memory_limit = 29 * GiB;
  const MemoryVerdict capped = memory_verdict(cfg, storage);
  CHECK_FALSE(capped.fits);
  CHECK_THAT(capped.details, Contains("grass train's memory_limit caps the plan alone, 28.40 GiB"));
}

TEST_CASE("a sampled run's verdict offers no checkpointing mode sampling cannot take",
          "[memory][verdict]") {
  // sampled activations need checkpointing "none": the advice must not plan "elementwise" or
  // "layer" with them (it stopped at an internal check before), with a limit and without one
  for (const char* limit : {"memory_limit=40GiB", "memory_limit=24GiB"}) {
    CAPTURE(limit);
    const RunConfig cfg = run_13b({"activation_checkpointing=none", "activations.sample=wta-crs",
                                   "activations.keep=0.3", limit});
    const Storage storage = planned_storage(cfg);
    const MemoryVerdict v = memory_verdict(cfg, storage);
    CHECK_THAT(v.line, !Contains("activation_checkpointing"));
    CHECK(v.fits == (cfg.memory_limit == 40 * GiB));
  }
  const RunConfig unlimited = run_13b({"activation_checkpointing=none",
                                       "activations.sample=wta-crs", "activations.keep=0.5"});
  CHECK(memory_verdict(unlimited, planned_storage(unlimited)).exit_code() == 0);
}

TEST_CASE("without a limit grass mem names the card sizes a GPU run fits, and exits 0",
          "[memory][verdict]") {
  const RunConfig grass = run_13b();
  const Storage storage = planned_storage(grass);
  const MemoryVerdict v = memory_verdict(grass, storage);
  CHECK_FALSE(v.limited);
  CHECK(v.exit_code() == 0);
  CHECK(v.card == 32 * GiB);  // 29.66 GiB needed
  CHECK(v.line.starts_with("fits a 32 GB card and larger, not a 24 GB card: "));
  CHECK_THAT(v.line, Contains("needs 29.66 GiB (2.34 GiB to spare on a 32 GB card)"));
  RunConfig planned = grass;  // as grass mem plans "auto": with cuDNN's workspace
  planned.attention = AttentionChoice::Cudnn;
  CHECK(v.largest_micro_batch ==
        largest_micro_batch(planned, storage, 32 * GiB - beyond_plan_bytes(storage)));
  CHECK_THAT(v.details, Contains("a card sold as N GB counted as N GiB"));
  const nlohmann::json cards = nlohmann::json::parse(memory_plan_json(grass, storage))["verdict"]["cards"];
  REQUIRE(cards.size() == std::size(kCardGiB));
  for (const nlohmann::json& card : cards)
    CHECK(card["fits"] == (card["gib"].get<int64_t>() * GiB >= v.needed));

  // AdamW in bf16-mixed: over every card; the floor it states is under 80 GiB, so a smaller
  // micro-batch cannot help and the line says what would
  const RunConfig adamw = run_13b({R"(optimizer={"name": "adamw", "lr": 0.001})", "precision=bf16-mixed"});
  const MemoryVerdict over = memory_verdict(adamw, planned_storage(adamw));
  CHECK(over.exit_code() == 0);
  CHECK(over.needed > 80 * GiB);
  CHECK(over.line.starts_with("fits no card up to 80 GB: LLaMA 13.016B, adamw, bf16-mixed"));
  CHECK_THAT(over.line, Contains(" over 80 GB); "));

  // the CPU backend: no cards, nothing beyond the plan
  RunConfig cpu = small_run("adamw");
  const MemoryVerdict host = memory_verdict(cpu, storage_for(PrecisionChoice::F32, false));
  CHECK(host.needed == plan_memory(cpu, storage_for(PrecisionChoice::F32, false)).total);
  CHECK(host.line.starts_with("the CPU backend needs " + format_bytes(host.needed) + ": "));
  CHECK(host.details.empty());
}

TEST_CASE("grass mem shows what the ranks sum only for a data-parallel run", "[memory][verdict]") {
  RunConfig cfg = small_run("grass");
  const Storage storage = storage_for(PrecisionChoice::Bf16, true);
  CHECK_THAT(format_memory_plans(cfg, storage), !Contains("data-parallel"));
  cfg.ranks = 2;
  const std::string two = format_memory_plans(cfg, storage);
  CHECK_THAT(first_line(two), Contains(", one of 2 data-parallel ranks needs "));
  CHECK_THAT(two, Contains("\nsummed over the 2 data-parallel ranks, per rank:\n"));
}

TEST_CASE("a host_memory_limit the host tier is over makes the verdict does-not-fit",
          "[memory][verdict]") {
  RunConfig cfg = small_run("adamw");
  cfg.offload.optimizer_states = true;
  const Storage storage = storage_for(PrecisionChoice::F32, false);
  const MemoryPlan plan = plan_memory(cfg, storage);
  REQUIRE(plan.host_total > 0);
  cfg.host_memory_limit = plan.host_total;
  CHECK(memory_verdict(cfg, storage).exit_code() == 0);
  cfg.host_memory_limit = plan.host_total - 1;
  const MemoryVerdict v = memory_verdict(cfg, storage);
  CHECK(v.exit_code() == kExitDoesNotFit);
  CHECK_THAT(v.line, Contains("; its host tier's " + format_bytes(plan.host_total) +
                              " does not fit host_memory_limit"));
}

// WEIGHT_STREAMING.md §4's byte tables (../shared, 2026-11-27: pure bf16, GRASS r=256 on all seven
// projections, q8 states, per-layer checkpointing, fused updates, 3 slots, the slices written
// back, layer inputs in the host tier, two copy queues), at their first column, against the
// engine's plan of the same run with the engine's attention. Where they differ, why:
// - the device total is the design's, plus the head's logits for a 4,096-row chunk (250 MiB;
//   the design counted a vocab-chunked head's 16 MiB), less the [N, C] buffer that held o_proj's
//   and down's output before the residual add (the add is in their GEMMs' epilogue now), within
//   0.04 GiB: the design sums eight components each rounded to 0.01 GiB (the engine's is 0.024 to
//   0.038 GiB below it);
// - the norm gains stay resident (the design streamed them): the host tier and the bytes each
//   way differ by under 1 MiB a layer, below the tables' digits.
TEST_CASE("weight streaming: the design's byte tables to their printed digits",
          "[memory][stream]") {
  struct Row {
    const char* model;
    int micro_batch, streamed;
    bool states_on_host;
    double device_gib, host_gib, h2d_gb, d2h_gb;
  };
  const Row rows[] = {
      {"llama_7b", 16, 13, true, 10.36, 7.38, 10.9, 2.7},
      {"llama_13b", 16, 10, true, 22.05, 9.47, 12.8, 3.8},
      {"llama_70b", 32, 43, false, 75.71, 80.6, 152.1, 13.0},
  };
  const double GiBf = double(GiB);
  for (const Row& row : rows) {
    INFO(row.model << ", " << row.micro_batch << " x 256, " << row.streamed << " layers streamed");
    const std::string mb = std::to_string(row.micro_batch);
    const RunConfig cfg = load_run_config(
        std::string(GRASS_SOURCE_DIR) + "/configs/runs/llama_13b_grass.json",
        {"model=" + std::string(GRASS_SOURCE_DIR) + "/configs/models/" + row.model + ".json",
         "micro_batch_size=" + mb, "total_batch_size=" + mb, "optimizer.state_dtype=q8",
         "attention=grass",
         std::string("offload={\"optimizer_states\": ") + (row.states_on_host ? "true" : "false") +
             ", \"activations\": \"host\", \"layers\": " + std::to_string(row.streamed) + "}"});
    const Storage storage = planned_storage(cfg);
    REQUIRE(storage.cuda);
    const MemoryPlan plan = plan_memory(cfg, storage);
    const auto printed = [](double value, double digits) {  // value to the table's digits
      return std::round(value * digits) / digits;
    };
    CHECK(printed(double(plan.host_total) / GiBf, row.host_gib < 10 ? 100 : 10) == row.host_gib);
    // each way a step, GB: within half the last digit (70B's D2H: 12.95 here, 10.3 + 2.6 there)
    CHECK(std::abs(double(plan.h2d_bytes_per_step) / 1e9 - row.h2d_gb) <= 0.051);
    CHECK(std::abs(double(plan.d2h_bytes_per_step) / 1e9 - row.d2h_gb) <= 0.051);
    const int64_t logits =
        head_rows(storage, int64_t(row.micro_batch) * 256, cfg.model.vocab_size,
                  resolve(cfg, true).memory.head_chunk_rows) *
        cfg.model.vocab_size * storage.act_bytes;
    const int64_t head_allowance = int64_t(16) << 20;
    const int64_t projection_out =
        int64_t(row.micro_batch) * 256 * cfg.model.hidden_size * storage.act_bytes;
    const double device_as_designed =
        double(plan.total - logits + head_allowance + projection_out) / GiBf;
    INFO("the engine's device total less the head's and the residual add's differences: "
         << device_as_designed << " GiB");
    CHECK(std::abs(device_as_designed - row.device_gib) <= 8 * 0.005);
    // the plan stays within the design's budget for the card (22.5, 10.5 and 77 GiB) once
    // the head is chunked as the design's
    CHECK(double(plan.total - logits + head_allowance) / GiBf <=
          (row.device_gib < 11 ? 10.5 : row.device_gib < 23 ? 22.5 : 77.0));
  }
}
