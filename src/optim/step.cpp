#include "optim/step.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/trace.h"
#include "optim/clip.h"

namespace grass {

namespace {
int64_t projected_numel(const OptimizerSet& optimizers, int tensor) {
  return optimizers.of(tensor).projected_numel(tensor);
}
}  // namespace

DeferredStep::DeferredStep(LlamaModel& model, const OptimizerSet& optimizers, double max_norm,
                           Arena& arena)
    : model_(model), optimizers_(optimizers), max_norm_(max_norm),
      projected_(model.tensors().size(), nullptr) {
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
  for (const auto& o : optimizers_.all()) o->begin_step(step);
}

void DeferredStep::projected(int tensor, const void* dy, const void* x, int64_t N) {
  optimizers_.of(tensor).accumulate(tensor, projected_.at(size_t(tensor)), dy, x, N);
}

void DeferredStep::dense_ready(int, void*) {
  throw InternalError("dense_ready() in a deferred step: the model holds the dense gradients");
}

double DeferredStep::finish() {
  Backend& backend = model_.backend();
  // one global norm over the dense and the projected gradients
  double projected = 0;
  for (size_t i = 0; i < projected_.size(); i++)
    if (projected_[i]) projected += backend.sum_squares(projected_[i], projected_numel(optimizers_, int(i)));
  const double norm =
      std::sqrt(backend.sum_squares(model_.grads_buffer(), model_.num_dense_grads()) + projected);
  const double clip = clip_coefficient(norm, max_norm_);
  clipped_ = clip < 1.0 ? int(model_.tensors().size()) : 0;
  const TraceRange range("optimizer");
  for (size_t i = 0; i < projected_.size(); i++) {
    void* g = projected_[i] ? projected_[i] : model_.grad(model_.tensors()[i]);
    optimizers_.of(int(i)).update(int(i), g, clip, lr_);
  }
  return norm;
}

FusedStep::FusedStep(LlamaModel& model, const OptimizerSet& optimizers, double max_norm,
                     Arena& arena)
    : model_(model), optimizers_(optimizers), max_norm_(max_norm) {
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
  sum_squares_ = 0;
  clipped_ = 0;
  for (const auto& o : optimizers_.all()) o->begin_step(step);
}

void FusedStep::apply(int tensor, void* g, int64_t numel) {
  const double sum_squares = model_.backend().sum_squares(g, numel);
  sum_squares_ += sum_squares;
  const double clip = clip_coefficient(std::sqrt(sum_squares), max_norm_);
  clipped_ += clip < 1.0;
  optimizers_.of(tensor).update(tensor, g, clip, lr_);
}

void FusedStep::projected(int tensor, const void* dy, const void* x, int64_t N) {
  const int64_t numel = projected_numel(optimizers_, tensor);
  model_.backend().zero(projected_, size_t(numel) * model_.storage().grad_bytes);
  optimizers_.of(tensor).accumulate(tensor, projected_, dy, x, N);
  apply(tensor, projected_, numel);
}

void FusedStep::dense_ready(int tensor, void* grad) {
  apply(tensor, grad, model_.tensors()[size_t(tensor)].numel);
}

double FusedStep::finish() { return std::sqrt(sum_squares_); }

}  // namespace grass
