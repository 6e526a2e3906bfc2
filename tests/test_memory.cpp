// The memory features change where numbers live, never the numbers: per-layer activation
// checkpointing recomputes exactly what the forward kept, and fused per-layer updates apply exactly
// the unfused step whenever global-norm clipping would not clip. Both checked bit for bit on the
// CPU backend, in every precision, through the trainer's own step (train_step).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/optim/grass.h"
#include "src/optim/lowrank.h"
#include "src/train/memory_plan.h"
#include "src/train/run_resolution.h"
#include "src/train/training_state.h"
#include "tests/named_choice.h"
#include "tests/ngram_batches.h"
#include "tests/test_util.h"

using namespace grass;

namespace {

RunConfig small_run(const std::string& optimizer, const std::string& precision) {
  RunConfig c;
  c.model.hidden_size = 32;
  c.model.intermediate_size = 86;
  c.model.num_attention_heads = 4;
  c.model.num_key_value_heads = 2;
  c.model.num_hidden_layers = 3;
  c.model.vocab_size = test::NgramBatches::V;
  c.model.max_position_embeddings = 64;
  c.model.initializer_range = 0.1;
  c.micro_batch_size = 2;
  c.total_batch_size = 2;
  c.seq_len = 16;
  c.precision = test::named<PrecisionChoice>(precision);
  c.grad_clip = 0;
  c.optimizer.kind = test::named<OptimizerKind>(optimizer);
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.1;
  c.optimizer.projection.rank = 4;
  c.optimizer.projection.update_interval = 3;  // refreshes at steps 0 and 3
  c.optimizer.projection.seed = 11;
  c.optimizer.projection.targets = test::named_targets({"q", "k", "o", "gate", "down"});  // v and up stay dense
  return c;
}

// The step strategy's sink, counting the projected gradients formed from kept columns.
class CountingSink final : public GradientSink {
 public:
  explicit CountingSink(GradientSink& inner) : inner_(inner) {}
  int64_t from_columns = 0;
  void projected(int tensor, const void* dy, const void* x, int64_t N, bool x_selected) override {
    from_columns += x_selected;
    inner_.projected(tensor, dy, x, N, x_selected);
  }
  bool stacks(int first, int count) const override { return inner_.stacks(first, count); }
  void projected_stack(int first, int count, const void* dy, const void* const* x, int64_t N,
                       bool x_selected) override {
    from_columns += x_selected ? count : 0;
    inner_.projected_stack(first, count, dy, x, N, x_selected);
  }
  bool selected_columns(int tensor, SelectedColumns* columns) const override {
    return inner_.selected_columns(tensor, columns);
  }
  void dense_ready(int tensor, void* grad) override { inner_.dense_ready(tensor, grad); }

 private:
  GradientSink& inner_;
};

// What a run leaves: its losses and norms per step, and every byte of its state.
struct RunRecord {
  std::vector<double> losses, norms, clip_coefs;
  std::vector<int64_t> from_columns;  // per step: projected gradients formed from kept columns
  std::vector<int> clipped;
  std::vector<std::vector<int>> galore_batches;  // per step: GaLore::refresh_batches()
  std::vector<std::vector<char>> state;  // the weights and optimizer blocks, in order
  std::vector<std::string> state_names;
};

RunRecord train(const RunConfig& cfg, int steps) {
  const Storage storage = storage_for(cfg.precision, false);
  const std::unique_ptr<Backend> backend = make_cpu_backend(storage);
  Arena arena(false, *backend);
  TrainingState s = build_training_state(cfg, arena, *backend);
  s.model->init_weights(3);
  CountingSink sink(*s.step);
  s.model->set_gradient_sink(&sink);
  const test::NgramBatches data;
  RunRecord record;
  int64_t batch = 0;
  for (int64_t step = 0; step < steps; step++) {
    const StepOutcome out = train_step(s, cfg, step, cfg.optimizer.lr, [&](int32_t* in, int32_t* tg) {
      std::vector<int32_t> inputs, targets;
      data.batch(batch++, cfg.micro_batch_size, cfg.seq_len, inputs, targets);
      std::copy(inputs.begin(), inputs.end(), in);
      std::copy(targets.begin(), targets.end(), tg);
    });
    record.losses.push_back(out.loss);
    record.norms.push_back(out.grad_norm);
    record.from_columns.push_back(std::exchange(sink.from_columns, 0));
    record.clipped.push_back(s.step->clipped_tensors());
    record.clip_coefs.push_back(out.clip_coef);
    if (const GaLore* galore = s.optimizers->find<GaLore>())
      record.galore_batches.push_back(galore->refresh_batches());
  }
  for (const Arena::Block& b : arena.blocks())
    if (b.cat == MemCategory::Weights || b.cat == MemCategory::Optimizer) {
      const char* p = static_cast<const char*>(b.ptr);
      record.state.emplace_back(p, p + b.bytes);
      record.state_names.push_back(b.name);
    }
  return record;
}

void require_same_state(const RunRecord& a, const RunRecord& b) {
  REQUIRE(a.state_names == b.state_names);
  for (size_t i = 0; i < a.state.size(); i++) {
    INFO(a.state_names[i]);
    CHECK(a.state[i] == b.state[i]);
  }
}

}  // namespace

