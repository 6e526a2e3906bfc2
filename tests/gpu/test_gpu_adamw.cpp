// The GPU's optimizer math against the CPU reference (kernels/ops.h, float): AdamW in both storage
// schemes ("bf16-mixed": fp32 master, m, v and gradient; "bf16": everything bf16 with stochastic
// rounding), the deterministic sum of squares behind clipping, and the fp32 <-> bf16 conversions.
// Stochastic rounding is checked as a distribution: every result is one of the two bf16 values
// around the fp32 result, its mean over many seeds is that fp32 value, and the param, m and v
// streams draw independently.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "src/core/bf16.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

using namespace grass;
using gputest::DeviceBuffer;
using gputest::rel_error;
using bf16 = cuda::bf16;

void put(DeviceBuffer<bf16>& d, const std::vector<float>& x) { d.upload(gputest::to_bf16(x)); }
std::vector<float> get(const DeviceBuffer<bf16>& d) { return gputest::to_f32(d.download()); }

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

uint16_t bits_of(float bf16_value) { return grass::float_to_bf16(bf16_value); }  // exact here
uint32_t bits_of_f32(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

// The bf16 values around x: its top 16 bits (x rounded toward zero) and the next value away from
// zero; the same value twice when x is a bf16 value.
struct Neighbours {
  uint16_t toward_zero, away;
};
Neighbours bf16_neighbours(float x) {
  const uint32_t bits = bits_of_f32(x);
  const uint16_t toward_zero = uint16_t(bits >> 16);
  return {toward_zero, uint16_t(toward_zero + ((bits & 0xffffu) != 0))};
}

// x rounded to bf16 downward and upward (equal when x is a bf16 value).
float bf16_floor(float x) {
  const Neighbours n = bf16_neighbours(x);
  return std::min(grass::bf16_to_float(n.toward_zero), grass::bf16_to_float(n.away));
}
float bf16_ceil(float x) {
  const Neighbours n = bf16_neighbours(x);
  return std::max(grass::bf16_to_float(n.toward_zero), grass::bf16_to_float(n.away));
}

// Elements of got that are not one of the two bf16 values around want. The GPU's fp32 result may
// differ from the CPU's by a few fp32 ulps of the terms that made it (contracted multiply-adds;
// when the terms nearly cancel, that is many ulps of the result), so want is widened by
// slack[i] = 2^-20 · (the terms' magnitude) before taking its neighbours.
size_t count_not_neighbour(const std::vector<float>& got, const std::vector<float>& want,
                           const std::vector<float>& terms) {
  size_t misses = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const float slack = 0x1p-20f * (std::fabs(want[i]) + terms[i]);
    misses += !(bf16_floor(want[i] - slack) <= got[i] && got[i] <= bf16_ceil(want[i] + slack));
  }
  return misses;
}

// Elements whose result differs from round-to-nearest of the fp32 value: about 1/4 of them under
// stochastic rounding (min(frac, 1 - frac) on average), none under round-to-nearest.
size_t count_not_nearest(const std::vector<float>& got, const std::vector<float>& want) {
  size_t n = 0;
  for (size_t i = 0; i < got.size(); i++) n += bits_of(got[i]) != grass::float_to_bf16(want[i]);
  return n;
}

// The update's scalars as the GPU narrows them (fp32), widened exactly for the calls.
struct AdamFloats {
  float grad_scale = 0.7f, lr = 0.05f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f,
        weight_decay = 0.1f;
  AdamArgs at(int64_t step) const {
    return {.grad_scale = grad_scale, .lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps,
            .weight_decay = weight_decay, .step = step};
  }
};

// The CPU step on fp32 copies, with the GPU's float arguments widened exactly.
void cpu_adamw(std::vector<float>& p, const std::vector<float>& g, std::vector<float>& m,
               std::vector<float>& v, const AdamFloats& a, int64_t step) {
  ops::adamw_update<float>(p.data(), g.data(), m.data(), v.data(), int64_t(p.size()), a.at(step));
}

// Moments as after some training: m ~ gradients, v ~ squared gradients (never negative).
std::vector<float> random_v(size_t n) {
  std::vector<float> v = gputest::randn(n);
  for (float& x : v) x = x * x + 1e-3f;
  return v;
}

}  // namespace

