// Properties of the model and the training step that the PyTorch fixture does not cover:
// initialisation, tied embeddings, micro-batch accumulation, the learning-rate schedule.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "src/core/arena.h"
#include "src/core/rng.h"
#include "src/model/llama.h"
#include "src/optim/schedule.h"
#include "tests/test_util.h"

using namespace grass;

namespace {

ModelConfig small_config() {
  ModelConfig c;
  c.hidden_size = 32;
  c.intermediate_size = 45;  // odd on purpose
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.num_hidden_layers = 2;
  c.vocab_size = 50;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.initializer_range = 0.1;
  return c;
}

std::vector<int32_t> random_tokens(size_t n, int vocab, uint64_t seed) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; i++) t[i] = int32_t(uniform_open01(seed, i) * vocab);
  return t;
}

double rel_err(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST_CASE("initialisation is seeded, HF-shaped and norm gains start at 1", "[model]") {
  const ModelConfig cfg = small_config();
  Arena arena;
  LlamaModel a(cfg, arena, 1, 8), b(cfg, arena, 1, 8);
  a.init_weights(1);
  b.init_weights(1);
  CHECK(std::equal(test::params(a), test::params(a) + a.num_params(), test::params(b)));
  b.init_weights(2);
  CHECK_FALSE(std::equal(test::params(a), test::params(a) + a.num_params(), test::params(b)));
  for (const ParamTensor& t : a.tensors()) {
    const float* p = test::params(a) + t.offset;
    if (t.is_norm) {
      for (int64_t i = 0; i < t.numel; i++) REQUIRE(p[i] == 1.0f);
      continue;
    }
    double mean = 0, sq = 0;
    for (int64_t i = 0; i < t.numel; i++) mean += p[i], sq += double(p[i]) * p[i];
    mean /= t.numel;
    const double stddev = std::sqrt(sq / t.numel - mean * mean);
    INFO(t.name);
    CHECK(std::abs(mean) < 5 * cfg.initializer_range / std::sqrt(double(t.numel)));
    CHECK(stddev == Approx(cfg.initializer_range).epsilon(0.1));
  }
}

TEST_CASE("tied embeddings: one table, gradient = embedding part + lm_head part", "[model]") {
  ModelConfig untied_cfg = small_config(), tied_cfg = small_config();
  tied_cfg.tie_word_embeddings = true;
  const int B = 2, T = 8;
  Arena arena;
  LlamaModel untied(untied_cfg, arena, B, T), tied(tied_cfg, arena, B, T);
  CHECK(tied.num_params() == untied.num_params() - int64_t(untied_cfg.vocab_size) * 32);
  untied.init_weights(5);
  // the untied model's lm_head becomes a copy of its embedding; the rest is shared by name
  const ParamTensor& emb = untied.tensor("model.embed_tokens.weight");
  const ParamTensor& head = untied.tensor("lm_head.weight");
  std::copy(test::params(untied) + emb.offset, test::params(untied) + emb.offset + emb.numel,
            test::params(untied) + head.offset);
  for (const ParamTensor& t : tied.tensors())
    std::copy(test::params(untied) + untied.tensor(t.name).offset,
              test::params(untied) + untied.tensor(t.name).offset + t.numel, test::params(tied) + t.offset);

  const auto inputs = random_tokens(B * T, 50, 11), targets = random_tokens(B * T, 50, 12);
  const double lu = untied.forward(inputs.data(), targets.data(), B);
  const double lt = tied.forward(inputs.data(), targets.data(), B);
  CHECK(lt == Approx(lu).epsilon(1e-6));
  untied.zero_grads();
  tied.zero_grads();
  untied.backward(1.0);
  tied.backward(1.0);
  std::vector<float> expected(emb.numel);
  for (int64_t i = 0; i < emb.numel; i++)
    expected[i] = test::cpu_grad(untied, emb)[i] + test::cpu_grad(untied, head)[i];
  CHECK(rel_err(test::cpu_grad(tied, tied.tensor("model.embed_tokens.weight")), expected.data(),
                emb.numel) < 1e-5);
}

TEST_CASE("4 accumulated micro-batches give the gradient of the concatenated batch", "[model]") {
  const ModelConfig cfg = small_config();
  const int B = 4, T = 8;
  Arena arena;
  LlamaModel whole(cfg, arena, B, T), micro(cfg, arena, 1, T);
  whole.init_weights(3);
  micro.init_weights(3);
  const auto inputs = random_tokens(B * T, 50, 21), targets = random_tokens(B * T, 50, 22);
  whole.zero_grads();
  const double loss_whole = whole.forward(inputs.data(), targets.data(), B);
  whole.backward(1.0);
  micro.zero_grads();
  double loss_micro = 0;
  for (int m = 0; m < B; m++) {
    loss_micro += micro.forward(inputs.data() + m * T, targets.data() + m * T, 1) / B;
    micro.backward(1.0 / B);
  }
  CHECK(loss_micro == Approx(loss_whole).epsilon(1e-6));
  for (const ParamTensor& t : whole.tensors()) {
    INFO(t.name);
    CHECK(rel_err(test::cpu_grad(micro, t), test::cpu_grad(whole, t), t.numel) < 1e-5);
  }
}

TEST_CASE("forward_backward equals forward then backward and queues the losses in order", "[model]") {
  // The trainer's one-pass head and queued losses against the two calls, bit for bit, with
  // tied and untied heads, a micro-batch whose targets are all ignored, and more forwards queued
  // than the model has loss slots (65 > 64: the first 64 are read early, transparently).
  for (const bool tied : {false, true}) {
    INFO("tied " << tied);
    ModelConfig cfg = small_config();
    cfg.tie_word_embeddings = tied;
    const int B = 2, T = 8, kMicro = 65;
    Arena arena;
    LlamaModel one_pass(cfg, arena, B, T), two_calls(cfg, arena, B, T);
    one_pass.init_weights(5);
    two_calls.init_weights(5);
    one_pass.zero_grads();
    two_calls.zero_grads();
    std::vector<double> want;
    for (int m = 0; m < kMicro; m++) {
      const auto inputs = random_tokens(B * T, 50, 40 + m);
      auto targets = random_tokens(B * T, 50, 140 + m);
      if (m == 3) targets.assign(targets.size(), -1);
      one_pass.forward_backward(inputs.data(), targets.data(), B, 1.0 / kMicro);
      want.push_back(two_calls.forward(inputs.data(), targets.data(), B));
      two_calls.backward(1.0 / kMicro);
    }
    const std::vector<double> got = one_pass.take_losses();
    REQUIRE(got.size() == want.size());
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(double)) == 0);
    CHECK(got[3] == 0.0);
    CHECK(one_pass.take_losses().empty());
    CHECK(std::memcmp(test::grads(one_pass), test::grads(two_calls),
                      size_t(one_pass.num_dense_grads()) * sizeof(float)) == 0);
  }
}