TEST_CASE("activation checkpointing, elementwise or per layer, gives identical losses and weights",
          "[memory]") {
  for (const Checkpointing mode : {Checkpointing::Elementwise, Checkpointing::Layer})
  for (const std::string optimizer : {"adamw", "grass"})
    for (const std::string precision : {"fp32", "bf16"})
      for (const int micro_batches : {1, 2}) {
        INFO(name_of(mode) << " " << optimizer << " " << precision << ", " << micro_batches
                           << " micro-batch(es)");
        RunConfig kept = small_run(optimizer, precision);
        kept.total_batch_size = kept.micro_batch_size * micro_batches;
        kept.grad_clip = 1.0;
        RunConfig recomputed = kept;
        recomputed.activation_checkpointing = mode;
        const RunRecord a = train(kept, 5), b = train(recomputed, 5);
        CHECK(a.losses == b.losses);
        CHECK(a.norms == b.norms);
        require_same_state(a, b);
        CHECK(a.losses.back() < a.losses.front());  // it trained
      }
}

// GaLore's optimizer.svd_batch "layer": at a step where every target refreshes, a pass of its
// own over the first micro-batch sketches each target and solves each layer's eigenproblems in
// one batched call, before the step's backward. On the CPU (LAPACK's syevd for each matrix of a
// batch) its projections, and so the whole run, are the per-target refresh's bit for bit: fused
// (bf16, one micro-batch) and deferred, one and two micro-batches (the pass's loss and dense
// gradients dropped), staggered refreshes (the pass only at step 0, where every target
// refreshes), and with the states or the layer inputs in the host tier.
TEST_CASE("GaLore's svd_batch layer: a refresh pass gives the per-target refreshes' bits",
          "[memory][lowrank]") {
  enum Offload { None, States, Inputs };
  for (const std::string precision : {"fp32", "bf16"})
    for (const int micro_batches : {1, 2})
      for (const bool stagger : {false, true})
      for (const Offload offload : {None, States, Inputs}) {
        if (offload != None && (stagger || micro_batches == 2)) continue;
        INFO(precision << ", " << micro_batches << " micro-batch(es)"
                       << (stagger ? ", staggered refreshes" : "")
                       << (offload == States ? ", states in the host tier" : "")
                       << (offload == Inputs ? ", layer inputs in the host tier" : ""));
        RunConfig one = small_run("galore", precision);
        one.offload.optimizer_states = offload == States;
        if (offload == Inputs) {
          one.activation_checkpointing = Checkpointing::Layer;
          one.offload.activations = ActivationOffload::Host;
        }
        one.optimizer.projection.svd = GaloreSvd::Randomized;
        one.optimizer.projection.svd_power_iters = 1;
        one.optimizer.projection.svd_oversample = 2;
        one.optimizer.projection.refresh_stagger = stagger;
        one.total_batch_size = one.micro_batch_size * micro_batches;
        one.grad_clip = 1.0;
        RunConfig batched = one;
        batched.optimizer.projection.svd_batch = GaloreSvdBatch::Layer;
        const RunRecord a = train(one, 5), b = train(batched, 5);
        CHECK(a.losses == b.losses);
        CHECK(a.norms == b.norms);
        require_same_state(a, b);
        CHECK(a.losses.back() < a.losses.front());  // it trained
        // refreshes at steps 0 and 3 (interval 3): one call per layer for its 5 targets
        REQUIRE(b.galore_batches.size() == 5);
        for (size_t step = 0; step < 5; step++) {
          INFO("step " << step);
          const bool pass = step == 0 || (step == 3 && !stagger);
          CHECK(b.galore_batches[step] == (pass ? std::vector<int>{5, 5, 5} : std::vector<int>{}));
          CHECK(a.galore_batches[step].empty());
        }
      }
}

