// GaLore and FLORA as optimizers of the model (the ops themselves: test_lowrank.cpp): the
// projected gradient the backward forms from the activations is the projection of the dense
// gradient, GaLore's P is the top-r basis of the refresh step's gradient and survives until the
// next refresh with the moments kept, FLORA's P is the seeded Gaussian of its refresh index and
// its first moment is carried over at a resampling, each update is lowrank_adam_update's, and
// micro-batches accumulate.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kernels/lowrank_ops.h"
#include "src/core/arena.h"
#include "src/core/rng.h"
#include "src/model/llama.h"
#include "src/optim/adamw.h"
#include "src/optim/lowrank.h"
#include "src/optim/step.h"
#include "tests/named_choice.h"
#include "tests/ngram_batches.h"
#include "tests/test_util.h"

using namespace grass;

namespace {

ModelConfig small_config() {
  ModelConfig c;
  c.hidden_size = 16;
  c.intermediate_size = 22;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.num_hidden_layers = 2;
  c.vocab_size = test::NgramBatches::V;
  c.max_position_embeddings = 32;
  c.rms_norm_eps = 1e-5;
  c.initializer_range = 0.2;
  return c;
}

OptimizerConfig lowrank_config(const std::string& name, int rank, int64_t interval) {
  OptimizerConfig o;
  o.kind = test::named<OptimizerKind>(name);
  o.lr = 1e-2;
  o.beta2 = 0.95;
  o.weight_decay = 0.1;
  o.projection.rank = rank;
  o.projection.update_interval = interval;
  o.projection.scale = 0.5;
  o.projection.seed = 9;
  return o;
}

// A model with AdamW on every tensor (lowrank == nullptr) or GaLore/FLORA on the projections,
// stepped without clipping.
struct Rig {
  Arena arena;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<OptimizerSet> optimizers;
  LowRankOptimizer* lowrank = nullptr;
  std::unique_ptr<DeferredStep> step;
  OptimizerConfig opt;
  int T;

  Rig(const ModelConfig& cfg, const OptimizerConfig& o, int max_batch, int T_, bool projected)
      : opt(o), T(T_) {
    model = std::make_unique<LlamaModel>(
        cfg, arena, max_batch, T,
        projected ? projection_tensor_names(cfg.num_hidden_layers, o.projection.targets)
                  : std::vector<std::string>{});
    model->init_weights(5);
    optimizers = std::make_unique<OptimizerSet>(model->tensors().size());
    optimizers->add(std::make_unique<AdamW>(o, *model, arena, 5));
    if (projected) {
      std::unique_ptr<LowRankOptimizer> p;
      if (o.kind == OptimizerKind::GaLore) p = std::make_unique<GaLore>(o, *model, max_batch * T, arena);
      else p = std::make_unique<Flora>(o, *model, max_batch * T, arena);
      lowrank = p.get();
      optimizers->add(std::move(p));
    }
    step = std::make_unique<DeferredStep>(*model, *optimizers, /*max_norm=*/0.0, arena);
    model->set_gradient_sink(step.get());
  }
  // forward + backward of `micro` micro-batches of the step's n-gram batch (no update)
  void gradients(int64_t s, int B, int micro = 1) {
    std::vector<int32_t> in, tg;
    test::NgramBatches().batch(s, B, T, in, tg);
    step->begin(s, opt.lr);
    const int b = B / micro;
    for (int k = 0; k < micro; k++) {
      model->forward(in.data() + size_t(k) * b * T, tg.data() + size_t(k) * b * T, b);
      model->backward(1.0 / micro);
    }
  }
  std::vector<float> R(const LowRankOptimizer::Target& t) const {
    const auto* p = static_cast<const float*>(step->projected_gradient(t.tensor_index));
    return {p, p + t.r_numel};
  }
  std::vector<float> weights(int tensor) const {
    const ParamTensor& p = model->tensors()[size_t(tensor)];
    return {test::params(*model) + p.offset, test::params(*model) + p.offset + p.numel};
  }
  std::vector<float> dense_grad(int tensor) const {
    const ParamTensor& p = model->tensors()[size_t(tensor)];
    const float* g = test::cpu_grad(*model, p);
    return {g, g + p.numel};
  }
};

std::vector<float> copy(const void* p, int64_t n) {
  const auto* f = static_cast<const float*>(p);
  return {f, f + n};
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); i++) {
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// P of target t as ops::galore_basis or ops::flora_projection gives it
std::vector<float> basis_of(const LowRankOptimizer::Target& t, const std::vector<float>& g, int r) {
  std::vector<float> P(size_t(t.side) * r);
  ops::galore_basis(P.data(), g.data(), t.out, t.in, r, t.rows);
  return P;
}
std::vector<float> gaussian_of(const LowRankOptimizer::Target& t, uint64_t seed, int64_t refresh,
                               int r) {
  std::vector<float> P(size_t(t.side) * r);
  ops::flora_projection(P.data(), seed, t.tensor_index, refresh, t.side, r);
  return P;
}
std::vector<float> project(const LowRankOptimizer::Target& t, const std::vector<float>& g,
                           const std::vector<float>& P, int r) {
  std::vector<float> R(size_t(t.r_numel));
  ops::lowrank_project(R.data(), g.data(), P.data(), t.out, t.in, r, t.rows);
  return R;
}

}  // namespace