TEST_CASE("gpu adamw bf16-mixed updates the fp32 master as the CPU, param = RN(master)", "[gpu]") {
  gputest::TestContext tc;
  const AdamFloats a;
  const int64_t n = 100003;
  for (const int64_t step : {int64_t(1), int64_t(7)}) {
    CAPTURE(step);
    // Weights of 0.1 and steps of ~lr = 0.05: the update itself is well above fp32's resolution.
    const std::vector<float> master0 = gputest::randn(n, 0.1), g = gputest::randn(n);
    const std::vector<float> m0 = gputest::randn(n, 0.3), v0 = random_v(n);
    DeviceBuffer<float> d_master(n), d_g(n), d_m(n), d_v(n);
    DeviceBuffer<bf16> d_param(n);
    d_master.upload(master0);
    d_g.upload(g);
    d_m.upload(m0);
    d_v.upload(v0);
    d_param.poison();
    cuda::adamw_update(tc.ctx, d_param.ptr, d_master.ptr, d_g.ptr, d_m.ptr, d_v.ptr, n,
                       a.at(step),
                       /*seed=*/12345);
    const std::vector<float> master = d_master.download(), m = d_m.download(), v = d_v.download();

    std::vector<float> want = master0, want_m = m0, want_v = v0;
    cpu_adamw(want, g, want_m, want_v, a, step);
    CHECK(rel_error(master, want) <= 1e-5);
    CHECK(rel_error(m, want_m) <= 1e-5);
    CHECK(rel_error(v, want_v) <= 1e-5);
    // The step itself, not just the weight it lands on.
    std::vector<float> delta(n), want_delta(n);
    for (int64_t i = 0; i < n; i++) {
      delta[i] = float(double(master[i]) - master0[i]);
      want_delta[i] = float(double(want[i]) - master0[i]);
    }
    CHECK(rel_error(delta, want_delta) <= 1e-5);
    // The compute copy is the master rounded to nearest, bit for bit.
    CHECK(same_bits(d_param.download(), gputest::to_bf16(master)));
  }
}

TEST_CASE("gpu adamw bf16 rounds param, m and v stochastically to a neighbour of the fp32 step",
          "[gpu]") {
  gputest::TestContext tc;
  const AdamFloats a;
  const int64_t n = 100003, step = 3;
  const std::vector<float> p0 = gputest::bf16_rounded(gputest::randn(n, 0.1));
  const std::vector<float> g = gputest::bf16_rounded(gputest::randn(n));
  const std::vector<float> m0 = gputest::bf16_rounded(gputest::randn(n, 0.3));
  const std::vector<float> v0 = gputest::bf16_rounded(random_v(n));
  DeviceBuffer<bf16> d_p(n), d_g(n), d_m(n), d_v(n);
  put(d_g, g);
  // One step from (p0, m0, v0) with the given seed; returns (param, m, v) as fp32.
  auto run = [&](uint64_t seed) {
    put(d_p, p0);
    put(d_m, m0);
    put(d_v, v0);
    cuda::adamw_update(tc.ctx, d_p.ptr, /*master=*/nullptr, d_g.ptr, d_m.ptr, d_v.ptr, n,
                       a.at(step), seed);
    return std::vector<std::vector<float>>{get(d_p), get(d_m), get(d_v)};
  };
  const std::vector<std::vector<float>> got = run(2024);

  std::vector<float> want_p = p0, want_m = m0, want_v = v0;
  cpu_adamw(want_p, g, want_m, want_v, a, step);
  const std::vector<float>* want[3] = {&want_p, &want_m, &want_v};
  // The magnitude of the terms each result is summed from: p0·decay and the step (bounded by
  // |p0| + |p|), b1·m0 and (1-b1)·g, b2·v0 and (1-b2)·g² (over-estimates are harmless).
  std::vector<float> terms[3] = {std::vector<float>(n), std::vector<float>(n),
                                 std::vector<float>(n)};
  for (int64_t i = 0; i < n; i++) {
    terms[0][i] = 2 * std::fabs(p0[i]);
    terms[1][i] = std::fabs(m0[i]) + std::fabs(g[i]);
    terms[2][i] = v0[i] + g[i] * g[i];
  }
  for (int k = 0; k < 3; k++) {
    CAPTURE(k);  // 0 param, 1 m, 2 v
    CHECK(rel_error(got[k], *want[k]) <= 1e-2);
    CHECK(count_not_neighbour(got[k], *want[k], terms[k]) == 0);
    CHECK(count_not_nearest(got[k], *want[k]) > size_t(n) / 10);
  }
  const std::vector<std::vector<float>> same_seed = run(2024);
  for (int k = 0; k < 3; k++) CHECK(same_bits(same_seed[k], got[k]));  // the same draws
  const std::vector<std::vector<float>> other_seed = run(2025);
  for (int k = 0; k < 3; k++) CHECK(!same_bits(other_seed[k], got[k]));
}

