// The GRASS optimizer (../shared/GRASS.md is the specification; docs/grass.md says how it is
// built): each target weight trains r selected rows (or columns) with Adam on its compressed
// gradient G_C, which the backward forms straight from the activations. The selection is
// refreshed every update_interval steps (and at step 0) from that step's full gradient, taken
// one layer at a time in a transient buffer; a refresh resets the moments and the step counter.
//
// One optimizer step:   begin_step(step)  ->  forward/backward of every micro-batch (the model
// calls accumulate() for each target)  ->  grad_sum_squares() for clipping  ->  step().
// With several micro-batches, a refresh step selects on the first micro-batch's gradient and the
// rest accumulate G_C on that selection.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/arena.h"
#include "model/llama.h"

namespace grass {

class GrassOptimizer : public CompressedGradSink {
 public:
  // The model must have been built with grass_target_tensor_names(...) as its compressed tensors.
  // max_tokens: the largest micro-batch, in tokens (B x T), for the gather scratch.
  // shared_gc: one G_C buffer (the largest target's) serves every target in turn, for fused
  // updates, where each target's G_C is applied (update_target) as soon as accumulate() formed it.
  GrassOptimizer(const OptimizerConfig& cfg, const LlamaModel& model, int64_t max_tokens,
                 Arena& arena, bool shared_gc = false);

  void begin_step(int64_t step);  // zeroes G_C; a refresh step re-selects on the next accumulate
  void accumulate(int tensor_index, const void* dy, const void* x, int64_t N) override;
  double grad_sum_squares() const;  // Σ G_C², for the global gradient norm
  // Weight-gradient FLOPs per token that G_C saves against the full gradient:
  // Σ over targets of 2·out·in - 2·(r·in or out·r). (Refresh steps still form one full gradient.)
  double flops_saved_per_token() const;
  // The sparse Adam update of every target, at learning rate lr (the targets use lr·scale);
  // grad_scale is the clipping coefficient. Precision as in AdamW (optim/adamw.h): the master
  // copy's rows change and params() re-rounds them, or, in pure bf16, params() and the moments
  // are stored with stochastic rounding.
  void step(LlamaModel& model, double grad_scale, double lr);
  // step() for one target, targets()[k]
  void update_target(size_t k, LlamaModel& model, double grad_scale, double lr);
  int target_of_tensor(int tensor_index) const { return target_of_tensor_.at(size_t(tensor_index)); }
  double gc_sum_squares(size_t k) const;  // Σ G_C² of targets()[k]

  struct Target {
    int tensor_index;
    int64_t param_offset;  // the weight [out, in] inside the model's parameters
    int out, in;
    bool rows;             // selects rows (out) rather than columns (in)
    int64_t gc_numel;      // r·in (rows) or out·r (cols)
    // backend memory (host on the CPU): G_C grad-typed, moments state-typed
    void* gc;              // compressed gradient (shared_gc: the one buffer of every target)
    void* m;               // Adam moments, shaped like gc
    void* v;
    int32_t* sigma;        // [r] selected slices, ascending
    float* rho;            // [r] their scales
    int64_t adam_step = 0; // steps since the last refresh
    bool needs_selection = true;
  };
  const std::vector<Target>& targets() const { return targets_; }
  // Checkpoint restore of target k's counters (its tensors are arena blocks, restored as bytes).
  void restore_counters(size_t k, int64_t adam_step, bool needs_selection) {
    targets_.at(k).adam_step = adam_step;
    targets_.at(k).needs_selection = needs_selection;
  }

 private:
  void select(Target& t, const void* dy, const void* x, int64_t N);

  OptimizerConfig cfg_;
  int rank_;
  std::vector<Target> targets_;
  std::vector<int> target_of_tensor_;  // tensor index -> targets_ index, or -1
  Backend* backend_;
  void* scratch_ = nullptr;            // [max_tokens, r] gathered columns (act-typed)
  float* full_grad_ = nullptr;         // [largest out x in]: the transient gradient at a refresh
  int64_t step_ = 0;
  bool shared_gc_ = false;
};

}  // namespace grass
