// Dense AdamW (torch.optim.AdamW's formula, kernels/ops.h) over the model's tensors that have a
// dense gradient, tensor by tensor so that RMSNorm gains skip weight decay. Moments are laid out
// like the dense gradient buffer, in the arena's optimizer category.
// Precision (kernels/storage.h): fp32 updates the weights in place; bf16-mixed updates the fp32
// master copy and re-rounds the weights from it; pure bf16 updates the weights and stores them
// and the moments with stochastic rounding. With cfg.target_lr_scale, the default projection
// targets (every layer's q/k/v/o/gate/up/down) train at lr × target_lr_scale, their decoupled
// weight decay staying 1 - lr·wd (the projected optimizers' targets decay so).
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
  void begin_step(int64_t step) override { step_ = step; }
  void update(int tensor, void* g, const double* clip, double lr) override;

 private:
  OptimizerConfig cfg_;
  LlamaModel& model_;
  uint64_t seed_;
  std::vector<double> lr_scale_;  // per tensor of the model: 1, or target_lr_scale for a target
  int64_t step_ = 0;   // from 0; Adam's bias correction counts from 1
  void* m_ = nullptr;  // first moment  [num_dense_grads], state-typed backend memory
  void* v_ = nullptr;  // second moment [num_dense_grads]
};

}  // namespace grass
