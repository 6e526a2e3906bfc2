// 8-bit blockwise quantization on the GPU (kernels/cuda/quant8.cu) against the CPU reference
// (kernels/cpu/quant8.cpp), code for code and bit for bit: issue 27's "same codes on the CPU and
// the GPU" over values that include 0 and -0, denormals, each block's ±absmax, NaN and ±Inf,
// blocks spanning magnitudes from 1e-30 to 1e30, an all-zero block and a last, shorter block.
// 10⁷ values on a GPU, 10⁶ on the emulator (its fibers are slower than a GPU's threads).
// Then the 8-bit AdamW and GRASS steps (kernels/cuda/adamw.cu, grass.cu) against their CPU ops
// in both storage schemes: codes, absmax and weights bit for bit (every rounding of the step is
// written out, so no compiler's contraction separates them; the emulator checks both builds).
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"
#include "kernels/quant8.h"
#include "tests/gpu/gpu_test_util.h"

#if __has_include(<cuda_emu.h>)
constexpr int64_t kValues = 1000000;
#else
constexpr int64_t kValues = 10000000;
#endif

using namespace grass;
using namespace grass::gputest;

namespace {

// Fresh values: Gaussian blocks whose scale is 10^u, u uniform in [-30, 30], and the special
// values at random places (each block of 256 starts with a new scale).
std::vector<float> awkward_values(int64_t n) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-30.0f, 30.0f);
  std::uniform_int_distribution<int> special(0, 99);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f, -0.0f, 1e-40f, -3e-42f, std::numeric_limits<float>::quiet_NaN(),
                            inf, -inf, std::numeric_limits<float>::denorm_min()};
  std::vector<float> x(static_cast<size_t>(n));
  float scale = 1.0f;
  for (int64_t i = 0; i < n; i++) {
    if (i % 256 == 0) scale = std::pow(10.0f, exponent(rng));
    x[size_t(i)] = normal(rng) * scale;
    const int s = special(rng);
    if (s < 8) x[size_t(i)] = specials[s];
  }
  for (int64_t i = 512; i < 768 && i < n; i++) x[size_t(i)] = 0.0f;  // an all-zero block of 256
  return x;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The first element whose bits differ, where any NaN equals any NaN (-1: none). A block whose
// absmax is ±Inf decodes its zero code as 0·Inf, a NaN whose bits are 0xFFC00000 on x86 and
// 0x7FFFFFFF on a GPU (seen on an H100).
int64_t first_difference_any_nan(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); i++)
    if (!(std::isnan(a[i]) && std::isnan(b[i])) &&
        std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]))
      return int64_t(i);
  return -1;
}

}  // namespace

TEST_CASE("quant8: the GPU's codes, absmax and decoded values are the CPU's, bit for bit",
          "[gpu][quant8]") {
  TestContext tc;
  const int64_t n = kValues + 77;  // the last block shorter for every block size below
  const std::vector<float> x = awkward_values(n);
  DeviceBuffer<float> d_x(x.size()), d_back(x.size());
  DeviceBuffer<uint8_t> d_codes(x.size());
  d_x.upload(x);
  for (const bool is_signed : {true, false})
    for (const int block : {256, 2048, 100}) {
      INFO((is_signed ? "signed" : "unsigned") << " map, blocks of " << block);
      const Quant8Map map = dynamic_quant8_map(is_signed);
      const int64_t blocks = (n + block - 1) / block;
      std::vector<float> input = x;
      if (!is_signed)
        for (float& v : input) v = std::fabs(v);
      d_x.upload(input);
      DeviceBuffer<float> d_absmax(static_cast<size_t>(blocks));
      d_codes.poison();
      d_absmax.poison();
      d_back.poison();
      cuda::quantize_blockwise(tc.ctx, map, d_x.ptr, n, block, d_codes.ptr, d_absmax.ptr);
      cuda::dequantize_blockwise(tc.ctx, map, d_codes.ptr, d_absmax.ptr, n, block, d_back.ptr);
      std::vector<uint8_t> codes(x.size());
      std::vector<float> absmax(static_cast<size_t>(blocks)), back(x.size());
      ops::quantize_blockwise(map, input.data(), n, block, codes.data(), absmax.data());
      ops::dequantize_blockwise(map, codes.data(), absmax.data(), n, block, back.data());
      const std::vector<uint8_t> got = d_codes.download();
      int64_t differ = 0;
      for (int64_t i = 0; i < n; i++) differ += got[size_t(i)] != codes[size_t(i)];
      CHECK(differ == 0);
      CHECK(same_bits(d_absmax.download(), absmax));
      const std::vector<float> got_back = d_back.download();
      const int64_t at = first_difference_any_nan(got_back, back);
      INFO("first decoded value that differs: " << at << (at >= 0 ? ": GPU " : "")
           << (at >= 0 ? got_back[size_t(at)] : 0.0f) << (at >= 0 ? ", CPU " : "")
           << (at >= 0 ? back[size_t(at)] : 0.0f));
      CHECK(at == -1);
      if (block == 256) CHECK(absmax[2] == 0.0f);  // the all-zero block
    }
}

