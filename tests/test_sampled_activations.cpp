// Sampled activations (model/sampled_inputs.h) in the model: the weight gradients formed from
// kept rows are unbiased estimates of the exact ones (the mean of 10^4 draws within 5 standard
// errors, element by element), alone and composed with GRASS's compressed gradient; every other
// gradient stays exact to the bit (the forward and dx are exact); a pass that draws nothing is the
// exact backward, bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "src/core/arena.h"
#include "src/model/llama.h"
#include "src/train/run_resolution.h"
#include "src/train/training_state.h"
#include "tests/named_choice.h"
#include "tests/ngram_batches.h"

using namespace grass;

namespace {

constexpr int kB = 2, kT = 8, kLayers = 3, kDraws = 10000;
constexpr const char* kSampledTensors[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                           "self_attn.v_proj.weight", "mlp.gate_proj.weight",
                                           "mlp.up_proj.weight",      "mlp.down_proj.weight"};

ModelConfig tiny_model() {
  ModelConfig m;
  m.hidden_size = 16;
  m.intermediate_size = 24;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 1;
  m.num_hidden_layers = kLayers;
  m.vocab_size = 32;
  m.max_position_embeddings = kT;
  m.initializer_range = 0.3;
  return m;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};
Batch random_batch() {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int32_t> token(0, 31);
  Batch b;
  for (int i = 0; i < kB * kT; i++) b.inputs.push_back(token(rng)), b.targets.push_back(token(rng));
  return b;
}

// A sink that forms each projected tensor's G_C with GRASS's own op (σ and ρ fixed), summed.
class GrassSink final : public GradientSink {
 public:
  struct Target {
    int in, out;
    bool rows;
    std::vector<int32_t> sigma;
    std::vector<float> rho;
    std::vector<float> gc;
  };
  std::vector<Target> targets;  // by tensor index (in = 0: not projected)
  void projected(int tensor, const void* dy, const void* x, int64_t N, bool x_selected) override {
    REQUIRE_FALSE(x_selected);
    Target& t = targets.at(size_t(tensor));
    const int r = int(t.sigma.size());
    std::vector<float> scratch(size_t(N) * r + 1);
    ops::grass_compressed_grad(t.gc.data(), scratch.data(), static_cast<const float*>(dy),
                               static_cast<const float*>(x), t.sigma.data(), t.rho.data(), N, t.in,
                               t.out, r, t.rows);
  }
  void dense_ready(int, void*) override {}
};

// The gradients (dense, then every projected G_C) of one forward_backward of `b`, after
// begin_sampled_step(step, exact).
std::vector<float> gradients(LlamaModel& m, GrassSink* sink, const Batch& b, int64_t step,
                             bool exact) {
  m.zero_grads();
  if (sink)
    for (auto& t : sink->targets) std::fill(t.gc.begin(), t.gc.end(), 0.0f);
  m.begin_sampled_step(7, step, 0, exact);
  m.forward_backward(b.inputs.data(), b.targets.data(), kB, 1.0);
  m.take_losses();
  const float* g = static_cast<const float*>(m.grads_buffer());
  std::vector<float> out(g, g + m.num_dense_grads());
  if (sink)
    for (const auto& t : sink->targets) out.insert(out.end(), t.gc.begin(), t.gc.end());
  return out;
}

std::vector<std::string> sampled_names(int layers) {
  std::vector<std::string> names;
  for (int l = 0; l < layers; l++)
    for (const char* t : kSampledTensors)
      names.push_back("model.layers." + std::to_string(l) + "." + t);
  return names;
}

// The model (sampled or not) and, for `projected` tensors, a GrassSink with fresh σ and ρ.
struct Setup {
  Arena arena;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<GrassSink> sink;
  Setup(const std::vector<std::string>& projected, SampledActivations sampled, uint32_t sink_seed) {
    ModelMemoryOptions memory;
    memory.sampled = sampled;
    model = std::make_unique<LlamaModel>(tiny_model(), arena, kB, kT, projected,
                                         default_cpu_backend(), memory);
    model->init_weights(3);
    if (projected.empty()) return;
    sink = std::make_unique<GrassSink>();
    sink->targets.resize(model->tensors().size());
    std::mt19937 rng(sink_seed);
    for (const std::string& name : projected) {
      const ParamTensor& p = model->tensor(name);
      GrassSink::Target& t = sink->targets[size_t(model->tensors().index_of(name))];
      t.out = int(p.shape[0]), t.in = int(p.shape[1]);
      t.rows = t.out <= t.in;  // the shorter side, as GRASS's auto
      const int side = t.rows ? t.out : t.in, r = 3;
      for (int j = 0; j < r; j++) {
        t.sigma.push_back(int32_t((j * 5 + int(rng() % 3)) % side));
        t.rho.push_back(0.5f + float(rng() % 100) / 100.0f);
      }
      t.gc.assign(size_t(r) * (t.rows ? t.in : t.out), 0.0f);
    }
    model->set_gradient_sink(sink.get());
  }
};

}  // namespace

