// The whole engine on the GPU against the CPU reference: the model's forward and backward on
// awkward shapes, one GRASS step, 50-step training runs whose loss curves must track the CPU's,
// bit-for-bit determinism of a GPU run, checkpointed and fused runs against the plain one, and the
// memory plan against what the GPU arena allocates.
//
// Every model here is built as src/train/trainer.cpp builds it (build_training_state in an arena
// of the backend's memory; on the GPU one reservation of the planned size) and stepped in the
// trainer's order: the deferred step's begin (gradients zeroed, GRASS's refresh flags),
// forward/backward, then its finish (the global norm over dense and compressed gradients,
// clipping, every tensor's update). Backend memory is read only
// through the backend (read_tensor, read_grads, download): on the GPU the buffers, GRASS's G_C,
// σ, ρ and moments included, are device pointers.
//
// Tolerances and why (the numbers in brackets are what a CPU emulation of the GPU's precision,
// every activation rounded to bf16, gave on these very shapes):
//   loss                   1e-2 relative      [≤ 1.3e-4]
//   dense gradients        3e-2 relative L2   [≤ 1.3e-2 at init 0.04, 1.5e-2 at 0.05, 3.6e-2 at 0.1]
//     The weights are the same bf16 values on both sides (the CPU in "bf16-mixed" rounds them as
//     the GPU stores them), but the GPU keeps every activation and activation gradient in bf16
//     (8 significant bits, one rounding per op, attention probabilities included) where the CPU
//     keeps fp32; two layers of that give errors of about 1%, largest in q/k (the softmax
//     amplifies them). Init 0.04 rather than HF's 0.02 spreads the attention scores about 4x
//     wider (std ~0.4 instead of ~0.1), so a wrong scale or mask shows more clearly, while the
//     bf16 noise stays well inside the bound.
//   GRASS step             weights 1e-2 relative per tensor [≤ 2.1e-3]; σ ≥ 90% equal [112/112];
//     the sign of each master-weight update equal in ≥ 95% of elements [≥ 99.5%]. Adam's first
//     step moves every element by about lr·sign(g), so where |g| is below the bf16 noise the
//     two backends move it opposite ways: a small fraction, counted, not a bug. lr 1e-3 is about
//     4 bf16 ulps of a weight of 0.04, so a missing update (2.5% error) or a reversed one fails.
//   50-step loss curves    5% per step over the last 10 (bf16-mixed), 10% (pure bf16)
//     [≤ 0.8%]. lr 3e-3 keeps the runs out of the chaotic regime where tiny differences grow
//     (at lr 1e-2 even the emulation differs by 6%), and the loss still falls to ~20-30% of start.
//     GRASS may pick other slices on the GPU at a refresh: on the CPU, GRASS runs with entirely
//     different selections (multinomial_nr, uniform_nr) stay within 2.5% of top_r's curve.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/storage.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/core/rng.h"
#include "src/model/llama.h"
#include "src/optim/grass.h"
#include "src/optim/step.h"
#include "src/train/memory_plan.h"
#include "src/train/run_resolution.h"
#include "src/train/training_state.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/training_run.h"
#include "tests/named_choice.h"
#include "tests/ngram_batches.h"

namespace {

using namespace grass;
using grass::test::NgramBatches;
using gputest::rel_error;

// ---- configurations ---------------------------------------------------------------------------

// A model shape for the CPU-vs-GPU comparisons. head_dim = hidden / heads.
struct Shape {
  const char* name;
  int hidden, heads, kv_heads, ffn;
};

// The awkward shapes: seq_len 100 (not a multiple of the attention's 64-row tiles), micro-batch
// 3, GQA, head dims 32, 64 and 128, and an ffn width of 347 (odd: rows of gate/up/down and of the
// SwiGLU activations start at 2-byte boundaries, so the GEMMs and elementwise kernels take their
// unaligned paths).
constexpr int kBatch = 3, kSeq = 100, kVocab = 512;
const Shape kHd32{"hidden 128, 4 heads of 32, 2 kv heads, ffn 344", 128, 4, 2, 344};
const Shape kHd64{"hidden 256, 4 heads of 64, 2 kv heads, ffn 344", 256, 4, 2, 344};
const Shape kHd128Odd{"hidden 256, 2 heads of 128, 1 kv head, ffn 347", 256, 2, 1, 347};
const Shape kHd64Odd{"hidden 256, 4 heads of 64, 2 kv heads, ffn 347", 256, 4, 2, 347};

ModelConfig model_config(const Shape& s, int vocab, double init) {
  ModelConfig m;
  m.hidden_size = s.hidden;
  m.intermediate_size = s.ffn;
  m.num_attention_heads = s.heads;
  m.num_key_value_heads = s.kv_heads;
  m.num_hidden_layers = 2;
  m.vocab_size = vocab;
  m.max_position_embeddings = 128;
  m.rms_norm_eps = 1e-5;
  m.initializer_range = init;
  return m;
}

// A run of micro-batch B x T with one micro-batch per step; GRASS as the brief of these tests
// says: rank 8 on all seven targets, top_r, refresh every 10 steps, scale 1.
RunConfig run_config(const ModelConfig& m, int B, int T, const std::string& optimizer, double lr) {
  RunConfig c;
  c.model = m;
  c.micro_batch_size = B;
  c.total_batch_size = B;
  c.seq_len = T;
  c.seed = 3;
  c.grad_clip = 1.0;
  c.optimizer.kind = test::named<OptimizerKind>(optimizer);
  c.optimizer.lr = lr;
  c.optimizer.beta1 = 0.9;
  c.optimizer.beta2 = 0.95;
  c.optimizer.weight_decay = 0.0;
  c.optimizer.projection.rank = 8;
  c.optimizer.projection.update_interval = 10;
  c.optimizer.projection.scale = 1.0;
  c.optimizer.projection.selection = Selection::TopR;
  c.optimizer.projection.seed = 5;
  c.fused_update = Switch::Off;  // the tests compare the two halves of a step; fused runs have their own
  c.pad_ffn = Switch::Off;  // the odd ffn widths test the unaligned paths; padded runs have their own
  return c;
}

// The n-gram runs: hidden 64, 4 heads of 16 (2 kv heads), ffn 172 (not a multiple of 8),
// 8 x 64 tokens per step, lr 3e-3 (see the header), HF's init 0.02.
RunConfig ngram_run(const std::string& optimizer) {
  const Shape s{"ngram", 64, 4, 2, 172};
  RunConfig c = run_config(model_config(s, NgramBatches::V, 0.02), 8, 64, optimizer, 3e-3);
  c.model.rms_norm_eps = 1e-6;
  c.seed = 11;
  c.optimizer.projection.seed = 11;
  return c;
}

// Random tokens of [0, vocab) and their targets, every 37th target ignored (-1).
struct Batch {
  std::vector<int32_t> inputs, targets;
};
Batch random_batch(int64_t n, int vocab, uint64_t seed) {
  Batch b;
  b.inputs.resize(size_t(n));
  b.targets.resize(size_t(n));
  for (int64_t i = 0; i < n; i++) {
    b.inputs[size_t(i)] = int32_t(uniform_open01(seed, uint64_t(i)) * vocab);
    b.targets[size_t(i)] =
        i % 37 == 5 ? -1 : int32_t(uniform_open01(seed + 1, uint64_t(i)) * vocab);
  }
  return b;
}

// ---- a run on one backend -----------------------------------------------------------------------

// A training state on one backend, as the trainer builds it (training_run.h), and the
// trainer's two halves of a step.
struct Run : gputest::TrainingRun {
  double gnorm = 0;  // of the last update()

