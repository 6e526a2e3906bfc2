// The GRASS optimizer (../shared/GRASS.md is the specification; docs/grass.md says how it is
// built): each target weight trains r selected rows (or columns) with Adam on its compressed
// gradient G_C, which accumulate() forms straight from the activations. The selection is
// refreshed every update_interval steps (and at step 0) from that step's full gradient, taken
// one layer at a time in a transient buffer; a refresh resets the moments and the step counter.
// With several micro-batches, a refresh step selects on the first micro-batch's gradient and the
// rest accumulate G_C on that selection.
#pragma once
#include <cstdint>
#include <vector>

#include "config/config.h"
#include "core/arena.h"
#include "model/llama.h"
#include "optim/optimizer.h"

namespace grass {

class Grass final : public Optimizer {
 public:
  // Trains the model's projected tensors. max_tokens: the largest micro-batch, in tokens (B x T),
  // for the gather scratch.
  Grass(const OptimizerConfig& cfg, LlamaModel& model, int64_t max_tokens, Arena& arena);
  const char* name() const override { return "grass"; }

  int64_t projected_numel(int tensor) const override { return target_of(tensor).gc_numel; }
  void begin_step(int64_t step) override;  // a refresh step re-selects on the next accumulate
  void accumulate(int tensor, void* gc, const void* dy, const void* x, int64_t N) override;
  // The sparse Adam update of the target; the targets use lr·scale. Precision as in AdamW
  // (optim/adamw.h): the master copy's rows change and the weights re-round them, or, in pure
  // bf16, the weights and the moments are stored with stochastic rounding.
  void update(int tensor, void* gc, double grad_scale, double lr) override;
  // Σ over targets of 2·out·in - 2·(r·in or out·r). (Refresh steps still form one full gradient.)
  double flops_saved_per_token() const override;

  // Per target: the steps since its refresh and whether it is due to select, in "grass_targets".
  const char* state_key() const override { return "grass_targets"; }
  nlohmann::json save_state() const override;
  void check_state(const nlohmann::json* saved, const StateReader& reader) const override;
  void restore_state(const nlohmann::json& saved) override;

  struct Target {
    int tensor_index;
    int out, in;
    bool rows;             // selects rows (out) rather than columns (in)
    int64_t gc_numel;      // r·in (rows) or out·r (cols)
    // backend memory (host on the CPU), moments state-typed
    void* m;               // Adam moments, shaped like G_C
    void* v;
    int32_t* sigma;        // [r] selected slices, ascending
    float* rho;            // [r] their scales
    int64_t adam_step = 0; // steps since the last refresh
    bool needs_selection = true;
  };
  const std::vector<Target>& targets() const { return targets_; }
  const Target& target_of(int tensor) const;

 private:
  Target& target(int tensor) { return targets_[size_t(target_index(tensor))]; }
  int target_index(int tensor) const;
  void select(Target& t, void* gc, const void* dy, const void* x, int64_t N);

  OptimizerConfig cfg_;
  LlamaModel& model_;
  int rank_;
  std::vector<Target> targets_;
  std::vector<int> target_of_tensor_;  // tensor index -> targets_ index, or -1
  Backend* backend_;
  void* scratch_ = nullptr;            // [max_tokens, r] gathered columns (act-typed)
  float* full_grad_ = nullptr;         // [largest out x in]: the transient gradient at a refresh
  int64_t step_ = 0;
};

}  // namespace grass
