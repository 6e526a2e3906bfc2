#include "src/optim/adamw.h"

#include "src/core/rng.h"

namespace grass {

AdamW::AdamW(const OptimizerConfig& cfg, LlamaModel& model, Arena& arena, uint64_t seed)
    : cfg_(cfg), model_(model), seed_(seed), lr_scale_(model.tensors().size(), 1.0) {
  for (size_t i = 0; i < model.tensors().size(); i++)
    if (model.tensors()[i].dense()) tensors_.push_back(int(i));
  if (cfg.target_lr_scale != 1.0)
    for (const std::string& name : projection_tensor_names(model.config().num_hidden_layers,
                                                           ProjectionConfig{}.targets))
      lr_scale_[size_t(model.tensors().index_of(name))] = cfg.target_lr_scale;
  const int64_t bytes = model.num_dense_grads() * model.storage().state_bytes;
  m_ = arena.alloc_bytes(MemCategory::Optimizer, "adamw.m", bytes);
  v_ = arena.alloc_bytes(MemCategory::Optimizer, "adamw.v", bytes);
}

void AdamW::update(int tensor, void* g, const double* clip, double lr) {
  const ParamTensor& t = model_.tensors()[size_t(tensor)];
  const int64_t state_offset = t.grad_offset * model_.storage().state_bytes;
  const int64_t step = step_ + 1;
  // pure bf16's stochastic rounding: one stream per (step, tensor)
  const uint64_t seed = derive_seed(derive_seed(seed_, uint64_t(step)), uint64_t(tensor));
  // A target's step moves at lr × target_lr_scale while its decay stays 1 - lr·wd, as GRASS's and
  // GaLore's targets decay: the rate and the decay's product is what adam_scalars() takes.
  const double scale = lr_scale_[size_t(tensor)];
  const AdamArgs args = adam_args(cfg_, clip, lr * scale,
                                  t.is_norm ? 0.0 : cfg_.weight_decay / scale, step);
  model_.backend().adamw_update(model_.weight_ref(t), g, static_cast<char*>(m_) + state_offset,
                                static_cast<char*>(v_) + state_offset, t.numel, args, seed);
}

}  // namespace grass
