#include "train/training_state.h"

#include <cmath>
#include <vector>

#include "core/trace.h"
#include "optim/clip.h"

namespace grass {

ModelMemoryOptions model_memory_options(const RunConfig& cfg, const Storage& storage) {
  ModelMemoryOptions options;
  options.checkpoint_layers = cfg.activation_checkpointing == "layer";
  options.fused_update = cfg.fused_update == "on" ||
                         (cfg.fused_update == "auto" && storage.pure_bf16() &&
                          cfg.grad_accum_steps() == 1);
  return options;
}

TrainingState build_training_state(const RunConfig& cfg, Arena& arena, Backend& backend) {
  TrainingState s;
  const bool use_grass = cfg.optimizer.name == "grass";
  const std::vector<std::string> compressed =
      use_grass ? grass_target_tensor_names(cfg.model.num_hidden_layers, cfg.optimizer.grass.targets)
                : std::vector<std::string>{};
  const ModelMemoryOptions memory = model_memory_options(cfg, backend.storage());
  s.model = std::make_unique<LlamaModel>(cfg.model, arena, cfg.micro_batch_size, cfg.seq_len,
                                         compressed, backend, memory);
  s.adamw = std::make_unique<AdamW>(cfg.optimizer, *s.model, arena, cfg.seed);
  if (use_grass) {
    s.grass = std::make_unique<GrassOptimizer>(cfg.optimizer, *s.model,
                                               int64_t(cfg.micro_batch_size) * cfg.seq_len, arena,
                                               /*shared_gc=*/memory.fused_update);
    s.model->set_compressed_sink(s.grass.get());
  }
  if (memory.fused_update) {
    s.fused = std::make_unique<FusedUpdate>(*s.model, *s.adamw, s.grass.get(), cfg.grad_clip);
    s.model->set_fused_sink(s.fused.get());
  }
  return s;
}

StepOutcome train_step(TrainingState& s, const RunConfig& cfg, int64_t step, double lr,
                       const std::function<void(int32_t*, int32_t*)>& next_batch) {
  LlamaModel& model = *s.model;
  if (s.fused) {
    s.fused->begin_step(step, lr);
  } else {
    model.zero_grads();
    if (s.grass) s.grass->begin_step(step);
  }
  const int accum = cfg.grad_accum_steps();
  const size_t N = size_t(cfg.micro_batch_size) * cfg.seq_len;
  std::vector<int32_t> inputs(N), targets(N);
  StepOutcome out;
  for (int micro = 0; micro < accum; micro++) {
    next_batch(inputs.data(), targets.data());
    out.loss += model.forward(inputs.data(), targets.data(), cfg.micro_batch_size) / accum;
    model.backward(1.0 / accum);  // the step's loss is the mean over its micro-batches
  }
  if (s.fused) {  // already applied, each tensor clipped on its own (optim/fused_update.h)
    out.grad_norm = s.fused->grad_norm();
    return out;
  }
  // one global norm over the dense and the compressed gradients
  out.grad_norm = std::sqrt(model.backend().sum_squares(model.grads_buffer(), model.num_dense_grads()) +
                            (s.grass ? s.grass->grad_sum_squares() : 0.0));
  const double clip = clip_coefficient(out.grad_norm, cfg.grad_clip);
  const TraceRange range("optimizer");
  if (s.grass) s.grass->step(model, clip, lr);
  s.adamw->step(model, clip, lr, step + 1);
  return out;
}

}  // namespace grass
