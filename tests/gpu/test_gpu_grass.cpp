// GRASS on the GPU (kernels/cuda/grass.cu) against the CPU reference (kernels/cpu/grass.cpp) on
// the same bf16-rounded inputs: the compressed gradient (accumulating), the slice norms, the
// gather, and the sparse Adam step in both storage schemes; rows and columns, with σ sorted and
// repeated (sampling with replacement) and holding the last slice, at a width of 5461.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "src/core/bf16.h"
#include "tests/gpu/gpu_test_util.h"

using namespace grass;
using namespace grass::gputest;
using bf16 = __nv_bfloat16;

namespace {

constexpr int64_t kTokens = 3 * 77;
constexpr int kIn = 5461, kOut = 384, kRank = 37;

// r sorted indices into [0, width) with a pair and a triple of repeats and the last index.
std::vector<int32_t> sigma_with_repeats(int r, int width) {
  static std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int32_t> pick(0, width - 1);
  std::vector<int32_t> sigma(r);
  for (int32_t& s : sigma) s = pick(rng);
  sigma[1] = sigma[0];
  sigma[3] = sigma[4] = sigma[2];
  sigma[5] = width - 1;
  std::sort(sigma.begin(), sigma.end());
  return sigma;
}

// ρ_j in [0.5, ∞): positive, and different per j so a swapped ρ shows.
std::vector<float> random_rho(int r) {
  std::vector<float> rho = randn(r);
  for (float& p : rho) p = 0.5f + std::abs(p);
  return rho;
}

std::vector<float> squares(std::vector<float> x) {
  for (float& v : x) v *= v;
  return x;
}

uint16_t bits(bf16 x) { return std::bit_cast<uint16_t>(x); }

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// A parameter-gradient-shaped device buffer in either storage type, read and written as floats.
struct GradBuffer {
  cuda::GradType gtype;
  DeviceBuffer<float> f32;
  DeviceBuffer<bf16> b16;
  GradBuffer(cuda::GradType type, size_t n)
      : gtype(type), f32(is_f32() ? n : 0), b16(is_f32() ? 0 : n) {}
  bool is_f32() const { return gtype == cuda::GradType::F32; }
  void* ptr() { return is_f32() ? static_cast<void*>(f32.ptr) : static_cast<void*>(b16.ptr); }
  // x as this buffer will hold it
  std::vector<float> representable(const std::vector<float>& x) const {
    return is_f32() ? x : bf16_rounded(x);
  }
  void upload(const std::vector<float>& x) { is_f32() ? f32.upload(x) : b16.upload(to_bf16(x)); }
  void poison() { is_f32() ? f32.poison() : b16.poison(); }
  std::vector<float> download() const { return is_f32() ? f32.download() : to_f32(b16.download()); }
};

// Elements of `got`, stored in bf16 by stochastic rounding, that are not one of the two bf16
// neighbours of `want` (the CPU's fp32 result from `before`): each lies within one bf16 spacing
// of the GPU's own fp32 result, whatever the draws, and that differs from the CPU's by the fp32
// arithmetic's error, a few units of 2^-24 of the magnitudes involved (|before| and the change;
// with cancellation far more than of `want` itself). A statistical bound on the whole vector's
// error is not a promise: with fresh random inputs it fails now and then.
int64_t off_bf16_neighbours(const std::vector<float>& got, const std::vector<float>& want,
                            const std::vector<float>& before) {
  int64_t off = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double spacing = std::max(bf16_spacing(want[i]), bf16_spacing(got[i]));
    const double magnitudes = std::abs(double(before[i])) + std::abs(double(want[i]) - before[i]);
    off += !(std::abs(double(got[i]) - double(want[i])) <= spacing + 1e-5 * magnitudes);
  }
  return off;
}

template <typename T>
void upload(DeviceBuffer<T>& d, const std::vector<T>& x) {
  d.upload(x);
}
void upload(DeviceBuffer<bf16>& d, const std::vector<float>& x) { d.upload(to_bf16(x)); }

// One target's compressed-gradient inputs, fresh and random, on the host and the device: σ (with
// repeats) over `selectable` slices, ρ, dy [kTokens, kOut] and x [kTokens, kIn] (bf16 values).
struct CompressInputs {
  std::vector<int32_t> sigma;
  std::vector<float> rho, dy, x;
  DeviceBuffer<bf16> d_dy, d_x;
  DeviceBuffer<int32_t> d_sigma;
  DeviceBuffer<float> d_rho;
  explicit CompressInputs(int selectable)
      : sigma(sigma_with_repeats(kRank, selectable)), rho(random_rho(kRank)),
        dy(bf16_rounded(randn(kTokens * kOut))), x(bf16_rounded(randn(kTokens * kIn))),
        d_dy(dy.size()), d_x(x.size()), d_sigma(kRank), d_rho(kRank) {
    upload(d_dy, dy);
    upload(d_x, x);
    upload(d_sigma, sigma);
    upload(d_rho, rho);
  }
};