TEST_CASE("gpu adamw: the proximal term and its anchor as the CPU's, in both storage schemes",
          "[gpu]") {
  gputest::TestContext tc;
  const AdamFloats a;
  const int64_t n = 100003, step = 4;
  const float coef = 2.5f;  // with |θ - anchor| ~ 0.05, a term of ~0.1 beside gradients of ~1
  for (const bool pure : {false, true}) {
    const auto stored = [&](const std::vector<float>& x) { return pure ? gputest::bf16_rounded(x) : x; };
    const std::vector<float> p0 = stored(gputest::randn(n, 0.1)), g = stored(gputest::randn(n));
    const std::vector<float> m0 = stored(gputest::randn(n, 0.3)), v0 = stored(random_v(n));
    std::vector<float> anchor0 = gputest::randn(n, 0.05);
    for (int64_t i = 0; i < n; i++) anchor0[i] += p0[i];
    anchor0 = stored(anchor0);
    for (const bool reset : {true, false}) {
      INFO((pure ? "pure bf16" : "bf16-mixed") << (reset ? ", a loop's first step" : ", later"));
      AdamArgs args = a.at(step);
      args.proximal_coef = coef;
      args.anchor_reset = reset;
      std::vector<float> p, m, v, anchor;
      if (pure) {
        DeviceBuffer<bf16> d_p(n), d_g(n), d_m(n), d_v(n), d_anchor(n);
        put(d_p, p0), put(d_g, g), put(d_m, m0), put(d_v, v0), put(d_anchor, anchor0);
        args.anchor = d_anchor.ptr;
        cuda::adamw_update(tc.ctx, d_p.ptr, nullptr, d_g.ptr, d_m.ptr, d_v.ptr, n, args, 77);
        p = get(d_p), m = get(d_m), v = get(d_v), anchor = get(d_anchor);
      } else {
        DeviceBuffer<float> d_master(n), d_g(n), d_m(n), d_v(n), d_anchor(n);
        DeviceBuffer<bf16> d_param(n);
        d_master.upload(p0), d_g.upload(g), d_m.upload(m0), d_v.upload(v0), d_anchor.upload(anchor0);
        args.anchor = d_anchor.ptr;
        cuda::adamw_update(tc.ctx, d_param.ptr, d_master.ptr, d_g.ptr, d_m.ptr, d_v.ptr, n, args, 77);
        p = d_master.download(), m = d_m.download(), v = d_v.download(), anchor = d_anchor.download();
      }
      std::vector<float> want = p0, want_m = m0, want_v = v0, want_anchor = anchor0;
      args.anchor = want_anchor.data();
      ops::adamw_update<float>(want.data(), g.data(), want_m.data(), want_v.data(), n, args);
      // the anchor takes the weight exactly at a loop's start, and is read only after it
      CHECK(same_bits(anchor, reset ? p0 : anchor0));
      const double tolerance = pure ? 1e-2 : 1e-5;
      CHECK(rel_error(p, want) <= tolerance);
      CHECK(rel_error(m, want_m) <= tolerance);
      CHECK(rel_error(v, want_v) <= tolerance);
      if (!reset) {  // the term moved the result: the plain step lands elsewhere
        std::vector<float> plain = p0, plain_m = m0, plain_v = v0;
        cpu_adamw(plain, g, plain_m, plain_v, a, step);
        CHECK(rel_error(m, plain_m) > 1e-2);
      }
    }
  }
}