TEST_CASE("GaLore: R is the top-r basis's projection of the dense gradient", "[lowrank]") {
  const int B = 2, T = 8, r = 3;
  const OptimizerConfig o = lowrank_config("galore", r, 2);
  Rig dense(small_config(), o, B, T, false), galore(small_config(), o, B, T, true);
  dense.gradients(0, B);
  galore.gradients(0, B);  // a refresh: P from this gradient, R with it
  REQUIRE(galore.lowrank->targets().size() == 14);
  std::vector<std::vector<float>> P0;
  for (const auto& t : galore.lowrank->targets()) {
    INFO(dense.model->tensors()[size_t(t.tensor_index)].name);
    CHECK(t.rows == (t.out < t.in));  // the shorter side; a square q or o projects its columns
    const std::vector<float> g = dense.dense_grad(t.tensor_index);
    P0.push_back(basis_of(t, g, r));
    CHECK(rel_err(galore.R(t), project(t, g, P0.back(), r)) < 1e-5);
  }
  galore.step->finish();
  Rig dense1(small_config(), o, B, T, false);
  for (size_t i = 0; i < galore.model->tensors().size(); i++)  // dense1 at galore's weights
    dense1.model->write_tensor(galore.model->tensors()[i], galore.weights(int(i)).data());
  dense1.gradients(1, B);
  galore.gradients(1, B);  // not a refresh: R from the activations with step 0's P
  size_t k = 0;
  for (const auto& t : galore.lowrank->targets())
    CHECK(rel_err(galore.R(t), project(t, dense1.dense_grad(t.tensor_index), P0[k++], r)) < 1e-5);
}

TEST_CASE("GaLore: svd \"randomized\" refreshes P by the range finder, seeded per refresh and "
          "target", "[lowrank]") {
  const int B = 2, T = 8, r = 3;
  OptimizerConfig o = lowrank_config("galore", r, 2);
  o.projection.svd = GaloreSvd::Randomized;
  o.projection.svd_power_iters = 1;
  o.projection.svd_oversample = 4;
  // q, k, v and gate, up dense in both rigs: each group's backward is then one packed computation
  // in both (LlamaModel::stacked_backward), so the dense rig's gradients are GaLore's to the bit
  // (both sides of the range finder and its seeds: test_lowrank.cpp)
  o.projection.targets = {ProjectionTarget::O, ProjectionTarget::Down};
  Rig dense(small_config(), o, B, T, false), galore(small_config(), o, B, T, true);
  const auto* g = dynamic_cast<const GaLore*>(galore.lowrank);
  REQUIRE(g != nullptr);
  CHECK_THAT(g->describe(), Catch::Contains("randomized SVD every 2 steps") &&
                                Catch::Contains("(1 power iterations, 4 extra columns, on the CPU)"));
  for (const int64_t step : {0, 2}) {  // two refreshes (interval 2), each from its own gradient
    if (step > 0) {
      galore.step->finish();
      for (size_t i = 0; i < galore.model->tensors().size(); i++)  // dense at galore's weights
        dense.model->write_tensor(galore.model->tensors()[i], galore.weights(int(i)).data());
    }
    dense.gradients(step, B);
    galore.gradients(step, B);
    for (const auto& t : galore.lowrank->targets()) {
      INFO("step " << step << " " << dense.model->tensors()[size_t(t.tensor_index)].name);
      const std::vector<float> grad = dense.dense_grad(t.tensor_index);
      std::vector<float> want(size_t(t.side) * r);
      const uint64_t seed = derive_seed(derive_seed(9 ^ 0x6a10, uint64_t(step / 2)), uint64_t(t.tensor_index));
      ops::galore_basis_randomized(want.data(), grad.data(), t.out, t.in, r, t.rows, seed, 1, 4);
      const float* P = g->basis(t.tensor_index);
      CHECK(std::vector<float>(P, P + want.size()) == want);
    }
  }
}

