#include "optim/fused_update.h"

#include <cmath>

#include "core/error.h"
#include "optim/clip.h"

namespace grass {

FusedUpdate::FusedUpdate(LlamaModel& model, AdamW& adamw, GrassOptimizer* grass, double max_norm)
    : model_(model), adamw_(adamw), grass_(grass), max_norm_(max_norm) {
  GRASS_CHECK(model.memory_options().fused_update, "FusedUpdate needs a model built for it");
}

void FusedUpdate::begin_step(int64_t step, double lr) {
  step_ = step;
  lr_ = lr;
  sum_squares_ = 0;
  clipped_ = 0;
  if (grass_) grass_->begin_step(step);
}

double FusedUpdate::clip_for(double sum_squares) {
  sum_squares_ += sum_squares;
  const double coefficient = clip_coefficient(std::sqrt(sum_squares), max_norm_);
  clipped_ += coefficient < 1.0;
  return coefficient;
}

void FusedUpdate::accumulate(int tensor_index, const void* dy, const void* x, int64_t N) {
  GRASS_CHECK(grass_, "a compressed gradient in a run without GRASS");
  grass_->accumulate(tensor_index, dy, x, N);
  const int k = grass_->target_of_tensor(tensor_index);
  grass_->update_target(size_t(k), model_, clip_for(grass_->gc_sum_squares(size_t(k))), lr_);
}

void FusedUpdate::dense_ready(int tensor_index, void* grad) {
  const ParamTensor& t = model_.tensors()[size_t(tensor_index)];
  const double coefficient = clip_for(model_.backend().sum_squares(grad, t.numel));
  adamw_.update_tensor(model_, tensor_index, grad, coefficient, lr_, step_ + 1);
}

double FusedUpdate::grad_norm() const { return std::sqrt(sum_squares_); }

}  // namespace grass