TEST_CASE("gpu adamw bf16 stochastic rounding is unbiased over seeds, streams independent",
          "[gpu]") {
  gputest::TestContext tc;
  const AdamFloats a;
  const int64_t n = 4096, step = 5;
  const int seeds = 256;
  const std::vector<float> p0 = gputest::bf16_rounded(gputest::randn(n, 0.1));
  const std::vector<float> g = gputest::bf16_rounded(gputest::randn(n));
  const std::vector<float> m0 = gputest::bf16_rounded(gputest::randn(n, 0.3));
  const std::vector<float> v0 = gputest::bf16_rounded(random_v(n));
  std::vector<float> want_p = p0, want_m = m0, want_v = v0;
  cpu_adamw(want_p, g, want_m, want_v, a, step);
  const std::vector<float>* want[3] = {&want_p, &want_m, &want_v};

  DeviceBuffer<bf16> d_p(n), d_g(n), d_m(n), d_v(n);
  put(d_g, g);
  std::vector<double> sum[3] = {std::vector<double>(n, 0.0), std::vector<double>(n, 0.0),
                                std::vector<double>(n, 0.0)};
  // Rounding directions (away from zero or not) of the three streams: both[k] counts the (element,
  // seed) pairs rounded away in stream k and in (k+1) % 3.
  double both[3] = {0, 0, 0};
  for (int s = 0; s < seeds; s++) {
    put(d_p, p0);
    put(d_m, m0);
    put(d_v, v0);
    cuda::adamw_update(tc.ctx, d_p.ptr, nullptr, d_g.ptr, d_m.ptr, d_v.ptr, n, a.at(step), /*seed=*/1000 + s);
    const std::vector<float> got[3] = {get(d_p), get(d_m), get(d_v)};
    for (int64_t i = 0; i < n; i++) {
      bool away[3];
      for (int k = 0; k < 3; k++) {
        sum[k][i] += got[k][i];
        away[k] = bits_of(got[k][i]) != bf16_neighbours((*want[k])[i]).toward_zero;
      }
      for (int k = 0; k < 3; k++) both[k] += away[k] && away[(k + 1) % 3];
    }
  }
  // Each element's chance of rounding away from zero in stream k: its distance from the bf16
  // value toward zero, in units of the spacing (0 where it is a bf16 value).
  std::vector<double> p_away[3];
  for (int k = 0; k < 3; k++)
    for (int64_t i = 0; i < n; i++) {
      const float w = (*want[k])[i];
      const Neighbours nb = bf16_neighbours(w);
      const double zero = grass::bf16_to_float(nb.toward_zero);
      const double spacing = std::fabs(double(grass::bf16_to_float(nb.away)) - zero);
      p_away[k].push_back(spacing == 0 ? 0.0 : std::fabs(double(w) - zero) / spacing);
    }

  for (int k = 0; k < 3; k++) {
    CAPTURE(k);  // 0 param, 1 m, 2 v
    // Mean over seeds minus the fp32 value, in units of the local bf16 spacing. Unbiased rounding
    // leaves only sampling noise: RMS ≈ sqrt(E[f(1-f)] / seeds) ≈ 0.026 (nearest: 0.29).
    double sum_err = 0, sum_sq_err = 0;
    for (int64_t i = 0; i < n; i++) {
      const float w = (*want[k])[i];
      const Neighbours nb = bf16_neighbours(w);
      const double spacing =
          std::fabs(double(grass::bf16_to_float(nb.toward_zero)) - grass::bf16_to_float(nb.away));
      if (spacing == 0) continue;  // w is a bf16 value: nothing to round
      const double err = (sum[k][i] / seeds - w) / spacing;
      sum_err += err;
      sum_sq_err += err * err;
    }
    CHECK(std::fabs(sum_err / n) < 0.01);
    CHECK(std::sqrt(sum_sq_err / n) < 0.05);
    // Independent streams: at each element two streams round away together with the product of
    // their chances, so both[k] is a sum of independent Bernoulli draws with that mean. One shared
    // stream would round away together with the smaller chance: about seeds·n/12 more pairs, over
    // 100 standard deviations here. (A correlation over all pairs, as this test checked before,
    // also sees how the elements' chances co-vary, noise of about 0.005 at n = 4,096 that reached
    // 0.021 in one run.)
    const int k2 = (k + 1) % 3;
    double mean = 0, variance = 0;
    for (int64_t i = 0; i < n; i++) {
      const double q = p_away[k][size_t(i)] * p_away[k2][size_t(i)];
      mean += seeds * q;
      variance += seeds * q * (1 - q);
    }
    const double z = (both[k] - mean) / std::sqrt(variance);
    CAPTURE(k2, both[k], mean, z);
    CHECK(std::fabs(z) < 6);
  }
}

