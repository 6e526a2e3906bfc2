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
  for (size_t i = 0; i < model.tensors().size(); i++)
    if (model.tensors()[i].dense())
      update_tensor(model, int(i), model.grad(model.tensors()[i]), grad_scale, lr, step);
}

void AdamW::update_tensor(LlamaModel& model, int index, const void* grad, double grad_scale,
                          double lr, int64_t step) {
  const ParamTensor& t = model.tensors()[size_t(index)];
  const double wd = t.is_norm ? 0.0 : cfg_.weight_decay;
  const int64_t state_offset = t.grad_offset * model.storage().state_bytes;
  float* master = model.master() ? model.master() + t.offset : nullptr;
  // pure bf16's stochastic rounding: one stream per (step, tensor)
  const uint64_t seed = derive_seed(derive_seed(seed_, uint64_t(step)), uint64_t(index));
  model.backend().adamw_update(model.weight(t), master, grad, static_cast<char*>(m_) + state_offset,
                               static_cast<char*>(v_) + state_offset, t.numel, grad_scale, lr,
                               cfg_.beta1, cfg_.beta2, cfg_.eps, wd, step, seed);
}

}  // namespace grass