TEST_CASE("sampled weight gradients are unbiased, the rest exact, alone and composed with GRASS",
          "[sampled]") {
  const ActivationSample sampler = GENERATE(ActivationSample::Crs, ActivationSample::WtaCrs,
                                            ActivationSample::Bernoulli);
  const bool with_grass = GENERATE(false, true);
  INFO(name_of(sampler) << (with_grass ? ", composed with GRASS" : ""));
  // GRASS trains q, gate and down of every layer (so of the sampled layers and the exact last one)
  std::vector<std::string> projected;
  if (with_grass)
    for (int l = 0; l < kLayers; l++)
      for (const char* t : {"self_attn.q_proj.weight", "mlp.gate_proj.weight", "mlp.down_proj.weight"})
        projected.push_back("model.layers." + std::to_string(l) + "." + t);
  const uint32_t sink_seed = std::random_device{}();
  Setup exact_setup(projected, {}, sink_seed), sampled_setup(projected, {sampler, 0.3}, sink_seed);
  const Batch batch = random_batch();
  const std::vector<float> exact = gradients(*exact_setup.model, exact_setup.sink.get(), batch, 0, true);

  // A pass that draws nothing is the exact backward (the inputs recomputed), bit for bit.
  CHECK(gradients(*sampled_setup.model, sampled_setup.sink.get(), batch, 0, true) == exact);

  // Which elements are estimated: the sampled layers' q, k, v, gate, up, down gradients (dense)
  // and the G_C of those layers' GRASS targets (after the dense buffer, in tensor order).
  LlamaModel& m = *sampled_setup.model;
  std::vector<bool> estimated(exact.size(), false);
  int64_t projected_offset = m.num_dense_grads();
  std::vector<int64_t> gc_offset(m.tensors().size(), -1);
  if (with_grass)
    for (size_t i = 0; i < m.tensors().size(); i++)
      if (!sampled_setup.sink->targets[i].gc.empty()) {
        gc_offset[i] = projected_offset;
        projected_offset += int64_t(sampled_setup.sink->targets[i].gc.size());
      }
  REQUIRE(size_t(projected_offset) == exact.size());
  for (const std::string& name : sampled_names(kLayers - 1)) {
    const size_t index = size_t(m.tensors().index_of(name));
    const ParamTensor& p = m.tensors()[index];
    const int64_t first = p.dense() ? p.grad_offset : gc_offset[index];
    const int64_t count = p.dense() ? p.numel : int64_t(sampled_setup.sink->targets[index].gc.size());
    for (int64_t i = 0; i < count; i++) estimated[size_t(first + i)] = true;
  }

  std::vector<double> sum(exact.size(), 0.0), sum_sq(exact.size(), 0.0);
  size_t exact_differs = 0;
  for (int d = 1; d <= kDraws; d++) {
    const std::vector<float> g = gradients(m, sampled_setup.sink.get(), batch, d, false);
    for (size_t i = 0; i < g.size(); i++) {
      if (!estimated[i]) {
        exact_differs += g[i] != exact[i];
        continue;
      }
      sum[i] += g[i];
      sum_sq[i] += double(g[i]) * g[i];
    }
  }
  CHECK(exact_differs == 0);  // every gradient that is not estimated: the exact bits, every draw
  size_t misses = 0, varied = 0, checked = 0;
  double scale = 0;  // the estimated gradients' rms, for a rounding floor
  for (size_t i = 0; i < exact.size(); i++)
    if (estimated[i]) scale += double(exact[i]) * exact[i], checked++;
  scale = std::sqrt(scale / double(checked));
  for (size_t i = 0; i < exact.size(); i++) {
    if (!estimated[i]) continue;
    const double mean = sum[i] / kDraws;
    const double var = std::max(0.0, sum_sq[i] / kDraws - mean * mean);
    const double se = std::sqrt(var / kDraws);
    varied += var > 1e-12 * scale * scale;
    if (!(std::fabs(mean - exact[i]) <= 5 * se + 1e-6 * scale)) misses++;
  }
  INFO(checked << " estimated elements, " << varied << " of them vary between draws");
  CHECK(misses == 0);
  CHECK(varied > checked / 2);  // the draws do differ: an estimate, not the exact gradient
}