  Run(const RunConfig& c, const std::string& precision, bool cuda)
      : TrainingRun(c, test::named<PrecisionChoice>(precision), cuda) {}

  Grass& grass() { return *state.optimizers->find<Grass>(); }
  DeferredStep& deferred() { return dynamic_cast<DeferredStep&>(*state.step); }

  // The trainer's own step (train_step) on batch `step` of the n-gram data.
  StepOutcome train(int64_t step, const NgramBatches& data) {
    return train_step(state, cfg, step, cfg.optimizer.lr, [&](int32_t* in, int32_t* tg) {
      std::vector<int32_t> i, t;
      data.batch(step, cfg.micro_batch_size, cfg.seq_len, i, t);
      std::copy(i.begin(), i.end(), in);
      std::copy(t.begin(), t.end(), tg);
    });
  }

  // The trainer's first half of a step, one micro-batch: returns the loss.
  double gradients(int64_t step, const std::vector<int32_t>& in, const std::vector<int32_t>& tg) {
    LlamaModel& m = model();
    deferred().begin(step, cfg.optimizer.lr);
    const double loss = m.forward(in.data(), tg.data(), cfg.micro_batch_size);
    m.backward(1.0);
    return loss;
  }
  // The second half: the global norm over dense and compressed gradients, clipping, and every
  // tensor's update.
  void update() { gnorm = deferred().finish(); }

  // ---- reading backend memory on the host ----
  std::vector<float> weights(const ParamTensor& t) { return model().read_tensor(t); }
  // The fp32 master copy of t (empty without one)
  std::vector<float> master(const ParamTensor& t) {
    if (!model().master()) return {};
    std::vector<float> host(size_t(t.numel));
    backend->download(host.data(), model().master() + t.offset, host.size() * sizeof(float));
    return host;
  }
  std::vector<int32_t> sigma(const Grass::Target& t) {
    std::vector<int32_t> host(size_t(cfg.optimizer.projection.rank));
    backend->download(host.data(), t.sigma, host.size() * sizeof(int32_t));
    return host;
  }
  std::vector<float> rho(const Grass::Target& t) {
    std::vector<float> host(size_t(cfg.optimizer.projection.rank));
    backend->download(host.data(), t.rho, host.size() * sizeof(float));
    return host;
  }
  std::vector<float> gc(const Grass::Target& t) {
    std::vector<float> host(size_t(t.gc_numel));
    backend->read_grads(host.data(), deferred().projected_gradient(t.tensor_index), 0, t.gc_numel);
    return host;
  }
};

// ---- small helpers ------------------------------------------------------------------------------

bool all_finite(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
}

double l2_norm(const std::vector<float>& x) {
  double sum = 0;
  for (float v : x) sum += double(v) * v;
  return std::sqrt(sum);
}

double rel_diff(double got, double want) { return std::abs(got - want) / std::abs(want); }

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Whether element (i, c) of target t's weight [out, in] lies in a slice listed in `selected`
// (indexed by row for a rows target, by column for a columns target).
bool in_selected(const Grass::Target& t, const std::vector<bool>& selected, int i, int c) {
  return selected[size_t(t.rows ? i : c)];
}

std::vector<bool> slice_mask(const Grass::Target& t, const std::vector<int32_t>& sigma) {
  std::vector<bool> mask(size_t(t.rows ? t.out : t.in), false);
  for (int32_t s : sigma) mask[size_t(s)] = true;
  return mask;
}

// The losses of `steps` training steps on the n-gram batches.
std::vector<double> ngram_curve(const RunConfig& cfg, const std::string& precision, bool cuda,
                                int steps) {
  Run run(cfg, precision, cuda);
  const NgramBatches data;
  std::vector<int32_t> in, tg;
  std::vector<double> losses;
  for (int64_t step = 0; step < steps; step++) {
    data.batch(step, cfg.micro_batch_size, cfg.seq_len, in, tg);
    losses.push_back(run.gradients(step, in, tg));
    run.update();
  }
  return losses;
}

// Everything a GPU run leaves behind, for the determinism test.
struct Outcome {
  std::vector<double> losses, gnorms;
  std::vector<float> weights, master;
  std::vector<int32_t> sigma;
  std::vector<float> rho;
};

Outcome gpu_outcome(const RunConfig& cfg, const std::string& precision, int steps) {
  Run run(cfg, precision, true);
  const NgramBatches data;
  std::vector<int32_t> in, tg;
  Outcome o;
  for (int64_t step = 0; step < steps; step++) {
    data.batch(step, cfg.micro_batch_size, cfg.seq_len, in, tg);
    o.losses.push_back(run.gradients(step, in, tg));
    run.update();
    o.gnorms.push_back(run.gnorm);
  }
  for (const ParamTensor& t : run.model().tensors()) {
    const std::vector<float> w = run.weights(t), m = run.master(t);
    o.weights.insert(o.weights.end(), w.begin(), w.end());
    o.master.insert(o.master.end(), m.begin(), m.end());
  }
  if (run.state.optimizers->find<Grass>())
    for (const auto& t : run.grass().targets()) {
      const std::vector<int32_t> s = run.sigma(t);
      const std::vector<float> r = run.rho(t);
      o.sigma.insert(o.sigma.end(), s.begin(), s.end());
      o.rho.insert(o.rho.end(), r.begin(), r.end());
    }
  return o;
}

}  // namespace