// refresh_stagger: target k of n forms a new P at step 0 and then at the steps ≡ k·K/n (mod K),
// so every step of the interval has a target refreshing; between its refreshes a target's P
// stays as it was. Each P is the bits of the op (the exact SVD, or the range finder seeded by
// the refresh's step: step / K would give a target's refreshes at step 0 and at its phase one
// test matrix) on the dense gradient of that step: o and down projected, as in the randomized
// test above, so the dense rig forms the same gradients bit for bit.
TEST_CASE("GaLore: refresh_stagger spreads the targets' refreshes over the interval", "[lowrank]") {
  const int B = 2, T = 8, r = 3, K = 4;
  for (const GaloreSvd svd : {GaloreSvd::Exact, GaloreSvd::Randomized}) {
    INFO((svd == GaloreSvd::Exact ? "exact SVD" : "randomized SVD"));
    OptimizerConfig o = lowrank_config("galore", r, K);
    o.projection.refresh_stagger = true;
    o.projection.svd = svd;
    o.projection.svd_power_iters = 1;
    o.projection.svd_oversample = 4;
    o.projection.targets = {ProjectionTarget::O, ProjectionTarget::Down};
    Rig dense(small_config(), o, B, T, false), galore(small_config(), o, B, T, true);
    const auto& g = static_cast<const GaLore&>(*galore.lowrank);
    CHECK_THAT(g.describe(), Catch::Contains("each target at its own step of the interval"));
    const auto& targets = galore.lowrank->targets();
    const size_t n = targets.size();
    REQUIRE(n == 4);  // 2 layers' o and down: phases 0, 1, 2, 3
    std::vector<std::vector<float>> held(n);
    for (int64_t step = 0; step < 9; step++) {
      for (size_t i = 0; i < galore.model->tensors().size(); i++)  // dense at galore's weights
        dense.model->write_tensor(galore.model->tensors()[i], galore.weights(int(i)).data());
      dense.gradients(step, B);
      galore.gradients(step, B);
      for (size_t k = 0; k < n; k++) {
        const auto& t = targets[k];
        const int64_t phase = int64_t(k) * K / int64_t(n);
        const bool refreshes = step == 0 || (step >= phase && (step - phase) % K == 0);
        INFO("step " << step << ", target " << k << " (phase " << phase << ")"
                     << (refreshes ? ", refreshing" : ""));
        if (refreshes) {
          const std::vector<float> grad = dense.dense_grad(t.tensor_index);
          held[k].assign(size_t(t.side) * r, 0.0f);
          if (svd == GaloreSvd::Exact) {
            held[k] = basis_of(t, grad, r);
          } else {
            const uint64_t seed = derive_seed(derive_seed(9 ^ 0x6a10, uint64_t(step)),
                                              uint64_t(t.tensor_index));
            ops::galore_basis_randomized(held[k].data(), grad.data(), t.out, t.in, r, t.rows,
                                         seed, 1, 4);
          }
        }
        const float* P = g.basis(t.tensor_index);
        CHECK(std::vector<float>(P, P + held[k].size()) == held[k]);
      }
      galore.step->finish();
    }
  }
}

TEST_CASE("GaLore: an update is lowrank_adam_update's, and a refresh keeps moments and counter",
          "[lowrank]") {
  const int B = 2, T = 8, r = 3;
  Rig rig(small_config(), lowrank_config("galore", r, 2), B, T, true);
  for (int64_t s = 0; s < 3; s++) {  // refreshes at steps 0 and 2
    rig.gradients(s, B);
    // the update of each target, recomputed with the op on copies of everything it reads
    std::vector<std::vector<float>> want, want_m;
    for (const auto& t : rig.lowrank->targets()) {
      std::vector<float> w = rig.weights(t.tensor_index), R = rig.R(t);
      std::vector<float> m = copy(t.m, t.r_numel), v = copy(t.v, t.r_numel);
      if (s == 2) {  // the refresh kept the moments of step 1
        double mass = 0;
        for (float x : m) mass += std::abs(x);
        CHECK(mass > 0);
        CHECK(t.adam_step == 2);
      }
      const AdamArgs a{.grad_scale = 1, .lr = rig.opt.lr, .beta1 = rig.opt.beta1,
                       .beta2 = rig.opt.beta2, .eps = rig.opt.eps,
                       .weight_decay = rig.opt.weight_decay, .step = t.adam_step + 1};
      const auto& galore = static_cast<const GaLore&>(*rig.lowrank);
      const std::vector<float> P = copy(galore.basis(t.tensor_index), int64_t(t.side) * r);
      ops::lowrank_adam_update(w.data(), R.data(), m.data(), v.data(), P.data(), t.out, t.in, r,
                               t.rows, rig.opt.projection.scale, 0.0, a);
      want.push_back(w);
      want_m.push_back(m);
    }
    rig.step->finish();
    size_t k = 0;
    for (const auto& t : rig.lowrank->targets()) {
      CHECK(rig.weights(t.tensor_index) == want[k]);  // the same op on the same inputs: bitwise
      CHECK(copy(t.m, t.r_numel) == want_m[k]);
      CHECK(t.adam_step == s + 1);  // never reset
      k++;
    }
  }
}

