// GRASS against its specification (docs/grass.md): compressed gradients equal ρ times the
// selected slices of the dense gradient, only selected slices move, the selection rules, the
// refresh, the identity with dense AdamW at full rank, and micro-batch accumulation.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

#include "kernels/ops.h"
#include "src/core/arena.h"
#include "src/core/rng.h"
#include "src/model/llama.h"
#include "src/optim/adamw.h"
#include "src/optim/clip.h"
#include "src/optim/grass.h"
#include "src/optim/grass_selection.h"
#include "src/optim/step.h"
#include "tests/named_choice.h"
#include "tests/test_util.h"

using namespace grass;

namespace {

const std::vector<std::string> kAllTargets = {"q", "k", "v", "o", "gate", "up", "down"};

ModelConfig small_config() {
  ModelConfig c;
  c.hidden_size = 16;
  c.intermediate_size = 22;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.num_hidden_layers = 2;
  c.vocab_size = 40;
  c.max_position_embeddings = 32;
  c.rms_norm_eps = 1e-5;
  c.initializer_range = 0.2;
  return c;
}

OptimizerConfig grass_config(int rank, const std::string& selection, const std::string& dim,
                             int64_t interval) {
  OptimizerConfig o;
  o.kind = OptimizerKind::Grass;
  o.lr = 1e-2;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.weight_decay = 0.0;
  o.projection.rank = rank;
  o.projection.selection = test::named<Selection>(selection);
  o.projection.select_dim = test::named<SelectDim>(dim);
  o.projection.update_interval = interval;
  o.projection.scale = 1.0;
  o.projection.seed = 9;
  return o;
}

std::vector<int32_t> tokens(size_t n, int vocab, uint64_t seed) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; i++) t[i] = int32_t(uniform_open01(seed, i) * vocab);
  return t;
}

// A model with its optimizers: dense AdamW for everything (grass == nullptr), or GRASS targets;
// deferred steps without clipping.
struct Rig {
  Arena arena;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<OptimizerSet> optimizers;
  Grass* grass = nullptr;
  std::unique_ptr<DeferredStep> step;
  OptimizerConfig opt;
  int T;

  Rig(const ModelConfig& cfg, const OptimizerConfig& o, int max_batch, int T_, bool use_grass,
      int64_t refresh_chunk_bytes = Grass::kRefreshChunkBytes)
      : opt(o), T(T_) {
    const auto names = use_grass ? projection_tensor_names(cfg.num_hidden_layers, o.projection.targets)
                                 : std::vector<std::string>{};
    model = std::make_unique<LlamaModel>(cfg, arena, max_batch, T, names);
    model->init_weights(5);
    optimizers = std::make_unique<OptimizerSet>(model->tensors().size());
    optimizers->add(std::make_unique<AdamW>(o, *model, arena, 5));
    if (use_grass) {
      auto g = std::make_unique<Grass>(o, *model, int64_t(max_batch) * T, arena, refresh_chunk_bytes);
      grass = g.get();
      optimizers->add(std::move(g));
    }
    step = std::make_unique<DeferredStep>(*model, *optimizers, /*max_norm=*/0.0, arena);
    model->set_gradient_sink(step.get());
  }
  // forward + backward of `micro` micro-batches of B/micro sequences each (no update)
  double gradients(int64_t step_index, const std::vector<int32_t>& in,
                   const std::vector<int32_t>& tg, int B, int micro = 1) {
    step->begin(step_index, opt.lr);
    double loss = 0;
    const int b = B / micro;
    for (int k = 0; k < micro; k++) {
      loss += model->forward(in.data() + size_t(k) * b * T, tg.data() + size_t(k) * b * T, b) / micro;
      model->backward(1.0 / micro);
    }
    return loss;
  }
  void update() { step->finish(); }
  // target t's G_C as the step accumulated it
  const float* gc(const Grass::Target& t) const {
    return static_cast<const float*>(step->projected_gradient(t.tensor_index));
  }
  std::vector<float> weights(const std::string& name) {
    const ParamTensor& t = model->tensor(name);
    return {test::params(*model) + t.offset, test::params(*model) + t.offset + t.numel};
  }
};