TEST_CASE("model: forward and backward on the GPU match the CPU reference", "[gpu][model]") {
  for (const Shape& shape : {kHd32, kHd64, kHd128Odd}) {
    INFO(shape.name);
    const RunConfig cfg = run_config(model_config(shape, kVocab, 0.04), kBatch, kSeq, "adamw", 1e-3);
    // The CPU in "bf16-mixed" keeps fp32 activations but rounds its weights to bf16 exactly as the
    // GPU stores them: both run on the same weights.
    Run cpu(cfg, "bf16-mixed", false), gpu(cfg, "bf16-mixed", true);
    const ParameterSet& tensors = cpu.model().tensors();
    REQUIRE(gpu.model().tensors().size() == tensors.size());
    for (const ParamTensor& t : tensors) {
      INFO(t.name);
      REQUIRE(same_bits(gpu.weights(t), cpu.weights(t)));
      REQUIRE(same_bits(gpu.master(t), cpu.master(t)));
    }

    const Batch batch = random_batch(int64_t(kBatch) * kSeq, kVocab, 21);
    const double cpu_loss = cpu.gradients(0, batch.inputs, batch.targets);
    const double gpu_loss = gpu.gradients(0, batch.inputs, batch.targets);
    INFO("loss: GPU " << gpu_loss << ", CPU " << cpu_loss);
    REQUIRE(std::isfinite(gpu_loss));
    CHECK(gpu.model().valid_targets() == cpu.model().valid_targets());
    CHECK(rel_diff(gpu_loss, cpu_loss) <= 1e-2);

    // Every dense gradient: finite, not zero (each tensor got its gradient), and close.
    double worst = 0;
    std::string worst_name;
    std::vector<std::vector<float>> gpu_grads;
    for (const ParamTensor& t : tensors) {
      INFO(t.name);
      const std::vector<float> want = cpu.grad(t), got = gpu.grad(t);
      REQUIRE(all_finite(got));
      CHECK(l2_norm(want) > 0);
      CHECK(l2_norm(got) > 0);
      const double err = rel_error(got, want);
      CHECK(err <= 3e-2);
      if (err > worst) {
        worst = err;
        worst_name = t.name;
      }
      gpu_grads.push_back(got);
    }
    std::printf("model fwd/bwd %s: loss GPU %.6f CPU %.6f; worst gradient rel error %.2e (%s)\n",
                shape.name, gpu_loss, cpu_loss, worst, worst_name.c_str());

    // The trainer's micro-batch protocol on the GPU: two backward(0.5) accumulate into the
    // gradients of one backward(1.0). Scaling by 1/2 is exact in every op and the GEMMs repeat
    // their plans, so the sums agree to rounding (in practice bit for bit).
    LlamaModel& m = gpu.model();
    m.zero_grads();
    for (int micro = 0; micro < 2; micro++) {
      const double loss = m.forward(batch.inputs.data(), batch.targets.data(), kBatch);
      CHECK(loss == gpu_loss);  // the forward is deterministic
      m.backward(0.5);
    }
    for (size_t i = 0; i < tensors.size(); i++) {
      INFO(tensors[i].name << " after two backward(0.5)");
      CHECK(rel_error(gpu.grad(tensors[i]), gpu_grads[i]) <= 1e-6);
    }
  }
}

TEST_CASE("model: one GRASS step on the GPU matches the CPU reference", "[gpu][grass][model]") {
  RunConfig cfg = run_config(model_config(kHd64Odd, kVocab, 0.04), kBatch, kSeq, "grass", 1e-3);
  cfg.optimizer.weight_decay = 0.1;  // decoupled decay: selected slices only on GRASS targets
  const int r = cfg.optimizer.projection.rank;
  Run cpu(cfg, "bf16-mixed", false), gpu(cfg, "bf16-mixed", true);
  const Batch batch = random_batch(int64_t(kBatch) * kSeq, kVocab, 21);
  const double cpu_loss = cpu.gradients(0, batch.inputs, batch.targets);
  const double gpu_loss = gpu.gradients(0, batch.inputs, batch.targets);
  CHECK(rel_diff(gpu_loss, cpu_loss) <= 1e-2);

  const auto& cpu_targets = cpu.grass().targets();
  const auto& gpu_targets = gpu.grass().targets();
  REQUIRE(cpu_targets.size() == 7 * size_t(cfg.model.num_hidden_layers));
  REQUIRE(gpu_targets.size() == cpu_targets.size());
  const ParameterSet& tensors = cpu.model().tensors();

  // σ (top_r of the refresh gradient's slice norms): the two backends compute the norms from
  // bf16 and fp32 activations, so two nearly equal norms at the r-th place may swap. Count.
  std::vector<std::vector<int32_t>> gpu_sigma(gpu_targets.size());
  std::vector<std::vector<bool>> common(gpu_targets.size());  // slices both selected
  int64_t agreeing = 0, identical_targets = 0;
  for (size_t k = 0; k < gpu_targets.size(); k++) {
    const Grass::Target &tc = cpu_targets[k], &tg = gpu_targets[k];
    const std::string& name = tensors[size_t(tg.tensor_index)].name;
    INFO(name);
    REQUIRE(tg.tensor_index == tc.tensor_index);
    REQUIRE(tg.rows == tc.rows);
    const std::vector<int32_t> sc = cpu.sigma(tc), sg = gpu.sigma(tg);
    // top_r: r distinct slices in ascending order, ρ = 1
    for (int j = 0; j < r; j++) {
      REQUIRE(sg[size_t(j)] >= 0);
      REQUIRE(sg[size_t(j)] < (tg.rows ? tg.out : tg.in));
      if (j > 0) REQUIRE(sg[size_t(j)] > sg[size_t(j - 1)]);
    }
    CHECK(gpu.rho(tg) == std::vector<float>(size_t(r), 1.0f));
    const std::vector<bool> mask_c = slice_mask(tc, sc), mask_g = slice_mask(tg, sg);
    common[k].resize(mask_g.size());
    for (size_t i = 0; i < mask_g.size(); i++) {
      common[k][i] = mask_c[i] && mask_g[i];
      agreeing += common[k][i];
    }
    gpu_sigma[k] = sg;
    if (sc == sg) {
      identical_targets++;
      // G_C of the refresh step: the selected slices of the full gradient
      const std::vector<float> got = gpu.gc(tg);
      REQUIRE(all_finite(got));
      CHECK(rel_error(got, cpu.gc(tc)) <= 3e-2);
    }
  }
  const int64_t selected = int64_t(gpu_targets.size()) * r;
  std::printf("model GRASS step: %lld of %lld selected slices agree (%lld of %zu targets "
              "identical); loss GPU %.6f CPU %.6f\n",
              (long long)agreeing, (long long)selected, (long long)identical_targets,
              gpu_targets.size(), gpu_loss, cpu_loss);
  CHECK(double(agreeing) >= 0.9 * double(selected));

  // Before the update, on both sides: the weights the forward reads and the fp32 master copy.
  std::vector<std::vector<float>> gpu_w0, gpu_m0, cpu_m0;
  for (const ParamTensor& t : tensors) {
    gpu_w0.push_back(gpu.weights(t));
    gpu_m0.push_back(gpu.master(t));
    cpu_m0.push_back(cpu.master(t));
  }
  cpu.update();
  gpu.update();
  INFO("gradient norm: GPU " << gpu.gnorm << ", CPU " << cpu.gnorm);
  CHECK(rel_diff(gpu.gnorm, cpu.gnorm) <= 1e-2);

  // Every tensor after the step: the weights close, and the update of the master copy in the
  // same direction on both sides (on a GRASS target: within the slices both selected).
  std::vector<int> target_of(tensors.size(), -1);
  for (size_t k = 0; k < gpu_targets.size(); k++) target_of[size_t(gpu_targets[k].tensor_index)] = int(k);
  double worst = 0, worst_sign = 1;
  for (size_t i = 0; i < tensors.size(); i++) {
    const ParamTensor& t = tensors[i];
    INFO(t.name);
    const std::vector<float> got = gpu.weights(t), want = cpu.weights(t);
    REQUIRE(all_finite(got));
    const double err = rel_error(got, want);
    CHECK(err <= 1e-2);
    worst = std::max(worst, err);

    const std::vector<float> gm = gpu.master(t), cm = cpu.master(t);
    REQUIRE(all_finite(gm));
    const int k = target_of[i];
    const int64_t cols = t.shape.size() == 2 ? t.shape[1] : t.numel;
    int64_t moved = 0, same_direction = 0;
    for (int64_t e = 0; e < t.numel; e++) {
      if (k >= 0 && !in_selected(gpu_targets[size_t(k)], common[size_t(k)], int(e / cols),
                                 int(e % cols)))
        continue;
      const double dc = double(cm[size_t(e)]) - cpu_m0[i][size_t(e)];
      const double dg = double(gm[size_t(e)]) - gpu_m0[i][size_t(e)];
      if (dc == 0) continue;
      moved++;
      same_direction += dg != 0 && (dg > 0) == (dc > 0);
    }
    if (k < 0) REQUIRE(moved > 0);
    if (moved == 0) continue;  // a GRASS target whose selections share no slice
    const double agreement = double(same_direction) / double(moved);
    INFO(same_direction << " of " << moved << " master elements moved the same way");
    CHECK(agreement >= 0.95);
    worst_sign = std::min(worst_sign, agreement);
  }
  std::printf("model GRASS step: worst weight rel error %.2e, worst update sign agreement %.4f\n",
              worst, worst_sign);

  // On the GPU only the selected slices of each target changed: bitwise, in the bf16 weights and
  // the master copy; every element of a selected slice moved in the master.
  for (size_t k = 0; k < gpu_targets.size(); k++) {
    const Grass::Target& t = gpu_targets[k];
    const size_t i = size_t(t.tensor_index);
    INFO(tensors[i].name);
    const std::vector<bool> mask = slice_mask(t, gpu_sigma[k]);
    const std::vector<float> w1 = gpu.weights(tensors[i]), m1 = gpu.master(tensors[i]);
    int64_t unselected_changed = 0, selected_weights_changed = 0, selected_master_changed = 0;
    for (int row = 0; row < t.out; row++)
      for (int col = 0; col < t.in; col++) {
        const size_t e = size_t(row) * size_t(t.in) + size_t(col);
        const bool w_changed = std::memcmp(&w1[e], &gpu_w0[i][e], sizeof(float)) != 0;
        const bool m_changed = std::memcmp(&m1[e], &gpu_m0[i][e], sizeof(float)) != 0;
        if (in_selected(t, mask, row, col)) {
          selected_weights_changed += w_changed;
          selected_master_changed += m_changed;
        } else {
          unselected_changed += w_changed || m_changed;
        }
      }
    CHECK(unselected_changed == 0);
    CHECK(selected_master_changed == int64_t(r) * (t.rows ? t.in : t.out));
    CHECK(selected_weights_changed > 0);
  }
}

