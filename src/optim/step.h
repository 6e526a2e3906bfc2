// The two ways an optimizer step is taken (docs/architecture.md draws both). Each is the model's
// GradientSink for the step: the backward hands it every projected tensor's dy and x and, fused,
// every dense gradient as it completes; it calls the tensors' optimizers (optim/optimizer.h),
// which have no modes of their own.
//
//   DeferredStep  gradients first: the dense ones accumulate in the model's gradient buffer and
//                 each projected tensor's in a buffer of its own, over every micro-batch; then
//                 one global L2 norm over all of them (dense and projected), one clipping
//                 coefficient, and every tensor's update.
//   FusedStep     each tensor is updated the moment the backward forms its gradient, so only one
//                 tensor's gradient exists at a time (docs/memory.md). The global norm is known
//                 only at the end, so each tensor's gradient is clipped on its own to the max norm;
//                 whenever the global norm is within it, so is every tensor's, and the result
//                 equals the deferred step's. One backward per step.
// With several ranks (dist/communicator.h) each gradient is summed over the ranks before its
// norm: deferred, each tensor's as the last micro-batch's backward completes it, started there
// (NCCL: on a communication stream, under the rest of the backward) and waited for in finish();
// fused, each tensor's as it forms, before its update.
// Both report the global L2 norm of the unclipped gradients, dense and projected: the projected
// gradients are what the optimizers train on (G_C for GRASS), so that is the norm clipped and
// logged, not the norm the full gradients would have had.
// Norms and clipping coefficients stay in backend memory (ClipScalars, kernels/clip_rule.h): the
// updates read the coefficient there, and the host reads the norm once, in finish().
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/clip_rule.h"
#include "src/core/arena.h"
#include "src/dist/communicator.h"
#include "src/model/gradient_sink.h"
#include "src/model/llama.h"
#include "src/optim/optimizer.h"
#include "src/optim/state_slots.h"

namespace grass {

// The element of the storage's gradients as the ranks sum them (fp32, or bf16 in pure bf16).
inline Element grad_element(const Storage& storage) {
  return storage.grad_bytes == 2 ? Element::BF16 : Element::F32;
}

class StepStrategy : public GradientSink {
 public:
  StepStrategy(LlamaModel& model, const OptimizerSet& optimizers, double max_norm, Arena& arena,
               Communicator& comm);
  // offload.optimizer_states: the optimizers' states live in the host tier (their constructors
  // put them there) and pass through two device slots, allocated here, around each update; an
  // elementwise update in pieces of up to piece_bytes of states (or the largest whole tensor's).
  void offload_states(Arena& arena, int64_t piece_bytes);
  const StateSlots* state_slots() const { return slots_.get(); }
  // Before the step's first forward; step counts from 0.
  virtual void begin(int64_t step, double lr) = 0;
  // The tensor's optimizer's (Optimizer::selected_columns).
  bool selected_columns(int tensor, SelectedColumns* columns) const override;
  // Their one optimizer's (Optimizer::stacks).
  bool stacks(int first, int count) const override;
  // Before the step's last forward: from here each gradient is complete when the backward hands
  // it over, and its sum over the ranks can start.
  void last_micro_batch() { summing_ = launched(); }
  // After the last backward: the updates are done (or done now); returns the global L2 norm of
  // the step's unclipped gradients.
  virtual double finish() = 0;
  // Tensors whose gradient was scaled down by clipping in the last step (fused: per tensor;
  // deferred: all of them or none).
  int clipped_tensors() const { return clipped_; }
  // The smallest coefficient a gradient of the last step was multiplied by: deferred, the one
  // coefficient of every gradient; fused, the most clipped tensor's. 1 when nothing was clipped.
  double clip_coefficient() const { return clip_coefficient_; }

 protected:
  // Zeroes the step's sums and starts every optimizer's step.
  void begin_scalars(int64_t step);
  // Tensor t's update from g, read with the coefficient of the last Backend::clip(). With
  // offloaded states, piece by piece, each piece's states in a slot for its update (nothing else
  // reads or writes them), the next piece's on their way meanwhile: the tensor's next, or the
  // first of the tensor the last step updated after this one.
  void update(int tensor, void* g);
  // Reads the step's sums back (the step's one wait for the device): the global norm, and sets
  // clipped_ to the count of clip() calls that scaled down, times `tensors_per_clip`, and the
  // step's smallest clipping coefficient.
  double read_norm(int tensors_per_clip);