double rel_err(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// ρ-scaled selected rows (gc[slices, in]) or columns (gc[out, slices]) of a dense gradient
// g[out, in]
std::vector<float> expected_gc(const float* g, const Grass::Target& t) {
  const int r = t.slices;
  std::vector<float> gc(t.gc_numel);
  for (int j = 0; j < r; j++)
    if (t.rows)
      for (int c = 0; c < t.in; c++) gc[size_t(j) * t.in + c] = t.rho[j] * g[int64_t(t.sigma[j]) * t.in + c];
    else
      for (int i = 0; i < t.out; i++) gc[size_t(i) * r + j] = t.rho[j] * g[int64_t(i) * t.in + t.sigma[j]];
  return gc;
}

}  // namespace

TEST_CASE("G_C equals rho times the selected slices of the dense gradient", "[grass]") {
  const ModelConfig cfg = small_config();
  const int B = 2, T = 8, r = 3;
  const auto in = tokens(B * T, 40, 1), tg = tokens(B * T, 40, 2);
  for (const std::string dim : {"rows", "cols"}) {
    DYNAMIC_SECTION("select_dim " << dim) {
      // multinomial: ρ ≠ 1 and possible repeats exercise the scaling and the gather
      const OptimizerConfig o = grass_config(r, "multinomial", dim, 10);
      Rig dense(cfg, o, B, T, false), sparse(cfg, o, B, T, true);
      sparse.gradients(0, in, tg, B);  // step 0 selects (from the full gradient)
      sparse.gradients(1, in, tg, B);  // step 1 forms G_C from the activations alone
      dense.gradients(1, in, tg, B);
      REQUIRE(sparse.grass->targets().size() == 7 * size_t(cfg.num_hidden_layers));
      for (const auto& t : sparse.grass->targets()) {
        const ParamTensor& p = dense.model->tensors()[t.tensor_index];
        INFO(p.name);
        CHECK(t.rows == (dim == std::string("rows")));
        const auto want = expected_gc(test::cpu_grad(*dense.model, p), t);
        CHECK(rel_err(sparse.gc(t), want.data(), t.gc_numel) < 1e-5);
      }
    }
  }
}

TEST_CASE("a GRASS step changes only the selected rows or columns", "[grass]") {
  const ModelConfig cfg = small_config();
  const int B = 2, T = 8, r = 2;
  const auto in = tokens(B * T, 40, 3), tg = tokens(B * T, 40, 4);
  for (const std::string dim : {"rows", "cols"}) {
    DYNAMIC_SECTION("select_dim " << dim) {
      OptimizerConfig o = grass_config(r, "top_r", dim, 10);
      o.weight_decay = 0.1;  // decay, too, touches only the selected slices
      Rig rig(cfg, o, B, T, true);
      std::map<std::string, std::vector<float>> before;
      for (const auto& t : rig.grass->targets())
        before[rig.model->tensors()[t.tensor_index].name] =
            rig.weights(rig.model->tensors()[t.tensor_index].name);
      rig.gradients(0, in, tg, B);
      rig.update();
      for (const auto& t : rig.grass->targets()) {
        const std::string& name = rig.model->tensors()[t.tensor_index].name;
        const auto after = rig.weights(name);
        const std::vector<int32_t> sel(t.sigma, t.sigma + r);
        int changed_slices = 0;
        for (int i = 0; i < t.out; i++)
          for (int c = 0; c < t.in; c++) {
            const bool selected = std::count(sel.begin(), sel.end(), t.rows ? i : c) > 0;
            const bool changed = after[size_t(i) * t.in + c] != before[name][size_t(i) * t.in + c];
            if (!selected) REQUIRE_FALSE(changed);
            changed_slices += changed;
          }
        INFO(name);
        CHECK(changed_slices == r * (t.rows ? t.in : t.out));  // every selected element moved
      }
    }
  }
}

TEST_CASE("top_r selects the largest-norm rows of the true gradient", "[grass]") {
  const ModelConfig cfg = small_config();
  const int B = 2, T = 8, r = 5;
  const auto in = tokens(B * T, 40, 5), tg = tokens(B * T, 40, 6);
  const OptimizerConfig o = grass_config(r, "top_r", "rows", 10);
  Rig dense(cfg, o, B, T, false), sparse(cfg, o, B, T, true);
  dense.gradients(0, in, tg, B);
  sparse.gradients(0, in, tg, B);
  for (const auto& t : sparse.grass->targets()) {
    const float* g =
        test::cpu_grad(*dense.model, dense.model->tensors()[t.tensor_index]);
    std::vector<double> norms(t.out, 0.0);
    for (int i = 0; i < t.out; i++)
      for (int c = 0; c < t.in; c++) norms[i] += double(g[int64_t(i) * t.in + c]) * g[int64_t(i) * t.in + c];
    std::vector<int32_t> order(t.out);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return norms[a] > norms[b]; });
    std::vector<int32_t> want(order.begin(), order.begin() + r), got(t.sigma, t.sigma + r);
    std::sort(want.begin(), want.end());
    CHECK(got == want);
    for (int j = 0; j < r; j++) CHECK(t.rho[j] == 1.0f);
  }
}

