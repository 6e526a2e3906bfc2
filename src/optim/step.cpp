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

// The model's stacks whose tensors' one optimizer can form their gradients together.
std::vector<LlamaModel::TensorStack> stackable(const LlamaModel& model,
                                               const OptimizerSet& optimizers) {
  std::vector<LlamaModel::TensorStack> stacks;
  for (const LlamaModel::TensorStack& s : model.projected_stacks()) {
    const Optimizer& o = optimizers.of(s.first);
    bool one = true;
    for (int i = 1; i < s.count; i++) one = one && &optimizers.of(s.first + i) == &o;
    if (one && o.stackable(s.first, s.count)) stacks.push_back(s);
  }
  return stacks;
}

int64_t stack_numel(const OptimizerSet& optimizers, const LlamaModel::TensorStack& s) {
  int64_t numel = 0;
  for (int i = 0; i < s.count; i++) numel += projected_numel(optimizers, s.first + i);
  return numel;
}
}  // namespace

bool StepStrategy::selected_columns(int tensor, SelectedColumns* columns) const {
  return optimizers_.of(tensor).selected_columns(tensor, columns);
}

bool StepStrategy::stacks(int first, int count) const {
  const Optimizer& o = optimizers_.of(first);
  for (int i = 1; i < count; i++)
    if (&optimizers_.of(first + i) != &o) return false;
  return o.stacks(first, count);
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
  last_updated_ = -1;
  if (slots_ && first_updated_ >= 0) prefetch_piece(first_updated_, 0);  // under the forward
}

void StepStrategy::offload_states(Arena& arena, int64_t piece_bytes) {
  const size_t n = model_.tensors().size();
  // Whole tensors' states set the floor; elementwise updates go in pieces up to it.
  int64_t budget = piece_bytes;
  for (size_t i = 0; i < n; i++)
    if (optimizers_.of(int(i)).piece_quantum() == 0)
      budget = std::max(budget, StateSlots::slot_bytes_for(optimizers_.of(int(i)).state_spans(int(i))));
  piece_.assign(n, 0);
  int64_t slot_bytes = 0;
  for (size_t i = 0; i < n; i++) {
    const Optimizer& o = optimizers_.of(int(i));
    const int64_t numel = model_.tensors()[i].numel, quantum = o.piece_quantum();
    int64_t& piece = piece_[i] = numel;
    const auto bytes = [&](int64_t count) {
      return StateSlots::slot_bytes_for(o.state_spans(int(i), 0, count));
    };
    if (quantum > 0 && bytes(numel) > budget) {  // as many whole quanta as fit, at least one
      piece = std::max<int64_t>(1, budget / (bytes(quantum) / quantum) / quantum) * quantum;
      while (piece > quantum && bytes(piece) > budget) piece -= quantum;
    }
    slot_bytes = std::max(slot_bytes, bytes(piece));
  }
  slots_ = std::make_unique<StateSlots>(model_.backend(), arena, slot_bytes);
  next_updated_.assign(n, -1);
  for (const auto& o : optimizers_.all()) o->use_slots(slots_.get());
}

std::vector<StateSpan> StepStrategy::piece_spans(int tensor, int64_t first) const {
  const int64_t numel = model_.tensors()[size_t(tensor)].numel, piece = piece_[size_t(tensor)];
  const Optimizer& o = optimizers_.of(tensor);
  return piece == numel ? o.state_spans(tensor)
                        : o.state_spans(tensor, first, std::min(piece, numel - first));
}

void StepStrategy::prefetch_piece(int tensor, int64_t first) {
  slots_->prefetch(StateSlots::key(tensor, first), piece_spans(tensor, first));
}

