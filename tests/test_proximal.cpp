// The small-batch proximal method (docs/proximal.md): AdamW's step against TRAdam.py's arithmetic
// (huiqu18/TRAlgorithm) over two inner loops, GRASS's term on its selected slices against the plain
// update of the same gradient plus the term, and, in whole training steps of both optimizers
// (deferred and fused), anchors that hold the weights as they were at each inner loop's start.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "src/core/rng.h"
#include "src/optim/grass.h"
#include "src/optim/optimizer.h"
#include "src/train/run_resolution.h"
#include "src/train/training_state.h"
#include "tests/named_choice.h"
#include "tests/ngram_batches.h"

using namespace grass;

namespace {

std::vector<double> normals(uint64_t seed, int n, double scale = 1) {
  std::vector<double> x(static_cast<size_t>(n));
  for (int i = 0; i < n; i++) x[size_t(i)] = scale * normal(seed, uint64_t(i));
  return x;
}

}  // namespace

TEST_CASE("proximal AdamW follows TRAdam.py over two inner loops", "[ops][optim][proximal]") {
  const int n = 33, S = 3;
  const double lr = 0.01, lambda = 0.1 * lr, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  std::vector<double> p = normals(7, n), m(n, 0.0), v(n, 0.0), anchor = normals(8, n);
  std::vector<double> pr = p, mr = m, vr = v, p_old(n);  // TRAdam.py's state
  std::vector<double> plain = p, plain_m = m, plain_v = v;  // the same steps without the term
  std::vector<double> loop_start;
  for (int k = 0; k < 2 * S; k++) {
    const int inner = k % S;  // TRAdam.py's `iteration`
    std::vector<double> g = normals(100 + uint64_t(k), n);
    const double clip = k == 4 ? 0.3 : 1.0;
    if (inner == 0) loop_start = p;
    const AdamArgs args{.grad_scale = clip, .lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps,
                        .weight_decay = wd, .step = k + 1};
    ops::adamw_update(p.data(), g.data(), m.data(), v.data(), n,
                      proximal_args(args, lambda, lr, inner, anchor.data()));
    ops::adamw_update(plain.data(), g.data(), plain_m.data(), plain_v.data(), n, args);
    // TRAdam.py: lr_t = lr/(iteration+1); at iteration 0 p_old = p; grad += 2·(λ/lr)·(p − p_old).
    // Its weight decay is L2; ours stays decoupled and moves at the step's rate.
    const double lr_t = lr / (inner + 1);
    if (inner == 0) p_old = pr;
    for (int i = 0; i < n; i++) {
      const double gi = g[i] * clip + 2 * (lambda / lr) * (pr[i] - p_old[i]);
      pr[i] *= 1 - lr_t * wd;
      mr[i] = b1 * mr[i] + (1 - b1) * gi;
      vr[i] = b2 * vr[i] + (1 - b2) * gi * gi;
      pr[i] -= lr_t * (mr[i] / (1 - std::pow(b1, k + 1))) /
               (std::sqrt(vr[i] / (1 - std::pow(b2, k + 1))) + eps);
    }
    CHECK(anchor == loop_start);  // the weights at the loop's start, exactly
  }
  double moved = 0;  // the method changed the trajectory, well beyond rounding
  for (int i = 0; i < n; i++) {
    CHECK(p[i] == Approx(pr[i]).epsilon(1e-12));
    moved = std::max(moved, std::abs(p[i] - plain[i]));
  }
  CHECK(moved > 1e-3);
}

TEST_CASE("proximal GRASS: the term reads the selected slices of the weight before the step",
          "[ops][optim][proximal]") {
  const int out = 12, in = 10, r = 4;
  const double lr = 0.02, coef = 3.0, alpha = 0.25;
  for (const bool rows : {true, false}) {
    INFO("rows=" << rows);
    const int side = rows ? out : in, n = r * (rows ? in : out);
    const std::vector<int32_t> sigma = {1, 4, 5, side - 1};
    const std::vector<double> scale = {1, 2, 1, 3};  // merged repeats' counts
    const std::vector<double> w0 = normals(1, out * in), gc0 = normals(2, n),
                              m0 = normals(3, n, 0.1), v0 = normals(4, n, 0.1);
    std::vector<double> v_pos = v0;
    for (double& x : v_pos) x = x * x;
    const auto element = [&](const std::vector<double>& w, int i) {  // w at gc's element i
      const int j = rows ? i / in : i % r, e = rows ? i % in : i / r;
      return w[size_t(rows ? sigma[size_t(j)] * in + e : e * in + sigma[size_t(j)])];
    };
    AdamArgs args{.grad_scale = 0.7, .lr = lr, .weight_decay = 0.1, .step = 3};
    // The plain update of a given gradient, read unscaled.
    const auto plain = [&](std::vector<double> gc, double grad_scale, std::vector<double>& w,
                           std::vector<double>& m, std::vector<double>& v) {
      AdamArgs a = args;
      a.grad_scale = grad_scale;
      ops::grass_adam_update(w.data(), gc.data(), m.data(), v.data(), sigma.data(), scale.data(),
                             out, in, r, rows, alpha, a);
    };
    // The first step of a loop: the anchor takes the slices, the update is the plain one.
    std::vector<double> w = w0, gc = gc0, m = m0, v = v_pos, anchor(size_t(n), -99.0);
    AdamArgs reset = args;
    reset.anchor = anchor.data();
    reset.anchor_reset = true;
    ops::grass_adam_update(w.data(), gc.data(), m.data(), v.data(), sigma.data(), scale.data(), out,
                           in, r, rows, alpha, reset);
    std::vector<double> want_w = w0, want_m = m0, want_v = v_pos;
    plain(gc0, args.grad_scale, want_w, want_m, want_v);
    for (int i = 0; i < n; i++) CHECK(anchor[size_t(i)] == element(w0, i));
    CHECK(w == want_w);
    CHECK(m == want_m);
    // A later step: gc·clip + coef·(w − anchor), the plain update of that gradient.
    const std::vector<double> anchor0 = normals(5, n);
    anchor = anchor0;
    w = w0, gc = gc0, m = m0, v = v_pos;
    AdamArgs term = args;
    term.anchor = anchor.data();
    term.proximal_coef = coef;
    ops::grass_adam_update(w.data(), gc.data(), m.data(), v.data(), sigma.data(), scale.data(), out,
                           in, r, rows, alpha, term);
    std::vector<double> g_with_term(static_cast<size_t>(n));
    for (int i = 0; i < n; i++)
      g_with_term[size_t(i)] = gc0[size_t(i)] * args.grad_scale + coef * (element(w0, i) - anchor0[size_t(i)]);
    want_w = w0, want_m = m0, want_v = v_pos;
    plain(g_with_term, 1.0, want_w, want_m, want_v);
    CHECK(anchor == anchor0);  // read only
    CHECK(w == want_w);
    CHECK(m == want_m);
    CHECK(v == want_v);
    CHECK(w != w0);
  }
}

