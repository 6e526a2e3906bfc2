// The backend a run computes on, chosen from its `device` key: "cpu", "cuda" (a UserError naming
// the key when no GPU is usable or the build has no CUDA), or "auto" (the GPU when one is usable,
// else the CPU). The run's precision gives the backend its storage. *why_cpu (when given) gets
// the reason an "auto" run is on the CPU, for the start-up table; stderr stays for errors.
// gpu_index: the GPU a data-parallel rank takes (its index among its node's ranks).
#pragma once
#include <memory>
#include <string>

#include "kernels/backend.h"
#include "src/config/config.h"

namespace grass {

std::unique_ptr<Backend> choose_backend(const RunConfig& cfg, std::string* why_cpu = nullptr,
                                        int gpu_index = 0);

}  // namespace grass