// The Adam hyperparameters of the update tests: step 3 (bias corrections not 1), clipping on,
// weight decay on.
// The update's scalars as the GPU narrows them (fp32), widened exactly for the calls.
struct Hyper {
  float grad_scale = 0.7f, lr = 1e-2f, alpha = 0.25f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f,
        weight_decay = 0.1f;
  int64_t step = 3;
  AdamArgs adam() const {
    return {.grad_scale = grad_scale, .lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps,
            .weight_decay = weight_decay, .step = step};
  }
};

}  // namespace

TEST_CASE("grass: compressed gradient accumulates rho-scaled selected slices", "[gpu]") {
  TestContext tc;
  for (const bool rows : {true, false})
    for (const cuda::GradType gtype : {cuda::GradType::F32, cuda::GradType::BF16}) {
      INFO("rows=" << rows << " fp32=" << (gtype == cuda::GradType::F32));
      const CompressInputs in(rows ? kOut : kIn);
      DeviceBuffer<bf16> scratch(kTokens * kRank);
      scratch.poison();
      const size_t gc_size = size_t(kRank) * (rows ? kIn : kOut);
      GradBuffer gc(gtype, gc_size);
      // The earlier micro-batches' sum, as large as this one's: dropping it fails the bound.
      std::vector<float> want = gc.representable(randn(gc_size, std::sqrt(double(kTokens))));
      gc.upload(want);
      cuda::grass_compressed_grad(tc.ctx, gc.ptr(), gtype, scratch.ptr, in.d_dy.ptr, in.d_x.ptr,
                                  in.d_sigma.ptr, in.d_rho.ptr, kTokens, kIn, kOut, kRank, rows);
      std::vector<float> cpu_scratch(kTokens * kRank);
      ops::grass_compressed_grad<float>(want.data(), cpu_scratch.data(), in.dy.data(),
                                        in.x.data(), in.sigma.data(), in.rho.data(), kTokens, kIn,
                                        kOut, kRank, rows);
      CHECK(rel_error(gc.download(), want) <= 1e-2);
    }
}

TEST_CASE("grass: packed slices out of a weight and back, as the CPU moves them", "[gpu]") {
  // offload.layers' write-back of a streamed GRASS target (model/layer_stream.h): pure copies,
  // so the GPU's values are the CPU reference's on the same bf16 values, exactly, and the unpack
  // writes σ's slices of w alone.
  TestContext tc;
  std::mt19937 rng(std::random_device{}());
  const int out = 70, in = 132;
  for (const bool rows : {true, false}) {
    const int side = rows ? out : in, count = 23;
    std::vector<int32_t> sigma(static_cast<size_t>(side));
    for (int i = 0; i < side; i++) sigma[size_t(i)] = i;
    std::shuffle(sigma.begin(), sigma.end(), rng);
    sigma.resize(size_t(count));
    std::sort(sigma.begin(), sigma.end());
    INFO((rows ? "rows" : "cols"));
    const std::vector<bf16> w = to_bf16(randn(size_t(out) * in)),
                            other = to_bf16(randn(size_t(out) * in));
    const auto bits = [](const std::vector<bf16>& x) { return to_f32(x); };
    const size_t packed = size_t(count) * (rows ? in : out);
    std::vector<float> want(packed), unpacked = bits(other);
    ops::pack_slices(want.data(), bits(w).data(), sigma.data(), count, out, in, rows);
    ops::unpack_slices(unpacked.data(), want.data(), sigma.data(), count, out, in, rows);
    DeviceBuffer<bf16> d_w(w.size()), d_other(other.size()), d_delta(packed);
    DeviceBuffer<int32_t> d_sigma(sigma.size());
    d_w.upload(w);
    d_other.upload(other);
    d_sigma.upload(sigma);
    d_delta.poison();
    cuda::pack_slices(tc.ctx, d_delta.ptr, d_w.ptr, d_sigma.ptr, count, out, in, rows);
    CHECK(bits(d_delta.download()) == want);
    cuda::unpack_slices(tc.ctx, d_other.ptr, d_delta.ptr, d_sigma.ptr, count, out, in, rows);
    CHECK(bits(d_other.download()) == unpacked);
    // the slices are w's, and the rest other's
    const std::vector<float> got = bits(d_other.download()), wb = bits(w), ob = bits(other);
    int64_t from_w = 0;
    for (int o = 0; o < out; o++)
      for (int c = 0; c < in; c++) {
        const int slice = rows ? o : c;
        const bool selected = std::binary_search(sigma.begin(), sigma.end(), slice);
        const size_t e = size_t(o) * in + size_t(c);
        from_w += selected && got[e] == wb[e];
        if (!selected) CHECK(got[e] == ob[e]);
      }
    CHECK(from_w == int64_t(packed));
  }
}

