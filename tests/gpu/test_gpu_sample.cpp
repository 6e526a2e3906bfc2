// Sampling on the GPU (model/generate.h): LlamaModel::head_logits there (a one-row GEMM into the
// head's bf16 logits, widened on the host) against the CPU reference on the same bf16 weights, and
// greedy generation, whose windows are padded after their last token, against one forward over
// the whole text: causal attention must keep the padding out of every position it predicts from.
#include <algorithm>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/storage.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/core/rng.h"
#include "src/model/generate.h"
#include "src/model/llama.h"
#include "src/train/run_resolution.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

using namespace grass;

// Head dim 32, GQA, 2 layers; init 0.04 as test_gpu_model.cpp's comparisons (its header says why).
ModelConfig sample_model() {
  ModelConfig m;
  m.hidden_size = 128;
  m.intermediate_size = 344;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.num_hidden_layers = 2;
  m.vocab_size = 512;
  m.max_position_embeddings = 128;
  m.initializer_range = 0.04;
  return m;
}

// A model on one backend, weights from init_weights(seed): the same fp32 values on either side,
// stored in bf16 by the GPU and rounded to it by the CPU in bf16-mixed.
struct SampleModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Arena> arena;
  std::unique_ptr<LlamaModel> model;
  SampleModel(bool cuda, int B, int T) {
    const Storage storage = storage_for(PrecisionChoice::Bf16Mixed, cuda);
    backend = cuda ? make_cuda_backend(storage) : make_cpu_backend(storage);
    arena = std::make_unique<Arena>(false, *backend);
    model = std::make_unique<LlamaModel>(sample_model(), *arena, B, T, std::vector<std::string>{},
                                         *backend);
    model->init_weights(9);
  }
};

std::vector<int32_t> random_tokens(size_t n, int vocab, uint64_t seed) {
  std::vector<int32_t> out(n);
  for (size_t i = 0; i < n; i++) out[i] = int32_t(uniform_open01(seed, i) * vocab);
  return out;
}

int argmax(const float* row, int V) { return int(std::max_element(row, row + V) - row); }

}  // namespace

TEST_CASE("sample: the GPU's head_logits match the CPU reference", "[gpu]") {
  const int B = 2, T = 40, V = sample_model().vocab_size;
  SampleModel gpu(true, B, T), cpu(false, B, T);
  const std::vector<int32_t> inputs = random_tokens(size_t(B) * T, V, 31);
  const std::vector<int32_t> targets(inputs.size(), -1);
  gpu.model->forward(inputs.data(), targets.data(), B);
  cpu.model->forward(inputs.data(), targets.data(), B);
  const std::vector<int64_t> rows = {T - 1, 2 * T - 1, 7};
  const std::vector<float> got = gpu.model->head_logits(rows), want = cpu.model->head_logits(rows);
  REQUIRE(got.size() == rows.size() * size_t(V));
  // bf16 activations through two layers and a bf16 store of the logits (test_gpu_model.cpp: ~1%)
  CHECK(gputest::rel_error(got, want) < 2e-2);
}

TEST_CASE("sample: greedy on the GPU is the argmax of one forward over the whole text", "[gpu]") {
  const int T = 24, V = sample_model().vocab_size;
  SampleModel gpu(true, 1, T);
  const std::vector<int32_t> prompt = random_tokens(6, V, 32);
  SamplingSettings greedy;
  greedy.greedy = true;
  GenerationLimits limits;
  limits.max_new_tokens = T - int(prompt.size()) + 1;
  const std::vector<int32_t> made = generate(*gpu.model, prompt, 1, greedy, limits)[0];
  REQUIRE(made.size() == size_t(limits.max_new_tokens));

  std::vector<int32_t> text = prompt;
  text.insert(text.end(), made.begin(), made.end());
  const std::vector<int32_t> window(text.begin(), text.begin() + T), targets(size_t(T), -1);
  gpu.model->forward(window.data(), targets.data(), 1);
  std::vector<int64_t> rows;
  for (int64_t t = int64_t(prompt.size()) - 1; t < T; t++) rows.push_back(t);
  const std::vector<float> logits = gpu.model->head_logits(rows);
  for (size_t i = 0; i < rows.size(); i++) {
    INFO("position " << rows[i]);
    CHECK(text[size_t(rows[i]) + 1] == argmax(logits.data() + i * size_t(V), V));
  }
}
