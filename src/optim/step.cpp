#include "src/optim/step.h"

#include <algorithm>
#include <cmath>

#include "src/core/error.h"
#include "src/core/trace.h"

namespace grass {

namespace {
int64_t projected_numel(const OptimizerSet& optimizers, int tensor) {
  return optimizers.of(tensor).projected_numel(tensor);
}
}  // namespace

bool StepStrategy::selected_columns(int tensor, SelectedColumns* columns) const {
  return optimizers_.of(tensor).selected_columns(tensor, columns);
}

StepStrategy::StepStrategy(LlamaModel& model, const OptimizerSet& optimizers, double max_norm,
                           Arena& arena, Communicator& comm)
    : model_(model), optimizers_(optimizers), comm_(comm), max_norm_(max_norm),
      clip_(reinterpret_cast<ClipScalars*>(arena.alloc_bytes(
          MemCategory::Workspace, "clipping scalars (fp64)", sizeof(ClipScalars)))) {}

void StepStrategy::begin_scalars(int64_t step) {
  summing_ = false;
  model_.backend().zero(clip_, sizeof(ClipScalars));
  for (const auto& o : optimizers_.all()) o->begin_step(step);
}

double StepStrategy::read_norm(int tensors_per_clip) {
  ClipScalars s;
  model_.backend().download(&s, clip_, sizeof s);
  clipped_ = int(s.clipped) * tensors_per_clip;
  clip_coefficient_ = 1.0 - s.largest_cut;
  return std::sqrt(s.total);
}

DeferredStep::DeferredStep(LlamaModel& model, const OptimizerSet& optimizers, double max_norm,
                           Arena& arena, Communicator& comm)
    : StepStrategy(model, optimizers, max_norm, arena, comm), projected_(model.tensors().size(), nullptr) {
  GRASS_CHECK(!model.memory_options().fused_update, "DeferredStep needs the model's gradient buffer");
  for (size_t i = 0; i < model.tensors().size(); i++) {
    const ParamTensor& t = model.tensors()[i];
    if (t.dense()) continue;
    projected_[i] = arena.alloc_bytes(MemCategory::CompressedGradients, t.name + ".G_C",
                                      projected_numel(optimizers, int(i)) * model.storage().grad_bytes);
  }
}

void DeferredStep::begin(int64_t step, double lr) {
  lr_ = lr;
  model_.zero_grads();
  for (size_t i = 0; i < projected_.size(); i++)
    if (projected_[i])
      model_.backend().zero(projected_[i], size_t(projected_numel(optimizers_, int(i))) *
                                               model_.storage().grad_bytes);
  sums_started_ = 0;
  begin_scalars(step);
}

void DeferredStep::projected(int tensor, const void* dy, const void* x, int64_t N,
                             bool x_selected) {
  void* gc = projected_.at(size_t(tensor));
  optimizers_.of(tensor).accumulate(tensor, gc, dy, x, N, x_selected);
  if (summing_) {
    comm_.start_sum(gc, projected_numel(optimizers_, tensor), grad_element(model_.storage()));
    sums_started_++;
  }
}

void DeferredStep::dense_ready(int tensor, void* grad) {
  if (!summing_) return;  // more micro-batches to add
  comm_.start_sum(grad, model_.tensors()[size_t(tensor)].numel, grad_element(model_.storage()));
  sums_started_++;
}

double DeferredStep::finish() {
  Backend& backend = model_.backend();
  // the ranks' sums, then one global norm over the projected and the dense gradients, one
  // coefficient for all
  if (launched()) {
    GRASS_CHECK(sums_started_ == projected_.size(),
                "a launched step summed " + std::to_string(sums_started_) + " of " +
                    std::to_string(projected_.size()) + " gradients (last_micro_batch() not called?)");
    comm_.wait_sums();
  }
  for (size_t i = 0; i < projected_.size(); i++)
    if (projected_[i])
      backend.sum_squares(&clip_->pending, projected_[i], projected_numel(optimizers_, int(i)));
  backend.sum_squares(&clip_->pending, model_.grads_buffer(), model_.num_dense_grads());
  backend.clip(clip_, max_norm_);
  const TraceRange range("optimizer");
  for (size_t i = 0; i < projected_.size(); i++)
    update(int(i), projected_[i] ? projected_[i] : model_.grad(model_.tensors()[i]));
  return read_norm(int(model_.tensors().size()));
}

FusedStep::FusedStep(LlamaModel& model, const OptimizerSet& optimizers, double max_norm,
                     Arena& arena, Communicator& comm)
    : StepStrategy(model, optimizers, max_norm, arena, comm) {
  GRASS_CHECK(model.memory_options().fused_update, "FusedStep needs a model built for it");
  int64_t largest = 0;
  for (size_t i = 0; i < model.tensors().size(); i++)
    largest = std::max(largest, projected_numel(optimizers, int(i)));
  if (largest > 0)
    projected_ = arena.alloc_bytes(MemCategory::CompressedGradients,
                                   "G_C (one tensor at a time)", largest * model.storage().grad_bytes);
}

void FusedStep::begin(int64_t step, double lr) {
  lr_ = lr;
  begin_scalars(step);
}

void FusedStep::apply(int tensor, void* g, int64_t numel) {
  sum_over_ranks(g, numel);
  model_.backend().sum_squares(&clip_->pending, g, numel);
  model_.backend().clip(clip_, max_norm_);
  update(tensor, g);
}

void FusedStep::projected(int tensor, const void* dy, const void* x, int64_t N,
                          bool x_selected) {
  const int64_t numel = projected_numel(optimizers_, tensor);
  model_.backend().zero(projected_, size_t(numel) * model_.storage().grad_bytes);
  optimizers_.of(tensor).accumulate(tensor, projected_, dy, x, N, x_selected);
  apply(tensor, projected_, numel);
}

void FusedStep::dense_ready(int tensor, void* grad) {
  apply(tensor, grad, model_.tensors()[size_t(tensor)].numel);
}

double FusedStep::finish() { return read_norm(1); }

}  // namespace grass
