// Fused per-layer updates (docs/memory.md): the optimizer applies each gradient the moment the
// backward forms it, so neither the dense gradients nor GRASS's G_C exist for the whole model at
// once: one tensor's gradient at a time is all the memory gradients take. A 13B GRASS run saves
// 1.8 GiB of bf16 gradients this way (../shared/GRASS.md, "Memory arithmetic").
//
// Clipping is per tensor: the global norm is known only once every gradient is formed, by which
// time the early ones are applied and gone. Each tensor's gradient (G_C for a GRASS target) is
// clipped to the same max norm on its own. Whenever the global norm is within grad_clip, so is
// every tensor's, and the fused step equals the unfused one exactly; only when the global rule
// would clip do the two differ (per-tensor clipping then scales only the tensors over the limit).
// The step still reports the global norm of the unclipped gradient.
#pragma once
#include <cstdint>

#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/grass.h"

namespace grass {

class FusedUpdate : public FusedGradSink {
 public:
  // grass: null for AdamW runs; it must have been built with a shared G_C.
  FusedUpdate(LlamaModel& model, AdamW& adamw, GrassOptimizer* grass, double max_norm);

  // Before the step's forward. step counts from 0, as the trainer's loop does.
  void begin_step(int64_t step, double lr);
  void accumulate(int tensor_index, const void* dy, const void* x, int64_t N) override;
  void dense_ready(int tensor_index, void* grad) override;

  // After the backward: the global L2 norm of the step's (unclipped) gradients, dense and
  // compressed, and how many tensors per-tensor clipping scaled down.
  double grad_norm() const;
  int clipped_tensors() const { return clipped_; }

 private:
  double clip_for(double sum_squares);  // the coefficient of one tensor; counts the clipped

  LlamaModel& model_;
  AdamW& adamw_;
  GrassOptimizer* grass_;
  double max_norm_;
  int64_t step_ = 0;
  double lr_ = 0;
  double sum_squares_ = 0;
  int clipped_ = 0;
};

}  // namespace grass
