// Dense AdamW (torch.optim.AdamW's formula, kernels/ops.h) over the model's tensors that have a
// dense gradient, tensor by tensor so that RMSNorm gains skip weight decay. Moments are laid out
// like the dense gradient buffer, in the arena's optimizer category.
// Precision (kernels/storage.h): fp32 updates the weights in place; bf16-mixed updates the fp32
// master copy and re-rounds the weights from it; pure bf16 updates the weights and stores them
// and the moments with stochastic rounding. With cfg.target_lr_scale, the default projection
// targets (every layer's q/k/v/o/gate/up/down) train at lr × target_lr_scale, their decoupled
// weight decay staying 1 - lr·wd (the projected optimizers' targets decay so).
// With cfg.proximal in an AdamW run (docs/proximal.md) every tensor keeps an anchor (a copy of the
// weights, state-typed, in the optimizer category: the plan counts it and checkpoints save it),
// taken at each inner loop's first step; the steps within a loop run at lr/(t+1) and their
// gradients gain 2·(λ/lr)·(θ − anchor). In a projected run its dense tensors train without it.
// With optimizer.state_dtype "q8" each tensor of at least kQuant8MinElements elements keeps its
// moments as 8-bit codes with an fp32 absmax per block of state_block elements (blocks never
// straddle tensors; kernels/quant8.h); the smaller ones (RMSNorm gains) keep state-typed moments.
#pragma once
#include <cstdint>
#include <vector>

#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/model/llama.h"
#include "src/optim/optimizer.h"

namespace grass {

class AdamW final : public Optimizer {
 public:
  // Trains every dense tensor of the model. seed: pure bf16's stochastic rounding streams.
  AdamW(const OptimizerConfig& cfg, LlamaModel& model, Arena& arena, uint64_t seed);
  const char* name() const override { return "adamw"; }
  void begin_step(int64_t step) override;
  void update(int tensor, void* g, const double* clip, double lr) override;
  // Its moments (codes and absmax with q8) and anchor; in pieces of whole 8-bit blocks (64
  // elements without q8).
  std::vector<StateSpan> state_spans(int tensor) const override;
  int64_t piece_quantum() const override { return state_block_ > 0 ? state_block_ : 64; }
  std::vector<StateSpan> state_spans(int tensor, int64_t first, int64_t count) const override;
  void update_elements(int tensor, void* g, const double* clip, double lr, int64_t first,
                       int64_t count) override;
  std::string describe() const override;

  // With the proximal method: the step its anchor was taken at, in "adamw_proximal".
  const char* state_key() const override { return anchor_ ? "adamw_proximal" : nullptr; }
  nlohmann::json save_state() const override;
  void check_state(const nlohmann::json* saved, const StateReader& reader) const override;
  void restore_state(const nlohmann::json& saved) override;

 private:
  OptimizerConfig cfg_;
  LlamaModel& model_;
  uint64_t seed_;
  std::vector<double> lr_scale_;  // per tensor of the model: 1, or target_lr_scale for a target
  int64_t step_ = 0;   // from 0; Adam's bias correction counts from 1
  // Where tensor i's moments live: with q8 and numel ≥ kQuant8MinElements, element `offset` of
  // the codes and block `block` of the absmax; else element `offset` of m_, v_.
  struct MomentPlace {
    bool q8 = false;
    int64_t offset = 0, block = 0;
  };
  std::vector<MomentPlace> place_;  // per tensor of the model
  int state_block_ = 0;               // q8's block; 0: no q8 states
  void* m_ = nullptr;  // first moment  [the unquantized tensors' elements], state-typed
  void* v_ = nullptr;  // second moment [the same]
  uint8_t* m_codes_ = nullptr;   // [the quantized tensors' elements]
  uint8_t* v_codes_ = nullptr;
  float* m_absmax_ = nullptr;    // [their blocks]
  float* v_absmax_ = nullptr;
  void* anchor_ = nullptr;     // the proximal anchor [num_dense_grads], state-typed; null: off
  bool proximal_ = false;      // whether there is one (a planning arena's pointers are null)
  int64_t anchor_step_ = -1;   // the step the anchor was last taken at (-1: not yet)
};

}  // namespace grass
