// AdamW and the clipping reductions against direct scalar formulas.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "kernels/ops.h"
#include "src/core/rng.h"
#include "src/optim/clip.h"

using namespace grass;

TEST_CASE("adamw_update follows torch.optim.AdamW step by step", "[ops][optim]") {
  const int n = 33;
  const double lr = 0.01, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  std::vector<double> p(n), m(n, 0.0), v(n, 0.0);
  for (int i = 0; i < n; i++) p[i] = normal(7, i);
  std::vector<double> pr = p, mr = m, vr = v;  // scalar reference
  for (int step = 1; step <= 4; step++) {
    std::vector<double> g(n);
    for (int i = 0; i < n; i++) g[i] = normal(100 + step, i);
    const double clip = step == 2 ? 0.3 : 1.0;  // the clipping coefficient scales g first
    ops::adamw_update(p.data(), g.data(), m.data(), v.data(), n,
                      {.grad_scale = clip, .lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps,
                       .weight_decay = wd, .step = step});
    for (int i = 0; i < n; i++) g[i] *= clip;
    for (int i = 0; i < n; i++) {
      pr[i] *= 1 - lr * wd;
      mr[i] = b1 * mr[i] + (1 - b1) * g[i];
      vr[i] = b2 * vr[i] + (1 - b2) * g[i] * g[i];
      const double mhat = mr[i] / (1 - std::pow(b1, step));
      const double vhat = vr[i] / (1 - std::pow(b2, step));
      pr[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
  for (int i = 0; i < n; i++) CHECK(p[i] == Approx(pr[i]).epsilon(1e-12));
}

TEST_CASE("sum_squares is exact and the clip coefficient follows torch's rule", "[ops][optim]") {
  const int64_t n = 200003;  // several 64K chunks and a ragged tail
  std::vector<float> x(n);
  double ref = 0;
  for (int64_t i = 0; i < n; i++) {
    x[i] = float(normal(3, i));
    ref += double(x[i]) * x[i];
  }
  CHECK(ops::sum_squares(x.data(), n) == Approx(ref).epsilon(1e-12));
  CHECK(grad_norm(x.data(), n) == Approx(std::sqrt(ref)).epsilon(1e-12));
  CHECK(clip_coefficient(4.0, 2.0) == Approx(2.0 / (4.0 + 1e-6)));
  CHECK(clip_coefficient(1.0, 2.0) == 1.0);  // below the threshold nothing changes
  CHECK(clip_coefficient(4.0, 0.0) == 1.0);  // clipping off
}
