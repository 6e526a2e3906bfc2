// The backend a run computes on, chosen from its `device` key, and the storage its precision
// gives there. The CUDA kernels (kernels/cuda) are built and tested on their own, but the model
// does not run on them yet: "auto" says so when it finds a GPU and trains on the CPU, and
// "cuda" is refused with that explanation rather than silently running elsewhere.
#pragma once
#include <string>

#include "config/config.h"
#include "model/storage.h"

namespace grass {

struct BackendChoice {
  Storage storage;
  std::string description;  // for the start-up table: "cpu, 2 threads (...); GPU ... found, ..."
};

// UserError naming `device` when the run asks for a backend that cannot run it.
BackendChoice choose_backend(const RunConfig& cfg);

}  // namespace grass