TEST_CASE("multinomial draws follow q and the estimator is unbiased", "[grass][selection]") {
  // Slice norms² n_i, q_i = n_i / Σn (one zero-norm slice, which must never be drawn).
  const std::vector<double> norms_sq = {4.0, 1.0, 0.0, 2.0, 8.0, 0.5, 3.5, 1.0};
  const double total = std::accumulate(norms_sq.begin(), norms_sq.end(), 0.0);
  const int m = int(norms_sq.size()), r = 3, trials = 20000;
  std::vector<double> count(m, 0.0), weight(m, 0.0);  // draws, and Σ ρ_j² per slice
  for (int s = 0; s < trials; s++) {
    const SliceSelection sel = select_slices(test::named<Selection>("multinomial"), norms_sq, r, uint64_t(1000 + s));
    for (int j = 0; j < r; j++) {
      count[sel.sigma[j]] += 1;
      weight[sel.sigma[j]] += double(sel.rho[j]) * sel.rho[j];
    }
  }
  // Pearson chi-square over the 7 non-zero slices (6 degrees of freedom): the 99.9% quantile
  // is 22.46, so a correct sampler fails this with probability 0.1% (and the seeds are fixed).
  double chi2 = 0;
  for (int i = 0; i < m; i++) {
    const double expected = double(trials) * r * norms_sq[i] / total;
    if (expected == 0) {
      CHECK(count[i] == 0);
      continue;
    }
    chi2 += (count[i] - expected) * (count[i] - expected) / expected;
  }
  CHECK(chi2 < 22.46);
  // Unbiased: E[Σ_j ρ_j² 1(σ_j = i)] = r q_i / (r q_i) = 1 for every slice with q_i > 0, i.e.
  // E[P Pᵀ] = I. The mean over 20000 trials has a standard error below 0.03 for these q; allow 5
  // standard errors.
  for (int i = 0; i < m; i++) {
    if (norms_sq[i] == 0) continue;
    const double q = norms_sq[i] / total;
    const double stderr_ = std::sqrt((1.0 / (r * q) - 1.0 / r) / trials * r);
    INFO("slice " << i << " mean weight " << weight[i] / trials << " stderr " << stderr_);
    CHECK(std::abs(weight[i] / trials - 1.0) < 5 * stderr_ + 1e-3);
  }
}

TEST_CASE("selection methods give r sorted slices with their scales and the same draw per seed", "[grass][selection]") {
  std::vector<double> norms_sq(50);
  for (int i = 0; i < 50; i++) norms_sq[i] = 1.0 + (i % 7);
  const int r = 10;
  for (const std::string method : {"top_r", "multinomial", "multinomial_nr", "uniform", "uniform_nr"}) {
    INFO(method);
    const SliceSelection a = select_slices(test::named<Selection>(method), norms_sq, r, 77);
    const SliceSelection b = select_slices(test::named<Selection>(method), norms_sq, r, 77);
    REQUIRE(a.sigma.size() == size_t(r));
    CHECK(a.sigma == b.sigma);  // same seed, same selection (every rank agrees)
    CHECK(std::is_sorted(a.sigma.begin(), a.sigma.end()));
    const bool distinct = std::adjacent_find(a.sigma.begin(), a.sigma.end()) == a.sigma.end();
    if (method == "top_r" || method.ends_with("_nr")) CHECK(distinct);
    if (method == "top_r" || method == "multinomial_nr")
      for (float rho : a.rho) CHECK(rho == 1.0f);
    if (method.starts_with("uniform"))  // E[P·Pᵀ] = I: r/m inclusion, ρ² = m/r
      for (float rho : a.rho) CHECK(rho == Approx(std::sqrt(50.0 / r)));
  }
  // all-zero norms: the multinomial methods fall back to uniform ones
  const SliceSelection z = select_slices(test::named<Selection>("multinomial"), std::vector<double>(50, 0.0), r, 3);
  for (float rho : z.rho) CHECK(rho == Approx(std::sqrt(50.0 / r)));
}

