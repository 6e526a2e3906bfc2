// A training state on one backend, built as src/train/trainer.cpp builds it: the memory plan's
// one reservation (a no-op on the CPU), an arena of the backend's memory, build_training_state,
// then init_weights(seed), which writes the same fp32 values through either backend. Members are
// destroyed in reverse order: the state, then the arena (handing its buffers back), then the
// backend. Backend memory is read only through the backend.
#pragma once
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "backend.h"
#include "config/config.h"
#include "core/arena.h"
#include "model/llama.h"
#include "storage.h"
#include "train/memory_plan.h"
#include "train/training_state.h"

namespace grass::gputest {

struct TrainingRun {
  RunConfig cfg;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Arena> arena;
  TrainingState state;

  TrainingRun(const RunConfig& c, PrecisionChoice precision, bool cuda) : cfg(c) {
    const Storage storage = storage_for(precision, cuda);
    backend = cuda ? make_cuda_backend(storage) : make_cpu_backend(storage);
    const MemoryPlan plan = plan_memory(cfg, storage);
    backend->reserve(plan.total, plan.buffers);
    arena = std::make_unique<Arena>(false, *backend);
    state = build_training_state(cfg, *arena, *backend);
    model().init_weights(cfg.seed);
  }
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  LlamaModel& model() { return *state.model; }
  // Dense tensor t's gradient, in fp32 on the host.
  std::vector<float> grad(const ParamTensor& t) {
    REQUIRE(t.dense());
    std::vector<float> host(size_t(t.numel));
    backend->read_grads(host.data(), model().grads_buffer(), t.grad_offset, t.numel);
    return host;
  }
};

}  // namespace grass::gputest
