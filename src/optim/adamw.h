// Dense AdamW over the model's tensors that have a dense gradient, tensor by tensor so that
// RMSNorm gains skip weight decay. Moments are laid out like the gradient buffer, in the arena's
// optimizer category. Compressed (GRASS) tensors are left to the GRASS optimizer.
// Precision (model/storage.h): fp32 updates params() in place; bf16-mixed updates the fp32
// master copy and re-rounds params() from it; pure bf16 updates params() and stores it and the
// moments with stochastic rounding.
#pragma once
#include <cstdint>
#include <vector>

#include "config/config.h"
#include "core/arena.h"
#include "model/llama.h"

namespace grass {

class AdamW {
 public:
  // seed: the stochastic rounding streams of pure bf16 (the run's seed)
  AdamW(const OptimizerConfig& cfg, const LlamaModel& model, Arena& arena, uint64_t seed);
  // One update of the dense tensors from the model's gradients·grad_scale (the clipping
  // coefficient) at learning rate lr; step counts from 1.
  void step(LlamaModel& model, double grad_scale, double lr, int64_t step);
  // The same update for one dense tensor (tensors()[index]) from its gradient `grad`: what step()
  // does for each, and what a fused update does as the backward forms each gradient.
  void update_tensor(LlamaModel& model, int index, const void* grad, double grad_scale, double lr,
                     int64_t step);

 private:
  OptimizerConfig cfg_;
  uint64_t seed_;
  void* m_ = nullptr;  // first moment  [num_dense_grads], state-typed backend memory
  void* v_ = nullptr;  // second moment [num_dense_grads]
};

}  // namespace grass
