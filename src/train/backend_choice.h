// The backend a run computes on, chosen from its `device` key: "cpu", "cuda" (a UserError naming
// the key when no GPU is usable or the build has no CUDA), or "auto" (the GPU when one is usable,
// else the CPU, saying which and why). The run's precision gives the backend its storage.
#pragma once
#include <memory>

#include "backend.h"
#include "config/config.h"

namespace grass {

std::unique_ptr<Backend> choose_backend(const RunConfig& cfg);

}  // namespace grass