TEST_CASE("inputs kept as GRASS's selected columns give the whole inputs' bits", "[memory]") {
  // cols: every input kept as columns (n1 for q, k, v; n2 for gate, up; act for down); auto:
  // gate and up select their input side (86 x 32), so n2 alone. Refreshes at steps 0 and 3 read
  // the whole inputs on their first micro-batch: the backward recomputes them.
  struct Case {
    const char* select_dim;
    std::initializer_list<const char*> targets;
    int readers;  // the targets that read kept columns
  };
  for (const Case c : {Case{"cols", {"q", "k", "v", "gate", "up", "down"}, 6},
                       Case{"auto", {"q", "gate", "up", "down"}, 2}})
    for (const std::string precision : {"fp32", "bf16-mixed", "bf16"})
      for (const int micro_batches : {1, 2})
        for (const bool stagger : {false, true}) {
          INFO(c.select_dim << " " << precision << ", " << micro_batches << " micro-batch(es)"
                            << (stagger ? ", staggered refreshes" : ""));
          RunConfig whole = small_run("grass", precision);
          whole.optimizer.projection.targets = test::named_targets(c.targets);
          whole.optimizer.projection.select_dim = test::named<SelectDim>(c.select_dim);
          whole.optimizer.projection.refresh_stagger = stagger;
          // multinomial: ρ ≠ 1 scales the kept columns
          if (micro_batches == 2) whole.optimizer.projection.selection = Selection::Multinomial;
          whole.total_batch_size = whole.micro_batch_size * micro_batches;
          whole.grad_clip = 1.0;
          whole.activations.selected_columns = Switch::Off;
          RunConfig columns = whole;
          columns.activations.selected_columns = Switch::On;
          const RunRecord a = train(whole, 5), b = train(columns, 5);
          CHECK(a.losses == b.losses);
          CHECK(a.norms == b.norms);
          require_same_state(a, b);
          CHECK(a.losses.back() < a.losses.front());  // it trained
          CHECK(a.from_columns == std::vector<int64_t>(5, 0));
          // layers 0 and 1 keep columns (the last layer's inputs are whole in the shared buffers)
          const int64_t per_pass = 2 * c.readers;
          if (!stagger) {
            const int64_t refresh = (micro_batches - 1) * per_pass;
            const int64_t plain = micro_batches * per_pass;
            CHECK(b.from_columns == std::vector<int64_t>{refresh, plain, plain, refresh, plain});
          } else {  // some targets refresh at each step: fewer, but never none after step 0
            for (size_t step = 1; step < 5; step++) {
              CHECK(b.from_columns[step] > 0);
              CHECK(b.from_columns[step] <= micro_batches * per_pass);
            }
          }
        }
}

TEST_CASE("selected columns: the plan keeps r columns of each kept input per layer", "[memory]") {
  RunConfig cfg = small_run("grass", "bf16-mixed");
  cfg.optimizer.projection.targets = test::named_targets({"q", "k", "v", "gate", "up", "down"});
  cfg.optimizer.projection.select_dim = SelectDim::Cols;
  const Storage storage = storage_for(PrecisionChoice::Bf16Mixed, true);  // ffn padded to 88
  RunConfig whole = cfg;
  whole.activations.selected_columns = Switch::Off;
  const int64_t saved = plan_memory(whole, storage).bytes[int(MemCategory::Activations)] -
                        plan_memory(cfg, storage).bytes[int(MemCategory::Activations)];
  const int64_t N = 2 * 16, C = 32, F = 88, r = 4, L = 3;
  // each layer but the last: n1 as 3 x r columns, n2 as 2 x r, act as r; one whole set shared
  CHECK(saved == (L - 1) * N * ((C - 3 * r) + (C - 2 * r) + (F - r)) * 2);
  // inputs whose readers' columns together are not fewer than the width stay whole
  RunConfig wide = cfg;
  wide.optimizer.projection.rank = 11;  // n1: 33 columns of 32; n2: 22; act: 11
  const ModelMemoryOptions memory = model_memory_options(wide, storage);
  CHECK(inputs_kept_as_columns(wide.model, memory) == std::array<bool, 3>{false, true, true});
  RunConfig layer = cfg;
  layer.activation_checkpointing = Checkpointing::Elementwise;
  CHECK(inputs_kept_as_columns(layer.model, model_memory_options(layer, storage)) ==
        std::array<bool, 3>{});
}

