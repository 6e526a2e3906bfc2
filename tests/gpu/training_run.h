// A training state on one backend, built as src/train/trainer.cpp builds it: the memory plan's
// one reservation (a no-op on the CPU), an arena of the backend's memory, build_training_state,
// then init_weights(seed), which writes the same fp32 values through either backend. Members are
// destroyed in reverse order: the state, then the arena (handing its buffers back), then the
// backend. Backend memory is read only through the backend.
#pragma once
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/storage.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/model/llama.h"
#include "src/train/memory_plan.h"
#include "src/train/run_resolution.h"
#include "src/train/training_state.h"

namespace grass::gputest {

struct TrainingRun {
  RunConfig cfg;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Arena> arena;
  TrainingState state;

  TrainingRun(const RunConfig& c, PrecisionChoice precision, bool cuda) : cfg(c) {
    const Storage storage = storage_for(precision, cuda);
#ifdef GRASS_HAVE_CUDA
    backend = cuda ? make_cuda_backend(storage) : make_cpu_backend(storage);
#else
    REQUIRE_FALSE(cuda);  // a build without CUDA (no nvcc) runs the CPU tests only
    backend = make_cpu_backend(storage);
#endif
    const MemoryPlan plan = plan_memory(cfg, storage);
    backend->reserve(plan.total, plan.buffers);
    arena = std::make_unique<Arena>(false, *backend, &backend->host_tier());
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
  // The stored elements of t outside Hugging Face's shape (a padded ffn's pad), in the weights
  // and, with one, the master copy: empty for an unpadded tensor.
  std::vector<float> pad_values(const ParamTensor& t) {
    std::vector<float> stored(size_t(t.numel)), master;
    backend->read_weights(stored.data(), model().weights(), t.offset, t.numel);
    if (model().master()) {
      master.resize(size_t(t.numel));
      backend->download(master.data(), model().master() + t.offset, master.size() * sizeof(float));
    }
    const int64_t cols = t.shape.back(), hf_cols = t.hf_shape.back();
    const int64_t hf_rows = t.shape.size() == 2 ? t.hf_shape[0] : 1;
    std::vector<float> pad;
    for (int64_t e = 0; e < t.numel; e++)
      if (e / cols >= hf_rows || e % cols >= hf_cols) {
        pad.push_back(stored[size_t(e)]);
        if (!master.empty()) pad.push_back(master[size_t(e)]);
      }
    return pad;
  }
};

}  // namespace grass::gputest