namespace {

// Moments as after some training, quantized on the CPU: m ~ gradients, v ~ their squares, with a
// reset (all-zero) block at elements [256, 512).
struct Q8Moments {
  std::vector<uint8_t> m, v;
  std::vector<float> absmax_m, absmax_v;
};
Q8Moments trained_moments(int64_t n, int block) {
  const size_t count = static_cast<size_t>(n);
  std::vector<float> m = randn(count, 0.01), v = randn(count, 0.01);
  for (float& x : v) x = x * x + 1e-9f;
  for (int64_t i = 256; i < 512 && i < n; i++) m[size_t(i)] = v[size_t(i)] = 0.0f;
  const size_t blocks = size_t((n + block - 1) / block);
  Q8Moments q{std::vector<uint8_t>(count), std::vector<uint8_t>(count),
              std::vector<float>(blocks), std::vector<float>(blocks)};
  ops::quantize_blockwise(quant8_map(true), m.data(), n, block, q.m.data(), q.absmax_m.data());
  ops::quantize_blockwise(quant8_map(false), v.data(), n, block, q.v.data(), q.absmax_v.data());
  return q;
}

// The GPU's requantized moments against the CPU's, bit for bit: the moment updates write every
// rounding out (adam_moments_rn), so neither side's compiler can contract them differently.
void check_moments(const Q8Moments& got, const Q8Moments& want) {
  CHECK(same_bits(got.absmax_m, want.absmax_m));
  CHECK(same_bits(got.absmax_v, want.absmax_v));
  for (const bool first : {true, false}) {
    const std::vector<uint8_t>& a = first ? got.m : got.v;
    const std::vector<uint8_t>& b = first ? want.m : want.v;
    int64_t differ = 0;
    for (size_t i = 0; i < a.size(); i++) differ += a[i] != b[i];
    INFO((first ? "m" : "v") << ": " << differ << " codes differ from the CPU's");
    CHECK(differ == 0);
  }
}

}  // namespace

