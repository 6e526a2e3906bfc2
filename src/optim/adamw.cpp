#include "optim/adamw.h"

#include "ops.h"

namespace grass {

AdamW::AdamW(const OptimizerConfig& cfg, const std::vector<ParamTensor>& tensors,
             int64_t num_dense_grads, Arena& arena)
    : cfg_(cfg), tensors_(tensors) {
  m_ = arena.alloc<float>(MemCategory::Optimizer, "adamw.m", num_dense_grads);
  v_ = arena.alloc<float>(MemCategory::Optimizer, "adamw.v", num_dense_grads);
}

void AdamW::step(float* params, const float* grads, double grad_scale, double lr, int64_t step) {
  for (const ParamTensor& t : tensors_) {
    if (!t.dense()) continue;
    const double wd = t.is_norm ? 0.0 : cfg_.weight_decay;
    const int64_t g = t.grad_offset;
    ops::adamw_update(params + t.offset, grads + g, m_ + g, v_ + g, t.numel, grad_scale, lr,
                      cfg_.beta1, cfg_.beta2, cfg_.eps, wd, step);
  }
}

}  // namespace grass
