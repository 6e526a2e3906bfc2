// The backend a run computes on, as resolve() (train/run_resolution.h) decides its `device` key
// for this machine: "cpu", "cuda" (a UserError naming the key when no GPU is usable or the build
// has no CUDA), or "auto" (the GPU when one is usable, unless fp32, else the CPU), with the
// storage resolve() gives. *why_cpu (when given) gets
// the reason an "auto" run is on the CPU, for the start-up table; stderr stays for errors.
// gpu_index: the GPU a data-parallel rank takes (its index among its node's ranks).
#pragma once
#include <memory>
#include <string>

#include "kernels/backend.h"
#include "src/config/config.h"

namespace grass {

// On the GPU, attention "auto" asks the CUDA backend to try cuDNN's kernels where it may take
// them (run_resolution.h: attention_request), falling back to the engine's in prepare_attention
// below.
std::unique_ptr<Backend> choose_backend(const RunConfig& cfg, std::string* why_cpu = nullptr,
                                        int gpu_index = 0);

// Before the reservation: builds on `backend` what attention keeps for the run's micro-batch
// (cuDNN's graphs, for its shapes and row pitches) and returns the kernels it computes with.
// attention "auto" on the CUDA backend takes cuDNN's when the build has them, libcudnn.so.9 and
// its engines load and both graphs build, else the engine's, saying why in one line
// (why_not_cudnn); "cudnn" that does not build is a UserError; the CPU has the engine's (its
// reference) and says nothing.
AttentionInUse prepare_attention(const RunConfig& cfg, Backend& backend);

// What this machine offers the build, for `grass --version`: the first GPU (or why none is
// usable) and whether cuDNN's library loads; one line each, "" for what the build lacks.
struct RuntimeReport {
  std::string gpu;
  std::string cudnn;
};
RuntimeReport runtime_report();

}  // namespace grass