void StepStrategy::update(int tensor, void* g) {
  Optimizer& o = optimizers_.of(tensor);
  if (!slots_) return o.update(tensor, g, &clip_->coefficient, lr_);
  (last_updated_ < 0 ? first_updated_ : next_updated_[size_t(last_updated_)]) = tensor;
  last_updated_ = tensor;
  const int64_t numel = model_.tensors()[size_t(tensor)].numel, piece = piece_[size_t(tensor)];
  for (int64_t first = 0; first < numel; first += piece) {
    slots_->hold(StateSlots::key(tensor, first), piece_spans(tensor, first));
    if (first + piece < numel)
      prefetch_piece(tensor, first + piece);
    else if (const int next = next_updated_[size_t(tensor)]; next >= 0)
      prefetch_piece(next, 0);
    if (piece == numel)
      o.update(tensor, g, &clip_->coefficient, lr_);
    else
      o.update_elements(tensor, g, &clip_->coefficient, lr_, first, std::min(piece, numel - first));
    slots_->release();
  }
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
  const int grad_bytes = model.storage().grad_bytes;
  std::vector<bool> stacked(projected_.size(), false);
  for (const LlamaModel::TensorStack& stack : stackable(model, optimizers)) {
    std::string name;
    for (int i = 0; i < stack.count; i++)
      name += (i ? " + " : "") + model.tensors()[size_t(stack.first + i)].name + ".G_C";
    char* g = static_cast<char*>(arena.alloc_bytes(MemCategory::CompressedGradients, name,
                                                   stack_numel(optimizers, stack) * grad_bytes));
    for (int i = 0; i < stack.count; i++) {
      projected_[size_t(stack.first + i)] = g;
      stacked[size_t(stack.first + i)] = true;
      if (g) g += projected_numel(optimizers, stack.first + i) * grad_bytes;
    }
  }
  for (size_t i = 0; i < model.tensors().size(); i++) {
    const ParamTensor& t = model.tensors()[i];
    if (t.dense() || stacked[i]) continue;
    projected_[i] = arena.alloc_bytes(MemCategory::CompressedGradients, t.name + ".G_C",
                                      projected_numel(optimizers, int(i)) * grad_bytes);
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

void DeferredStep::projected_stack(int first, int count, const void* dy, const void* const* x,
                                   int64_t N, bool x_selected) {
  optimizers_.of(first).accumulate_stack(first, count, projected_.at(size_t(first)), dy, x, N,
                                         x_selected);
  if (!summing_) return;
  for (int i = 0; i < count; i++) {
    comm_.start_sum(projected_[size_t(first + i)], projected_numel(optimizers_, first + i),
                    grad_element(model_.storage()));
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
  // a streamed layer is on the device for its matrices' updates, then goes back (resident
  // tensors between them, its norm gains, update as they are)
  LayerStream* stream = model_.weight_store().stream();
  int held = -1;
  for (size_t i = 0; i < projected_.size(); i++) {
    const ParamTensor& t = model_.tensors()[i];
    if (t.place == Place::Streamed && t.layer != held) {
      if (held >= 0) stream->release(held, true);
      stream->acquire(t.layer, LayerStream::Direction::Forward);
      held = t.layer;
    }
    update(int(i), projected_[i] ? projected_[i] : model_.grad(t));
  }
  if (held >= 0) stream->release(held, true);
  return read_norm(int(model_.tensors().size()));
}

FusedStep::FusedStep(LlamaModel& model, const OptimizerSet& optimizers, double max_norm,
                     Arena& arena, Communicator& comm)
    : StepStrategy(model, optimizers, max_norm, arena, comm) {
  GRASS_CHECK(model.memory_options().fused_update, "FusedStep needs a model built for it");
  int64_t largest = 0;
  for (size_t i = 0; i < model.tensors().size(); i++)
    largest = std::max(largest, projected_numel(optimizers, int(i)));
  for (const LlamaModel::TensorStack& stack : stackable(model, optimizers))
    largest = std::max(largest, stack_numel(optimizers, stack));
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

void FusedStep::projected_stack(int first, int count, const void* dy, const void* const* x,
                                int64_t N, bool x_selected) {
  const int64_t numel = stack_numel(optimizers_, {first, count});
  const int grad_bytes = model_.storage().grad_bytes;
  model_.backend().zero(projected_, size_t(numel) * grad_bytes);
  optimizers_.of(first).accumulate_stack(first, count, projected_, dy, x, N, x_selected);
  char* g = static_cast<char*>(projected_);
  for (int i = 0; i < count; i++) {
    const int64_t n = projected_numel(optimizers_, first + i);
    apply(first + i, g, n);
    g += n * grad_bytes;
  }
}

void FusedStep::dense_ready(int tensor, void* grad) {
  apply(tensor, grad, model_.tensors()[size_t(tensor)].numel);
}

double FusedStep::finish() { return read_norm(1); }

void RefreshPass::projected(int tensor, const void* dy, const void* x, int64_t N,
                            bool x_selected) {
  GRASS_CHECK(!x_selected, "a refresh pass reads the inputs whole");
  optimizers_.of(tensor).refresh_pass_projected(tensor, dy, x, N);
}

}  // namespace grass