TEST_CASE("model: GPU training on repeated n-grams tracks the CPU's loss curve", "[gpu][train]") {
  const int steps = 20;  // the loss falls by half by step 20; the last 10 steps are compared
  struct Case {
    const char* optimizer;
    const char* gpu_precision;
    double tolerance;  // relative, per step, over the last 10 steps
  };
  const Case cases[] = {{"adamw", "bf16-mixed", 0.05}, {"grass", "bf16-mixed", 0.05},
                        {"adamw", "bf16", 0.10}};
  std::map<std::string, std::vector<double>> cpu_curves;  // fp32 on the CPU, per optimizer
  for (const Case& c : cases) {
    INFO(c.optimizer << " " << c.gpu_precision << " on the GPU against fp32 on the CPU");
    const RunConfig cfg = ngram_run(c.optimizer);
    if (!cpu_curves.count(c.optimizer))
      cpu_curves[c.optimizer] = ngram_curve(cfg, "fp32", false, steps);
    const std::vector<double>& cpu = cpu_curves[c.optimizer];
    const std::vector<double> gpu = ngram_curve(cfg, c.gpu_precision, true, steps);
    REQUIRE(gpu.size() == size_t(steps));
    std::printf("model n-grams %s %s:", c.optimizer, c.gpu_precision);
    for (int i = 0; i < steps - 1; i += 7) std::printf(" %d: %.3f/%.3f", i, gpu[size_t(i)], cpu[size_t(i)]);
    std::printf(" %d: %.3f/%.3f (GPU/CPU)\n", steps - 1, gpu.back(), cpu.back());
    for (double loss : gpu) REQUIRE(std::isfinite(loss));
    CHECK(rel_diff(gpu.front(), cpu.front()) <= 1e-2);
    for (int i = steps - 10; i < steps; i++) {
      INFO("step " << i << ": GPU " << gpu[size_t(i)] << ", CPU " << cpu[size_t(i)]);
      CHECK(rel_diff(gpu[size_t(i)], cpu[size_t(i)]) <= c.tolerance);
    }
    CHECK(cpu.back() < 0.6 * cpu.front());
    CHECK(gpu.back() < 0.6 * gpu.front());
  }
}

TEST_CASE("model: the same GPU run twice gives the same bits", "[gpu][determinism]") {
  const int steps = 9;
  // GRASS with multinomial selection (seeded draws, ρ ≠ 1, possible repeats) refreshing at steps
  // 0, 4 and 8; pure bf16 AdamW (stochastic rounding on every store).
  RunConfig grass_cfg = ngram_run("grass");
  grass_cfg.optimizer.projection.selection = Selection::Multinomial;
  grass_cfg.optimizer.projection.update_interval = 4;
  const std::pair<RunConfig, std::string> runs[] = {{grass_cfg, "bf16-mixed"},
                                                    {ngram_run("adamw"), "bf16"}};
  for (const auto& [cfg, precision] : runs) {
    INFO(name_of(cfg.optimizer.kind) << " " << precision);
    const Outcome a = gpu_outcome(cfg, precision, steps);
    const Outcome b = gpu_outcome(cfg, precision, steps);
    REQUIRE(a.losses.size() == size_t(steps));
    for (double loss : a.losses) REQUIRE(std::isfinite(loss));
    CHECK(same_bits(a.losses, b.losses));
    CHECK(same_bits(a.gnorms, b.gnorms));
    CHECK(same_bits(a.weights, b.weights));
    CHECK(same_bits(a.master, b.master));
    CHECK(same_bits(a.sigma, b.sigma));
    CHECK(same_bits(a.rho, b.rho));
    CHECK(a.losses.back() < a.losses.front());  // and it trained
  }
}

