#include "optim/adamw.h"

#include "ops.h"

namespace grass {

AdamW::AdamW(const OptimizerConfig& cfg, const std::vector<ParamTensor>& tensors,
             int64_t num_params, Arena& arena)
    : cfg_(cfg), tensors_(tensors) {
  m_ = arena.alloc<float>(MemCategory::Optimizer, "adamw.m", num_params);
  v_ = arena.alloc<float>(MemCategory::Optimizer, "adamw.v", num_params);
}

void AdamW::step(float* params, const float* grads, double grad_scale, double lr, int64_t step) {
  for (const ParamTensor& t : tensors_) {
    const double wd = t.is_norm ? 0.0 : cfg_.weight_decay;
    ops::adamw_update(params + t.offset, grads + t.offset, m_ + t.offset, v_ + t.offset, t.numel,
                      grad_scale, lr, cfg_.beta1, cfg_.beta2, cfg_.eps, wd, step);
  }
}

}  // namespace grass