TEST_CASE("gpu sum_squares equals the CPU's double sum and is deterministic", "[gpu]") {
  gputest::TestContext tc;
  // One element, one partial block, and sizes past the fixed grid (grid-stride loops).
  for (const int64_t n : {int64_t(1), int64_t(1000), int64_t(3) * 77 * 5461, int64_t(5000003)}) {
    for (const cuda::GradType gtype : {cuda::GradType::F32, cuda::GradType::BF16}) {
      const bool f32 = gtype == cuda::GradType::F32;
      CAPTURE(n, f32);
      std::vector<float> x = gputest::randn(n);
      if (!f32) x = gputest::bf16_rounded(x);
      DeviceBuffer<float> d_x_f32(f32 ? n : 0);
      DeviceBuffer<bf16> d_x_bf16(f32 ? 0 : n);
      if (f32)
        d_x_f32.upload(x);
      else
        put(d_x_bf16, x);
      const void* d_x = f32 ? static_cast<const void*>(d_x_f32.ptr) : d_x_bf16.ptr;
      DeviceBuffer<double> d_out(1), d_scratch(size_t(cuda::sum_squares_scratch_doubles(n)));
      // it adds to what *acc holds
      auto run = [&] {
        d_out.upload({0.25});
        d_scratch.poison();
        cuda::sum_squares(tc.ctx, d_out.ptr, d_x, gtype, n, d_scratch.ptr);
        return d_out.download()[0];
      };
      const double got = run();
      const double want = 0.25 + ops::sum_squares<float>(x.data(), n);
      // Exact squares summed in double in two orders: ~1e-14 apart; one element more or less
      // would move the sum by ~1/n.
      CHECK(std::fabs(got - want) <= 1e-10 * want);
      const double again = run();
      CHECK(std::memcmp(&got, &again, sizeof got) == 0);
    }
  }
  DeviceBuffer<double> d_out(1), d_scratch(size_t(cuda::sum_squares_scratch_doubles(0)));
  d_out.upload({1.5});
  cuda::sum_squares(tc.ctx, d_out.ptr, /*x=*/nullptr, cuda::GradType::F32, 0, d_scratch.ptr);
  CHECK(d_out.download()[0] == 1.5);  // nothing to sum adds nothing
}

TEST_CASE("gpu f32_to_bf16 rounds to nearest even, bf16_to_f32 widens exactly", "[gpu]") {
  gputest::TestContext tc;
  const float inf = std::numeric_limits<float>::infinity();
  // Random values over many binades, then the cases rounding gets wrong: ties (to even), carries
  // into the exponent, overflow to infinity, subnormals, signed zero, infinities, NaN.
  std::vector<float> x = gputest::randn(100003);
  for (size_t i = 0; i < x.size(); i++) x[i] *= std::ldexp(1.0f, int(i % 61) - 30);
  for (const float special :
       {0x1.01p0f, 0x1.03p0f, -0x1.01p0f, 0x1.ffffp0f, 0x1.fffffep127f, -0x1.fffffep127f, 1e-40f,
        -1e-40f, 0x1p-149f, 0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN()})
    x.push_back(special);
  const int64_t n = int64_t(x.size());
  DeviceBuffer<float> d_x(n);
  DeviceBuffer<bf16> d_bf(n);
  d_x.upload(x);
  d_bf.poison();
  cuda::f32_to_bf16(tc.ctx, d_bf.ptr, d_x.ptr, n);
  const std::vector<bf16> rounded = d_bf.download();
  size_t wrong = 0;
  for (int64_t i = 0; i < n; i++) {
    const uint16_t got = __nv_bfloat16_raw(rounded[i]).x;
    if (std::isnan(x[i]))
      wrong += !std::isnan(grass::bf16_to_float(got));
    else
      wrong += got != grass::float_to_bf16(x[i]);
  }
  CHECK(wrong == 0);

  // Every bf16 bit pattern, widened.
  std::vector<bf16> all(1 << 16);
  for (uint32_t b = 0; b < (1u << 16); b++) {
    __nv_bfloat16_raw raw;
    raw.x = uint16_t(b);
    all[b] = raw;
  }
  DeviceBuffer<bf16> d_all(all.size());
  DeviceBuffer<float> d_wide(all.size());
  d_all.upload(all);
  d_wide.poison();
  cuda::bf16_to_f32(tc.ctx, d_wide.ptr, d_all.ptr, int64_t(all.size()));
  const std::vector<float> wide = d_wide.download();
  wrong = 0;
  for (uint32_t b = 0; b < (1u << 16); b++) {
    const float want = grass::bf16_to_float(uint16_t(b));
    wrong += std::isnan(want) ? !std::isnan(wide[b]) : bits_of_f32(wide[b]) != bits_of_f32(want);
  }
  CHECK(wrong == 0);
}