TEST_CASE("model: checkpointed and fused GPU runs give the plain run's bits", "[gpu][memory]") {
  // The trainer's own step (train_step). Recomputation repeats the forward's kernels on the same
  // inputs, and a fused update applies each gradient as the unfused step would (clipping on but
  // never reached), so losses, weights and master weights must be identical.
  struct Case {
    Checkpointing mode;
    const char* optimizer;
    const char* precision;
    bool columns = false;  // GRASS's inputs kept as selected columns (no recomputation)
  };
  // per layer with both optimizers and precisions; elementwise (the same ops again, nothing new
  // on the GPU) once per optimizer; selected columns in both precisions
  for (const Case c : {Case{Checkpointing::Layer, "adamw", "bf16-mixed"},
                       Case{Checkpointing::Layer, "adamw", "bf16"},
                       Case{Checkpointing::Layer, "grass", "bf16-mixed"},
                       Case{Checkpointing::Layer, "grass", "bf16"},
                       Case{Checkpointing::Elementwise, "adamw", "bf16-mixed"},
                       Case{Checkpointing::Elementwise, "grass", "bf16"},
                       Case{Checkpointing::None, "grass", "bf16-mixed", true},
                       Case{Checkpointing::None, "grass", "bf16", true}}) {
      const Checkpointing mode = c.mode;
      const std::string optimizer = c.optimizer, precision = c.precision;
      INFO(name_of(mode) << " " << optimizer << " " << precision << (c.columns ? " columns" : ""));
      RunConfig plain = ngram_run(optimizer);
      plain.optimizer.projection.update_interval = 3;
      plain.grad_clip = 1e6;
      if (c.columns) {  // every input kept as columns in `lean` (steps 0 and 3 refresh)
        plain.optimizer.projection.select_dim = SelectDim::Cols;
        plain.optimizer.projection.targets =
            test::named_targets({"q", "k", "v", "gate", "up", "down"});
        plain.optimizer.projection.selection = Selection::Multinomial;  // ρ ≠ 1
        plain.activations.selected_columns = Switch::Off;
      }
      RunConfig lean = plain;
      if (c.columns) lean.activations.selected_columns = Switch::On;
      lean.activation_checkpointing = mode;
      lean.fused_update = Switch::On;
      std::vector<double> losses[2];
      std::vector<float> weights[2], master[2];
      const RunConfig* cfgs[2] = {&plain, &lean};
      for (int k = 0; k < 2; k++) {
        Run run(*cfgs[k], precision, true);
        REQUIRE(bool(dynamic_cast<FusedStep*>(run.state.step.get())) == (k == 1));
        const NgramBatches data;
        for (int64_t step = 0; step < 4; step++)  // refreshes at 0 and 3
          losses[k].push_back(run.train(step, data).loss);
        for (const ParamTensor& t : run.model().tensors()) {
          const std::vector<float> w = run.weights(t), m = run.master(t);
          weights[k].insert(weights[k].end(), w.begin(), w.end());
          master[k].insert(master[k].end(), m.begin(), m.end());
        }
      }
      CHECK(same_bits(losses[0], losses[1]));
      CHECK(same_bits(weights[0], weights[1]));
      CHECK(same_bits(master[0], master[1]));
      CHECK(losses[0].back() < losses[0].front());
    }
}

TEST_CASE("model: offloaded optimizer states give the resident GPU run's bits",
          "[gpu][memory][offload]") {
  // The states live in pinned host memory and pass through two device slots on the copy streams
  // (kernels/cuda/copy_stream.cuh: fetches on one, write-backs on the other, each fetch waiting
  // for the write-backs before it; under late streams, without that wait, it fails): the same
  // kernels on the same bytes, so the same bits, and no more host waits a step. Three steps: 0
  // and 2 refresh (FLORA: step 1 resamples), and steps 1 and 2 fetch what the step before wrote
  // back. AdamW's runs take the embedding and lm_head in 4 KiB
  // pieces (pure bf16: one rounding stream across them).
  struct Case {
    const char* optimizer;
    const char* precision;
    bool fused;
  };
  for (const Case c : {Case{"grass", "bf16", true}, Case{"grass", "bf16-mixed", false},
                       Case{"adamw", "bf16-mixed", false}, Case{"adamw", "bf16", true},
                       Case{"galore", "bf16", true}, Case{"flora", "bf16", true}}) {
    INFO(c.optimizer << " " << c.precision << (c.fused ? ", fused" : ", deferred"));
    RunConfig resident = ngram_run(c.optimizer);
    resident.micro_batch_size = resident.total_batch_size = 2;  // the emulator's time: 64 tokens
    resident.seq_len = 32;
    resident.optimizer.projection.update_interval = 2;
    resident.fused_update = c.fused ? Switch::On : Switch::Off;
    resident.grad_clip = 0.05;
    RunConfig offloaded = resident;
    offloaded.offload.optimizer_states = true;
    if (std::string(c.optimizer) == "adamw") offloaded.offload.piece_bytes = 4096;
    std::vector<double> losses[2];
    std::vector<float> weights[2], master[2];
    std::vector<int64_t> waits[2];
    std::vector<std::vector<std::byte>> states[2];
    const RunConfig* cfgs[2] = {&resident, &offloaded};
    for (int k = 0; k < 2; k++) {
      Run run(*cfgs[k], c.precision, true);
      const NgramBatches data;
      for (int64_t step = 0; step < 2; step++) {
        const int64_t before = run.backend->host_waits();
        losses[k].push_back(run.train(step, data).loss);
        waits[k].push_back(run.backend->host_waits() - before);
      }
      for (const ParamTensor& t : run.model().tensors()) {
        const std::vector<float> w = run.weights(t), m = run.master(t);
        weights[k].insert(weights[k].end(), w.begin(), w.end());
        master[k].insert(master[k].end(), m.begin(), m.end());
      }
      int64_t host = 0;
      for (const Arena::Block& b : run.arena->blocks())
        if (b.cat == MemCategory::Optimizer) {
          std::vector<std::byte> bytes(size_t(b.bytes));
          run.backend->download(bytes.data(), b.ptr, bytes.size());
          states[k].push_back(std::move(bytes));
          host += b.place == MemPlace::Host ? b.bytes : 0;
        }
      CHECK((host > 0) == (k == 1));
    }
    CHECK(same_bits(losses[0], losses[1]));
    CHECK(same_bits(weights[0], weights[1]));
    CHECK(same_bits(master[0], master[1]));
    CHECK(states[0] == states[1]);
    CHECK(waits[0] == waits[1]);
  }
}

