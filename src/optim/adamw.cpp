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
  const int state_bytes = model.storage().state_bytes;
  if (cfg.state_dtype == StateDtype::Q8) state_block_ = cfg.state_block;
  place_.resize(model.tensors().size());
  int64_t plain = 0, coded = 0, blocks = 0;  // elements of each kind, and absmax blocks
  for (const int i : tensors_) {
    const int64_t numel = model.tensors()[size_t(i)].numel;
    MomentPlace& p = place_[size_t(i)];
    p.q8 = state_block_ > 0 && numel >= kQuant8MinElements;
    if (p.q8) {
      p.offset = coded;
      p.block = blocks;
      coded += numel;
      blocks += (numel + state_block_ - 1) / state_block_;
    } else {
      p.offset = plain;
      plain += numel;
    }
  }
  if (plain > 0) {
    m_ = arena.alloc_bytes(MemCategory::Optimizer, "adamw.m", plain * state_bytes);
    v_ = arena.alloc_bytes(MemCategory::Optimizer, "adamw.v", plain * state_bytes);
  }
  if (coded > 0) {
    m_codes_ = arena.alloc<uint8_t>(MemCategory::Optimizer, "adamw.m_q8", coded);
    v_codes_ = arena.alloc<uint8_t>(MemCategory::Optimizer, "adamw.v_q8", coded);
    m_absmax_ = arena.alloc<float>(MemCategory::Optimizer, "adamw.m_absmax", blocks);
    v_absmax_ = arena.alloc<float>(MemCategory::Optimizer, "adamw.v_absmax", blocks);
  }
  if (cfg.proximal.enabled() && cfg.kind == OptimizerKind::AdamW)
    anchor_ = arena.alloc_bytes(MemCategory::Optimizer, "adamw.proximal_anchor",
                                model.num_dense_grads() * state_bytes);
}

void AdamW::begin_step(int64_t step) {
  step_ = step;
  if (anchor_ && (anchor_step_ < 0 || step - anchor_step_ >= cfg_.proximal.inner_steps))
    anchor_step_ = step;  // a new inner loop
}

void AdamW::update(int tensor, void* g, const double* clip, double lr) {
  const ParamTensor& t = model_.tensors()[size_t(tensor)];
  const int state_bytes = model_.storage().state_bytes;
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
                         static_cast<char*>(anchor_) + t.grad_offset * state_bytes);
  }
  const MomentPlace& p = place_[size_t(tensor)];
  if (p.q8) {
    const Quant8Moments q{.m = m_codes_ + p.offset,
                          .v = v_codes_ + p.offset,
                          .absmax_m = m_absmax_ + p.block,
                          .absmax_v = v_absmax_ + p.block,
                          .block = state_block_};
    model_.backend().adamw_update_q8(model_.weight_ref(t), g, q, t.numel, args, seed);
    return;
  }
  model_.backend().adamw_update(model_.weight_ref(t), g, static_cast<char*>(m_) + p.offset * state_bytes,
                                static_cast<char*>(v_) + p.offset * state_bytes, t.numel, args, seed);
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