TEST_CASE("fused per-layer updates give the same weights as the unfused step", "[memory]") {
  for (const std::string optimizer : {"adamw", "grass"})
    for (const std::string precision : {"fp32", "bf16-mixed", "bf16"})
      for (const bool tied : {false, true})
        for (const double clip : {0.0, 1e6}) {  // clipping off, and on but never reached
          INFO(optimizer << " " << precision << (tied ? " tied" : " untied") << " clip " << clip);
          RunConfig unfused = small_run(optimizer, precision);
          unfused.model.tie_word_embeddings = tied;
          unfused.grad_clip = clip;
          unfused.fused_update = Switch::Off;
          RunConfig fused = unfused;
          fused.fused_update = Switch::On;
          fused.activation_checkpointing = Checkpointing::Layer;  // and both memory features together
          const RunRecord a = train(unfused, 5), b = train(fused, 5);
          CHECK(a.losses == b.losses);
          for (size_t i = 0; i < a.norms.size(); i++)  // summed per tensor: another order
            CHECK(b.norms[i] == Approx(a.norms[i]).epsilon(1e-12));
          require_same_state(a, b);
          CHECK(b.clipped == std::vector<int>(5, 0));
        }
}

TEST_CASE("GaLore and FLORA: fused and checkpointed steps give the plain step's bits", "[memory]") {
  // Fewer combinations than above: the strategies are shared; what is new is the optimizers'
  // refreshes (an SVD at steps 0 and 3, a FLORA resampling at step 2) under both strategies.
  for (const Checkpointing mode : {Checkpointing::Elementwise, Checkpointing::Layer})
  for (const std::string optimizer : {"galore", "flora"})
    for (const std::string precision : {"fp32", "bf16"}) {
      INFO(name_of(mode) << " " << optimizer << " " << precision);
      RunConfig unfused = small_run(optimizer, precision);
      unfused.fused_update = Switch::Off;
      RunConfig fused = unfused;
      fused.fused_update = Switch::On;
      fused.activation_checkpointing = mode;
      const RunRecord a = train(unfused, 5), b = train(fused, 5);
      CHECK(a.losses == b.losses);
      for (size_t i = 0; i < a.norms.size(); i++)
        CHECK(b.norms[i] == Approx(a.norms[i]).epsilon(1e-12));
      require_same_state(a, b);
      CHECK(a.losses.back() < a.losses.front());  // it trained
    }
}

TEST_CASE("pure bf16 with one micro-batch fuses its updates by default", "[memory]") {
  const RunConfig cfg = small_run("grass", "bf16");
  CHECK(model_memory_options(cfg, storage_for(PrecisionChoice::Bf16, false)).fused_update);
  CHECK(model_memory_options(cfg, storage_for(PrecisionChoice::Bf16, true)).fused_update);
  CHECK_FALSE(model_memory_options(cfg, storage_for(PrecisionChoice::Bf16Mixed, true)).fused_update);
  RunConfig accumulating = cfg;
  accumulating.total_batch_size = 2 * cfg.micro_batch_size;
  CHECK_FALSE(model_memory_options(accumulating, storage_for(PrecisionChoice::Bf16, true)).fused_update);
  // ... and so no gradient buffer for the whole model exists: one tensor's, and one G_C
  const Storage storage = storage_for(PrecisionChoice::Bf16, true);
  const std::unique_ptr<Backend> sizes = make_planning_backend(storage);
  Arena fused(true), unfused(true);
  const TrainingState probe = build_training_state(cfg, fused, *sizes);
  RunConfig off = cfg;
  off.fused_update = Switch::Off;
  build_training_state(off, unfused, *sizes);
  int64_t largest_dense = 0, largest_gc = 0;
  for (const ParamTensor& t : probe.model->tensors())
    if (t.dense()) largest_dense = std::max(largest_dense, t.numel);
  for (const auto& t : probe.optimizers->find<Grass>()->targets())
    largest_gc = std::max(largest_gc, t.gc_numel);
  CHECK(fused.bytes(MemCategory::Gradients) == 2 * largest_dense);
  CHECK(fused.bytes(MemCategory::CompressedGradients) == 2 * largest_gc);
  CHECK(unfused.bytes(MemCategory::Gradients) == 2 * probe.model->num_dense_grads());
}