TEST_CASE("grass: the cols gradient from kept columns gives grass_compressed_grad's bits",
          "[gpu]") {
  // What the model does with an input kept as selected columns: the gather in the forward, the
  // GEMM in the backward, against the one call that does both.
  TestContext tc;
  const CompressInputs in(kIn);
  DeviceBuffer<bf16> scratch(kTokens * kRank), xs(kTokens * kRank);
  xs.poison();
  cuda::grass_gather_columns(tc.ctx, xs.ptr, in.d_x.ptr, in.d_sigma.ptr, in.d_rho.ptr, kTokens,
                             kIn, kRank);
  std::vector<float> want_xs(size_t(kTokens) * kRank);  // x·ρ in fp32, rounded once to bf16
  ops::grass_gather_columns<float>(want_xs.data(), in.x.data(), in.sigma.data(), in.rho.data(),
                                   kTokens, kIn, kRank);
  CHECK(same_bits(to_f32(xs.download()), bf16_rounded(want_xs)));
  for (const cuda::GradType gtype : {cuda::GradType::F32, cuda::GradType::BF16}) {
    INFO("fp32=" << (gtype == cuda::GradType::F32));
    const size_t gc_size = size_t(kOut) * kRank;
    GradBuffer whole(gtype, gc_size), kept(gtype, gc_size);
    const std::vector<float> earlier = whole.representable(randn(gc_size));
    whole.upload(earlier);
    kept.upload(earlier);
    scratch.poison();
    cuda::grass_compressed_grad(tc.ctx, whole.ptr(), gtype, scratch.ptr, in.d_dy.ptr, in.d_x.ptr,
                                in.d_sigma.ptr, in.d_rho.ptr, kTokens, kIn, kOut, kRank, false);
    cuda::grass_selected_cols_grad(tc.ctx, kept.ptr(), gtype, in.d_dy.ptr, kOut, xs.ptr, kTokens,
                                   kOut, kRank);
    CHECK(same_bits(whole.download(), kept.download()));
    CHECK_FALSE(same_bits(whole.download(), earlier));
  }
}

TEST_CASE("grass: slice norms match the CPU in double", "[gpu]") {
  TestContext tc;
  const std::vector<float> g = randn(size_t(kOut) * kIn);
  DeviceBuffer<float> d_g(g.size());
  d_g.upload(g);
  for (const bool rows : {true, false}) {
    INFO("rows=" << rows);
    DeviceBuffer<double> norms(rows ? kOut : kIn);
    norms.poison();
    cuda::grass_slice_norms(tc.ctx, norms.ptr, d_g.ptr, kOut, kIn, rows, false);
    std::vector<double> want(norms.n);
    ops::grass_slice_norms<float>(want.data(), g.data(), kOut, kIn, rows);
    const std::vector<double> got = norms.download();
    double worst = 0;  // a NaN (an unwritten norm) becomes the worst
    for (size_t i = 0; i < got.size(); i++) {
      const double err = std::abs(got[i] - want[i]) / want[i];
      if (!(err <= worst)) worst = err;
    }
    CHECK(worst <= 1e-12);
  }
}

TEST_CASE("grass: Adam with an fp32 master moves exactly the selected slices", "[gpu]") {
  TestContext tc;
  const Hyper h;
  for (const bool rows : {true, false}) {
    INFO("rows=" << rows);
    const int width = rows ? kOut : kIn;
    const size_t state = size_t(kRank) * (rows ? kIn : kOut);
    const std::vector<int32_t> sigma = sigma_with_repeats(kRank, width);
    const std::vector<float> rho = random_rho(kRank);
    const std::vector<float> master0 = randn(size_t(kOut) * kIn);
    const std::vector<bf16> param0 = to_bf16(master0);
    const std::vector<float> gc = randn(state), m0 = randn(state, 0.1),
                             v0 = squares(randn(state, 0.1));
    DeviceBuffer<float> d_master(master0.size()), d_gc(state), d_m(state), d_v(state), d_rho(kRank);
    DeviceBuffer<bf16> d_param(param0.size());
    DeviceBuffer<int32_t> d_sigma(kRank);
    upload(d_master, master0);
    upload(d_param, param0);
    upload(d_gc, gc);
    upload(d_m, m0);
    upload(d_v, v0);
    upload(d_sigma, sigma);
    upload(d_rho, rho);
    cuda::grass_adam_update(tc.ctx, d_param.ptr, d_master.ptr, d_gc.ptr, d_m.ptr, d_v.ptr,
                            d_sigma.ptr, d_rho.ptr, kOut, kIn, kRank, rows, h.alpha, h.adam(), 123);

    std::vector<float> w = master0, cpu_gc = gc, m = m0, v = v0;
    ops::grass_adam_update<float>(w.data(), cpu_gc.data(), m.data(), v.data(), sigma.data(),
                                  rho.data(), kOut, kIn, kRank, rows, h.alpha, h.adam());
    CHECK(rel_error(d_m.download(), m) <= 1e-5);
    CHECK(rel_error(d_v.download(), v) <= 1e-5);
    CHECK(same_bits(d_gc.download(), gc));  // read only

    std::vector<char> picked(width, 0);
    for (const int32_t s : sigma) picked[s] = 1;
    const std::vector<float> master = d_master.download();
    const std::vector<bf16> param = d_param.download();
    int64_t unpicked_moved = 0, picked_unmoved = 0, param_not_nearest = 0;
    std::vector<float> change, want_change;
    for (int i = 0; i < kOut; i++)
      for (int c = 0; c < kIn; c++) {
        const size_t e = size_t(i) * kIn + c;
        const bool moved =
            std::bit_cast<uint32_t>(master[e]) != std::bit_cast<uint32_t>(master0[e]);
        if (!picked[rows ? i : c]) {
          unpicked_moved += moved || bits(param[e]) != bits(param0[e]);
          continue;
        }
        // The decay and the step can cancel within fp32 rounding; the CPU then stays put too.
        picked_unmoved += !moved && std::bit_cast<uint32_t>(w[e]) != std::bit_cast<uint32_t>(master0[e]);
        param_not_nearest += bits(param[e]) != bits(__float2bfloat16_rn(master[e]));
        change.push_back(master[e] - master0[e]);
        want_change.push_back(w[e] - master0[e]);
      }
    CHECK(unpicked_moved == 0);
    CHECK(picked_unmoved == 0);
    CHECK(param_not_nearest == 0);
    CHECK(rel_error(change, want_change) <= 1e-3);
  }
}