TEST_CASE("model: offloaded layer inputs give the resident GPU run's bits",
          "[gpu][memory][offload]") {
  // Under per-layer checkpointing, layers 0 and 1 of 5 send their input to pinned host memory,
  // or through a pinned bounce buffer to a file (the file's writes are host functions on the
  // device-to-host copy stream, its reads on the host-to-device one, each read after its write by
  // a cross-stream wait: without it the deferred case fails under late streams), and it comes
  // back two layers ahead of their backward: the same bits, and no more host waits a step. The
  // deferred case takes two micro-batches a step (the ring reused within a step), its inputs go
  // to disk and its states to the host.
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("grass-gpu-xin-" + std::to_string(getpid()))).string();
  struct Case {
    const char* optimizer;
    const char* precision;
    bool fused;
  };
  for (const Case c : {Case{"grass", "bf16", true}, Case{"adamw", "bf16-mixed", false}}) {
    INFO(c.optimizer << " " << c.precision << (c.fused ? ", fused" : ", deferred"));
    RunConfig resident = ngram_run(c.optimizer);
    resident.model.num_hidden_layers = 5;
    resident.micro_batch_size = resident.total_batch_size = 2;  // the emulator's time: 64 tokens
    resident.seq_len = 32;
    resident.activation_checkpointing = Checkpointing::Layer;
    resident.fused_update = c.fused ? Switch::On : Switch::Off;
    if (!c.fused) resident.total_batch_size = 2 * resident.micro_batch_size;
    RunConfig offloaded = resident;
    if (c.fused)
      offloaded.offload.activations = ActivationOffload::Host;
    else
      offloaded.offload = {.optimizer_states = true, .activations = ActivationOffload::Disk,
                           .disk_dir = dir};
    const RunConfig* cfgs[2] = {&resident, &offloaded};
    std::vector<double> losses[2];
    std::vector<float> weights[2];
    std::vector<int64_t> waits[2];
    for (int k = 0; k < 2; k++) {
      Run run(*cfgs[k], c.precision, true);
      const NgramBatches data;
      for (int64_t step = 0; step < 2; step++) {
        const int64_t before = run.backend->host_waits();
        losses[k].push_back(run.train(step, data).loss);
        waits[k].push_back(run.backend->host_waits() - before);
      }
      for (const ParamTensor& t : run.model().tensors()) {
        const std::vector<float> w = run.weights(t);
        weights[k].insert(weights[k].end(), w.begin(), w.end());
      }
      CHECK((run.model().x_in_ring() != nullptr) == (k > 0));
    }
    CHECK(same_bits(losses[0], losses[1]));
    CHECK(same_bits(weights[0], weights[1]));
    CHECK(waits[0] == waits[1]);
  }
  CHECK(std::filesystem::is_empty(dir));  // the ring's file is gone with its run
  std::filesystem::remove_all(dir);
}

TEST_CASE("model: streamed layers give the resident GPU run's bits", "[gpu][memory][offload][stream]") {
  // offload.layers (model/layer_stream.h): the streamed layers' matrices live in pinned host
  // memory and pass through device slots on the copy streams, fetched ahead of each pass and
  // written back after each layer's fused updates, each fetch waiting across the streams for the
  // write-backs before it: the same kernels on the same bytes (each tensor in its alignment
  // class), so the same bits, and no more host waits a step. Three steps: 0 and 2 refresh, and
  // every step after the first reads what the one before wrote back; GRASS's step 1 sends back
  // its targets' selected slices alone, packed on the device, which step 2's fetch unpacks.
  // With two micro-batches a step (deferred updates) each micro-batch fetches the layers and an
  // update pass after the last updates each in a slot; a refresh step's backward sends a layer
  // whose σ it moved back whole.
  struct Case {
    const char* optimizer;
    int layers, slots, micro_batches;
  };
  for (const Case c : {Case{"grass", 3, 2, 1}, Case{"adamw", 4, 2, 1}, Case{"galore", 2, 3, 1},
                       Case{"flora", 1, 3, 1}, Case{"grass", 3, 2, 2}}) {
    INFO(c.optimizer << ", " << c.layers << " of 4 layers streamed through " << c.slots
                     << " slots, " << c.micro_batches << " micro-batches a step");
    RunConfig resident = ngram_run(c.optimizer);
    resident.model.num_hidden_layers = 4;
    // the emulator's time: 64 tokens a step
    resident.micro_batch_size = 2 / c.micro_batches;
    resident.total_batch_size = 2;
    resident.seq_len = 32;
    resident.optimizer.projection.update_interval = 2;
    resident.fused_update = c.micro_batches == 1 ? Switch::On : Switch::Off;
    resident.grad_clip = 0.05;
    RunConfig streamed = resident;
    streamed.offload.layers = c.layers;
    streamed.offload.layer_slots = c.slots;
    std::vector<double> losses[2];
    std::vector<float> weights[2];
    std::vector<int64_t> waits[2];
    std::vector<std::vector<std::byte>> states[2];
    const RunConfig* cfgs[2] = {&resident, &streamed};
    for (int k = 0; k < 2; k++) {
      Run run(*cfgs[k], "bf16", true);
      REQUIRE((run.model().weight_store().stream() != nullptr) == (k == 1));
      const NgramBatches data;
      for (int64_t step = 0; step < 2; step++) {
        const int64_t before = run.backend->host_waits();
        losses[k].push_back(run.train(step, data).loss);
        waits[k].push_back(run.backend->host_waits() - before);
      }
      for (const ParamTensor& t : run.model().tensors()) {
        const std::vector<float> w = run.weights(t);
        weights[k].insert(weights[k].end(), w.begin(), w.end());
      }
      for (const Arena::Block& b : run.arena->blocks())
        if (b.cat == MemCategory::Optimizer) {
          std::vector<std::byte> bytes(size_t(b.bytes));
          run.backend->download(bytes.data(), b.ptr, bytes.size());
          states[k].push_back(std::move(bytes));
        }
    }
    CHECK(same_bits(losses[0], losses[1]));
    CHECK(same_bits(weights[0], weights[1]));
    CHECK(states[0] == states[1]);
    CHECK(waits[0] == waits[1]);
  }
}

