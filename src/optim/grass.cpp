#include "optim/grass.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "optim/grass_selection.h"

namespace grass {

using nlohmann::json;

Grass::Grass(const OptimizerConfig& cfg, LlamaModel& model, int64_t max_tokens, Arena& arena)
    : cfg_(cfg), model_(model), rank_(cfg.grass.rank), target_of_tensor_(model.tensors().size(), -1),
      backend_(&model.backend()) {
  const int r = rank_;
  const Storage& storage = model.storage();
  int64_t largest = 0;
  for (size_t i = 0; i < model.tensors().size(); i++) {
    const ParamTensor& p = model.tensors()[i];
    if (p.dense()) continue;
    GRASS_CHECK(p.shape.size() == 2, "a GRASS target must be a matrix: " + p.name);
    Target t{};
    t.tensor_index = int(i);
    t.out = int(p.shape[0]);
    t.in = int(p.shape[1]);
    t.rows = cfg.grass.selects_rows(t.out, t.in);
    GRASS_CHECK(r <= (t.rows ? t.out : t.in), "rank exceeds the selectable side of " + p.name);
    t.gc_numel = int64_t(r) * (t.rows ? t.in : t.out);
    t.m = arena.alloc_bytes(MemCategory::Optimizer, p.name + ".grass.m",
                            t.gc_numel * storage.state_bytes);
    t.v = arena.alloc_bytes(MemCategory::Optimizer, p.name + ".grass.v",
                            t.gc_numel * storage.state_bytes);
    t.sigma = arena.alloc<int32_t>(MemCategory::Optimizer, p.name + ".grass.sigma", r);
    t.rho = arena.alloc<float>(MemCategory::Optimizer, p.name + ".grass.rho", r);
    largest = std::max(largest, p.numel);
    target_of_tensor_[i] = int(targets_.size());
    targets_.push_back(t);
    tensors_.push_back(int(i));
  }
  GRASS_CHECK(!targets_.empty(), "the GRASS optimizer has no target tensors");
  scratch_ = arena.alloc_bytes(MemCategory::Workspace, "grass.gather",
                               max_tokens * r * storage.act_bytes);
  full_grad_ = arena.alloc<float>(MemCategory::Workspace, "grass.refresh_gradient", largest);
}

int Grass::target_index(int tensor) const {
  const int k = target_of_tensor_.at(size_t(tensor));
  GRASS_CHECK(k >= 0, "a tensor that is not a GRASS target");
  return k;
}

const Grass::Target& Grass::target_of(int tensor) const {
  return targets_[size_t(target_index(tensor))];
}

void Grass::begin_step(int64_t step) {
  step_ = step;
  if (step % cfg_.grass.update_interval == 0)
    for (Target& t : targets_) t.needs_selection = true;
}

void Grass::accumulate(int tensor, void* gc, const void* dy, const void* x, int64_t N) {
  Target& t = target(tensor);
  if (t.needs_selection) {
    select(t, gc, dy, x, N);
    return;
  }
  backend_->grass_compressed_grad(gc, scratch_, dy, x, t.sigma, t.rho, N, t.in, t.out, rank_,
                                  t.rows);
}

void Grass::select(Target& t, void* gc, const void* dy, const void* x, int64_t N) {
  // The full gradient of this one weight, in the transient buffer: G[out, in] = dyᵀ x
  backend_->grass_full_grad(full_grad_, dy, x, N, t.in, t.out);
  std::vector<double> norms_sq(t.rows ? t.out : t.in);
  backend_->grass_slice_norms(norms_sq.data(), full_grad_, t.out, t.in, t.rows);
  // The draws come from the stream (seed, step, tensor); the selection itself (a sort or a draw
  // over at most max(out, in) norms) runs on the host.
  const uint64_t seed = derive_seed(derive_seed(cfg_.grass.seed, uint64_t(step_)), t.tensor_index);
  const SliceSelection s = select_slices(cfg_.grass.selection, norms_sq, rank_, seed);
  const std::vector<float> rho(s.rho.begin(), s.rho.end());
  backend_->upload(t.sigma, s.sigma.data(), size_t(rank_) * sizeof(int32_t));
  backend_->upload(t.rho, rho.data(), size_t(rank_) * sizeof(float));
  backend_->grass_gather(gc, full_grad_, t.sigma, t.rho, t.out, t.in, rank_, t.rows);
  // The paper resets the moments with the selection: they described other rows.
  const size_t state_bytes = size_t(t.gc_numel) * backend_->storage().state_bytes;
  backend_->zero(t.m, state_bytes);
  backend_->zero(t.v, state_bytes);
  t.adam_step = 0;
  t.needs_selection = false;
}

double Grass::flops_saved_per_token() const {
  double saved = 0;
  for (const Target& t : targets_) saved += 2.0 * t.out * t.in - 2.0 * double(t.gc_numel);
  return saved;
}

void Grass::update(int tensor, void* gc, double grad_scale, double lr) {
  Target& t = target(tensor);
  GRASS_CHECK(!t.needs_selection, "a GRASS update before any backward selected rows");
  t.adam_step++;
  const ParamTensor& p = model_.tensors()[size_t(t.tensor_index)];
  // pure bf16's stochastic rounding: one stream per (step, target)
  const uint64_t seed =
      derive_seed(derive_seed(cfg_.grass.seed ^ 0x5eed, uint64_t(step_)), t.tensor_index);
  const AdamArgs args{.grad_scale = grad_scale, .lr = lr, .beta1 = cfg_.beta1, .beta2 = cfg_.beta2,
                      .eps = cfg_.eps, .weight_decay = cfg_.weight_decay, .step = t.adam_step};
  backend_->grass_adam_update(model_.weight_ref(p), gc, t.m, t.v,
                              {t.sigma, t.rho, t.out, t.in, rank_, t.rows}, cfg_.grass.scale,
                              args, seed);
}

json Grass::save_state() const {
  json targets = json::array();
  for (const Target& t : targets_)
    targets.push_back({{"tensor", model_.tensors()[size_t(t.tensor_index)].name},
                       {"adam_step", t.adam_step},
                       {"needs_selection", t.needs_selection}});
  return targets;
}

void Grass::check_state(const json* saved, const StateReader& reader) const {
  Optimizer::check_state(saved, reader);
  const std::string mismatch = StateReader::kMismatch;
  if (!saved->is_array() || saved->size() != targets_.size())
    reader.fail("grass_targets does not list this run's " + std::to_string(targets_.size()) +
                " GRASS targets" + mismatch);
  for (size_t k = 0; k < targets_.size(); k++) {
    const std::string where = "grass_targets[" + std::to_string(k) + "].";
    const std::string& name = model_.tensors()[size_t(targets_[k].tensor_index)].name;
    const json& tensor = reader.field((*saved)[k], "tensor", where);
    if (tensor != name)
      reader.fail(where + "tensor is " + tensor.dump() + ", this run's target is " + name +
                  mismatch);
    reader.u64((*saved)[k], "adam_step", where);
    reader.boolean((*saved)[k], "needs_selection", where);
  }
  // σ indexes rows or columns of a weight: a value out of range would address memory outside
  // it, so a checkpoint's σ is checked like any other untrusted index.
  for (const Target& t : targets_) {
    const std::span<const std::byte> bytes = reader.saved_bytes(t.sigma);
    const int64_t r = int64_t(bytes.size() / sizeof(int32_t)), limit = t.rows ? t.out : t.in;
    for (int64_t i = 0; i < r; i++) {
      int32_t v;
      std::memcpy(&v, bytes.data() + i * sizeof(int32_t), sizeof v);
      if (v < 0 || v >= limit)
        reader.fail_buffer(t.sigma, "index " + std::to_string(v) + " at position " +
                                        std::to_string(i) + " lies outside [0, " +
                                        std::to_string(limit) + "); the checkpoint is corrupt");
    }
  }
}

void Grass::restore_state(const json& saved) {
  for (size_t k = 0; k < targets_.size(); k++) {
    targets_[k].adam_step = saved[k]["adam_step"].get<int64_t>();
    targets_[k].needs_selection = saved[k]["needs_selection"].get<bool>();
  }
}

}  // namespace grass