  // Started by a launcher: the gradients are summed over the ranks, even over one (the identity,
  // but through the communicator: `mpirun -np 1` on a GPU runs the real NCCL).
  bool launched() const { return &comm_ != &single_process(); }
  // g[numel], grad-typed, summed over the ranks in place.
  void sum_over_ranks(void* g, int64_t numel) {
    comm_.all_reduce_sum(g, numel, grad_element(model_.storage()));
  }

  LlamaModel& model_;
  const OptimizerSet& optimizers_;
  Communicator& comm_;
  double max_norm_;
  ClipScalars* clip_;  // backend memory
  bool summing_ = false;  // the last micro-batch of a launched run
  double lr_ = 0;
  int clipped_ = 0;
  double clip_coefficient_ = 1;

 private:
  // tensor's states from element `first` (its whole states when its pieces are whole tensors)
  std::vector<StateSpan> piece_spans(int tensor, int64_t first) const;
  void prefetch_piece(int tensor, int64_t first);

  std::unique_ptr<StateSlots> slots_;  // offload.optimizer_states; null otherwise
  std::vector<int64_t> piece_;         // per tensor: elements a piece (its numel: whole)
  // The order tensors were updated in (the backward's, or finish()'s): the first of a step and
  // each one's successor, -1 where not seen yet; prefetches follow it.
  int first_updated_ = -1, last_updated_ = -1;
  std::vector<int> next_updated_;
};

class DeferredStep final : public StepStrategy {
 public:
  // Allocates each projected tensor's gradient buffer; those of a stack their optimizer can form
  // together (Optimizer::stackable) in one block, in tensor order.
  DeferredStep(LlamaModel& model, const OptimizerSet& optimizers, double max_norm, Arena& arena,
               Communicator& comm = single_process());
  void begin(int64_t step, double lr) override;
  void projected(int tensor, const void* dy, const void* x, int64_t N, bool x_selected) override;
  void projected_stack(int first, int count, const void* dy, const void* const* x, int64_t N,
                       bool x_selected) override;
  void dense_ready(int tensor, void* grad) override;
  double finish() override;
  // Tensor t's projected gradient as accumulated so far (grad-typed; null for a dense tensor).
  const void* projected_gradient(int tensor) const { return projected_.at(size_t(tensor)); }

 private:
  std::vector<void*> projected_;  // per tensor: its projected gradient buffer, or null
  size_t sums_started_ = 0;       // tensors whose sum over the ranks has started this step
};

class FusedStep final : public StepStrategy {
 public:
  // Allocates one projected-gradient buffer, the largest any tensor needs, or any stack formed
  // together (Optimizer::stackable: both strategies form the same stacks, so their numbers are
  // the same), shared by all.
  FusedStep(LlamaModel& model, const OptimizerSet& optimizers, double max_norm, Arena& arena,
            Communicator& comm = single_process());
  void begin(int64_t step, double lr) override;
  void projected(int tensor, const void* dy, const void* x, int64_t N, bool x_selected) override;
  // The stack's gradients formed together, then each tensor clipped and updated in turn.
  void projected_stack(int first, int count, const void* dy, const void* const* x, int64_t N,
                       bool x_selected) override;
  void dense_ready(int tensor, void* grad) override;
  double finish() override;

 private:
  void apply(int tensor, void* g, int64_t numel);  // clips g on its own, then updates

  void* projected_ = nullptr;  // one tensor's projected gradient at a time
};

// The model's GradientSink for a refresh pass (Optimizer::wants_refresh_pass): each projected
// tensor's exact dy and x go to its optimizer's refresh_pass_projected, one tensor at a time;
// dense gradients are dropped (the step's own backward forms them again). train_step runs it.
class RefreshPass final : public GradientSink {
 public:
  explicit RefreshPass(const OptimizerSet& optimizers) : optimizers_(optimizers) {}
  void projected(int tensor, const void* dy, const void* x, int64_t N, bool x_selected) override;
  void dense_ready(int tensor, void* grad) override { (void)tensor, (void)grad; }

 private:
  const OptimizerSet& optimizers_;
};

}  // namespace grass