TEST_CASE("grass: Adam in pure bf16 rounds stochastically and matches the CPU", "[gpu]") {
  TestContext tc;
  Hyper h;
  h.alpha = 1.0f;  // steps well above the bf16 spacing of weights of size 0.01
  for (const bool rows : {true, false}) {
    INFO("rows=" << rows);
    const int width = rows ? kOut : kIn;
    const size_t state = size_t(kRank) * (rows ? kIn : kOut);
    const std::vector<int32_t> sigma = sigma_with_repeats(kRank, width);
    const std::vector<float> rho = random_rho(kRank);
    const std::vector<float> param0 = bf16_rounded(randn(size_t(kOut) * kIn, 0.01));
    const std::vector<float> gc = bf16_rounded(randn(state)), m0 = bf16_rounded(randn(state, 0.1)),
                             v0 = bf16_rounded(squares(randn(state, 0.1)));
    DeviceBuffer<bf16> d_param(param0.size()), d_gc(state), d_m(state), d_v(state);
    DeviceBuffer<int32_t> d_sigma(kRank);
    DeviceBuffer<float> d_rho(kRank);
    upload(d_param, param0);
    upload(d_gc, gc);
    upload(d_m, m0);
    upload(d_v, v0);
    upload(d_sigma, sigma);
    upload(d_rho, rho);
    cuda::grass_adam_update(tc.ctx, d_param.ptr, nullptr, d_gc.ptr, d_m.ptr, d_v.ptr, d_sigma.ptr,
                            d_rho.ptr, kOut, kIn, kRank, rows, h.alpha, h.adam(), 77);

    std::vector<float> w = param0, cpu_gc = gc, m = m0, v = v0;
    ops::grass_adam_update<float>(w.data(), cpu_gc.data(), m.data(), v.data(), sigma.data(),
                                  rho.data(), kOut, kIn, kRank, rows, h.alpha, h.adam());
    const std::vector<float> got_m = to_f32(d_m.download());
    CHECK(rel_error(got_m, m) <= 1e-2);
    CHECK(rel_error(to_f32(d_v.download()), v) <= 1e-2);
    // Stochastic rounding leaves the nearest bf16 for about a quarter of the values (E[min(p,
    // 1-p)] over a uniform position p between neighbours); round-to-nearest for none.
    int64_t not_nearest = 0;
    for (size_t i = 0; i < m.size(); i++)
      not_nearest += bits(__float2bfloat16_rn(got_m[i])) != bits(__float2bfloat16_rn(m[i]));
    const double fraction = double(not_nearest) / double(m.size());
    CHECK(fraction >= 0.15);
    CHECK(fraction <= 0.35);

    std::vector<char> picked(width, 0);
    for (const int32_t s : sigma) picked[s] = 1;
    const std::vector<float> param = to_f32(d_param.download());
    int64_t unpicked_moved = 0;
    std::vector<float> change, want_change;
    for (int i = 0; i < kOut; i++)
      for (int c = 0; c < kIn; c++) {
        const size_t e = size_t(i) * kIn + c;
        if (!picked[rows ? i : c]) {
          unpicked_moved += std::bit_cast<uint32_t>(param[e]) != std::bit_cast<uint32_t>(param0[e]);
          continue;
        }
        change.push_back(param[e] - param0[e]);
        want_change.push_back(w[e] - param0[e]);
      }
    CHECK(unpicked_moved == 0);
    CHECK(off_bf16_neighbours(param, w, param0) == 0);
    // and the update happened (a missing one has error 1; stochastic rounding's is near 1e-2)
    CHECK(rel_error(change, want_change) <= 5e-2);
  }
}