TEST_CASE("a refresh re-selects, and its first update resets the moments and the step counter", "[grass]") {
  const ModelConfig cfg = small_config();
  const int B = 2, T = 8, r = 2;
  const auto in = tokens(B * T, 40, 7), tg = tokens(B * T, 40, 8);
  Rig rig(cfg, grass_config(r, "uniform_nr", "rows", 2), B, T, true);
  for (int64_t step = 0; step < 2; step++) {
    rig.gradients(step, in, tg, B);
    rig.update();
  }
  const auto& t = rig.grass->targets()[0];
  CHECK(t.adam_step == 2);
  const std::vector<int32_t> old_sigma(t.sigma, t.sigma + r);
  double moment_mass = 0;
  const float *m = static_cast<const float*>(t.m), *v = static_cast<const float*>(t.v);
  for (int64_t i = 0; i < t.gc_numel; i++) moment_mass += std::abs(m[i]) + v[i];
  CHECK(moment_mass > 0);
  rig.gradients(2, in, tg, B);  // step 2 is a refresh: the backward re-selects
  CHECK(t.adam_step == 0);
  CHECK(std::vector<int32_t>(t.sigma, t.sigma + r) != old_sigma);  // uniform_nr, a new seed
  const std::vector<float> g(rig.gc(t), rig.gc(t) + t.gc_numel);  // the update may overwrite it
  rig.update();  // its first update starts from zero moments: one Adam step's, from G_C alone
  CHECK(t.adam_step == 1);
  const double b1 = rig.opt.beta1, b2 = rig.opt.beta2;
  double g_mass = 0;
  for (int64_t i = 0; i < t.gc_numel; i++) {
    g_mass += std::abs(g[size_t(i)]);
    REQUIRE(m[i] == Approx((1 - b1) * g[size_t(i)]).epsilon(1e-6).margin(1e-30));
    REQUIRE(v[i] == Approx((1 - b2) * g[size_t(i)] * g[size_t(i)]).epsilon(1e-6).margin(1e-30));
  }
  CHECK(g_mass > 0);
}

TEST_CASE("at full rank GRASS reproduces dense AdamW step for step", "[grass]") {
  const ModelConfig cfg = small_config();
  const int B = 2, T = 8;
  for (const std::string dim : {"rows", "cols"}) {
    DYNAMIC_SECTION("select_dim " << dim) {
      // rank = the selectable side of every target: 16 rows or 16 columns of each projection
      OptimizerConfig o = grass_config(16, "top_r", dim, 1000);
      o.projection.targets = dim == std::string("rows") ? test::named_targets({"q", "o", "down"})
                                                  : test::named_targets({"q", "o", "gate", "up"});
      o.weight_decay = 0.05;
      Rig dense(cfg, o, B, T, false), sparse(cfg, o, B, T, true);
      for (int64_t step = 0; step < 4; step++) {
        const auto in = tokens(B * T, 40, 100 + step), tg = tokens(B * T, 40, 200 + step);
        const double ld = dense.gradients(step, in, tg, B);
        const double ls = sparse.gradients(step, in, tg, B);
        CHECK(ls == Approx(ld).epsilon(1e-6));
        dense.update();
        sparse.update();
      }
      // Not the same bits: with gate and up dense the backward runs them as one stacked GEMM
      // (LlamaModel::gate_up_backward), projected as two, so the sums are reordered, and Adam moves
      // an element whose gradient nearly cancels by lr-sized amounts on last-bit differences
      // (measured 9.2e-6 after 4 steps over OpenBLAS's Haswell kernels, as the pad test's bound)
      for (const ParamTensor& p : dense.model->tensors()) {
        INFO(p.name);
        CHECK(rel_err(test::params(*sparse.model) + p.offset, test::params(*dense.model) + p.offset,
                      p.numel) < 1e-4);
      }
    }
  }
}

