#include "src/optim/adamw.h"

#include <cstdio>

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
  if (cfg.proximal.enabled() && cfg.kind == OptimizerKind::AdamW)
    anchor_ = arena.alloc_bytes(MemCategory::Optimizer, "adamw.proximal_anchor", bytes);
}

void AdamW::begin_step(int64_t step) {
  step_ = step;
  if (anchor_ && (anchor_step_ < 0 || step - anchor_step_ >= cfg_.proximal.inner_steps))
    anchor_step_ = step;  // a new inner loop
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
  AdamArgs args = adam_args(cfg_, clip, lr * scale, t.is_norm ? 0.0 : cfg_.weight_decay / scale,
                            step);
  if (anchor_) {
    // step t of the inner loop moves at lr/(t+1) (the decay with it); the term's λ/lr is the
    // run's lr
    const int64_t inner = step_ - anchor_step_;
    args = proximal_args(args, cfg_.proximal.lambda, lr, inner,
                         static_cast<char*>(anchor_) + state_offset);
  }
  model_.backend().adamw_update(model_.weight_ref(t), g, static_cast<char*>(m_) + state_offset,
                                static_cast<char*>(v_) + state_offset, t.numel, args, seed);
}

std::string AdamW::describe() const {
  if (!anchor_) return "";
  char line[160];
  std::snprintf(line, sizeof line,
                "proximal: lambda %.3g, inner loops of %lld steps (anchor: a copy of the weights)",
                cfg_.proximal.lambda, (long long)cfg_.proximal.inner_steps);
  return line;
}

nlohmann::json AdamW::save_state() const { return {{"anchor_step", anchor_step_}}; }

void AdamW::check_state(const nlohmann::json* saved, const StateReader& reader) const {
  Optimizer::check_state(saved, reader);
  if (!saved) return;
  const nlohmann::json& anchor_step = reader.field(*saved, "anchor_step", "adamw_proximal.");
  if (!anchor_step.is_number_integer() || anchor_step.get<int64_t>() < -1)
    reader.fail("adamw_proximal.anchor_step is not a step or -1");
}

void AdamW::restore_state(const nlohmann::json& saved) {
  anchor_step_ = saved["anchor_step"].get<int64_t>();
}

}  // namespace grass