TEST_CASE("grass: the proximal term and its anchor as the CPU's, in both storage schemes", "[gpu]") {
  TestContext tc;
  Hyper h;
  h.alpha = 1.0f;
  const float coef = 2.5f;
  for (const bool pure : {false, true})
    for (const bool rows : {true, false})
      for (const bool reset : {true, false}) {
        INFO((pure ? "pure bf16" : "fp32 master") << ", rows=" << rows << ", reset=" << reset);
        const auto stored = [&](const std::vector<float>& x) { return pure ? bf16_rounded(x) : x; };
        const int width = rows ? kOut : kIn;
        const size_t state = size_t(kRank) * (rows ? kIn : kOut);
        const std::vector<int32_t> sigma = sigma_with_repeats(kRank, width);
        const std::vector<float> rho = random_rho(kRank);
        const std::vector<float> w0 = stored(randn(size_t(kOut) * kIn, 0.1));
        const std::vector<float> gc = stored(randn(state)), m0 = stored(randn(state, 0.1)),
                                 v0 = stored(squares(randn(state, 0.1)));
        std::vector<float> anchor0(state);  // near the selected slices' weights
        const auto slice_element = [&](const std::vector<float>& w, size_t i) {
          const int64_t j = rows ? int64_t(i) / kIn : int64_t(i) % kRank;
          const int64_t e = rows ? int64_t(i) % kIn : int64_t(i) / kRank;
          return w[size_t(rows ? sigma[j] * int64_t(kIn) + e : e * kIn + sigma[j])];
        };
        const std::vector<float> noise = randn(state, 0.05);
        for (size_t i = 0; i < state; i++) anchor0[i] = slice_element(w0, i) + noise[i];
        anchor0 = stored(anchor0);
        AdamArgs args = h.adam();
        args.proximal_coef = coef;
        args.anchor_reset = reset;
        std::vector<float> w, m, v, anchor;
        DeviceBuffer<int32_t> d_sigma(kRank);
        DeviceBuffer<float> d_rho(kRank);
        upload(d_sigma, sigma);
        upload(d_rho, rho);
        DeviceBuffer<bf16> d_param(w0.size());
        upload(d_param, w0);
        if (pure) {
          DeviceBuffer<bf16> d_gc(state), d_m(state), d_v(state), d_anchor(state);
          upload(d_gc, gc), upload(d_m, m0), upload(d_v, v0), upload(d_anchor, anchor0);
          args.anchor = d_anchor.ptr;
          cuda::grass_adam_update(tc.ctx, d_param.ptr, nullptr, d_gc.ptr, d_m.ptr, d_v.ptr,
                                  d_sigma.ptr, d_rho.ptr, kOut, kIn, kRank, rows, h.alpha, args, 5);
          w = to_f32(d_param.download()), m = to_f32(d_m.download()), v = to_f32(d_v.download());
          anchor = to_f32(d_anchor.download());
        } else {
          DeviceBuffer<float> d_master(w0.size()), d_gc(state), d_m(state), d_v(state),
              d_anchor(state);
          upload(d_master, w0), upload(d_gc, gc), upload(d_m, m0), upload(d_v, v0),
              upload(d_anchor, anchor0);
          args.anchor = d_anchor.ptr;
          cuda::grass_adam_update(tc.ctx, d_param.ptr, d_master.ptr, d_gc.ptr, d_m.ptr, d_v.ptr,
                                  d_sigma.ptr, d_rho.ptr, kOut, kIn, kRank, rows, h.alpha, args, 5);
          w = d_master.download(), m = d_m.download(), v = d_v.download(), anchor = d_anchor.download();
        }
        std::vector<float> want_w = w0, cpu_gc = gc, want_m = m0, want_v = v0, want_anchor = anchor0;
        args.anchor = want_anchor.data();
        ops::grass_adam_update<float>(want_w.data(), cpu_gc.data(), want_m.data(), want_v.data(),
                                      sigma.data(), rho.data(), kOut, kIn, kRank, rows, h.alpha,
                                      args);
        if (reset) {  // every occurrence's anchor holds its slice's weight before the step
          int64_t differ = 0;
          for (size_t i = 0; i < state; i++)
            differ += std::bit_cast<uint32_t>(anchor[i]) != std::bit_cast<uint32_t>(slice_element(w0, i));
          CHECK(differ == 0);
        } else {
          CHECK(same_bits(anchor, anchor0));
        }
        const double tolerance = pure ? 1e-2 : 1e-5;
        CHECK(rel_error(m, want_m) <= tolerance);
        CHECK(rel_error(v, want_v) <= tolerance);
        std::vector<float> change(w0.size()), want_change(w0.size());
        for (size_t e = 0; e < w0.size(); e++) {
          change[e] = w[e] - w0[e];
          want_change[e] = want_w[e] - w0[e];
        }
        if (pure) {  // each weight a bf16 neighbour of the fp32 result, and the update applied
          CHECK(off_bf16_neighbours(w, want_w, w0) == 0);
          CHECK(rel_error(change, want_change) <= 5e-2);
        } else {
          CHECK(rel_error(change, want_change) <= 1e-3);
        }
      }
}