TEST_CASE("4 accumulated micro-batches equal one concatenated batch between refreshes", "[grass]") {
  const ModelConfig cfg = small_config();
  const int B = 4, T = 8, r = 3;
  const OptimizerConfig o = grass_config(r, "multinomial", "rows", 10);
  Rig whole(cfg, o, B, T, true), micro(cfg, o, B, T, true);
  const auto in0 = tokens(B * T, 40, 11), tg0 = tokens(B * T, 40, 12);
  whole.gradients(0, in0, tg0, B);  // step 0 (a refresh): the same batch and selection for both
  micro.gradients(0, in0, tg0, B);
  whole.update();
  micro.update();
  const auto in1 = tokens(B * T, 40, 13), tg1 = tokens(B * T, 40, 14);
  whole.gradients(1, in1, tg1, B);
  micro.gradients(1, in1, tg1, B, 4);
  for (size_t k = 0; k < whole.grass->targets().size(); k++) {
    const auto& a = micro.grass->targets()[k];
    const auto& b = whole.grass->targets()[k];
    CHECK(rel_err(micro.gc(a), whole.gc(b), a.gc_numel) < 1e-5);
  }
  whole.update();
  micro.update();
  for (const ParamTensor& p : whole.model->tensors()) {
    INFO(p.name);
    CHECK(rel_err(test::params(*micro.model) + p.offset, test::params(*whole.model) + p.offset, p.numel) < 1e-5);
  }
}

TEST_CASE("each rule's bias under SGD: E[P Pt] = I for multinomial, uniform and uniform_nr",
          "[grass][selection]") {
  // E[Σ_j ρ_j² 1(σ_j = i)], the diagonal of E[P·Pᵀ], per slice over 20,000 draws of r = 4 of 10
  // slices: 1 for every slice for the unbiased rules, within 5 standard errors (the largest is
  // multinomial's on its smallest slice, q = 0.5/28.5: sqrt((1-q)/(r·q·trials)) = 0.027);
  // top_r and multinomial_nr leave some slice far from 1.
  const std::vector<double> norms_sq = {4.0, 1.0, 0.5, 2.0, 8.0, 0.5, 3.5, 1.0, 2.0, 6.0};
  const int m = int(norms_sq.size()), r = 4, trials = 20000;
  for (const std::string rule : {"top_r", "multinomial", "multinomial_nr", "uniform", "uniform_nr"}) {
    INFO(rule);
    std::vector<double> weight(m, 0.0);
    for (int s = 0; s < trials; s++) {
      const SliceSelection sel =
          select_slices(test::named<Selection>(rule), norms_sq, r, uint64_t(50 + s));
      for (int j = 0; j < r; j++) weight[sel.sigma[j]] += double(sel.rho[j]) * sel.rho[j];
    }
    double worst = 0;
    for (int i = 0; i < m; i++) worst = std::max(worst, std::abs(weight[i] / trials - 1.0));
    INFO("largest deviation of a slice's mean weight from 1: " << worst);
    const bool unbiased = rule == "multinomial" || rule.starts_with("uniform");
    if (unbiased) CHECK(worst < 5 * 0.027);
    else CHECK(worst > 0.5);  // top_r: 0 or 1 per slice; multinomial_nr: inclusion probabilities
  }
}

TEST_CASE("each rule's step size: the learning rate's without rho_in_update, times rho with it",
          "[grass]") {
  // Adam's first step is Δ = g / (|g| + ε) ≈ ±1 on every selected element, so the mean |ΔW| over
  // a target's drawn slices, over lr·α, is the step factor a rule trains at: 1 without
  // rho_in_update for every rule (repeats count once per draw), the mean ρ of the draws with it
  // (sqrt(m/r) for the uniform rules: up to 2.3 times top_r's step on these 22-row weights).
  const ModelConfig cfg = small_config();
  const int B = 2, T = 8, r = 4;
  const auto in = tokens(B * T, 40, 21), tg = tokens(B * T, 40, 22);
  for (const std::string rule : {"top_r", "multinomial", "multinomial_nr", "uniform", "uniform_nr"})
    for (const bool rho_in_update : {false, true}) {
      INFO(rule << (rho_in_update ? " with" : " without") << " rho_in_update");
      OptimizerConfig o = grass_config(r, rule, "rows", 10);
      o.eps = 1e-20;  // Δ = ±1 up to fp32 rounding
      o.projection.rho_in_update = rho_in_update;
      Rig rig(cfg, o, B, T, true);
      std::vector<std::vector<float>> before;
      for (const auto& t : rig.grass->targets()) before.push_back(rig.weights(rig.model->tensors()[t.tensor_index].name));
      rig.gradients(0, in, tg, B);
      rig.update();
      double measured = 0, expected = 0, uniform_rho = 0;  // the last: Σ sqrt(m/r) over targets
      size_t k = 0;
      for (const auto& t : rig.grass->targets()) {
        const std::vector<float> after = rig.weights(rig.model->tensors()[t.tensor_index].name);
        double moved = 0;
        for (size_t e = 0; e < after.size(); e++) moved += std::abs(double(after[e]) - before[k][e]);
        measured += moved / (o.lr * o.projection.scale * r * t.in);
        double rho_mean = 0;  // over the r draws
        for (int j = 0; j < t.slices; j++) rho_mean += t.count[j] * double(t.rho[j]) / r;
        expected += rho_in_update ? rho_mean : 1.0;
        uniform_rho += std::sqrt(double(t.out) / r);  // rows: m = out (8, 16 or 22 here)
        k++;
      }
      const double targets = double(rig.grass->targets().size());
      CHECK(measured / targets == Approx(expected / targets).epsilon(1e-3));
      if (rho_in_update && rule.starts_with("uniform"))  // ρ = sqrt(m/r): 1.4 to 2.3 here
        CHECK(measured / targets == Approx(uniform_rho / targets).epsilon(1e-3));
    }
}

