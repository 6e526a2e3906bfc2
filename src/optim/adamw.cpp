#include "optim/adamw.h"

#include "core/rng.h"
#include "ops.h"

namespace grass {

AdamW::AdamW(const OptimizerConfig& cfg, const LlamaModel& model, Arena& arena, uint64_t seed)
    : cfg_(cfg), seed_(seed) {
  const int64_t bytes = model.num_dense_grads() * model.storage().state_bytes;
  m_ = static_cast<float*>(arena.alloc_bytes(MemCategory::Optimizer, "adamw.m", bytes));
  v_ = static_cast<float*>(arena.alloc_bytes(MemCategory::Optimizer, "adamw.v", bytes));
}

void AdamW::step(LlamaModel& model, double grad_scale, double lr, int64_t step) {
  const Storage& storage = model.storage();
  float* weights = storage.master ? model.master() : model.params();
  for (size_t i = 0; i < model.tensors().size(); i++) {
    const ParamTensor& t = model.tensors()[i];
    if (!t.dense()) continue;
    const double wd = t.is_norm ? 0.0 : cfg_.weight_decay;
    const int64_t g = t.grad_offset;
    ops::adamw_update(weights + t.offset, model.grads() + g, m_ + g, v_ + g, t.numel, grad_scale,
                      lr, cfg_.beta1, cfg_.beta2, cfg_.eps, wd, step);
    if (storage.master) model.round_params_from_master(t.offset, t.numel);
    if (storage.pure_bf16()) {  // one stream per (step, tensor, buffer): independent draws
      const uint64_t seed = derive_seed(derive_seed(seed_, uint64_t(step)), i);
      ops::stochastic_round_to_bf16(weights + t.offset, t.numel, derive_seed(seed, 0));
      ops::stochastic_round_to_bf16(m_ + g, t.numel, derive_seed(seed, 1));
      ops::stochastic_round_to_bf16(v_ + g, t.numel, derive_seed(seed, 2));
    }
  }
}

}  // namespace grass
