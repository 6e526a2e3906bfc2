#include "optim/grass.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "ops.h"
#include "optim/grass_selection.h"

namespace grass {

GrassOptimizer::GrassOptimizer(const OptimizerConfig& cfg, const LlamaModel& model,
                               int64_t max_tokens, Arena& arena)
    : cfg_(cfg), rank_(cfg.grass.rank), target_of_tensor_(model.tensors().size(), -1) {
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
    t.gc = static_cast<float*>(arena.alloc_bytes(MemCategory::CompressedGradients, p.name + ".G_C",
                                                 t.gc_numel * storage.grad_bytes));
    t.m = static_cast<float*>(arena.alloc_bytes(MemCategory::Optimizer, p.name + ".grass.m",
                                                t.gc_numel * storage.state_bytes));
    t.v = static_cast<float*>(arena.alloc_bytes(MemCategory::Optimizer, p.name + ".grass.v",
                                                t.gc_numel * storage.state_bytes));
    t.sigma = arena.alloc<int32_t>(MemCategory::Optimizer, p.name + ".grass.sigma", r);
    t.rho = arena.alloc<float>(MemCategory::Optimizer, p.name + ".grass.rho", r);
    largest = std::max(largest, p.numel);
    target_of_tensor_[i] = int(targets_.size());
    targets_.push_back(t);
  }
  GRASS_CHECK(!targets_.empty(), "the GRASS optimizer has no target tensors");
  scratch_ = static_cast<float*>(arena.alloc_bytes(MemCategory::Workspace, "grass.gather",
                                                   max_tokens * r * storage.act_bytes));
  pure_bf16_ = storage.pure_bf16();
  full_grad_ = arena.alloc<float>(MemCategory::Workspace, "grass.refresh_gradient", largest);
}

void GrassOptimizer::begin_step(int64_t step) {
  step_ = step;
  const bool refresh = step % cfg_.grass.update_interval == 0;
  for (Target& t : targets_) {
    std::memset(t.gc, 0, size_t(t.gc_numel) * sizeof(float));
    if (refresh) t.needs_selection = true;
  }
}

void GrassOptimizer::accumulate(int tensor_index, const float* dy, const float* x, int64_t N) {
  const int k = target_of_tensor_.at(tensor_index);
  GRASS_CHECK(k >= 0, "accumulate() for a tensor that is not a GRASS target");
  Target& t = targets_[k];
  if (t.needs_selection) {
    select(t, dy, x, N);
    return;
  }
  ops::grass_compressed_grad(t.gc, scratch_, dy, x, t.sigma, t.rho, N, t.in, t.out, rank_, t.rows);
  if (pure_bf16_) ops::round_to_bf16(t.gc, t.gc_numel);  // G_C is stored in bf16
}

void GrassOptimizer::select(Target& t, const float* dy, const float* x, int64_t N) {
  // The full gradient of this one weight, in the transient buffer: G[out, in] = dyᵀ x
  const int64_t numel = int64_t(t.out) * t.in;
  std::memset(full_grad_, 0, size_t(numel) * sizeof(float));
  ops::linear_backward<float>(nullptr, full_grad_, dy, x, nullptr, N, t.in, t.out, false);
  std::vector<double> norms_sq(t.rows ? t.out : t.in);
  ops::grass_slice_norms(norms_sq.data(), full_grad_, t.out, t.in, t.rows);
  // Every rank derives the same stream from (seed, step, tensor), so every rank picks the same σ.
  const uint64_t seed = derive_seed(derive_seed(cfg_.grass.seed, uint64_t(step_)), t.tensor_index);
  const SliceSelection s = select_slices(cfg_.grass.selection, norms_sq, rank_, seed);
  std::copy(s.sigma.begin(), s.sigma.end(), t.sigma);
  std::copy(s.rho.begin(), s.rho.end(), t.rho);
  ops::grass_gather(t.gc, full_grad_, t.sigma, t.rho, t.out, t.in, rank_, t.rows);
  if (pure_bf16_) ops::round_to_bf16(t.gc, t.gc_numel);
  // The paper resets the moments with the selection: they described other rows.
  std::memset(t.m, 0, size_t(t.gc_numel) * sizeof(float));
  std::memset(t.v, 0, size_t(t.gc_numel) * sizeof(float));
  t.adam_step = 0;
  t.needs_selection = false;
}

double GrassOptimizer::flops_saved_per_token() const {
  double saved = 0;
  for (const Target& t : targets_) saved += 2.0 * t.out * t.in - 2.0 * double(t.gc_numel);
  return saved;
}

double GrassOptimizer::grad_sum_squares() const {
  double total = 0;
  for (const Target& t : targets_) total += ops::sum_squares(t.gc, t.gc_numel);
  return total;
}

void GrassOptimizer::step(LlamaModel& model, double grad_scale, double lr) {
  const Storage& storage = model.storage();
  float* weights = storage.master ? model.master() : model.params();
  for (Target& t : targets_) {
    GRASS_CHECK(!t.needs_selection, "GRASS step() before any backward selected rows");
    t.adam_step++;
    ops::grass_adam_update(weights + t.param_offset, t.gc, t.m, t.v, t.sigma, t.rho, t.out, t.in,
                           rank_, t.rows, grad_scale, lr, cfg_.grass.scale, cfg_.beta1,
                           cfg_.beta2, cfg_.eps, cfg_.weight_decay, t.adam_step);
    const int64_t numel = int64_t(t.out) * t.in;
    if (storage.master) {  // re-round what changed: the selected rows, or (columns) every row
      if (t.rows)
        for (int j = 0; j < rank_; j++)
          model.round_params_from_master(t.param_offset + int64_t(t.sigma[j]) * t.in, t.in);
      else
        model.round_params_from_master(t.param_offset, numel);
    }
    if (storage.pure_bf16()) {
      // Stochastic rounding leaves a bf16 value as it is, so rounding the whole weight changes
      // only the selected slices. One stream per (step, target, buffer).
      const uint64_t seed =
          derive_seed(derive_seed(cfg_.grass.seed ^ 0x5eed, uint64_t(step_)), t.tensor_index);
      ops::stochastic_round_to_bf16(weights + t.param_offset, numel, derive_seed(seed, 0));
      ops::stochastic_round_to_bf16(t.m, t.gc_numel, derive_seed(seed, 1));
      ops::stochastic_round_to_bf16(t.v, t.gc_numel, derive_seed(seed, 2));
    }
  }
}

}  // namespace grass