TEST_CASE("grass: the same calls twice give the same bits", "[gpu]") {
  TestContext tc;
  const Hyper h;
  const bool rows = false;  // the scattered case: columns of w, repeated
  const size_t state = size_t(kOut) * kRank;
  const std::vector<int32_t> sigma = sigma_with_repeats(kRank, kIn);
  const std::vector<float> rho = random_rho(kRank);
  const std::vector<float> dy = randn(kTokens * kOut), x = randn(kTokens * kIn);
  const std::vector<float> param0 = randn(size_t(kOut) * kIn, 0.01), gc0 = randn(state),
                           m0 = randn(state, 0.1), v0 = squares(randn(state, 0.1));
  DeviceBuffer<bf16> d_dy(dy.size()), d_x(x.size()), scratch(kTokens * kRank);
  DeviceBuffer<bf16> d_param(param0.size()), d_gc(state), d_m(state), d_v(state);
  DeviceBuffer<int32_t> d_sigma(kRank);
  DeviceBuffer<float> d_rho(kRank), g(size_t(kOut) * kIn);
  DeviceBuffer<double> norms(kIn);
  upload(d_dy, dy);
  upload(d_x, x);
  upload(d_sigma, sigma);
  upload(d_rho, rho);
  g.upload(randn(g.n));

  std::vector<std::vector<bf16>> gc(2), param(2), m(2), v(2);
  std::vector<std::vector<double>> norm(2);
  for (int run = 0; run < 2; run++) {
    upload(d_gc, gc0);
    cuda::grass_compressed_grad(tc.ctx, d_gc.ptr, cuda::GradType::BF16, scratch.ptr, d_dy.ptr,
                                d_x.ptr, d_sigma.ptr, d_rho.ptr, kTokens, kIn, kOut, kRank, rows);
    gc[run] = d_gc.download();
    upload(d_param, param0);
    upload(d_m, m0);
    upload(d_v, v0);
    cuda::grass_adam_update(tc.ctx, d_param.ptr, nullptr, d_gc.ptr, d_m.ptr, d_v.ptr, d_sigma.ptr,
                            d_rho.ptr, kOut, kIn, kRank, rows, h.alpha, h.adam(), 5);
    param[run] = d_param.download();
    m[run] = d_m.download();
    v[run] = d_v.download();
    norms.poison();
    cuda::grass_slice_norms(tc.ctx, norms.ptr, g.ptr, kOut, kIn, rows, false);
    norm[run] = norms.download();
  }
  CHECK(same_bits(gc[0], gc[1]));
  CHECK(same_bits(param[0], param[1]));
  CHECK(same_bits(m[0], m[1]));
  CHECK(same_bits(v[0], v[1]));
  CHECK(same_bits(norm[0], norm[1]));
}

// ---- targets formed together (Grass::accumulate_stack) -----------------------------------------

namespace {

// A stack of rows targets that read one x [N, in], their dy packed side by side [N, Σ out] as the
// backward leaves them for q, k and v: each target's G_C alone (its own contiguous dy, σ, ρ, its
// slices only) and the stack's (the packed dy, every target's σ offset by the columns before
// it, padded to r slots with ρ = 0: Grass::store_stack_selection's layout) from the same start.
struct RowsStack {
  int64_t N;
  int in, r;
  std::vector<int> out, slices;
  std::vector<std::vector<int32_t>> sigma;
  std::vector<std::vector<float>> rho, dy;  // per target; dy bf16 values
  std::vector<std::vector<float>> gathered;  // per target [N, slices]: bf16(dy[:, σ]·ρ), the GEMM's
  std::vector<float> x, packed;
  std::vector<int32_t> stack_sigma;
  std::vector<float> stack_rho;

