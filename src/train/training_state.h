// Everything a training step holds, built in one place so that a real run and `grass mem`'s
// plan make the same allocations in the same order: the model (weights, dense gradients,
// activations, workspace), dense AdamW, and the GRASS optimizer when the run uses it.
#pragma once
#include <memory>

#include "config/config.h"
#include "core/arena.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/grass.h"

namespace grass {

struct TrainingState {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<AdamW> adamw;          // dense tensors (all of them without GRASS)
  std::unique_ptr<GrassOptimizer> grass; // GRASS targets; null for optimizer "adamw"
};

// Allocates from `arena` (the backend's memory) with the element sizes of the backend's storage;
// with a planning arena nothing is allocated or initialised.
TrainingState build_training_state(const RunConfig& cfg, Arena& arena, Backend& backend);

}  // namespace grass