TEST_CASE("model: the memory plan equals what the GPU arena allocates", "[gpu][memory]") {
  for (const std::string optimizer : {"adamw", "grass"})
  for (const std::string precision : {"bf16-mixed", "bf16"})
  for (const std::string lean : {"off", "elementwise", "layer", "sampled", "columns", "offload",
                                 "stream"}) {
      if (lean == "stream" && precision == "bf16-mixed") continue;  // its master copy stays
      INFO(optimizer << " " << precision << " checkpointing and fused " << lean);
      RunConfig cfg =
          run_config(model_config(kHd64Odd, kVocab, 0.02), kBatch, kSeq, optimizer, 1e-3);
      cfg.fused_update = lean == "off" ? Switch::Off : Switch::On;
      cfg.activation_checkpointing = lean == "elementwise" || lean == "layer"
                                         ? test::named<Checkpointing>(lean)
                                         : Checkpointing::None;
      cfg.offload.optimizer_states = lean == "offload";  // the states in pinned host memory
      cfg.offload.layers = lean == "stream" ? 1 : 0;     // a layer's matrices there too
      if (lean == "sampled")  // wta-crs's draw has a workspace on the GPU, bernoulli's none
        cfg.activations = {optimizer == "adamw" ? ActivationSample::WtaCrs : ActivationSample::Bernoulli, 0.3};
      if (lean == "columns") {  // GRASS's `cols` targets: gate and up's n2 kept as columns
        cfg.optimizer.projection.select_dim = SelectDim::Cols;
        cfg.activations.selected_columns = optimizer == "grass" ? Switch::On : Switch::Off;
      }
      const Storage storage = storage_for(test::named<PrecisionChoice>(precision), true);
      const MemoryPlan plan = plan_memory(cfg, storage);
      {  // one cudaMalloc per buffer: the arena's own count
        const std::unique_ptr<Backend> backend = make_cuda_backend(storage);
        Arena real(false, *backend, &backend->host_tier());
        build_training_state(cfg, real, *backend);
        for (int c = 0; c < kMemCategories; c++) {
          INFO(mem_category_name(MemCategory(c)));
          CHECK(plan.bytes[size_t(c)] == real.bytes(MemCategory(c)));
          CHECK(plan.host_bytes[size_t(c)] == real.bytes(MemPlace::Host, MemCategory(c)));
        }
        CHECK(plan.total == real.total_bytes());
        CHECK(plan.host_total == real.total_bytes(MemPlace::Host));
        CHECK(plan.buffers == real.num_blocks());
      }
      {  // the trainer's way: one reservation of the planned size holds every aligned buffer
        const std::unique_ptr<Backend> backend = make_cuda_backend(storage);
        backend->reserve(plan.total, plan.buffers);
        Arena real(false, *backend, &backend->host_tier());
        CHECK_NOTHROW(build_training_state(cfg, real, *backend));
        CHECK(real.total_bytes() == plan.total);
      }
    }
}

TEST_CASE("model: the plan equals the GPU arena at either head chunk, and a tight limit takes the "
          "smaller", "[gpu][memory][head]") {
  // Vocabulary 16,384: the default chunk is 2,048 rows (64 MiB), the larger 4,096; 42 x 100
  // tokens hold more than either. Only allocated: nothing is computed.
  const RunConfig cfg = run_config(model_config(kHd32, 16384, 0.02), 42, kSeq, "adamw", 1e-3);
  const Storage storage = storage_for(PrecisionChoice::Bf16Mixed, true);
  const MemoryPlan large = plan_memory(cfg, storage);
  CHECK(model_memory_options(cfg, storage).head_chunk_rows == 4096);
  RunConfig tight = cfg;
  tight.memory_limit = large.total + beyond_plan_bytes(storage) - 1;  // a card 1 byte too small
  const MemoryPlan small = plan_memory(tight, storage);
  CHECK(model_memory_options(tight, storage).head_chunk_rows == 0);
  CHECK(large.total - small.total == (4096 - 2048) * int64_t(16384) * 2);
  CHECK(small.total <= tight.memory_limit);
  const RunConfig* runs[] = {&cfg, &tight};
  for (const RunConfig* c : runs) {
    INFO((c == &cfg ? "no memory_limit" : "a card 1 byte under the larger chunk's plan"));
    const MemoryPlan plan = plan_memory(*c, storage);
    const std::unique_ptr<Backend> backend = make_cuda_backend(storage);
    backend->reserve(plan.total, plan.buffers);  // the trainer's way: one reservation
    Arena real(false, *backend, &backend->host_tier());
    CHECK_NOTHROW(build_training_state(*c, real, *backend));
    for (int k = 0; k < kMemCategories; k++) {
      INFO(mem_category_name(MemCategory(k)));
      CHECK(plan.bytes[size_t(k)] == real.bytes(MemCategory(k)));
    }
    CHECK(real.total_bytes() == plan.total);
    CHECK(plan.buffers == real.num_blocks());
  }
}

TEST_CASE("model: sampled activations drawn on a side stream give the in-line draws' bits",
          "[gpu][sampled]") {
  // Each keep's draw and gather run beside the layer's compute (Backend::begin_side_work); the
  // model joins them before it writes the shared n1, n2 or act again. Under the emulator's
  // deferred streams a missing join lets a draw read the next layer's input: its rows, and so
  // the weight gradients, then differ from the same draws on the compute stream
  // (GRASS_SIDE_STREAM=0). 3 layers: 2 draw (the last layer's inputs stay whole).
  constexpr int B = 2, T = 64;
  for (const char* sample : {"bernoulli", "crs", "wta-crs"}) {
    INFO(sample);
    RunConfig cfg = run_config(model_config(kHd32, kVocab, 0.04), B, T, "adamw", 1e-3);
    cfg.model.num_hidden_layers = 3;
    cfg.activations.sample = test::named<ActivationSample>(sample);
    cfg.activations.keep = 0.5;
    const Batch batch = random_batch(int64_t(B) * T, kVocab, 29);
    std::vector<std::vector<float>> grads[3];  // in line, beside, exact
    std::vector<std::string> names;
    double loss[3] = {};
    for (int run = 0; run < 3; run++) {
      ::setenv("GRASS_SIDE_STREAM", run == 0 ? "0" : "1", 1);
      Run gpu(cfg, "bf16-mixed", true);
      ::unsetenv("GRASS_SIDE_STREAM");
      LlamaModel& m = gpu.model();
      m.zero_grads();
      m.begin_sampled_step(7, 1, 0, /*exact=*/run == 2);
      m.forward_backward(batch.inputs.data(), batch.targets.data(), B, 1.0);
      loss[run] = m.take_losses().at(0);
      for (const ParamTensor& t : m.tensors()) {
        grads[run].push_back(gpu.grad(t));
        if (run == 0) names.push_back(t.name);
      }
    }
    CHECK(loss[1] == loss[0]);  // the forward is exact either way
    CHECK(loss[2] == loss[0]);
    int sampled = 0;
    for (size_t i = 0; i < names.size(); i++) {
      INFO(names[i]);
      CHECK(same_bits(grads[1][i], grads[0][i]));
      sampled += !same_bits(grads[2][i], grads[0][i]);  // what the draws estimate
    }
    CHECK(sampled == 2 * 6);  // q, k, v, gate, up and down of each layer that draws; dx is exact
  }
}