TEST_CASE("ignored targets do not contribute to loss or gradient", "[model]") {
  const ModelConfig cfg = small_config();
  const int T = 8, V = cfg.vocab_size;
  Arena arena;
  LlamaModel model(cfg, arena, 1, T);
  model.init_weights(4);
  auto inputs = random_tokens(T, V, 31), targets = random_tokens(T, V, 32);
  targets[2] = -100;
  const double loss = model.forward(inputs.data(), targets.data(), 1);
  CHECK(model.valid_targets() == T - 1);
  double sum = 0;  // the mean over the other positions, recomputed from the logits
  for (int t = 0; t < T; t++) {
    if (t == 2) continue;
    const float* row = test::logits(model) + size_t(t) * V;
    double mx = row[0], z = 0;
    for (int i = 0; i < V; i++) mx = std::max<double>(mx, row[i]);
    for (int i = 0; i < V; i++) z += std::exp(row[i] - mx);
    sum += mx + std::log(z) - row[targets[t]];
  }
  CHECK(loss == Approx(sum / (T - 1)).epsilon(1e-6));
  model.zero_grads();
  model.backward(1.0);
  const float* dlogits = test::logits(model) + size_t(2) * V;  // the logits buffer now holds dlogits
  for (int i = 0; i < V; i++) CHECK(dlogits[i] == 0.0f);
}

TEST_CASE("learning-rate schedule: warmup ramp, cosine to min ratio, constant", "[optim]") {
  ScheduleConfig s;
  s.kind = ScheduleKind::Cosine;
  s.warmup_steps = 10;
  s.min_lr_ratio = 0.1;
  CHECK(schedule_lr(s, 1.0, 0, 100) == Approx(0.1));   // (step+1)/warmup: no wasted step
  CHECK(schedule_lr(s, 1.0, 9, 100) == Approx(1.0));
  CHECK(schedule_lr(s, 1.0, 10, 100) == Approx(1.0));  // cosine starts at the peak
  CHECK(schedule_lr(s, 1.0, 99, 100) == Approx(0.1));  // and ends at lr * min_lr_ratio
  CHECK(schedule_lr(s, 1.0, 10 + 89 / 2, 100) == Approx(0.55).epsilon(0.02));  // half-way
  for (int64_t step = 11; step < 100; step++)
    CHECK(schedule_lr(s, 1.0, step, 100) <= schedule_lr(s, 1.0, step - 1, 100));
  s.kind = ScheduleKind::Constant;
  CHECK(schedule_lr(s, 2.0, 5, 100) == Approx(1.2));
  CHECK(schedule_lr(s, 2.0, 50, 100) == Approx(2.0));
}

TEST_CASE("an ffn width that is not a multiple of 8 (llama_1b's 5461) trains every row",
          "[model]") {
  ModelConfig cfg = small_config();
  cfg.intermediate_size = 5461;
  cfg.num_hidden_layers = 1;
  const int T = 8;
  Arena arena;
  LlamaModel model(cfg, arena, 1, T);
  model.init_weights(6);
  const auto inputs = random_tokens(T, 50, 41), targets = random_tokens(T, 50, 42);
  const double loss = model.forward(inputs.data(), targets.data(), 1);
  CHECK(std::isfinite(loss));
  model.zero_grads();
  model.backward(1.0);
  for (const char* name : {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"}) {
    const ParamTensor& t = model.tensor(name);
    REQUIRE(t.shape == std::vector<int64_t>{5461, 32});
    int rows_with_gradient = 0;  // the last, ragged rows included
    for (int64_t r = 0; r < 5461; r++) {
      double sq = 0;
      const float* row = test::cpu_grad(model, t) + r * 32;
      for (int c = 0; c < 32; c++) sq += double(row[c]) * row[c];
      rows_with_gradient += sq > 0 && std::isfinite(sq);
    }
    INFO(name);
    CHECK(rows_with_gradient == 5461);
  }
}