namespace {

RunConfig proximal_run(const std::string& optimizer, const std::string& precision) {
  RunConfig c;
  c.model.hidden_size = 32;
  c.model.intermediate_size = 40;
  c.model.num_attention_heads = 4;
  c.model.num_key_value_heads = 2;
  c.model.num_hidden_layers = 2;
  c.model.vocab_size = test::NgramBatches::V;
  c.model.max_position_embeddings = 64;
  c.micro_batch_size = 2;
  c.total_batch_size = 2;
  c.seq_len = 16;
  c.precision = test::named<PrecisionChoice>(precision);
  c.optimizer.kind = test::named<OptimizerKind>(optimizer);
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.1;
  c.optimizer.projection.rank = 4;
  c.optimizer.projection.update_interval = 3;  // GRASS: refreshes, and new anchors, at 0, 3, 6
  c.optimizer.projection.seed = 11;
  c.optimizer.proximal = {.lambda = 1e-3, .inner_steps = 3};
  return c;
}

const float* block_named(const Arena& arena, const std::string& name) {
  for (const Arena::Block& b : arena.blocks())
    if (b.name == name) return static_cast<const float*>(b.ptr);
  return nullptr;
}

}  // namespace

TEST_CASE("proximal runs: each anchor holds the weights of its inner loop's first step",
          "[optim][proximal][train]") {
  // fp32 updates after the backward; pure bf16 fuses them into it (one micro-batch).
  for (const std::string optimizer : {"adamw", "grass"})
    for (const std::string precision : {"fp32", "bf16"}) {
      INFO(optimizer << " " << precision);
      const RunConfig cfg = proximal_run(optimizer, precision);
      const std::unique_ptr<Backend> backend = make_cpu_backend(storage_for(cfg.precision, false));
      Arena arena(false, *backend);
      TrainingState s = build_training_state(cfg, arena, *backend);
      s.model->init_weights(3);
      const int64_t weights = s.model->num_stored_params();
      const float* w = static_cast<const float*>(s.model->weights());
      const test::NgramBatches data;
      std::vector<std::vector<float>> before;  // the weights before each step
      for (int64_t step = 0; step < 8; step++) {
        before.emplace_back(w, w + weights);
        train_step(s, cfg, step, cfg.optimizer.lr, [&](int32_t* in, int32_t* tg) {
          std::vector<int32_t> inputs, targets;
          data.batch(step, cfg.micro_batch_size, cfg.seq_len, inputs, targets);
          std::copy(inputs.begin(), inputs.end(), in);
          std::copy(targets.begin(), targets.end(), tg);
        });
      }
      const std::vector<float>& loop_start = before[6];  // steps 6, 7 are the third loop's
      CHECK(loop_start != before[7]);
      if (optimizer == "adamw") {
        const float* anchor = block_named(arena, "adamw.proximal_anchor");
        REQUIRE(anchor);
        for (const ParamTensor& t : s.model->tensors()) {
          INFO(t.name);
          CHECK(std::memcmp(anchor + t.grad_offset, loop_start.data() + t.offset,
                            size_t(t.numel) * sizeof(float)) == 0);
        }
        continue;
      }
      const Grass& g = *s.optimizers->find<Grass>();
      for (const Grass::Target& t : g.targets()) {
        const ParamTensor& p = s.model->tensors()[size_t(t.tensor_index)];
        INFO(p.name << (t.rows ? " rows" : " columns"));
        const float* anchor = static_cast<const float*>(t.anchor);
        const float* w6 = loop_start.data() + p.offset;
        int64_t differ = 0;
        for (int j = 0; j < t.slices; j++)
          for (int e = 0; e < (t.rows ? t.in : t.out); e++) {
            const float want = t.rows ? w6[int64_t(t.sigma[j]) * t.in + e]
                                      : w6[int64_t(e) * t.in + t.sigma[j]];
            const float got = t.rows ? anchor[int64_t(j) * t.in + e] : anchor[int64_t(e) * t.slices + j];
            differ += std::memcmp(&want, &got, sizeof want) != 0;
          }
        CHECK(differ == 0);
      }
      CHECK(block_named(arena, "adamw.m"));  // GRASS's dense tensors train without the method
      CHECK(!block_named(arena, "adamw.proximal_anchor"));
    }
}