TEST_CASE("fused updates clip each tensor's gradient on its own", "[memory]") {
  // The per-tensor norms of step 1's gradient, from an unfused fp32 run that stops after the
  // backward; a max norm between the smallest and the largest clips exactly those above it.
  RunConfig cfg = small_run("grass", "fp32");
  cfg.fused_update = Switch::Off;
  const Storage storage = storage_for(PrecisionChoice::F32, false);
  const std::unique_ptr<Backend> backend = make_cpu_backend(storage);
  Arena arena(false, *backend);
  TrainingState s = build_training_state(cfg, arena, *backend);
  s.model->init_weights(3);
  const test::NgramBatches data;
  std::vector<int32_t> in, tg;
  data.batch(0, cfg.micro_batch_size, cfg.seq_len, in, tg);
  s.step->begin(0, cfg.optimizer.lr);
  s.model->forward(in.data(), tg.data(), cfg.micro_batch_size);
  s.model->backward(1.0);
  const auto& deferred = dynamic_cast<const DeferredStep&>(*s.step);
  std::vector<double> norms;
  for (const ParamTensor& t : s.model->tensors())
    if (t.dense()) norms.push_back(std::sqrt(ops::sum_squares(test::cpu_grad(*s.model, t), t.numel)));
  for (const auto& t : s.optimizers->find<Grass>()->targets())
    norms.push_back(std::sqrt(ops::sum_squares(
        static_cast<const float*>(deferred.projected_gradient(t.tensor_index)), t.gc_numel)));
  std::vector<double> sorted = norms;
  std::sort(sorted.begin(), sorted.end());
  const double max_norm = 0.5 * (sorted[sorted.size() / 2] + sorted[sorted.size() / 2 + 1]);
  const int above = int(std::count_if(norms.begin(), norms.end(), [&](double n) { return n > max_norm; }));
  REQUIRE(above > 0);
  REQUIRE(above < int(norms.size()));

  RunConfig fused = small_run("grass", "fp32");
  fused.fused_update = Switch::On;
  fused.grad_clip = max_norm;
  const RunRecord clipped = train(fused, 1);
  CHECK(clipped.clipped[0] == above);
  double global = 0;
  for (double n : norms) global += n * n;
  CHECK(clipped.norms[0] == Approx(std::sqrt(global)).epsilon(1e-9));  // the unclipped norm
  // the step's clipping coefficient is the most clipped tensor's: the largest norm's
  const double largest = *std::max_element(norms.begin(), norms.end());
  CHECK(clipped.clip_coefs[0] == Approx(clip_coefficient(largest, max_norm)).epsilon(1e-9));
  CHECK(clipped.clip_coefs[0] < 1.0);
}

TEST_CASE("a step reports the clipping coefficient its gradients were multiplied by", "[memory]") {
  for (const bool fused : {false, true}) {
    CAPTURE(fused);
    RunConfig cfg = small_run("grass", "fp32");
    cfg.fused_update = fused ? Switch::On : Switch::Off;
    const RunRecord off = train(cfg, 3);  // grad_clip 0: never clipped
    CHECK(off.clip_coefs == std::vector<double>(3, 1.0));
    cfg.grad_clip = 1e6;  // far above every norm
    CHECK(train(cfg, 3).clip_coefs == std::vector<double>(3, 1.0));
    cfg.grad_clip = 0.5 * off.norms[0];  // the first step's global norm is clipped in half
    const RunRecord half = train(cfg, 1);
    REQUIRE(half.norms[0] == off.norms[0]);  // the same unclipped gradients
    if (fused) {  // each tensor's own coefficient, all at least the global one, some below 1
      CHECK(half.clip_coefs[0] < 1.0);
      CHECK(half.clip_coefs[0] >= clip_coefficient(half.norms[0], cfg.grad_clip));
    } else {
      CHECK(half.clip_coefs[0] == Approx(clip_coefficient(half.norms[0], cfg.grad_clip)).epsilon(1e-12));
      CHECK(half.clip_coefs[0] == Approx(0.5).epsilon(1e-5));
    }
  }
}