TEST_CASE("model: a GPU training step waits for the device a fixed number of times", "[gpu][waits]") {
  // The host reads the step's norm and its losses, once each, whatever the number of tensors and
  // micro-batches: tokens go through pinned staging and the clipping coefficient stays on the
  // device, and so do sampled activations' draws. A refresh (step 0 here) adds what the selection
  // or the basis reads; GaLore's refresh pass (svd_batch "layer") none more: its loss is dropped
  // unread. Step 0 refreshes, step 1 is a step between refreshes. (The projected optimizers skip
  // the 1-micro-batch deferred run to keep the emulator's time down.)
  constexpr int64_t kStepWaits = 2;
  for (const std::string optimizer : {"adamw", "grass", "galore", "galore-batched", "flora"})
    for (const std::string mode : {"deferred, 1 micro-batch", "deferred, 3 micro-batches", "fused"}) {
      if (optimizer != "adamw" && mode == "deferred, 1 micro-batch") continue;
      INFO(optimizer << ", " << mode);
      const bool batched = optimizer == "galore-batched";
      RunConfig cfg = ngram_run(batched ? "galore" : optimizer);
      if (batched) cfg.optimizer.projection.svd_batch = GaloreSvdBatch::Layer;
      cfg.optimizer.projection.update_interval = 8;
      if (mode == "deferred, 3 micro-batches") cfg.total_batch_size = 3 * cfg.micro_batch_size;
      cfg.fused_update = mode == "fused" ? Switch::On : Switch::Off;
      Run run(cfg, "bf16-mixed", true);
      const NgramBatches data;
      const int targets = int(run.model().tensors().size() - size_t(std::count_if(
          run.model().tensors().begin(), run.model().tensors().end(),
          [](const ParamTensor& t) { return t.dense(); })));
      for (int64_t step = 0; step < 2; step++) {
        const int64_t before = run.backend->host_waits();
        run.train(step, data);
        const int64_t waits = run.backend->host_waits() - before;
        CAPTURE(step, waits, targets);
        // at a refresh: GRASS reads each target's slice norms once (all its row chunks together);
        // GaLore reads its cuSOLVER statuses once, after the last target (its device refresh, svd
        // "auto"); FLORA draws P on the device
        const int64_t refresh =
            optimizer == "grass" ? targets : optimizer.starts_with("galore") ? 1 : 0;
        CHECK(waits == kStepWaits + (step == 0 ? refresh : 0));
      }
    }
  {  // Sampled activations add none: crs and wta-crs draw their rows on the device
     // (Backend::draw_rows; bernoulli reads no norms and draws on the host)
    INFO("adamw, activations wta-crs");
    RunConfig cfg = ngram_run("adamw");
    cfg.activations.sample = ActivationSample::WtaCrs;
    cfg.activations.keep = 0.5;
    Run run(cfg, "bf16-mixed", true);
    const int64_t before = run.backend->host_waits();
    run.train(0, NgramBatches{});
    CHECK(run.backend->host_waits() - before == kStepWaits);
  }
}

TEST_CASE("model: the GPU's head in chunks of either size matches the CPU and repeats its bits",
          "[gpu][model][head]") {
  // Chunks of 72 rows (4 and one of 12) against one chunk of all 300: the loss and every
  // gradient within the CPU comparison's bounds (see the header), each size bit for bit the same
  // twice. The chunk changes the order lm_head's gradient is summed in (chunk by chunk, fp32):
  // its bits differ between the sizes, which shows the chunk taken is the one asked for. (72 is
  // not a multiple of the GEMMs' K tiles, 16 to 64 on the emulator: chunks of 64 rows would sum
  // in the one chunk's order.)
  const RunConfig cfg = run_config(model_config(kHd64Odd, kVocab, 0.04), kBatch, kSeq, "adamw", 1e-3);
  const Batch batch = random_batch(int64_t(kBatch) * kSeq, kVocab, 29);
  Run cpu(cfg, "bf16-mixed", false);
  const double cpu_loss = cpu.gradients(0, batch.inputs, batch.targets);
  const ParameterSet& tensors = cpu.model().tensors();
  struct Result {
    double loss = 0;
    std::vector<std::vector<float>> grads;
  };
  const auto gpu_run = [&](int64_t chunk_rows) {
    const Storage storage = storage_for(PrecisionChoice::Bf16Mixed, true);
    ModelMemoryOptions memory = model_memory_options(cfg, storage);
    memory.head_chunk_rows = chunk_rows;
    const std::unique_ptr<Backend> backend = make_cuda_backend(storage);
    Arena arena(false, *backend, &backend->host_tier());
    LlamaModel model(cfg.model, arena, kBatch, kSeq, {}, *backend, memory);
    model.init_weights(cfg.seed);
    model.zero_grads();
    Result r;
    r.loss = model.forward(batch.inputs.data(), batch.targets.data(), kBatch);
    model.backward(1.0);
    for (const ParamTensor& t : model.tensors()) {
      r.grads.emplace_back(size_t(t.numel));
      backend->read_grads(r.grads.back().data(), model.grads_buffer(), t.grad_offset, t.numel);
    }
    return r;
  };
  std::vector<Result> by_size;
  for (const int64_t chunk_rows : {int64_t(72), kBatch * int64_t(kSeq)}) {
    INFO("chunks of " << chunk_rows << " rows");
    const Result a = gpu_run(chunk_rows), b = gpu_run(chunk_rows);
    REQUIRE(std::isfinite(a.loss));
    CHECK(rel_diff(a.loss, cpu_loss) <= 1e-2);
    CHECK(std::memcmp(&a.loss, &b.loss, sizeof a.loss) == 0);
    for (size_t i = 0; i < tensors.size(); i++) {
      INFO(tensors[i].name);
      const std::vector<float> want = cpu.grad(tensors[i]);
      CHECK(l2_norm(a.grads[i]) > 0);
      CHECK(rel_error(a.grads[i], want) <= 3e-2);
      CHECK(same_bits(a.grads[i], b.grads[i]));
    }
    by_size.push_back(a);
  }
  const size_t lm_head = tensors.size() - 1;
  REQUIRE(tensors[lm_head].name == "lm_head.weight");
  CHECK_FALSE(same_bits(by_size[0].grads[lm_head], by_size[1].grads[lm_head]));
}

TEST_CASE("model: the GPU's one-pass head gives the two calls' bits", "[gpu]") {
  // forward_backward computes each chunk's logits once; forward + backward computes them twice.
  // Same kernels on the same inputs: the loss and every gradient must be identical.
  const RunConfig cfg = run_config(model_config(kHd64Odd, kVocab, 0.04), kBatch, kSeq, "adamw", 1e-3);
  const Batch batch = random_batch(int64_t(kBatch) * kSeq, kVocab, 17);
  Run one_pass(cfg, "bf16-mixed", true), two_calls(cfg, "bf16-mixed", true);
  one_pass.deferred().begin(0, cfg.optimizer.lr);
  one_pass.model().forward_backward(batch.inputs.data(), batch.targets.data(), kBatch, 1.0);
  const std::vector<double> loss = one_pass.model().take_losses();
  REQUIRE(loss.size() == 1);
  const double want = two_calls.gradients(0, batch.inputs, batch.targets);
  CHECK(std::memcmp(&loss[0], &want, sizeof want) == 0);
  for (const ParamTensor& t : one_pass.model().tensors()) {
    INFO(t.name);
    CHECK(same_bits(one_pass.grad(t), two_calls.grad(t)));
  }
}