  RowsStack(int64_t N_, int in_, int r_, std::vector<int> out_) : N(N_), in(in_), r(r_), out(out_) {
    x = bf16_rounded(randn(size_t(N) * in));
    int width = 0;
    for (size_t t = 0; t < out.size(); t++) {
      // the first draws with repeats (the op adds them up), the others merged to fewer slices
      const int s = t == 0 ? r : r - 3 - int(t);
      slices.push_back(s);
      std::vector<int32_t> sg = sigma_with_repeats(s, out[t]);
      if (t > 0) {  // distinct, as a merge of repeated draws leaves them
        sg.erase(std::unique(sg.begin(), sg.end()), sg.end());
        slices.back() = int(sg.size());
      }
      sigma.push_back(sg);
      rho.push_back(random_rho(slices.back()));
      dy.push_back(bf16_rounded(randn(size_t(N) * out[t])));
      std::vector<float> g(size_t(N) * slices.back());
      ops::grass_gather_columns<float>(g.data(), dy.back().data(), sigma.back().data(),
                                       rho.back().data(), N, out[t], slices.back());
      gathered.push_back(bf16_rounded(g));
      width += out[t];
    }
    packed.resize(size_t(N) * width);
    for (int64_t n = 0, offset = 0; n < N; n++, offset = 0)
      for (size_t t = 0; t < out.size(); offset += out[t], t++)
        std::copy_n(&dy[t][size_t(n * out[t])], out[t], &packed[size_t(n * width + offset)]);
    for (size_t t = 0, offset = 0; t < out.size(); offset += size_t(out[t]), t++)
      for (int j = 0; j < r; j++) {
        stack_sigma.push_back(int32_t(offset) + sigma[t][size_t(j < slices[t] ? j : 0)]);
        stack_rho.push_back(j < slices[t] ? rho[t][size_t(j)] : 0.0f);
      }
  }
  int width() const { return int(packed.size() / size_t(N)); }
  size_t targets() const { return out.size(); }
  // Σ_n |gathered[n, j]·x[n, c]| of target t's element (j, c): the terms each GEMM sums.
  double magnitude(size_t t, int j, int c) const {
    double s = 0;
    for (int64_t n = 0; n < N; n++)
      s += std::abs(double(gathered[t][size_t(n * slices[t] + j)]) * x[size_t(n * in + c)]);
    return s;
  }
};

// Elements of target t's G_C [slices, in] where the stack's `got` and the target's own `want`
// (from the same start `start`) differ by more than two orders of the same N fp32 sums may:
// 2·γ(N+1)·Σ|terms|, the start's rounding, and in bf16 one spacing (two fp32 values that close
// may round to neighbours). Without `bound` any difference counts.
int64_t stack_mismatches(const RowsStack& s, size_t t, const std::vector<float>& got,
                         const std::vector<float>& want, const std::vector<float>& start,
                         bool bf16_output, bool bound) {
  int64_t off = 0;
  for (int j = 0; j < s.slices[t]; j++)
    for (int c = 0; c < s.in; c++) {
      const size_t i = size_t(j) * s.in + c;
      double allowed = 0;
      if (bound) {
        const double terms = s.magnitude(t, j, c) + std::abs(double(start[i]));
        allowed = (2.0 * double(s.N + 1) + 2.0) * std::ldexp(1.0, -24) * terms * 1.01;
        if (bf16_output) allowed += bf16_spacing(std::max(terms, 1e-30));
      }
      off += !(std::abs(double(got[i]) - double(want[i])) <= allowed);
    }
  return off;
}

}  // namespace

TEST_CASE("grass: a rows stack's one GEMM gives each target's G_C, bit for bit where the "
          "emulated cuBLAS sums in the same order, else within the bound of another shape",
          "[gpu]") {
  // The emulator's cuBLAS picks its order per GEMM (tests/cuda_emu/cublas.cpp): cublasGemmEx's
  // fixed K tile unless every operand is 16-byte aligned, else cuBLASLt's, which also splits K
  // for outputs of at most 128 x 128 with K >= 1024. The stack's GEMM [count·r, N]·[N, in] and a
  // target's own [slices, N]·[N, in] (the gathered columns' rows slices apart) sum in the same
  // order when both take the same route and split alike: there bit for bit, else the bound. A
  // target whose repeats merged to a slice count off a multiple of 8 falls to cublasGemmEx alone.
  // On a GPU cuBLASLt's heuristic chooses a kernel per shape, so there the bound is the claim.
  const auto emulated_order = [](int64_t m, int64_t N, int in) {
    if ((m * 2) % 16 != 0 || (int64_t(in) * 2) % 16 != 0) return 0;  // cublasGemmEx
    return 1 + (m * in <= 128 * 128 && N >= 1024 ? int(std::min<int64_t>(8, N / 512)) : 1);
  };
  TestContext tc;
  struct Shape {
    int64_t N;
    int in, r;
  };
  for (const Shape shape : {Shape{231, 512, 37},     // 2-byte aligned rows: cublasGemmEx
                            Shape{231, 512, 40},     // 16-byte: cuBLASLt (merged targets not)
                            Shape{1100, 128, 48}})   // the unmerged target splits K, the stack not
    for (const cuda::GradType gtype : {cuda::GradType::F32, cuda::GradType::BF16}) {
      INFO("N=" << shape.N << " in=" << shape.in << " r=" << shape.r
                << " fp32=" << (gtype == cuda::GradType::F32));
      const RowsStack s(shape.N, shape.in, shape.r, {256, 64, 64});  // q, k, v with 4:1 GQA
      const size_t block = size_t(s.r) * s.in;  // a target's G_C capacity
      // the earlier micro-batches' sums, the slots no slice fills zero
      std::vector<std::vector<float>> start(s.targets());
      std::vector<float> stack_start(block * s.targets(), 0.0f);
      GradBuffer stacked(gtype, stack_start.size());
      for (size_t t = 0; t < s.targets(); t++) {
        start[t] = stacked.representable(randn(size_t(s.slices[t]) * s.in, std::sqrt(double(s.N))));
        std::copy(start[t].begin(), start[t].end(), stack_start.begin() + ptrdiff_t(t * block));
      }
      stacked.upload(stack_start);
      DeviceBuffer<bf16> d_packed(s.packed.size()), d_x(s.x.size()),
          scratch(size_t(s.N) * s.r * s.targets());
      DeviceBuffer<int32_t> d_sigma(s.stack_sigma.size());
      DeviceBuffer<float> d_rho(s.stack_rho.size());
      upload(d_packed, s.packed);
      upload(d_x, s.x);
      upload(d_sigma, s.stack_sigma);
      upload(d_rho, s.stack_rho);
      scratch.poison();
      cuda::grass_compressed_grad(tc.ctx, stacked.ptr(), gtype, scratch.ptr, d_packed.ptr, d_x.ptr,
                                  d_sigma.ptr, d_rho.ptr, s.N, s.in, s.width(),
                                  s.r * int(s.targets()), true);
      const std::vector<float> got = stacked.download();
      for (size_t t = 0; t < s.targets(); t++) {
        INFO("target " << t << " of " << s.targets() << ", " << s.slices[t] << " slices");
        GradBuffer alone(gtype, start[t].size());
        alone.upload(start[t]);
        DeviceBuffer<bf16> d_dy(s.dy[t].size()), own_scratch(size_t(s.N) * s.slices[t]);
        DeviceBuffer<int32_t> own_sigma(s.sigma[t].size());
        DeviceBuffer<float> own_rho(s.rho[t].size());
        upload(d_dy, s.dy[t]);
        upload(own_sigma, s.sigma[t]);
        upload(own_rho, s.rho[t]);
        cuda::grass_compressed_grad(tc.ctx, alone.ptr(), gtype, own_scratch.ptr, d_dy.ptr, d_x.ptr,
                                    own_sigma.ptr, own_rho.ptr, s.N, s.in, s.out[t], s.slices[t],
                                    true);
        const std::vector<float> want = alone.download();
        const std::vector<float> got_t(got.begin() + ptrdiff_t(t * block),
                                       got.begin() + ptrdiff_t(t * block + want.size()));
        CHECK_FALSE(same_bits(want, start[t]));  // it added something
        const bool same_order = emulated_order(s.slices[t], s.N, s.in) ==
                                emulated_order(int64_t(s.r) * int(s.targets()), s.N, s.in);
        INFO((same_order ? "the same order: bit for bit" : "another order: the bound"));
        CHECK(stack_mismatches(s, t, got_t, want, start[t], gtype == cuda::GradType::BF16,
                               !same_order) == 0);
        // the slots no slice fills stay zero
        CHECK(std::all_of(got.begin() + ptrdiff_t(t * block + want.size()),
                          got.begin() + ptrdiff_t((t + 1) * block), [](float v) { return v == 0.0f; }));
      }
    }
}