TEST_CASE("a slice drawn c times steps c times as far (the paper's with-replacement estimator)",
          "[grass]") {
  // With replacement, a slice drawn c times is c identical rows of P: its update is c times one
  // draw's (stored once, stepped with its count). Adam's first step is ±1 per element (ε tiny),
  // so each stored row moves lr·α·c per element, whatever ρ (without rho_in_update).
  const ModelConfig cfg = small_config();
  const int B = 2, T = 8, r = 4;
  const auto in = tokens(B * T, 40, 21), tg = tokens(B * T, 40, 22);
  for (const std::string rule : {"multinomial", "uniform"}) {
    INFO(rule);
    OptimizerConfig o = grass_config(r, rule, "rows", 10);
    o.eps = 1e-20;
    Rig rig(cfg, o, B, T, true);
    std::vector<std::vector<float>> before;
    for (const auto& t : rig.grass->targets())
      before.push_back(rig.weights(rig.model->tensors()[t.tensor_index].name));
    rig.gradients(0, in, tg, B);
    rig.update();
    int repeated = 0;
    size_t k = 0;
    for (const auto& t : rig.grass->targets()) {
      const std::vector<float> after = rig.weights(rig.model->tensors()[t.tensor_index].name);
      for (int j = 0; j < t.slices; j++) {
        INFO("target " << t.tensor_index << ", slice " << t.sigma[j] << " drawn " << t.count[j] << " times");
        double moved = 0;
        for (int c = 0; c < t.in; c++) {
          const size_t e = size_t(t.sigma[j]) * size_t(t.in) + size_t(c);
          moved += std::abs(double(after[e]) - before[k][e]);
        }
        CHECK(moved / (o.lr * o.projection.scale * t.in) == Approx(double(t.count[j])).epsilon(1e-3));
        repeated += t.count[j] > 1;
      }
      k++;
    }
    CHECK(repeated > 0);  // some slice was drawn more than once, so the check above can fail
  }
}

