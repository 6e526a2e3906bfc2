// For the offload tests (test_offload.cpp, test_offload_activations.cpp): training runs (a few of
// the trainer's steps on the CPU backend, and every weights and optimizer buffer afterwards), and
// the plan checked against a real arena.
#pragma once
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kernels/backend.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/optim/step.h"
#include "src/train/memory_plan.h"
#include "src/train/run_resolution.h"
#include "src/train/training_state.h"
#include "tests/named_choice.h"
#include "tests/ngram_batches.h"

namespace grass::test {

// Sets GRASS_LAZY_COPIES for the backends made while it lives.
struct LazyCopies {
  explicit LazyCopies(bool on) {
    if (on) setenv("GRASS_LAZY_COPIES", "1", 1);
  }
  ~LazyCopies() { unsetenv("GRASS_LAZY_COPIES"); }
};

// A two-layer model on the n-gram data (tests/ngram_batches.h) trained by `optimizer` in
// `precision`: one micro-batch of 2 x 16 tokens a step with fused updates, else two; GRASS,
// GaLore and FLORA refresh every 2 steps, and clipping clips (its coefficient's order matters).
inline RunConfig offload_run(const std::string& optimizer, const std::string& precision, bool fused) {
  RunConfig c;
  c.model.hidden_size = 32;
  c.model.intermediate_size = 40;
  c.model.num_attention_heads = 4;
  c.model.num_key_value_heads = 2;
  c.model.num_hidden_layers = 2;
  c.model.vocab_size = NgramBatches::V;
  c.model.max_position_embeddings = 64;
  c.micro_batch_size = 2;
  c.total_batch_size = fused ? 2 : 4;  // deferred: two micro-batches a step
  c.seq_len = 16;
  c.precision = named<PrecisionChoice>(precision);
  c.fused_update = fused ? Switch::On : Switch::Off;
  c.optimizer.kind = named<OptimizerKind>(optimizer);
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.1;
  c.optimizer.projection.rank = 4;
  c.optimizer.projection.update_interval = 2;  // refreshes (FLORA: resamplings) inside 5 steps
  c.optimizer.projection.seed = 11;
  c.grad_clip = 0.05;
  return c;
}

// The trainer's step `step` on the n-gram data, its micro-batches batch, batch + 1, ...
inline StepOutcome ngram_step(TrainingState& s, const RunConfig& cfg, int64_t step,
                              const NgramBatches& data, int64_t& batch) {
  return train_step(s, cfg, step, cfg.optimizer.lr, [&](int32_t* in, int32_t* tg) {
    std::vector<int32_t> inputs, targets;
    data.batch(batch++, cfg.micro_batch_size, cfg.seq_len, inputs, targets);
    std::copy(inputs.begin(), inputs.end(), in);
    std::copy(targets.begin(), targets.end(), tg);
  });
}

struct Trained {
  std::vector<double> losses;
  std::vector<std::vector<std::byte>> state;  // every weights and optimizer buffer, in order
  std::vector<std::string> names;
  int64_t host_bytes = 0;
  std::vector<int64_t> unprefetched;  // per step: pieces whose fetch the update waited for whole
};

inline Trained train(const RunConfig& cfg, int steps) {
  const std::unique_ptr<Backend> backend = make_cpu_backend(storage_for(cfg.precision, false));
  Arena arena(false, *backend, &backend->host_tier());
  TrainingState s = build_training_state(cfg, arena, *backend);
  s.model->init_weights(3);
  const NgramBatches data;
  Trained out;
  int64_t batch = 0;
  const StateSlots* slots = s.step->state_slots();
  for (int64_t step = 0; step < steps; step++) {
    const int64_t before = slots ? slots->unprefetched_holds() : 0;
    out.losses.push_back(ngram_step(s, cfg, step, data, batch).loss);
    if (slots) out.unprefetched.push_back(slots->unprefetched_holds() - before);
  }
  backend->synchronize();  // the last write-backs
  for (const Arena::Block& b : arena.blocks())
    if (b.cat == MemCategory::Weights || b.cat == MemCategory::Optimizer) {
      const auto* bytes = static_cast<const std::byte*>(b.ptr);
      out.state.emplace_back(bytes, bytes + b.bytes);
      out.names.push_back(b.name);
    }
  out.host_bytes = arena.total_bytes(MemPlace::Host);
  return out;
}

// The plan equals what `real` allocated, category by category, on the device and in the host tier.
inline void check_plan_is_arena(const MemoryPlan& plan, const Arena& real) {
  for (int c = 0; c < kMemCategories; c++) {
    INFO(mem_category_name(MemCategory(c)));
    CHECK(plan.bytes[size_t(c)] == real.bytes(MemCategory(c)));
    CHECK(plan.host_bytes[size_t(c)] == real.bytes(MemPlace::Host, MemCategory(c)));
  }
}

}  // namespace grass::test