TEST_CASE("FLORA: P is the seeded Gaussian of the refresh index, and M moves to the new P",
          "[lowrank]") {
  // (the move happens at each target's update, before Adam reads M: the update is checked)
  const int B = 2, T = 8, r = 3;
  const OptimizerConfig o = lowrank_config("flora", r, 3);  // resamplings before steps 2 and 5
  Rig flora(small_config(), o, B, T, true);
  for (int64_t s = 0; s < 4; s++) {
    Rig dense(small_config(), o, B, T, false);
    for (size_t i = 0; i < flora.model->tensors().size(); i++)
      dense.model->write_tensor(flora.model->tensors()[i], flora.weights(int(i)).data());
    std::vector<std::vector<float>> m_before;
    for (const auto& t : flora.lowrank->targets()) m_before.push_back(copy(t.m, t.r_numel));
    dense.gradients(s, B);
    flora.gradients(s, B);
    const int64_t refresh = (s + 1) / 3;
    std::vector<std::vector<float>> want_m;  // M after the update
    size_t k = 0;
    for (const auto& t : flora.lowrank->targets()) {
      INFO("step " << s << " " << flora.model->tensors()[size_t(t.tensor_index)].name);
      const std::vector<float> P = gaussian_of(t, o.projection.seed, refresh, r);
      const std::vector<float> R = flora.R(t);
      CHECK(rel_err(R, project(t, dense.dense_grad(t.tensor_index), P, r)) < 1e-5);
      std::vector<float> m = m_before[k++];
      if (s == 2) {  // resampled: M = down_new(up_old(M)) before Adam reads it
        const std::vector<float> P_old = gaussian_of(t, o.projection.seed, 0, r);
        std::vector<float> scratch(size_t(r) * r + m.size());
        ops::flora_transfer(m.data(), scratch.data(), P_old.data(), P.data(), t.out, t.in, r, t.rows);
        CHECK(m != m_before[k - 1]);
      }
      for (size_t i = 0; i < m.size(); i++)
        m[i] = float(o.beta1) * m[i] + float(1 - o.beta1) * R[i];  // no clipping in the rig
      want_m.push_back(m);
    }
    flora.step->finish();
    k = 0;
    for (const auto& t : flora.lowrank->targets()) {
      INFO("step " << s << " " << flora.model->tensors()[size_t(t.tensor_index)].name);
      const std::vector<float> got = copy(t.m, t.r_numel);
      const std::vector<float>& want = want_m[k++];
      for (size_t i = 0; i < got.size(); i++)
        REQUIRE(got[i] == Approx(want[i]).epsilon(1e-5).margin(1e-9));
    }
  }
}

TEST_CASE("GaLore and FLORA: 4 accumulated micro-batches equal one batch between refreshes",
          "[lowrank]") {
  const int B = 4, T = 8, r = 3;
  for (const std::string name : {"galore", "flora"}) {
    INFO(name);
    const OptimizerConfig o = lowrank_config(name, r, 10);
    Rig whole(small_config(), o, B, T, true), micro(small_config(), o, B, T, true);
    whole.gradients(0, B);  // step 0 (GaLore's refresh): the same batch, so the same P
    micro.gradients(0, B);
    whole.step->finish();
    micro.step->finish();
    whole.gradients(1, B);
    micro.gradients(1, B, 4);
    for (size_t k = 0; k < whole.lowrank->targets().size(); k++)
      CHECK(rel_err(micro.R(micro.lowrank->targets()[k]), whole.R(whole.lowrank->targets()[k])) <
            1e-5);
  }
}