TEST_CASE("refresh steps take the exact path: the optimizers say which, the step's bits agree",
          "[sampled]") {
  for (const std::string optimizer : {"adamw", "grass", "galore", "flora"}) {
    INFO(optimizer);
    RunConfig cfg;
    cfg.model = tiny_model();
    cfg.model.vocab_size = test::NgramBatches::V;
    cfg.micro_batch_size = kB;
    cfg.total_batch_size = 2 * kB;  // two micro-batches: two draws per step
    cfg.seq_len = kT;
    cfg.precision = PrecisionChoice::F32;
    cfg.optimizer.kind = test::named<OptimizerKind>(optimizer);
    cfg.optimizer.projection.rank = 4;
    cfg.optimizer.projection.update_interval = 3;
    cfg.optimizer.projection.targets = test::named_targets({"q", "gate", "down"});
    RunConfig sampled = cfg;
    sampled.activations = {ActivationSample::WtaCrs, 0.4};
    const test::NgramBatches data;
    std::vector<StepOutcome> outcomes[2];
    std::vector<bool> exact_steps;
    for (int run = 0; run < 2; run++) {
      const RunConfig& c = run ? sampled : cfg;
      const Storage storage = storage_for(c.precision, false);
      const std::unique_ptr<Backend> backend = make_cpu_backend(storage);
      Arena arena(false, *backend);
      TrainingState s = build_training_state(c, arena, *backend);
      s.model->init_weights(3);
      int64_t batch = 0;
      for (int64_t step = 0; step < 4; step++)
        outcomes[run].push_back(train_step(s, c, step, 1e-2, [&](int32_t* in, int32_t* tg) {
          // before each forward: what the step told the model (the flag clears as it refreshes)
          if (run && batch % 2 == 0) exact_steps.push_back(s.optimizers->needs_exact_activations());
          std::vector<int32_t> inputs, targets;
          data.batch(batch++, kB, kT, inputs, targets);
          std::copy(inputs.begin(), inputs.end(), in);
          std::copy(targets.begin(), targets.end(), tg);
        }));
    }
    // GRASS and GaLore refresh at steps 0 and 3; AdamW and FLORA (whose refresh reads no
    // gradient) never ask for exact inputs.
    const bool refreshes = optimizer == "grass" || optimizer == "galore";
    CHECK(exact_steps == std::vector<bool>{refreshes, false, false, refreshes});
    CHECK(outcomes[1][0].loss == outcomes[0][0].loss);  // the same weights, an exact forward
    if (refreshes)  // step 0 is exact: the same gradients, so the same weights for step 1
      CHECK(outcomes[1][1].loss == outcomes[0][1].loss);
    CHECK((outcomes[1][0].grad_norm == outcomes[0][0].grad_norm) == refreshes);
    CHECK(outcomes[1][1].grad_norm != outcomes[0][1].grad_norm);  // estimated
  }
}
