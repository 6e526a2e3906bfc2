#include "src/train/training_state.h"

#include <vector>

#include "src/core/error.h"
#include "src/optim/adamw.h"
#include "src/optim/grass.h"
#include "src/optim/lowrank.h"
#include "src/train/run_resolution.h"

namespace grass {

TrainingState build_training_state(const RunConfig& cfg, Arena& arena, Backend& backend,
                                   Communicator& comm, int eval_batch) {
  TrainingState s;
  s.comm = &comm;
  const OptimizerKind kind = cfg.optimizer.kind;
  const std::vector<std::string> projected =
      is_projected(kind)
          ? projection_tensor_names(cfg.model.num_hidden_layers, cfg.optimizer.projection.targets)
          : std::vector<std::string>{};
  const ModelMemoryOptions memory = model_memory_options(cfg, backend.storage());
  s.model = std::make_unique<LlamaModel>(cfg.model, arena, cfg.micro_batch_size, cfg.seq_len,
                                         projected, backend, memory);
  s.optimizers = std::make_unique<OptimizerSet>(s.model->tensors().size());
  OptimizerConfig optimizer = cfg.optimizer;
  optimizer.offload_states = cfg.offload.optimizer_states;
  s.optimizers->add(std::make_unique<AdamW>(optimizer, *s.model, arena, cfg.seed));
  const int64_t max_tokens = int64_t(cfg.micro_batch_size) * cfg.seq_len;
  switch (kind) {
    case OptimizerKind::AdamW: break;
    case OptimizerKind::Grass:
      s.optimizers->add(std::make_unique<Grass>(optimizer, *s.model, max_tokens, arena,
                                                Grass::kRefreshChunkBytes, comm));
      break;
    case OptimizerKind::GaLore:
      s.optimizers->add(std::make_unique<GaLore>(optimizer, *s.model, max_tokens, arena, comm));
      break;
    case OptimizerKind::Flora:
      s.optimizers->add(std::make_unique<Flora>(optimizer, *s.model, max_tokens, arena, comm));
      break;
  }
  if (memory.fused_update)
    s.step = std::make_unique<FusedStep>(*s.model, *s.optimizers, cfg.grad_clip, arena, comm);
  else
    s.step = std::make_unique<DeferredStep>(*s.model, *s.optimizers, cfg.grad_clip, arena, comm);
  if (cfg.offload.optimizer_states) s.step->offload_states(arena, cfg.offload.piece_bytes);
  s.model->set_gradient_sink(s.step.get());
  if (eval_batch > cfg.micro_batch_size)
    s.eval_model = std::make_unique<LlamaModel>(*s.model, arena, eval_batch);
  return s;
}

double flops_per_token(const TrainingState& s) {
  return s.model->flops_per_token() - s.optimizers->flops_saved_per_token();
}

StepOutcome train_step(TrainingState& s, const RunConfig& cfg, int64_t step, double lr,
                       const std::function<void(int32_t*, int32_t*)>& next_batch) {
  LlamaModel& model = *s.model;
  s.step->begin(step, lr);  // the optimizers' begin_step: they know whether this step refreshes
  model.begin_sampled_step(cfg.seed, step, s.comm->rank(), s.optimizers->needs_exact_activations());
  const int world = s.comm->world();
  GRASS_CHECK(cfg.ranks == world, "a run config checked for another number of ranks");
  const int accum = cfg.micro_batches_per_rank();
  const size_t N = size_t(cfg.micro_batch_size) * cfg.seq_len;
  std::vector<int32_t> inputs(N), targets(N);
  StepOutcome out;
  // the first micro-batch's refresh pass (GaLore's svd_batch "layer"): its forward and backward
  // only form the projections; its loss and dense gradients are dropped, and the micro-batch
  // then trains as any other
  const bool refresh_pass = s.optimizers->wants_refresh_pass();
  if (refresh_pass) {
    next_batch(inputs.data(), targets.data());
    RefreshPass pass(*s.optimizers);
    {
      // the step's sink (or a test's around it) back when the pass ends, thrown out of or not
      struct SinkBack {
        LlamaModel& model;
        GradientSink* sink;
        ~SinkBack() { model.set_gradient_sink(sink); }
      } back{model, model.gradient_sink()};
      model.set_gradient_sink(&pass);
      model.forward_backward(inputs.data(), targets.data(), cfg.micro_batch_size,
                             1.0 / (double(accum) * world));
    }
    model.discard_last_loss();
    model.zero_grads();
    for (const auto& o : s.optimizers->all()) o->end_refresh_pass();
  }
  for (int micro = 0; micro < accum; micro++) {
    if (micro > 0 || !refresh_pass) next_batch(inputs.data(), targets.data());
    if (micro == accum - 1) s.step->last_micro_batch();
    // the step's loss is the mean over every rank's micro-batches: the ranks' gradients are summed
    model.forward_backward(inputs.data(), targets.data(), cfg.micro_batch_size,
                           1.0 / (double(accum) * world));
  }
  out.grad_norm = s.step->finish();
  out.clip_coef = s.step->clip_coefficient();
  for (const double loss : model.take_losses()) out.loss += loss / (double(accum) * world);
  out.loss = s.comm->sum(out.loss);
  return out;
}

}  // namespace grass
