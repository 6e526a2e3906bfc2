#include "optim/grass.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"
#include "optim/grass_selection.h"

namespace grass {

GrassOptimizer::GrassOptimizer(const OptimizerConfig& cfg, const LlamaModel& model,
                               int64_t max_tokens, Arena& arena, bool shared_gc)
    : cfg_(cfg), rank_(cfg.grass.rank), target_of_tensor_(model.tensors().size(), -1),
      backend_(&model.backend()), shared_gc_(shared_gc) {
  const int r = rank_;
  const Storage& storage = model.storage();
  int64_t largest = 0;
  for (size_t i = 0; i < model.tensors().size(); i++) {
    const ParamTensor& p = model.tensors()[i];
    if (p.dense()) continue;
    GRASS_CHECK(p.shape.size() == 2, "a GRASS target must be a matrix: " + p.name);
    Target t{};
    t.tensor_index = int(i);
    t.param_offset = p.offset;
    t.out = int(p.shape[0]);
    t.in = int(p.shape[1]);
    t.rows = cfg.grass.selects_rows(t.out, t.in);
    GRASS_CHECK(r <= (t.rows ? t.out : t.in), "rank exceeds the selectable side of " + p.name);
    t.gc_numel = int64_t(r) * (t.rows ? t.in : t.out);
    if (!shared_gc)
      t.gc = arena.alloc_bytes(MemCategory::CompressedGradients, p.name + ".G_C",
                               t.gc_numel * storage.grad_bytes);
    t.m = arena.alloc_bytes(MemCategory::Optimizer, p.name + ".grass.m",
                            t.gc_numel * storage.state_bytes);
    t.v = arena.alloc_bytes(MemCategory::Optimizer, p.name + ".grass.v",
                            t.gc_numel * storage.state_bytes);
    t.sigma = arena.alloc<int32_t>(MemCategory::Optimizer, p.name + ".grass.sigma", r);
    t.rho = arena.alloc<float>(MemCategory::Optimizer, p.name + ".grass.rho", r);
    largest = std::max(largest, p.numel);
    target_of_tensor_[i] = int(targets_.size());
    targets_.push_back(t);
  }
  GRASS_CHECK(!targets_.empty(), "the GRASS optimizer has no target tensors");
  if (shared_gc) {
    int64_t largest_gc = 0;
    for (const Target& t : targets_) largest_gc = std::max(largest_gc, t.gc_numel);
    void* gc = arena.alloc_bytes(MemCategory::CompressedGradients, "grass.G_C (one target at a time)",
                                 largest_gc * storage.grad_bytes);
    for (Target& t : targets_) t.gc = gc;
  }
  scratch_ = arena.alloc_bytes(MemCategory::Workspace, "grass.gather",
                               max_tokens * r * storage.act_bytes);
  full_grad_ = arena.alloc<float>(MemCategory::Workspace, "grass.refresh_gradient", largest);
}

void GrassOptimizer::begin_step(int64_t step) {
  step_ = step;
  const bool refresh = step % cfg_.grass.update_interval == 0;
  for (Target& t : targets_) {
    if (!shared_gc_) backend_->zero(t.gc, size_t(t.gc_numel) * backend_->storage().grad_bytes);
    if (refresh) t.needs_selection = true;
  }
}

void GrassOptimizer::accumulate(int tensor_index, const void* dy, const void* x, int64_t N) {
  const int k = target_of_tensor_.at(tensor_index);
  GRASS_CHECK(k >= 0, "accumulate() for a tensor that is not a GRASS target");
  Target& t = targets_[k];
  if (shared_gc_) backend_->zero(t.gc, size_t(t.gc_numel) * backend_->storage().grad_bytes);
  if (t.needs_selection) {
    select(t, dy, x, N);
    return;
  }
  backend_->grass_compressed_grad(t.gc, scratch_, dy, x, t.sigma, t.rho, N, t.in, t.out, rank_,
                                  t.rows);
}

void GrassOptimizer::select(Target& t, const void* dy, const void* x, int64_t N) {
  // The full gradient of this one weight, in the transient buffer: G[out, in] = dyᵀ x
  backend_->grass_full_grad(full_grad_, dy, x, N, t.in, t.out);
  std::vector<double> norms_sq(t.rows ? t.out : t.in);
  backend_->grass_slice_norms(norms_sq.data(), full_grad_, t.out, t.in, t.rows);
  // Every rank derives the same stream from (seed, step, tensor), so every rank picks the same σ.
  // The selection itself (a sort or a draw over at most max(out, in) norms) runs on the host.
  const uint64_t seed = derive_seed(derive_seed(cfg_.grass.seed, uint64_t(step_)), t.tensor_index);
  const SliceSelection s = select_slices(cfg_.grass.selection, norms_sq, rank_, seed);
  const std::vector<float> rho(s.rho.begin(), s.rho.end());
  backend_->upload(t.sigma, s.sigma.data(), size_t(rank_) * sizeof(int32_t));
  backend_->upload(t.rho, rho.data(), size_t(rank_) * sizeof(float));
  backend_->grass_gather(t.gc, full_grad_, t.sigma, t.rho, t.out, t.in, rank_, t.rows);
  // The paper resets the moments with the selection: they described other rows.
  const size_t state_bytes = size_t(t.gc_numel) * backend_->storage().state_bytes;
  backend_->zero(t.m, state_bytes);
  backend_->zero(t.v, state_bytes);
  t.adam_step = 0;
  t.needs_selection = false;
}

double GrassOptimizer::flops_saved_per_token() const {
  double saved = 0;
  for (const Target& t : targets_) saved += 2.0 * t.out * t.in - 2.0 * double(t.gc_numel);
  return saved;
}

double GrassOptimizer::gc_sum_squares(size_t k) const {
  return backend_->sum_squares(targets_.at(k).gc, targets_[k].gc_numel);
}

double GrassOptimizer::grad_sum_squares() const {
  GRASS_CHECK(!shared_gc_, "grad_sum_squares() with a shared G_C: fused updates take it per target");
  double total = 0;
  for (size_t k = 0; k < targets_.size(); k++) total += gc_sum_squares(k);
  return total;
}

void GrassOptimizer::step(LlamaModel& model, double grad_scale, double lr) {
  GRASS_CHECK(!shared_gc_, "step() with a shared G_C: fused updates apply each target at once");
  for (size_t k = 0; k < targets_.size(); k++) update_target(k, model, grad_scale, lr);
}

void GrassOptimizer::update_target(size_t k, LlamaModel& model, double grad_scale, double lr) {
  Target& t = targets_.at(k);
  GRASS_CHECK(!t.needs_selection, "GRASS step() before any backward selected rows");
  t.adam_step++;
  const ParamTensor& p = model.tensors()[t.tensor_index];
  float* master = model.master() ? model.master() + p.offset : nullptr;
  // pure bf16's stochastic rounding: one stream per (step, target)
  const uint64_t seed =
      derive_seed(derive_seed(cfg_.grass.seed ^ 0x5eed, uint64_t(step_)), t.tensor_index);
  backend_->grass_adam_update(model.weight(p), master, t.gc, t.m, t.v, t.sigma, t.rho, t.out, t.in,
                              rank_, t.rows, grad_scale, lr, cfg_.grass.scale, cfg_.beta1,
                              cfg_.beta2, cfg_.eps, cfg_.weight_decay, t.adam_step, seed);
}

}  // namespace grass
