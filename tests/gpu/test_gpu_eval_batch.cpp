// Evaluation's forward-only model on the GPU (ModelMemoryOptions::forward_only): beside the
// training model on its weights, and alone with its own, it scores the windows the training model
// scores at its micro-batch, its head in two chunks of rows (a vocabulary of 4096: 1,024 rows a
// chunk), on the training model's scratch or, alone, on a forward-only scratch.
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/storage.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/core/rng.h"
#include "src/model/llama.h"
#include "src/train/run_resolution.h"
#include "tests/gpu/gpu_test_util.h"

#if __has_include(<cuda_emu.h>)
#define GRASS_TEST_CUDA_EMU 1
#endif

namespace {

using namespace grass;

ModelConfig eval_model() {
  ModelConfig m;
  m.hidden_size = 64;
  m.intermediate_size = 172;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.num_hidden_layers = 1;  // odd: the last layer writes the stream buffer it did not start in
  m.vocab_size = 4096;
  m.max_position_embeddings = 64;
  m.initializer_range = 0.04;
  return m;
}

// The mean loss over `sequences` windows of T tokens, `batch` of them a forward.
double mean_loss(LlamaModel& model, const std::vector<int32_t>& inputs,
                 const std::vector<int32_t>& targets, int sequences, int batch) {
  const int T = model.seq_len();
  double sum = 0;
  int64_t counted = 0;
  for (int first = 0; first < sequences; first += batch) {
    const int B = std::min(batch, sequences - first);
    const size_t at = size_t(first) * T;
    sum += model.forward(inputs.data() + at, targets.data() + at, B) * double(model.valid_targets());
    counted += model.valid_targets();
  }
  return sum / double(counted);
}

}  // namespace

TEST_CASE("eval: a forward-only model on the GPU scores the training model's windows", "[gpu][model]") {
  const Storage storage = storage_for(PrecisionChoice::Bf16Mixed, true);
  const std::unique_ptr<Backend> backend = make_cuda_backend(storage);
  const int T = 16, sequences = 66;  // 1,056 rows: two chunks of the head, the second short
  std::vector<int32_t> inputs(size_t(sequences) * T), targets(inputs.size());
  for (size_t i = 0; i < inputs.size(); i++) {
    inputs[i] = int32_t(uniform_open01(41, i) * 4096);
    targets[i] = i % 13 == 5 ? -1 : int32_t(uniform_open01(42, i) * 4096);  // some ignored
  }
  Arena arena(false, *backend);
  LlamaModel model(eval_model(), arena, 2, T, {}, *backend);
  model.init_weights(5);
  LlamaModel view(model, arena, sequences);
  Arena own_arena(false, *backend);
  ModelMemoryOptions forward_only;
  forward_only.forward_only = true;
  LlamaModel own(eval_model(), own_arena, sequences, T, {}, *backend, forward_only);
  own.init_weights(5);

  const double reference = mean_loss(model, inputs, targets, sequences, 2);
  REQUIRE(std::isfinite(reference));
  // On a GPU, bf16 activations: another batch may round a GEMM's output differently on cuBLASLt
  // (2e-3). The emulator computes every element in one order whatever the shape, so only the
  // loss's fp64 sum is grouped otherwise: a row left out or counted twice moves it by 1e-3.
#ifdef GRASS_TEST_CUDA_EMU
  const double bound = 1e-12;
#else
  const double bound = 2e-3;
#endif
  // All windows in one forward (the head in two chunks), and 7 a forward with a short last one.
  const double view_all = mean_loss(view, inputs, targets, sequences, sequences);
  CHECK(std::abs(view_all - reference) <= bound * reference);
  CHECK(std::abs(mean_loss(view, inputs, targets, sequences, 7) - reference) <= bound * reference);
  CHECK(std::abs(mean_loss(own, inputs, targets, sequences, sequences) - reference) <=
        bound * reference);
  // A repeat gives the same bits.
  CHECK(mean_loss(view, inputs, targets, sequences, sequences) == view_all);
}