TEST_CASE("adamw's target_lr_scale moves the default targets at lr x scale, the rest at lr, and "
          "weight decay stays lr x wd, as GRASS's and GaLore's targets decay",
          "[optim]") {
  // One step from the same weights and batch: Adam's step is lr times a direction that does not
  // depend on lr, and the decoupled decay multiplies w by 1 - lr·wd first, so a target's change
  // beyond its decay scales by exactly the factor (to fp32 rounding of the update) and every
  // other tensor's change is identical. A weight decay of 5 makes the decay as large as the step
  // (lr·wd·|w| against lr·scale), so a decay that followed the scale would fail the bound.
  for (const double wd : {0.0, 5.0}) {
    INFO("weight_decay " << wd);
    RunConfig cfg = small_run("adamw", "fp32");
    cfg.optimizer.weight_decay = wd;
    RunConfig scaled = cfg;
    scaled.optimizer.target_lr_scale = 0.25;
    const test::NgramBatches data;
    std::vector<std::vector<float>> before, after[2];
    const RunConfig* cfgs[2] = {&cfg, &scaled};
    for (int k = 0; k < 2; k++) {
      const std::unique_ptr<Backend> backend = make_cpu_backend(storage_for(PrecisionChoice::F32, false));
      Arena arena(false, *backend);
      TrainingState s = build_training_state(*cfgs[k], arena, *backend);
      s.model->init_weights(3);
      if (k == 0)
        for (const ParamTensor& t : s.model->tensors()) before.push_back(s.model->read_tensor(t));
      train_step(s, *cfgs[k], 0, cfgs[k]->optimizer.lr, [&](int32_t* in, int32_t* tg) {
        std::vector<int32_t> i, t;
        data.batch(0, cfgs[k]->micro_batch_size, cfgs[k]->seq_len, i, t);
        std::copy(i.begin(), i.end(), in);
        std::copy(t.begin(), t.end(), tg);
      });
      for (const ParamTensor& t : s.model->tensors()) after[k].push_back(s.model->read_tensor(t));
    }
    const std::unique_ptr<Backend> probe_backend = make_cpu_backend(storage_for(PrecisionChoice::F32, false));
    Arena probe_arena(true, *probe_backend);
    const LlamaModel probe(cfg.model, probe_arena, 1, cfg.seq_len, {}, *probe_backend);
    const std::vector<std::string> targets =
        projection_tensor_names(cfg.model.num_hidden_layers, ProjectionConfig{}.targets);
    const double decay = 1.0 - cfg.optimizer.lr * wd;
    int scaled_tensors = 0;
    for (size_t i = 0; i < before.size(); i++) {
      const std::string& name = probe.tensors()[i].name;
      const bool target = std::find(targets.begin(), targets.end(), name) != targets.end();
      scaled_tensors += target;
      INFO(name << (target ? " (target)" : ""));
      double worst = 0;
      for (size_t j = 0; j < before[i].size(); j++) {
        const double decayed = decay * before[i][j];
        const double d1 = after[0][i][j] - decayed, d2 = after[1][i][j] - decayed;
        if (!target) {
          REQUIRE(after[1][i][j] == after[0][i][j]);
          continue;
        }
        REQUIRE(d1 != 0);
        // both changes are differences of fp32 weights near w: each off by up to an ulp of w
        worst = std::max(worst, std::abs(d2 - 0.25 * d1) / (std::abs(d1) + 4e-7 * std::abs(before[i][j])));
      }
      CHECK(worst < 0.05);
    }
    CHECK(scaled_tensors == 7 * cfg.model.num_hidden_layers);
  }
}
