// 8-bit blockwise quantization on the GPU (kernels/cuda/quant8.cu) against the CPU reference
// (kernels/cpu/quant8.cpp), code for code and bit for bit: issue 27's "same codes on the CPU and
// the GPU" over values that include 0 and -0, denormals, each block's ±absmax, NaN and ±Inf,
// blocks spanning magnitudes from 1e-30 to 1e30, an all-zero block and a last, shorter block.
// 10⁷ values on a GPU, 10⁶ on the emulator (its fibers are slower than a GPU's threads).
// Then the 8-bit AdamW and GRASS steps (kernels/cuda/adamw.cu, grass.cu, on the drivers of
// kernels/cuda/quant8.cuh) against their CPU ops in both storage schemes: codes, absmax and
// weights bit for bit (every rounding of the step is written out, so no compiler's contraction
// separates them; the emulator checks both builds), and the drivers' split search against
// quant8_encode.
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

// kernels/quant8.h's quant8_encode_pivoted, the 8-bit steps' encode on the GPU (the first three
// halving steps from registers, the sign rule by code), against quant8_encode: the same code at
// every bound and value of both maps and their nearest floats, at the specials, and at 10^5 fresh
// values, for absmax 1 (x·(1/absmax) = x exactly) and others.
TEST_CASE("quant8: the GPU steps' split search gives quant8_encode's code for every input",
          "[gpu][quant8]") {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> uniform(-1.25f, 1.25f), exponent(-45.0f, 1.0f);
  const float inf = std::numeric_limits<float>::infinity();
  for (const bool is_signed : {true, false}) {
    INFO((is_signed ? "signed" : "unsigned") << " map");
    const Quant8Map& map = quant8_map(is_signed);
    const Quant8Pivots pivots = quant8_pivots(map);
    for (int c = 0; c < 256; c++) CHECK((map.value[c] <= 0.0f) == (c <= map.zero));
    std::vector<float> s = {0.0f, -0.0f, 1.0f, -1.0f, 2.0f, -2.0f, inf, -inf,
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(), 1e-40f, -3e-42f};
    for (int c = 0; c < 256; c++)
      for (const float at : {map.value[c], c < 255 ? map.bound[c] : 1.0f}) {
        float up = at, down = at;
        for (int k = 0; k < 3; k++) {
          s.push_back(up);
          s.push_back(down);
          up = std::nextafter(up, inf);
          down = std::nextafter(down, -inf);
        }
      }
    for (int k = 0; k < 100000; k++) {
      s.push_back(uniform(rng));
      s.push_back(std::copysign(std::pow(10.0f, exponent(rng)), uniform(rng)));
    }
    int64_t differ = 0;
    for (const float absmax : {1.0f, 0.37f, 3e-20f, 7e15f, 0.0f, inf})
      for (float x : s) {
        if (!is_signed) x = std::fabs(x);  // the unsigned map codes v ≥ 0
        x *= absmax;
        differ += quant8_encode_pivoted(pivots, map.bound, map.zero, x, absmax, 1.0f / absmax) !=
                  quant8_encode(map, x, absmax);
      }
    CHECK(differ == 0);
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

namespace {

// A device array of n values starting `offset` elements into its allocation: offset 1 puts every
// array off the warp driver's vector alignment (kernels/cuda/quant8.cuh).
template <typename T>
struct OffsetBuffer {
  DeviceBuffer<T> buffer;
  size_t offset;
  OffsetBuffer(size_t n, size_t off) : buffer(n + off), offset(off) {}
  T* ptr() const { return buffer.ptr + offset; }
  void upload(const std::vector<T>& x) {
    std::vector<T> padded(offset, x.empty() ? T() : x[0]);
    padded.insert(padded.end(), x.begin(), x.end());
    buffer.upload(padded);
  }
  std::vector<T> download() const {
    const std::vector<T> all = buffer.download();
    return {all.begin() + ptrdiff_t(offset), all.end()};
  }
  void poison() { buffer.poison(); }
};

enum class Proximal { None, Term, Reset };

// The proximal term's arguments (AdamArgs::anchor): none, θ's distance to the anchor, or the
// anchor taking θ first (an inner loop's first step).
void set_proximal(AdamArgs& a, Proximal proximal, void* anchor) {
  a.anchor = proximal == Proximal::None ? nullptr : anchor;
  a.proximal_coef = 2.5;  // with |θ - anchor| ~ 0.05: a term of ~0.1 beside gradients of ~0.01
  a.anchor_reset = proximal == Proximal::Reset;
}

const char* name_of(Proximal proximal) {
  return proximal == Proximal::None ? "no proximal term"
         : proximal == Proximal::Term ? "the proximal term"
                                      : "the proximal term's reset";
}

// One 8-bit AdamW step of n elements on the GPU against the CPU's, from the same trained moments:
// codes, absmax, weights and the anchor bit for bit. The clipping coefficient is read from device
// memory, as in training; pure bf16 rounds from a rounding counter that does not start at 0
// (AdamArgs::first: a piece of a tensor).
void check_adamw_q8(int64_t n, int block, bool pure, Proximal proximal, size_t offset) {
  INFO("n " << n << ", blocks of " << block << (pure ? ", pure bf16" : ", bf16-mixed") << ", "
            << name_of(proximal) << (offset ? ", arrays off vector alignment" : ""));
  TestContext tc;
  const size_t count = size_t(n);
  AdamArgs a{.grad_scale = 0.7, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
             .weight_decay = 0.1, .step = 4, .first = pure ? 1000 : 0};
  const double clip = 0.8;
  const Q8Moments start = trained_moments(n, block);
  std::vector<float> p0 = randn(count, 0.1), g = randn(count, 0.01), anchor0 = randn(count, 0.05);
  g[7] = std::numeric_limits<float>::quiet_NaN();
  g[8] = std::numeric_limits<float>::infinity();
  for (int64_t i = 256; i < 512 && i < n; i++) g[size_t(i)] = 0.0f;  // the reset block gets none
  for (size_t i = 0; i < count; i++) anchor0[i] += p0[i];
  if (pure) {
    p0 = bf16_rounded(p0);
    g = bf16_rounded(g);
    anchor0 = bf16_rounded(anchor0);
  }
  const size_t blocks = start.absmax_m.size();
  OffsetBuffer<uint8_t> d_m(count, offset), d_v(count, offset);
  OffsetBuffer<float> d_master(count, offset), d_gf(count, offset), d_anchorf(count, offset);
  OffsetBuffer<cuda::bf16> d_param(count, offset), d_gb(count, offset), d_anchorb(count, offset);
  DeviceBuffer<float> d_am(blocks), d_av(blocks);
  DeviceBuffer<double> d_clip(1);
  d_m.upload(start.m);
  d_v.upload(start.v);
  d_am.upload(start.absmax_m);
  d_av.upload(start.absmax_v);
  d_clip.upload({clip});
  const uint64_t seed = 77;
  const Quant8Moments dq{.m = d_m.ptr(), .v = d_v.ptr(), .absmax_m = d_am.ptr,
                         .absmax_v = d_av.ptr, .block = block};
  AdamArgs gpu_args = a;
  gpu_args.clip = d_clip.ptr;
  if (pure) {
    d_param.upload(to_bf16(p0));
    d_gb.upload(to_bf16(g));
    d_anchorb.upload(to_bf16(anchor0));
    set_proximal(gpu_args, proximal, d_anchorb.ptr());
    cuda::adamw_update_q8(tc.ctx, d_param.ptr(), nullptr, d_gb.ptr(), dq, n, gpu_args, seed);
  } else {
    d_master.upload(p0);
    d_gf.upload(g);
    d_anchorf.upload(anchor0);
    d_param.poison();
    set_proximal(gpu_args, proximal, d_anchorf.ptr());
    cuda::adamw_update_q8(tc.ctx, d_param.ptr(), d_master.ptr(), d_gf.ptr(), dq, n, gpu_args,
                          seed);
  }
  // the CPU: the same step, in fp32, then the same rounding of the weight
  Q8Moments want = start;
  std::vector<float> p = p0, anchor = anchor0;
  AdamArgs cpu_args = a;
  cpu_args.clip = &clip;
  set_proximal(cpu_args, proximal, anchor.data());
  ops::adamw_update_q8(p.data(), g.data(),
                       {.m = want.m.data(), .v = want.v.data(), .absmax_m = want.absmax_m.data(),
                        .absmax_v = want.absmax_v.data(), .block = block},
                       n, cpu_args);
  const Q8Moments got{d_m.download(), d_v.download(), d_am.download(), d_av.download()};
  check_moments(got, want);
  const std::vector<float> param = to_f32(d_param.download());
  CHECK(param[7] == (pure ? p0[7] : float(bf16_rounded({p0[7]})[0])));  // NaN: left alone
  CHECK(same_bits(pure ? to_f32(d_anchorb.download()) : d_anchorf.download(), anchor));
  // the weights too: the same fp32 step (its roundings written out), the same draws
  if (pure) {
    std::vector<float> rounded = p;
    const uint64_t stream = rounding_stream_seed(seed, a.step, kRoundWeight);
    ops::stochastic_round_to_bf16(rounded.data(), n, stream, uint64_t(a.first));
    CHECK(same_bits(param, rounded));
    CHECK(rel_error(param, p) <= 1e-2);
  } else {
    const std::vector<float> master = d_master.download();
    CHECK(same_bits(master, p));
    CHECK(same_bits(d_param.download(), to_bf16(master)));
  }
}

}  // namespace

// Every block size the two drivers of kernels/cuda/quant8.cuh take apart: the warp driver's 64,
// 128 and 256, each with the thread-block driver on the ragged tail (n = 100,003), and the
// thread-block driver's 2,048 and 4,096; the proximal term and its reset on both; and arrays off
// the vector loads' alignment, which the thread-block driver takes whole.
TEST_CASE("gpu adamw q8: the CPU's 8-bit step in both storage schemes", "[gpu][quant8]") {
  struct Case {
    int block;
    Proximal proximal;
    size_t offset;
  };
  for (const Case c : {Case{256, Proximal::None, 0}, Case{256, Proximal::Term, 0},
                       Case{64, Proximal::Reset, 0}, Case{128, Proximal::None, 0},
                       Case{2048, Proximal::Term, 0}, Case{4096, Proximal::Reset, 0},
                       Case{256, Proximal::Term, 1}})
    for (const bool pure : {false, true})
      check_adamw_q8(100003, c.block, pure, c.proximal, c.offset);
}

// A tensor of fewer than 256 elements (the warp driver takes none of it), and one of whole spans
// (the thread-block driver takes none).
TEST_CASE("gpu adamw q8: a tensor shorter than one span, and one of whole spans", "[gpu][quant8]") {
  for (const bool pure : {false, true}) {
    check_adamw_q8(200, 64, pure, Proximal::None, 0);
    check_adamw_q8(4096, 256, pure, Proximal::Term, 0);
  }
}

// Blocks of 64 (several down each column in the per-feature layout), 256 and 2,048 (ragged, or one
// per column), all on the thread-block driver; the proximal term on one size, its reset on another.
TEST_CASE("gpu grass q8: the CPU's 8-bit step, rows and columns, flat and per feature",
          "[gpu][quant8]") {
  TestContext tc;
  const int out = 160, in = 136, r = 40;
  const AdamArgs a{.grad_scale = 0.7, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                   .weight_decay = 0.1, .step = 2};
  const double clip = 0.8;
  DeviceBuffer<double> d_clip(1);
  d_clip.upload({clip});
  std::mt19937_64 rng(std::random_device{}());
  for (const int block : {64, 256, 2048})
    for (const bool rows : {true, false})
      for (const bool by_columns : {false, true})
        for (const bool pure : {false, true}) {
          const Proximal proximal = block == 64    ? Proximal::None
                                    : block == 256 ? Proximal::Term
                                                   : Proximal::Reset;
          INFO("blocks of " << block << (rows ? ", rows" : ", cols")
                            << (by_columns ? ", per feature" : ", flat")
                            << (pure ? ", pure bf16, " : ", bf16-mixed, ") << name_of(proximal));
          const Quant8Layout L = projected_quant8_layout(out, in, r, rows, block, by_columns);
          const int64_t n = L.rows * L.cols;
          const size_t count = size_t(n), weights = size_t(out) * in, slices = size_t(r);
          // moments quantized per the layout on the CPU
          const size_t blocks = size_t(L.blocks());
          Q8Moments start{std::vector<uint8_t>(count), std::vector<uint8_t>(count),
                          std::vector<float>(blocks), std::vector<float>(blocks)};
          std::vector<float> m0 = randn(count, 0.01), v0 = randn(count, 0.01);
          for (float& x : v0) x = x * x + 1e-9f;
          ops::quantize_layout(quant8_map(true), m0.data(), L, start.m.data(),
                               start.absmax_m.data());
          ops::quantize_layout(quant8_map(false), v0.data(), L, start.v.data(),
                               start.absmax_v.data());
          std::vector<int32_t> sigma(size_t(rows ? out : in));
          for (size_t i = 0; i < sigma.size(); i++) sigma[i] = int32_t(i);
          std::shuffle(sigma.begin(), sigma.end(), rng);
          sigma.resize(size_t(r));
          std::sort(sigma.begin(), sigma.end());
          std::vector<float> scale(size_t(r), 1.0f);
          scale[3] = 2.0f;
          std::vector<float> w0 = randn(weights, 0.1), gc = randn(count, 0.01),
                             anchor0 = randn(count, 0.05);
          gc[5] = std::numeric_limits<float>::quiet_NaN();
          for (int64_t i = 0; i < n; i++) {  // the anchor near the weight its element updates
            const int64_t j = rows ? i / in : i % r, c = rows ? i % in : i / r;
            const int64_t w = rows ? sigma[size_t(j)] * int64_t(in) + c : c * in + sigma[size_t(j)];
            anchor0[size_t(i)] += w0[size_t(w)];
          }
          if (pure) {
            w0 = bf16_rounded(w0);
            gc = bf16_rounded(gc);
            anchor0 = bf16_rounded(anchor0);
          }
          DeviceBuffer<uint8_t> d_m(count), d_v(count);
          DeviceBuffer<float> d_am(blocks), d_av(blocks), d_master(weights), d_gf(count),
              d_anchorf(count), d_scale(slices);
          DeviceBuffer<cuda::bf16> d_param(weights), d_gb(count), d_anchorb(count);
          DeviceBuffer<int32_t> d_sigma(slices);
          d_m.upload(start.m);
          d_v.upload(start.v);
          d_am.upload(start.absmax_m);
          d_av.upload(start.absmax_v);
          d_sigma.upload(sigma);
          d_scale.upload(scale);
          const uint64_t seed = 99;
          const Quant8Moments dq{.m = d_m.ptr, .v = d_v.ptr, .absmax_m = d_am.ptr,
                                 .absmax_v = d_av.ptr, .block = block};
          AdamArgs gpu_args = a;
          gpu_args.clip = d_clip.ptr;
          d_param.upload(to_bf16(w0));
          if (pure) {
            d_gb.upload(to_bf16(gc));
            d_anchorb.upload(to_bf16(anchor0));
            set_proximal(gpu_args, proximal, d_anchorb.ptr);
            cuda::grass_adam_update_q8(tc.ctx, d_param.ptr, nullptr, d_gb.ptr, dq, by_columns,
                                       d_sigma.ptr, d_scale.ptr, out, in, r, rows, 0.25, gpu_args,
                                       seed);
          } else {
            d_master.upload(w0);
            d_gf.upload(gc);
            d_anchorf.upload(anchor0);
            set_proximal(gpu_args, proximal, d_anchorf.ptr);
            cuda::grass_adam_update_q8(tc.ctx, d_param.ptr, d_master.ptr, d_gf.ptr, dq, by_columns,
                                       d_sigma.ptr, d_scale.ptr, out, in, r, rows, 0.25, gpu_args,
                                       seed);
          }
          Q8Moments want = start;
          std::vector<float> w = w0, anchor = anchor0;
          AdamArgs cpu_args = a;
          cpu_args.clip = &clip;
          set_proximal(cpu_args, proximal, anchor.data());
          ops::grass_adam_update_q8(w.data(), gc.data(),
                                    {.m = want.m.data(), .v = want.v.data(),
                                     .absmax_m = want.absmax_m.data(),
                                     .absmax_v = want.absmax_v.data(), .block = block},
                                    by_columns, sigma.data(), scale.data(), out, in, r, rows, 0.25,
                                    cpu_args);
          check_moments({d_m.download(), d_v.download(), d_am.download(), d_av.download()}, want);
          CHECK(same_bits(pure ? to_f32(d_anchorb.download()) : d_anchorf.download(), anchor));
          const std::vector<float> param = to_f32(d_param.download());
          if (pure) {
            std::vector<float> rounded = w;
            ops::stochastic_round_to_bf16(rounded.data(), int64_t(weights),
                                          rounding_stream_seed(seed, a.step, kRoundWeight));
            CHECK(same_bits(param, rounded));
          } else {
            const std::vector<float> master = d_master.download();
            CHECK(same_bits(master, w));
            CHECK(same_bits(d_param.download(), to_bf16(master)));
          }
        }
}