TEST_CASE("repeated draws trained once with their count equal the draws trained apart",
          "[grass][selection]") {
  // A selection with repeats, applied to the same G rows both ways: every draw a slice of its
  // own (what the engine stored before merging), and the merged slices with count·ρ.
  const int out = 12, in = 7, r = 6;
  std::vector<double> g(size_t(out) * in);
  for (size_t i = 0; i < g.size(); i++) g[i] = normal(31, i);
  SliceSelection drawn;
  drawn.sigma = {1, 4, 4, 4, 9, 9};
  for (int32_t s : drawn.sigma) drawn.rho.push_back(0.5f + 0.1f * float(s));
  drawn.count.assign(r, 1);
  const SliceSelection merged = compact_slices(drawn);
  REQUIRE(merged.sigma == std::vector<int32_t>{1, 4, 9});
  REQUIRE(merged.count == std::vector<int32_t>{1, 3, 2});
  for (const bool rho_in_update : {false, true}) {
    INFO((rho_in_update ? "with" : "without") << " rho_in_update");
    std::vector<double> w_apart(g.size()), w_merged;
    for (size_t i = 0; i < g.size(); i++) w_apart[i] = normal(32, i);
    w_merged = w_apart;
    const AdamArgs a{.lr = 0.01, .beta2 = 0.95, .weight_decay = 0.1, .step = 1};
    const auto run = [&](const SliceSelection& s, std::vector<double>& w) {
      const int n = int(s.sigma.size());
      std::vector<double> gc(size_t(n) * in), m(gc.size(), 0.0), v(gc.size(), 0.0);
      std::vector<double> scale(static_cast<size_t>(n));
      for (int j = 0; j < n; j++) {
        for (int c = 0; c < in; c++) gc[size_t(j) * in + c] = s.rho[j] * g[size_t(s.sigma[j]) * in + c];
        scale[j] = s.count[j] * (rho_in_update ? double(s.rho[j]) : 1.0);
      }
      ops::grass_adam_update(w.data(), gc.data(), m.data(), v.data(), s.sigma.data(), scale.data(),
                             out, in, n, true, 0.25, a);
      return m;
    };
    const std::vector<double> m_apart = run(drawn, w_apart), m_merged = run(merged, w_merged);
    for (size_t i = 0; i < w_apart.size(); i++) CHECK(w_merged[i] == Approx(w_apart[i]).epsilon(1e-12));
    for (int c = 0; c < in; c++)  // slice 4's moments: stored 3 times apart, once merged
      CHECK(m_merged[size_t(1) * in + c] == m_apart[size_t(2) * in + c]);
  }
}

TEST_CASE("a refresh's slice norms from row chunks select as the whole gradient does", "[grass]") {
  const ModelConfig cfg = small_config();
  const int B = 2, T = 8, r = 5;
  const auto in = tokens(B * T, 40, 23), tg = tokens(B * T, 40, 24);
  for (const std::string dim : {"rows", "cols"}) {
    DYNAMIC_SECTION("select_dim " << dim) {
      const OptimizerConfig o = grass_config(r, "top_r", dim, 10);
      Rig dense(cfg, o, B, T, false);
      // 8 rows per chunk (the smallest): 22 rows of gate/up come in 3 chunks, 16 in 2
      Rig chunked(cfg, o, B, T, true, /*refresh_chunk_bytes=*/1);
      dense.gradients(0, in, tg, B);
      chunked.gradients(0, in, tg, B);
      for (const auto& t : chunked.grass->targets()) {
        const float* g = test::cpu_grad(*dense.model, dense.model->tensors()[t.tensor_index]);
        std::vector<double> norms(size_t(t.rows ? t.out : t.in), 0.0);
        for (int i = 0; i < t.out; i++)
          for (int c = 0; c < t.in; c++)
            norms[size_t(t.rows ? i : c)] += double(g[int64_t(i) * t.in + c]) * g[int64_t(i) * t.in + c];
        std::vector<int32_t> order(norms.size());
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int a, int b) { return norms[a] > norms[b]; });
        std::vector<int32_t> want(order.begin(), order.begin() + r), got(t.sigma, t.sigma + r);
        std::sort(want.begin(), want.end());
        CHECK(got == want);
      }
    }
  }
}

TEST_CASE("refresh_stagger spreads the targets' refreshes over the interval", "[grass]") {
  const ModelConfig cfg = small_config();
  const int B = 2, T = 8, K = 4;
  const auto in = tokens(B * T, 40, 25), tg = tokens(B * T, 40, 26);
  OptimizerConfig o = grass_config(2, "top_r", "rows", K);
  o.projection.refresh_stagger = true;
  Rig rig(cfg, o, B, T, true);
  const size_t n = rig.grass->targets().size();
  std::vector<std::vector<int64_t>> refreshed(n);  // the steps at which each target re-selected
  for (int64_t step = 0; step < 9; step++) {
    rig.gradients(step, in, tg, B);
    rig.update();
    for (size_t k = 0; k < n; k++)
      if (rig.grass->targets()[k].adam_step == 1) refreshed[k].push_back(step);
  }
  std::set<int64_t> phases;
  for (size_t k = 0; k < n; k++) {
    const int64_t phase = int64_t(k) * K / int64_t(n);
    phases.insert(phase);
    std::vector<int64_t> want = {0};  // every target selects at step 0
    for (int64_t s = 1; s < 9; s++)
      if (s >= phase && (s - phase) % K == 0) want.push_back(s);
    INFO("target " << k << " phase " << phase);
    CHECK(refreshed[k] == want);
  }
  CHECK(phases.size() == size_t(K));  // every step of the interval has targets refreshing
}