TEST_CASE("grass: a cols stack's targets read their dy in place from the packed one, with the "
          "contiguous dy's bits", "[gpu]") {
  // gate and up: each its own GEMM [out, N]·[N, r], dy read with rows Σ out apart. The emulated
  // cuBLAS orders a sum by shape and alignment, not by the leading dimension, and both layouts
  // here are 16-byte aligned: the same bits. (On a GPU another lda may get another kernel: the
  // bound of rows stacks' test.)
  TestContext tc;
  const int out = 384, count = 2, width = count * out;
  for (const cuda::GradType gtype : {cuda::GradType::F32, cuda::GradType::BF16}) {
    INFO("fp32=" << (gtype == cuda::GradType::F32));
    const std::vector<float> packed = bf16_rounded(randn(size_t(kTokens) * width));
    DeviceBuffer<bf16> d_packed(packed.size());
    upload(d_packed, packed);
    for (int t = 0; t < count; t++) {
      const CompressInputs in(kIn);
      std::vector<float> dy_t(size_t(kTokens) * out);
      for (int64_t n = 0; n < kTokens; n++)
        std::copy_n(&packed[size_t(n * width + t * out)], out, &dy_t[size_t(n * out)]);
      DeviceBuffer<bf16> d_dy(dy_t.size()), xs(size_t(kTokens) * kRank);
      upload(d_dy, dy_t);
      cuda::grass_gather_columns(tc.ctx, xs.ptr, in.d_x.ptr, in.d_sigma.ptr, in.d_rho.ptr, kTokens,
                                 kIn, kRank);
      const size_t gc_size = size_t(out) * kRank;
      GradBuffer in_place(gtype, gc_size), contiguous(gtype, gc_size);
      const std::vector<float> earlier = in_place.representable(randn(gc_size));
      in_place.upload(earlier);
      contiguous.upload(earlier);
      cuda::grass_selected_cols_grad(tc.ctx, in_place.ptr(), gtype, d_packed.ptr + t * out, width,
                                     xs.ptr, kTokens, out, kRank);
      cuda::grass_selected_cols_grad(tc.ctx, contiguous.ptr(), gtype, d_dy.ptr, out, xs.ptr,
                                     kTokens, out, kRank);
      CHECK(same_bits(in_place.download(), contiguous.download()));
      CHECK_FALSE(same_bits(in_place.download(), earlier));
    }
  }
}