TEST_CASE("gpu adamw q8: the CPU's 8-bit step in both storage schemes", "[gpu][quant8]") {
  TestContext tc;
  const int64_t n = 100003;
  const size_t count = 100003;
  const AdamArgs a{.grad_scale = 0.7, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                   .weight_decay = 0.1, .step = 4};
  for (const int block : {256, 64, 4096})
    for (const bool pure : {false, true}) {
      INFO("blocks of " << block << (pure ? ", pure bf16" : ", bf16-mixed"));
      const Q8Moments start = trained_moments(n, block);
      std::vector<float> p0 = randn(count, 0.1), g = randn(count, 0.01);
      g[7] = std::numeric_limits<float>::quiet_NaN();
      g[8] = std::numeric_limits<float>::infinity();
      for (int64_t i = 256; i < 512; i++) g[size_t(i)] = 0.0f;  // the reset block gets none
      if (pure) {
        p0 = bf16_rounded(p0);
        g = bf16_rounded(g);
      }
      const size_t blocks = start.absmax_m.size();
      DeviceBuffer<uint8_t> d_m(count), d_v(count);
      DeviceBuffer<float> d_am(blocks), d_av(blocks), d_master(count), d_gf(count);
      DeviceBuffer<cuda::bf16> d_param(count), d_gb(count);
      d_m.upload(start.m);
      d_v.upload(start.v);
      d_am.upload(start.absmax_m);
      d_av.upload(start.absmax_v);
      const uint64_t seed = 77;
      const Quant8Moments dq{.m = d_m.ptr, .v = d_v.ptr, .absmax_m = d_am.ptr, .absmax_v = d_av.ptr,
                             .block = block};
      if (pure) {
        d_param.upload(to_bf16(p0));
        d_gb.upload(to_bf16(g));
        cuda::adamw_update_q8(tc.ctx, d_param.ptr, nullptr, d_gb.ptr, dq, n, a, seed);
      } else {
        d_master.upload(p0);
        d_gf.upload(g);
        d_param.poison();
        cuda::adamw_update_q8(tc.ctx, d_param.ptr, d_master.ptr, d_gf.ptr, dq, n, a, seed);
      }
      // the CPU: the same step, in fp32, then the same rounding of the weight
      Q8Moments want = start;
      std::vector<float> p = p0;
      ops::adamw_update_q8(p.data(), g.data(),
                           {.m = want.m.data(), .v = want.v.data(), .absmax_m = want.absmax_m.data(),
                            .absmax_v = want.absmax_v.data(), .block = block},
                           n, a);
      const Q8Moments got{d_m.download(), d_v.download(), d_am.download(), d_av.download()};
      check_moments(got, want);
      const std::vector<float> param = to_f32(d_param.download());
      CHECK(param[7] == (pure ? p0[7] : float(bf16_rounded({p0[7]})[0])));  // NaN: left alone
      // the weights too: the same fp32 step (its roundings written out), the same draws
      if (pure) {
        std::vector<float> rounded = p;
        ops::stochastic_round_to_bf16(rounded.data(), n, rounding_stream_seed(seed, a.step, kRoundWeight));
        CHECK(same_bits(param, rounded));
        CHECK(rel_error(param, p) <= 1e-2);
      } else {
        const std::vector<float> master = d_master.download();
        CHECK(same_bits(master, p));
        CHECK(same_bits(d_param.download(), to_bf16(master)));
      }
    }
}

