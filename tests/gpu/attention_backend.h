// A CUDA backend on one of its attention kernels, its scratch planned for one attention shape:
// what the tests of the backend's attention paths (cuDNN's, "mma") run each kernel on.
#pragma once
#include <memory>

#include "kernels/backend.h"
#include "kernels/storage.h"
#include "src/core/arena.h"
#include "src/train/run_resolution.h"

namespace grass::gputest {

struct AttentionShape {
  int B, T, NH, NKV, HD;
};

struct AttentionBackend {
  std::unique_ptr<Backend> backend;
  Arena arena;
  std::unique_ptr<ScratchLease> scratch;
  AttentionBackend(AttentionKernel kernel, const AttentionShape& s)
      : backend(make_cuda_backend(storage_for(PrecisionChoice::Bf16Mixed, true), 0, kernel)),
        arena(false, *backend),
        scratch(backend->plan_scratch(
            arena, {s.B, s.T, s.NH * s.HD, 8, 8, s.NH, s.NKV, s.HD, 10000.0, kernel})) {}
};

}  // namespace grass::gputest
