// attention "auto" (the run config's default) on the CUDA backend: the backend starts on the
// engine's kernels and tries cuDNN's in prepare_attention, before the reservation. Where cuDNN's
// do not load or build (the emulator: a build without cuDNN's headers) it keeps the engine's and
// says why in one line, and the run then computes exactly what a backend given the engine's
// kernels computes. Where they build (a GPU with libcudnn.so.9) it runs on cuDNN's and names the
// version; tests/gpu/test_gpu_attention_cudnn.cpp holds cuDNN's numbers to the engine's.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/storage.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/core/rng.h"
#include "src/train/backend_choice.h"
#include "src/train/memory_plan.h"
#include "src/train/run_resolution.h"
#include "src/train/training_state.h"

#if __has_include(<cuda_emu.h>)
#define GRASS_TEST_CUDA_EMU 1
#endif

namespace {

using namespace grass;
using Catch::Matchers::Contains;

// A small GQA model at a micro-batch of 1 to 3 sequences of 16 or 32 tokens, on device "cuda".
RunConfig auto_run(std::mt19937_64& rng) {
  RunConfig c;
  c.model.hidden_size = 64;
  c.model.intermediate_size = 96;
  c.model.num_attention_heads = 4;
  c.model.num_key_value_heads = 2;
  c.model.num_hidden_layers = 2;
  c.model.vocab_size = 128;
  c.model.max_position_embeddings = 32;
  c.device = DeviceChoice::Cuda;
  c.precision = PrecisionChoice::Bf16Mixed;
  c.micro_batch_size = c.total_batch_size = int(1 + rng() % 3);
  c.seq_len = rng() % 2 ? 16 : 32;
  c.seed = rng();
  c.optimizer.lr = 1e-3;
  return c;
}

// One training step of cfg's run on `backend`, as the trainer takes it (its plan reserved, the
// model on the kernels cfg names), from seeded weights on random tokens: the loss, then every
// weight after the update.
std::vector<double> one_step(Backend& backend, const RunConfig& cfg, uint64_t token_seed) {
  const MemoryPlan plan = plan_memory(cfg, backend.storage());
  backend.reserve(plan.total, plan.buffers);
  Arena arena(false, backend, &backend.host_tier());
  TrainingState state = build_training_state(cfg, arena, backend);
  state.model->init_weights(cfg.seed);
  const auto tokens = [&](int32_t* in, int32_t* tg) {
    const size_t n = size_t(cfg.micro_batch_size) * cfg.seq_len;
    for (size_t i = 0; i < n; i++) {
      in[i] = int32_t(uniform_open01(token_seed, i) * cfg.model.vocab_size);
      tg[i] = int32_t(uniform_open01(token_seed + 1, i) * cfg.model.vocab_size);
    }
  };
  const StepOutcome outcome = train_step(state, cfg, 0, cfg.optimizer.lr, tokens);
  std::vector<double> out = {outcome.loss, outcome.grad_norm};
  for (const ParamTensor& t : state.model->tensors()) {
    std::vector<float> w(size_t(t.numel));
    backend.read_weights(w.data(), state.model->weights(), t.offset, t.numel);
    out.insert(out.end(), w.begin(), w.end());
  }
  return out;
}

}  // namespace

TEST_CASE("attention auto: the CUDA backend takes cuDNN's kernels where they build, else keeps "
          "the engine's and says why, computing what they compute",
          "[gpu][train]") {
  std::mt19937_64 rng(std::random_device{}());
  const RunConfig cfg = auto_run(rng);
  INFO("micro-batch " << cfg.micro_batch_size << " x " << cfg.seq_len << ", seed " << cfg.seed);
  REQUIRE(cfg.attention == AttentionChoice::Auto);  // the default
  const std::unique_ptr<Backend> backend = choose_backend(cfg);
  REQUIRE(backend->storage().cuda);
  // nothing is tried before prepare_attention (grass eval and sample never call it)
  CHECK(backend->attention_in_use().kernel == AttentionKernel::Grass);
  const AttentionInUse in_use = prepare_attention(cfg, *backend);
  INFO("why not cuDNN's: " << in_use.why_not_cudnn);
  CHECK(in_use.why_not_cudnn.find('\n') == std::string::npos);  // one line
#ifdef GRASS_HAVE_CUDNN
  if (in_use.kernel == AttentionKernel::Cudnn) {
    CHECK(in_use.cudnn_version >= 90000);  // libcudnn.so.9
    CHECK(in_use.why_not_cudnn.empty());
    CHECK_THAT(describe_attention(cfg.attention, in_use),
               Contains("cuDNN 9.") && Contains("taken by \"auto\""));
  } else {  // a library that does not load, or graphs that do not build here: named
    CHECK_THAT(in_use.why_not_cudnn, Contains("attention: \"cudnn\""));
  }
#else
  CHECK(in_use.kernel == AttentionKernel::Grass);
  CHECK(in_use.cudnn_version == 0);
  CHECK_THAT(in_use.why_not_cudnn, Contains("this grass was built without cuDNN's headers"));
  CHECK(describe_attention(cfg.attention, in_use) ==
        "the engine's kernels (\"auto\" did not take cuDNN's: " + in_use.why_not_cudnn + ")");
#endif
  CHECK(backend->attention_in_use().kernel == in_use.kernel);
  // The run on the kernels it settled on, against a backend given them outright: the same bits
  const RunConfig settled = with_attention(cfg, in_use.kernel);
  const std::unique_ptr<Backend> given =
      make_cuda_backend(backend->storage(), 0, in_use.kernel);
  given->prepare_attention(cfg.micro_batch_size, cfg.seq_len, cfg.model.num_attention_heads,
                           cfg.model.num_key_value_heads, cfg.model.head_dim(), true);
  const uint64_t tokens = rng();
  const std::vector<double> a = one_step(*backend, settled, tokens);
  const std::vector<double> b = one_step(*given, settled, tokens);
  REQUIRE(std::isfinite(a[0]));
  CHECK(a == b);
}

TEST_CASE("attention auto: an evaluation batch above the micro-batch keeps the engine's kernels, "
          "and grass asks nothing of cuDNN",
          "[gpu]") {
  std::mt19937_64 rng(std::random_device{}());
  RunConfig cfg = auto_run(rng);
  cfg.val_files = {"val.bin"};  // named only: nothing reads it here
  cfg.eval_batch_size = cfg.micro_batch_size + 1 + int(rng() % 4);
  const std::unique_ptr<Backend> backend = choose_backend(cfg);
  const AttentionInUse in_use = prepare_attention(cfg, *backend);
  CHECK(in_use.kernel == AttentionKernel::Grass);
  CHECK(in_use.why_not_cudnn == "eval_batch_size " + std::to_string(cfg.eval_batch_size) +
                                    " is above micro_batch_size " +
                                    std::to_string(cfg.micro_batch_size) +
                                    ", and cuDNN's graphs are built for the micro-batch");
  cfg.attention = AttentionChoice::Grass;
  const std::unique_ptr<Backend> engine = choose_backend(cfg);
  const AttentionInUse asked = prepare_attention(cfg, *engine);
  CHECK(asked.kernel == AttentionKernel::Grass);
  CHECK(asked.why_not_cudnn.empty());
  CHECK(describe_attention(cfg.attention, asked) == "the engine's kernels");
}
