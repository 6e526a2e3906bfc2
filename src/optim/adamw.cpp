#include "optim/adamw.h"

#include "core/rng.h"

namespace grass {

AdamW::AdamW(const OptimizerConfig& cfg, const LlamaModel& model, Arena& arena, uint64_t seed)
    : cfg_(cfg), seed_(seed) {
  const int64_t bytes = model.num_dense_grads() * model.storage().state_bytes;
  m_ = arena.alloc_bytes(MemCategory::Optimizer, "adamw.m", bytes);
  v_ = arena.alloc_bytes(MemCategory::Optimizer, "adamw.v", bytes);
}

void AdamW::step(LlamaModel& model, double grad_scale, double lr, int64_t step) {
  const int state_bytes = model.storage().state_bytes;
  for (size_t i = 0; i < model.tensors().size(); i++) {
    const ParamTensor& t = model.tensors()[i];
    if (!t.dense()) continue;
    const double wd = t.is_norm ? 0.0 : cfg_.weight_decay;
    const int64_t state_offset = t.grad_offset * state_bytes;
    float* master = model.master() ? model.master() + t.offset : nullptr;
    // pure bf16's stochastic rounding: one stream per (step, tensor)
    const uint64_t seed = derive_seed(derive_seed(seed_, uint64_t(step)), i);
    model.backend().adamw_update(model.weight(t), master, model.grad(t),
                                 static_cast<char*>(m_) + state_offset,
                                 static_cast<char*>(v_) + state_offset, t.numel, grad_scale, lr,
                                 cfg_.beta1, cfg_.beta2, cfg_.eps, wd, step, seed);
  }
}

}  // namespace grass
