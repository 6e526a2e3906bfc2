// Everything a training step holds, built in one place so that a real run and `grass mem`'s
// plan make the same allocations in the same order: the model (weights, dense gradients,
// activations, workspace), the optimizers that train its tensors, and the step strategy.
#pragma once
#include <functional>
#include <memory>

#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/dist/communicator.h"
#include "src/model/llama.h"
#include "src/optim/optimizer.h"
#include "src/optim/step.h"

namespace grass {

struct TrainingState {
  std::unique_ptr<LlamaModel> model;
  // Evaluation's forward-only view of model's weights at a larger batch; null: evaluation runs on
  // model itself (at most micro_batch_size sequences a forward).
  std::unique_ptr<LlamaModel> eval_model;
  std::unique_ptr<OptimizerSet> optimizers;  // dense AdamW, and the projected optimizer if any
  std::unique_ptr<StepStrategy> step;        // the model's gradient sink
  Communicator* comm = nullptr;              // the ranks whose gradients each step sums
};

// Allocates from `arena` (the backend's memory) with the element sizes of the backend's storage,
// the model's memory options resolved for it (train/run_resolution.h); with a planning arena
// nothing is allocated or initialised. comm: the data-parallel ranks. eval_batch: the sequences
// an evaluation forward takes (memory_plan.h: resolve_eval_batch); above micro_batch_size, the
// evaluation model is built for them after everything else.
TrainingState build_training_state(const RunConfig& cfg, Arena& arena, Backend& backend,
                                   Communicator& comm = single_process(), int eval_batch = 0);

// One optimizer step as the trainer takes it: the forward and backward of this rank's
// micro-batches (next_batch fills inputs and targets, [micro_batch_size, seq_len] each; a rank
// takes total_batch_size / (micro_batch_size x world) of them), then the step strategy's sums over
// the ranks, norm, clipping and updates (made during the backward when fused). step counts from 0.
// Training FLOPs per token as MFU counts them: the model's, less the weight-gradient FLOPs the
// projected gradients save (a GRASS target costs 2rn, not 2mn).
double flops_per_token(const TrainingState& s);

struct StepOutcome {
  double loss = 0;       // mean over the step's micro-batches, every rank's
  double grad_norm = 0;  // global L2 norm of the unclipped gradients, dense and projected
  double clip_coef = 1;  // the smallest clipping coefficient applied (StepStrategy); 1: none
};
StepOutcome train_step(TrainingState& s, const RunConfig& cfg, int64_t step, double lr,
                       const std::function<void(int32_t* inputs, int32_t* targets)>& next_batch);

}  // namespace grass
