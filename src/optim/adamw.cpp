#include "src/optim/adamw.h"

#include <cstdio>

#include "src/core/error.h"
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
  const MemPlace place = states_place(cfg);
  if (plain > 0) {
    m_ = arena.alloc_bytes(MemCategory::Optimizer, "adamw.m", plain * state_bytes, place);
    v_ = arena.alloc_bytes(MemCategory::Optimizer, "adamw.v", plain * state_bytes, place);
  }
  if (coded > 0) {
    m_codes_ = arena.alloc<uint8_t>(MemCategory::Optimizer, "adamw.m_q8", coded, place);
    v_codes_ = arena.alloc<uint8_t>(MemCategory::Optimizer, "adamw.v_q8", coded, place);
    m_absmax_ = arena.alloc<float>(MemCategory::Optimizer, "adamw.m_absmax", blocks, place);
    v_absmax_ = arena.alloc<float>(MemCategory::Optimizer, "adamw.v_absmax", blocks, place);
  }
  proximal_ = cfg.proximal.enabled() && cfg.kind == OptimizerKind::AdamW;
  if (proximal_)
    anchor_ = arena.alloc_bytes(MemCategory::Optimizer, "adamw.proximal_anchor",
                                model.num_dense_grads() * state_bytes, place);
}

void AdamW::begin_step(int64_t step) {
  step_ = step;
  if (anchor_ && (anchor_step_ < 0 || step - anchor_step_ >= cfg_.proximal.inner_steps))
    anchor_step_ = step;  // a new inner loop
}

void AdamW::update(int tensor, void* g, const double* clip, double lr) {
  update_elements(tensor, g, clip, lr, 0, model_.tensors()[size_t(tensor)].numel);
}

void AdamW::update_elements(int tensor, void* g, const double* clip, double lr, int64_t first,
                            int64_t count) {
  const ParamTensor& t = model_.tensors()[size_t(tensor)];
  const Storage& storage = model_.storage();
  const int64_t state_bytes = storage.state_bytes;
  const int64_t step = step_ + 1;
  // pure bf16's stochastic rounding: one stream per (step, tensor), counted from `first`
  const uint64_t seed = derive_seed(derive_seed(seed_, uint64_t(step)), uint64_t(tensor));
  // A target's step moves at lr × target_lr_scale while its decay stays 1 - lr·wd, as GRASS's and
  // GaLore's targets decay: the rate and the decay's product is what adam_scalars() takes.
  const double scale = lr_scale_[size_t(tensor)];
  AdamArgs args = adam_args(cfg_, clip, lr * scale, t.is_norm ? 0.0 : cfg_.weight_decay / scale,
                            step);
  args.first = first;
  if (anchor_) {
    // step t of the inner loop moves at lr/(t+1) (the decay with it); the term's λ/lr is the
    // run's lr
    const int64_t inner = step_ - anchor_step_;
    args = proximal_args(args, cfg_.proximal.lambda, lr, inner,
                         resident(static_cast<char*>(anchor_) + (t.grad_offset + first) * state_bytes));
  }
  const WeightRef whole = model_.weight_ref(t);
  const WeightRef w{static_cast<char*>(whole.weights) + first * storage.weight_bytes,
                    whole.master ? whole.master + first : nullptr};
  const void* gradient = static_cast<const char*>(g) + first * storage.grad_bytes;
  const MomentPlace& p = place_[size_t(tensor)];
  if (p.q8) {
    GRASS_CHECK(first % state_block_ == 0, "an 8-bit AdamW piece that splits a block");
    const int64_t block = p.block + first / state_block_;
    const Quant8Moments q{.m = resident(m_codes_ + p.offset + first),
                          .v = resident(v_codes_ + p.offset + first),
                          .absmax_m = resident(m_absmax_ + block),
                          .absmax_v = resident(v_absmax_ + block),
                          .block = state_block_};
    model_.backend().adamw_update_q8(w, gradient, q, count, args, seed);
    return;
  }
  model_.backend().adamw_update(w, gradient,
                                resident(static_cast<char*>(m_) + (p.offset + first) * state_bytes),
                                resident(static_cast<char*>(v_) + (p.offset + first) * state_bytes),
                                count, args, seed);
}

std::vector<StateSpan> AdamW::state_spans(int tensor) const {
  return state_spans(tensor, 0, model_.tensors()[size_t(tensor)].numel);
}

std::vector<StateSpan> AdamW::state_spans(int tensor, int64_t first, int64_t count) const {
  const ParamTensor& t = model_.tensors()[size_t(tensor)];
  const MomentPlace& p = place_[size_t(tensor)];
  const int64_t state_bytes = model_.storage().state_bytes;
  std::vector<StateSpan> spans;
  if (p.q8) {
    const int64_t block = p.block + first / state_block_;
    const int64_t blocks = (count + state_block_ - 1) / state_block_;
    spans = {{m_codes_ + p.offset + first, count, true},
             {v_codes_ + p.offset + first, count, true},
             {m_absmax_ + block, blocks * 4, true},
             {v_absmax_ + block, blocks * 4, true}};
  } else {
    spans = {{static_cast<char*>(m_) + (p.offset + first) * state_bytes, count * state_bytes, true},
             {static_cast<char*>(v_) + (p.offset + first) * state_bytes, count * state_bytes, true}};
  }
  if (proximal_)  // taken again at an inner loop's first step, but over the whole piece: fetched
    spans.push_back({static_cast<char*>(anchor_) + (t.grad_offset + first) * state_bytes,
                     count * state_bytes, true});
  return spans;
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
