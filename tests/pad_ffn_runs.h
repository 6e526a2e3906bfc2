// The runs the padded-ffn tests compare (tests/test_pad_ffn.cpp on the CPU,
// tests/gpu/test_gpu_pad_ffn.cpp on the GPU): one model trained with its ffn stored padded to a
// multiple of 8 (pad_ffn "on") and stored as it is ("off"). Padding is a layout: the pad must
// stay exactly zero, and the two runs agree bit for bit wherever the arithmetic does not depend
// on where an element is stored. Two things do (docs/memory.md, "Padded ffn rows"): a GEMM
// whose K grows by the pad may be blocked differently by the BLAS (OpenBLAS at K = 5461 against
// 5464; not at 341 against 344), and pure bf16's stochastic rounding draws by stored position.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "gpu/training_run.h"
#include "named_choice.h"
#include "train/training_state.h"

namespace grass::test {

// One layer of hidden 16 and an ffn of `ffn` (not a multiple of 8), 2 x 16 tokens per
// micro-batch; weight decay and clipping on, so both touch the pad. GRASS and the low-rank
// optimizers train every projection at rank 4 and refresh every 2 steps.
inline RunConfig pad_ffn_run(const std::string& optimizer, const std::string& precision,
                             int micro_batches, int ffn, bool pad) {
  RunConfig c;
  c.model.hidden_size = 16;
  c.model.intermediate_size = ffn;
  c.model.num_attention_heads = 2;
  c.model.num_key_value_heads = 1;
  c.model.num_hidden_layers = 1;
  c.model.vocab_size = 64;
  c.model.max_position_embeddings = 32;
  c.model.initializer_range = 0.05;
  c.micro_batch_size = 2;
  c.total_batch_size = 2 * micro_batches;
  c.seq_len = 16;
  c.seed = 7;
  c.grad_clip = 0.5;
  c.precision = named<PrecisionChoice>(precision);
  c.optimizer.kind = named<OptimizerKind>(optimizer);
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.1;
  c.optimizer.projection.rank = 4;
  c.optimizer.projection.update_interval = 2;
  c.optimizer.projection.selection = Selection::Multinomial;
  c.optimizer.projection.seed = 9;
  c.pad_ffn = pad ? "on" : "off";
  return c;
}

struct PadCase {
  const char* optimizer;
  const char* precision;
  int micro_batches;  // 1 in pure bf16: its updates are then fused into the backward
  int ffn;
  double tol;  // 0: the same bits; else the largest relative difference of a loss or a tensor
};

inline double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); i++) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Trains both layouts for `steps` steps on the same random tokens and checks the loss of every
// step and every tensor (Hugging Face's layout) at the end against c.tol, the gradient norms to
// 1e-12 at least, and a pad of exact zeros (+0.0) in the padded run's weights and master copy.
inline void check_padding_changes_nothing(const PadCase& c, bool cuda, int steps) {
  INFO(c.optimizer << " " << c.precision << ", " << c.micro_batches << " micro-batch(es), ffn "
                   << c.ffn);
  const PrecisionChoice precision = named<PrecisionChoice>(c.precision);
  gputest::TrainingRun padded(pad_ffn_run(c.optimizer, c.precision, c.micro_batches, c.ffn, true),
                              precision, cuda);
  gputest::TrainingRun plain(pad_ffn_run(c.optimizer, c.precision, c.micro_batches, c.ffn, false),
                             precision, cuda);
  REQUIRE(padded.model().ffn_stored() == (c.ffn + 7) / 8 * 8);
  REQUIRE(plain.model().ffn_stored() == c.ffn);
  auto same = [&](double a, double b) {
    return c.tol == 0 ? a == b : std::abs(a - b) <= c.tol * std::abs(b);
  };
  const RunConfig& cfg = padded.cfg;
  for (int64_t step = 0; step < steps; step++) {
    int64_t batch = 0;
    auto next = [&](int32_t* inputs, int32_t* targets) {
      const size_t n = size_t(cfg.micro_batch_size) * cfg.seq_len;
      for (size_t i = 0; i < n; i++) {
        const uint64_t k = uint64_t(step * 100 + batch) * n + i;
        inputs[i] = int32_t(uniform_open01(31, k) * cfg.model.vocab_size);
        targets[i] = int32_t(uniform_open01(32, k) * cfg.model.vocab_size);
      }
      batch++;
    };
    const StepOutcome a = train_step(padded.state, cfg, step, cfg.optimizer.lr, next);
    batch = 0;
    const StepOutcome b = train_step(plain.state, plain.cfg, step, cfg.optimizer.lr, next);
    INFO("step " << step << ": loss " << a.loss << " and " << b.loss << ", gradient norm "
                 << a.grad_norm << " and " << b.grad_norm);
    CHECK(same(a.loss, b.loss));
    // a sum over the stored gradients, which the GPU splits into blocks by position: the pad
    // moves the splits, so the order of the additions, not their terms, differs
    CHECK(std::abs(a.grad_norm - b.grad_norm) <= std::max(c.tol, 1e-12) * b.grad_norm);
  }
  int padded_tensors = 0;
  for (const ParamTensor& t : padded.model().tensors()) {
    INFO(t.name);
    const ParamTensor& u = plain.model().tensor(t.name);
    REQUIRE(t.hf_shape == u.shape);
    const std::vector<float> got = padded.model().read_tensor(t), want = plain.model().read_tensor(u);
    REQUIRE(got.size() == want.size());
    if (c.tol == 0)
      CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    else
      CHECK(relative_difference(got, want) <= c.tol);
    const std::vector<float> pad = padded.pad_values(t);
    if (!pad.empty()) padded_tensors++;
    for (const float v : pad) {
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      REQUIRE(bits == 0);  // +0.0 exactly: no -0.0, no denormal from a rounding of nothing
    }
  }
  CHECK(padded_tensors == 3);  // gate, up and down
}

}  // namespace grass::test