TEST_CASE("gpu grass q8: the CPU's 8-bit step, rows and columns, flat and per feature",
          "[gpu][quant8]") {
  TestContext tc;
  const int out = 160, in = 136, r = 40;
  const AdamArgs a{.grad_scale = 0.7, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                   .weight_decay = 0.1, .step = 2};
  std::mt19937_64 rng(std::random_device{}());
  for (const bool rows : {true, false})
    for (const bool by_columns : {false, true})
      for (const bool pure : {false, true}) {
        INFO((rows ? "rows" : "cols") << (by_columns ? ", per feature" : ", flat")
                                      << (pure ? ", pure bf16" : ", bf16-mixed"));
        const int block = 64;
        const Quant8Layout L = projected_quant8_layout(out, in, r, rows, block, by_columns);
        const int64_t n = L.rows * L.cols;
        const size_t count = static_cast<size_t>(n), weights = size_t(out) * in, slices = size_t(r);
        // moments quantized per the layout on the CPU (a flat AdamW-style start, then reblocked)
        Q8Moments start{std::vector<uint8_t>(count), std::vector<uint8_t>(count),
                        std::vector<float>(size_t(L.blocks())), std::vector<float>(size_t(L.blocks()))};
        std::vector<float> m0 = randn(count, 0.01), v0 = randn(count, 0.01);
        for (float& x : v0) x = x * x + 1e-9f;
        for (int64_t b = 0; b < L.blocks(); b++)
          for (const bool first : {true, false}) {
            const std::vector<float>& x = first ? m0 : v0;
            float am = 0;
            for (int k = 0; k < block && L.index(b, k) >= 0; k++) am = std::fmax(am, std::fabs(x[size_t(L.index(b, k))]));
            (first ? start.absmax_m : start.absmax_v)[size_t(b)] = am;
            for (int k = 0; k < block && L.index(b, k) >= 0; k++)
              (first ? start.m : start.v)[size_t(L.index(b, k))] = quant8_encode(quant8_map(first), x[size_t(L.index(b, k))], am);
          }
        std::vector<int32_t> sigma(size_t(rows ? out : in));
        for (size_t i = 0; i < sigma.size(); i++) sigma[i] = int32_t(i);
        std::shuffle(sigma.begin(), sigma.end(), rng);
        sigma.resize(size_t(r));
        std::sort(sigma.begin(), sigma.end());
        std::vector<float> scale(size_t(r), 1.0f);
        scale[3] = 2.0f;
        std::vector<float> w0 = randn(weights, 0.1), gc = randn(count, 0.01);
        gc[5] = std::numeric_limits<float>::quiet_NaN();
        if (pure) {
          w0 = bf16_rounded(w0);
          gc = bf16_rounded(gc);
        }
        DeviceBuffer<uint8_t> d_m(count), d_v(count);
        DeviceBuffer<float> d_am(start.absmax_m.size()), d_av(start.absmax_v.size()), d_master(weights),
            d_gf(count), d_scale(slices);
        DeviceBuffer<cuda::bf16> d_param(weights), d_gb(count);
        DeviceBuffer<int32_t> d_sigma(slices);
        d_m.upload(start.m);
        d_v.upload(start.v);
        d_am.upload(start.absmax_m);
        d_av.upload(start.absmax_v);
        d_sigma.upload(sigma);
        d_scale.upload(scale);
        const uint64_t seed = 99;
        const Quant8Moments dq{.m = d_m.ptr, .v = d_v.ptr, .absmax_m = d_am.ptr, .absmax_v = d_av.ptr,
                               .block = block};
        d_param.upload(to_bf16(w0));
        if (pure) {
          d_gb.upload(to_bf16(gc));
          cuda::grass_adam_update_q8(tc.ctx, d_param.ptr, nullptr, d_gb.ptr, dq, by_columns,
                                     d_sigma.ptr, d_scale.ptr, out, in, r, rows, 0.25, a, seed);
        } else {
          d_master.upload(w0);
          d_gf.upload(gc);
          cuda::grass_adam_update_q8(tc.ctx, d_param.ptr, d_master.ptr, d_gf.ptr, dq, by_columns,
                                     d_sigma.ptr, d_scale.ptr, out, in, r, rows, 0.25, a, seed);
        }
        Q8Moments want = start;
        std::vector<float> w = w0;
        ops::grass_adam_update_q8(w.data(), gc.data(),
                                  {.m = want.m.data(), .v = want.v.data(), .absmax_m = want.absmax_m.data(),
                                   .absmax_v = want.absmax_v.data(), .block = block},
                                  by_columns, sigma.data(), scale.data(), out, in, r, rows, 0.25, a);
        check_moments({d_m.download(), d_v.download(), d_am.download(), d_av.download()}, want);
        const std::vector<float> param = to_f32(d_param.download());
        if (pure) {
          std::vector<float> rounded = w;
          ops::stochastic_round_to_bf16(rounded.data(), int64_t(weights), rounding_stream_seed(seed, a.step, kRoundWeight));
          CHECK(same_bits(param, rounded));
        } else {
          const std::vector<float> master = d_master.download();
          CHECK(same_bits(master, w));
          CHECK(same_bits(d_param.download(), to_bf16(master)));
        }
      }
}
