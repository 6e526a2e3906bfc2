// The GPU's row and elementwise kernels against the CPU reference (kernels/ops.h, float):
// embedding, RMSNorm, RoPE, SwiGLU, row sampling (the residual add is o_proj's and down's GEMM
// epilogue: test_gpu_gemm). Inputs are fresh random values rounded to bf16, so both sides see the
// same numbers; shapes are awkward on purpose (C = 5461, N = 3·77) and also hit the 16-byte
// vector paths (C and n multiples of 8).
// Every output is poisoned first, accumulated outputs start from random values, and the
// reductions run twice to prove bitwise determinism.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "src/core/rng.h"
#include "src/train/run_resolution.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

using namespace grass;
using gputest::DeviceBuffer;
using gputest::rel_error;
using bf16 = cuda::bf16;

// A bf16 store is one rounding past an fp32 result, at most 2^-8 relative: allow twice that.
constexpr double kBf16Rel = 1.0 / 128;

void put(DeviceBuffer<bf16>& d, const std::vector<float>& x) { d.upload(gputest::to_bf16(x)); }
std::vector<float> get(const DeviceBuffer<bf16>& d) { return gputest::to_f32(d.download()); }

// Elements where got is farther than rel·|want| + abs from want (NaN counts): a norm-wise error can
// hide a few wrong or unwritten elements, this cannot.
size_t count_misses(const std::vector<float>& got, const std::vector<float>& want, double rel,
                    double abs) {
  REQUIRE(got.size() == want.size());
  size_t misses = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (!(std::fabs(double(got[i]) - want[i]) <= rel * std::fabs(want[i]) + abs)) misses++;
  return misses;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

std::vector<int32_t> random_tokens(int64_t N, int V) {
  static std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> tokens(N);
  for (int32_t& t : tokens) t = dist(rng);
  return tokens;
}

// The host side of embedding_backward: positions grouped by token id, ascending within a group.
struct TokenGroups {
  std::vector<int32_t> positions, group_start, group_token;
};
TokenGroups group_by_token(const std::vector<int32_t>& tokens) {
  TokenGroups g;
  g.positions.resize(tokens.size());
  for (size_t i = 0; i < tokens.size(); i++) g.positions[i] = int32_t(i);
  std::stable_sort(g.positions.begin(), g.positions.end(),
                   [&](int32_t a, int32_t b) { return tokens[a] < tokens[b]; });
  for (size_t i = 0; i < g.positions.size(); i++)
    if (i == 0 || tokens[g.positions[i]] != tokens[g.positions[i - 1]]) {
      g.group_start.push_back(int32_t(i));
      g.group_token.push_back(tokens[g.positions[i]]);
    }
  g.group_start.push_back(int32_t(tokens.size()));
  return g;
}

}  // namespace

TEST_CASE("gpu embedding forward gathers table rows", "[gpu]") {
  gputest::TestContext tc;
  const int64_t N = 3 * 77;
  const int V = 1000;
  for (int C : {5461, 768}) {
    CAPTURE(C);
    const std::vector<int32_t> tokens = random_tokens(N, V);
    const std::vector<float> table = gputest::bf16_rounded(gputest::randn(size_t(V) * C));
    DeviceBuffer<int32_t> d_tokens(N);
    DeviceBuffer<bf16> d_table(table.size()), d_out(size_t(N) * C);
    d_tokens.upload(tokens);
    put(d_table, table);
    d_out.poison();
    cuda::embedding_forward(tc.ctx, d_out.ptr, d_tokens.ptr, d_table.ptr, N, C);
    std::vector<float> want(size_t(N) * C);
    ops::embedding_forward<float>(want.data(), tokens.data(), table.data(), N, C);
    // A copy: exact (and a NaN left by the poison is never within 0 of anything).
    CHECK(count_misses(get(d_out), want, 0.0, 0.0) == 0);
  }
}

TEST_CASE("gpu embedding backward sums repeated tokens into dtable, deterministically", "[gpu]") {
  gputest::TestContext tc;
  struct Shape {
    int64_t N;
    int C, V;
  };
  // Few tokens (long groups), many tokens (mostly singletons), and three tokens for 924 positions.
// C = 768 and 64 take the kernel of 8-channel packs, 5461 the one-channel kernel; the packs give
// the one-channel kernel's bits.
  for (const Shape s :
       {Shape{3 * 77, 5461, 37}, Shape{3 * 77, 768, 1000}, Shape{3 * 77 * 4, 64, 3}}) {
    for (const cuda::GradType gtype : {cuda::GradType::F32, cuda::GradType::BF16}) {
      const bool f32 = gtype == cuda::GradType::F32;
      CAPTURE(s.N, s.C, s.V, f32);
      const std::vector<int32_t> tokens = random_tokens(s.N, s.V);
      const TokenGroups groups = group_by_token(tokens);
      const int num_groups = int(groups.group_token.size());
      const std::vector<float> dout = gputest::bf16_rounded(gputest::randn(size_t(s.N) * s.C));
      std::vector<float> dtable0 = gputest::randn(size_t(s.V) * s.C);
      if (!f32) dtable0 = gputest::bf16_rounded(dtable0);

      DeviceBuffer<bf16> d_dout(dout.size());
      DeviceBuffer<int32_t> d_positions(s.N), d_start(groups.group_start.size()),
          d_token(groups.group_token.size());
      put(d_dout, dout);
      d_positions.upload(groups.positions);
      d_start.upload(groups.group_start);
      d_token.upload(groups.group_token);
      DeviceBuffer<float> d_dtable_f32(f32 ? dtable0.size() : 0);
      DeviceBuffer<bf16> d_dtable_bf16(f32 ? 0 : dtable0.size());
      void* d_dtable = f32 ? static_cast<void*>(d_dtable_f32.ptr) : d_dtable_bf16.ptr;
      // Runs the backward from dtable0 and returns dtable's bits as fp32 values.
      auto run = [&] {
        if (f32)
          d_dtable_f32.upload(dtable0);
        else
          put(d_dtable_bf16, dtable0);
        cuda::embedding_backward(tc.ctx, d_dtable, gtype, d_dout.ptr, d_positions.ptr, d_start.ptr,
                                 d_token.ptr, num_groups, s.C);
        return f32 ? d_dtable_f32.download() : get(d_dtable_bf16);
      };
      const std::vector<float> got = run();

      std::vector<float> want = dtable0;
      ops::embedding_backward<float>(want.data(), dout.data(), tokens.data(), s.N, s.C);
      CHECK(rel_error(got, want) <= (f32 ? 1e-5 : 1e-2));
      CHECK(count_misses(got, want, f32 ? 1e-5 : kBf16Rel, 1e-4) == 0);
      // Rows of tokens absent from the batch are untouched, bit for bit.
      std::vector<bool> present(s.V, false);
      for (int32_t t : tokens) present[t] = true;
      size_t changed_absent = 0;
      for (int v = 0; v < s.V; v++)
        if (!present[v])
          for (int c = 0; c < s.C; c++)
            changed_absent += got[size_t(v) * s.C + c] != dtable0[size_t(v) * s.C + c];
      CHECK(changed_absent == 0);
      CHECK(same_bits(run(), got));
      if (s.C % 8 == 0) {
        // dout one element off 16-byte alignment takes the one-channel kernel: the packed
        // kernel's bits are its bits (each channel sums the same positions in the same order)
        DeviceBuffer<bf16> d_shifted(dout.size() + 1);
        std::vector<bf16> shifted(dout.size() + 1, __float2bfloat16(0.0f));
        for (size_t i = 0; i < dout.size(); i++) shifted[i + 1] = __float2bfloat16(dout[i]);
        d_shifted.upload(shifted);
        if (f32)
          d_dtable_f32.upload(dtable0);
        else
          put(d_dtable_bf16, dtable0);
        cuda::embedding_backward(tc.ctx, d_dtable, gtype, d_shifted.ptr + 1, d_positions.ptr,
                                 d_start.ptr, d_token.ptr, num_groups, s.C);
        CHECK(same_bits(f32 ? d_dtable_f32.download() : get(d_dtable_bf16), got));
      }
    }
  }
}

// RMSNorm's shapes: C in 64, 136 (17 packs: most lanes idle), 2048, 4096, 5120 (the forward holds
// the row in registers at each) and 8192 (the forward reads it again) take a warp per row; N is
// never a multiple of its 8 rows per block. 5461 (odd) and 8200 (above 8192) take the block-per-row
// kernels, one value and packs of 8 at a time.
struct NormShape {
  int64_t N;
  int C;
};
constexpr NormShape kNormShapes[] = {{1617, 64}, {1617, 136}, {203, 2048}, {45, 4096},
                                     {1025, 5120}, {77, 8192},  {3 * 77, 5461}, {13, 8200}};

TEST_CASE("gpu rmsnorm forward matches the CPU, rstd in fp32", "[gpu]") {
  gputest::TestContext tc;
  const float eps = 1e-5f;
  for (const auto& [N, C] : kNormShapes) {
    CAPTURE(N, C);
    const std::vector<float> x = gputest::bf16_rounded(gputest::randn(size_t(N) * C));
    std::vector<float> w = gputest::randn(C, 0.1);
    for (float& v : w) v += 1.0f;
    w = gputest::bf16_rounded(w);
    DeviceBuffer<bf16> d_x(x.size()), d_w(C), d_out(x.size());
    DeviceBuffer<float> d_rstd(N);
    put(d_x, x);
    put(d_w, w);
    d_out.poison();
    d_rstd.poison();
    cuda::rmsnorm_forward(tc.ctx, d_out.ptr, d_rstd.ptr, d_x.ptr, d_w.ptr, N, C, eps);
    const std::vector<float> out = get(d_out), rstd = d_rstd.download();

    std::vector<float> want(x.size()), want_rstd(N);
    ops::rmsnorm_forward<float>(want.data(), want_rstd.data(), x.data(), w.data(), N, C, eps);
    CHECK(rel_error(out, want) <= 1e-2);
    CHECK(count_misses(out, want, kBf16Rel, 1e-4) == 0);
    CHECK(rel_error(rstd, want_rstd) <= 1e-5);
    CHECK(count_misses(rstd, want_rstd, 1e-4, 0.0) == 0);  // fp32 sums of C squares, two orders

    d_out.poison();
    d_rstd.poison();
    cuda::rmsnorm_forward(tc.ctx, d_out.ptr, d_rstd.ptr, d_x.ptr, d_w.ptr, N, C, eps);
    CHECK(same_bits(get(d_out), out));
    CHECK(same_bits(d_rstd.download(), rstd));

    // x one element into its buffer, as a view may be (no 16-byte loads where C % 8 == 0 allows
    // them): the one-value-at-a-time kernel, within the same bounds
    DeviceBuffer<bf16> d_x_shifted(x.size() + 1);
    d_x_shifted.poison();
    gputest::check(cudaMemcpy(d_x_shifted.ptr + 1, d_x.ptr, x.size() * sizeof(bf16),
                              cudaMemcpyDeviceToDevice),
                   "shift x");
    d_out.poison();
    d_rstd.poison();
    cuda::rmsnorm_forward(tc.ctx, d_out.ptr, d_rstd.ptr, d_x_shifted.ptr + 1, d_w.ptr, N, C, eps);
    const std::vector<float> out_shifted = get(d_out), rstd_shifted = d_rstd.download();
    CHECK(count_misses(out_shifted, want, kBf16Rel, 1e-4) == 0);
    CHECK(count_misses(rstd_shifted, want_rstd, 1e-4, 0.0) == 0);
  }
}

TEST_CASE("gpu rmsnorm backward accumulates into dx and dw, deterministically", "[gpu]") {
  gputest::TestContext tc;
  // Past 1024 rows the backward's row blocks own several rows each, which a warp-per-row block
  // shares among its warps: at C = 64 and 7202 rows 8 rows and 8 warps a block, the last block 2
  // rows; at 136 and 1617 rows, and at 5120 (where the partials' shared memory fits 2 warps) and
  // 1025 rows, 2 rows on 2 warps, the last block 1 row. At 12,256 (the largest C it takes) a
  // row kernel's partials and its 128 static bytes fill the 48 KiB of shared memory a launch may
  // take unasked.
  const NormShape shapes[] = {{7202, 64},   {1617, 136}, {231, 2048},    {45, 4096},
                              {1025, 5120}, {77, 8192},  {3 * 77, 5461}, {13, 8200},
                              {3, 12256}};
  for (const auto& [N, C] : shapes) {
    for (const cuda::GradType gtype : {cuda::GradType::F32, cuda::GradType::BF16}) {
      const bool f32 = gtype == cuda::GradType::F32;
      CAPTURE(N, C, f32);
      const size_t NC = size_t(N) * C;
      const std::vector<float> x = gputest::bf16_rounded(gputest::randn(NC));
      const std::vector<float> dout = gputest::bf16_rounded(gputest::randn(NC));
      std::vector<float> w = gputest::randn(C, 0.1);
      for (float& v : w) v += 1.0f;
      w = gputest::bf16_rounded(w);
      // The CPU's rstd goes to the GPU too: this test is about the backward alone.
      std::vector<float> fwd_out(NC), rstd(N);
      ops::rmsnorm_forward<float>(fwd_out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
      const std::vector<float> dx0 = gputest::bf16_rounded(gputest::randn(NC, 0.5));
      std::vector<float> dw0 = gputest::randn(C);
      if (!f32) dw0 = gputest::bf16_rounded(dw0);

      DeviceBuffer<bf16> d_x(NC), d_dout(NC), d_w(C), d_dx(NC);
      DeviceBuffer<float> d_rstd(N), d_scratch(size_t(cuda::rmsnorm_scratch_floats(N, C)));
      put(d_x, x);
      put(d_dout, dout);
      put(d_w, w);
      d_rstd.upload(rstd);
      DeviceBuffer<float> d_dw_f32(f32 ? C : 0);
      DeviceBuffer<bf16> d_dw_bf16(f32 ? 0 : C);
      void* d_dw = f32 ? static_cast<void*>(d_dw_f32.ptr) : d_dw_bf16.ptr;
      // Runs the backward from (dx0, dw0) with a poisoned scratch; returns (dx, dw) as fp32.
      auto run = [&] {
        put(d_dx, dx0);
        if (f32)
          d_dw_f32.upload(dw0);
        else
          put(d_dw_bf16, dw0);
        d_scratch.poison();
        cuda::rmsnorm_backward(tc.ctx, d_dx.ptr, d_dw, gtype, d_dout.ptr, d_x.ptr, d_w.ptr,
                               d_rstd.ptr, d_scratch.ptr, N, C);
        return std::pair{get(d_dx), f32 ? d_dw_f32.download() : get(d_dw_bf16)};
      };
      const auto [dx, dw] = run();

      std::vector<float> want_dx = dx0, want_dw = dw0;
      ops::rmsnorm_backward<float>(want_dx.data(), want_dw.data(), dout.data(), x.data(), w.data(),
                                   rstd.data(), N, C);
      CHECK(rel_error(dx, want_dx) <= 1e-2);
      CHECK(count_misses(dx, want_dx, kBf16Rel, 1e-3) == 0);
      CHECK(rel_error(dw, want_dw) <= (f32 ? 1e-5 : 1e-2));
      CHECK(count_misses(dw, want_dw, f32 ? 1e-5 : kBf16Rel, 1e-3) == 0);

      const auto [dx_again, dw_again] = run();
      CHECK(same_bits(dx_again, dx));
      CHECK(same_bits(dw_again, dw));
    }
  }
}

TEST_CASE("gpu rope forward and backward match the CPU rotation", "[gpu]") {
  gputest::TestContext tc;
  struct Shape {
    int B, T, H, HD;
    float theta;
  };
  // The last shape reaches positions past 4000, where an fp32 angle would drift.
  for (const Shape s : {Shape{3, 77, 5, 64, 10000.0f}, Shape{3, 77, 5, 128, 500000.0f},
                        Shape{1, 4100, 2, 128, 10000.0f}}) {
    for (const bool forward : {true, false}) {
      CAPTURE(s.B, s.T, s.H, s.HD, s.theta, forward);
      const size_t n = size_t(s.B) * s.T * s.H * s.HD;
      const std::vector<float> x = gputest::bf16_rounded(gputest::randn(n));
      DeviceBuffer<bf16> d_x(n);
      put(d_x, x);
      std::vector<float> want(n);
      if (forward) {
        cuda::rope_forward(tc.ctx, d_x.ptr, s.B, s.T, s.H, s.HD, s.theta);
        ops::rope_forward<float>(want.data(), x.data(), s.B, s.T, s.H, s.HD, s.theta);
      } else {
        cuda::rope_backward(tc.ctx, d_x.ptr, s.B, s.T, s.H, s.HD, s.theta);
        ops::rope_backward<float>(want.data(), x.data(), s.B, s.T, s.H, s.HD, s.theta);
      }
      const std::vector<float> got = get(d_x);
      CHECK(rel_error(got, want) <= 1e-2);
      // In place, so nothing can be poisoned: an element left unrotated is caught here instead.
      CHECK(count_misses(got, want, kBf16Rel, 1e-5) == 0);
    }
  }
}

TEST_CASE("gpu swiglu forward and backward match the CPU and stay finite at |gate| = 200",
          "[gpu]") {
  gputest::TestContext tc;
  // gate and up packed in gu[N, 2F]: F odd (one value per thread) and F a multiple of 8 (16-byte
  // packs, up's half of each row aligned too).
  for (const int F : {5461, 1024}) {
    const int64_t N = 3 * 77, n = N * F;
    CAPTURE(F);
    std::vector<float> gu = gputest::randn(2 * n, 3.0);
    // Saturated sigmoids: exp(-g) overflows fp32 for g < -88.7; gate is column c < F of a row.
    auto gate_at = [&](int64_t i) -> float& { return gu[size_t((i / F) * 2 * F + i % F)]; };
    for (const int64_t i : {int64_t(0), int64_t(1), n / 2, n - 2, n - 1})
      gate_at(i) = (i % 2 == 0) ? 200.0f : -200.0f;
    gate_at(2) = 89.0f;
    gate_at(3) = -89.0f;
    gu = gputest::bf16_rounded(gu);
    const std::vector<float> dout = gputest::bf16_rounded(gputest::randn(n));
    DeviceBuffer<bf16> d_gu(2 * n), d_dout(n), d_out(n), d_dgu(2 * n);
    put(d_gu, gu);
    put(d_dout, dout);
    d_out.poison();
    cuda::swiglu_forward(tc.ctx, d_out.ptr, d_gu.ptr, N, F);
    const std::vector<float> out = get(d_out);
    std::vector<float> want_out(n);
    ops::swiglu_forward<float>(want_out.data(), gu.data(), N, F);
    CHECK(std::all_of(out.begin(), out.end(), [](float f) { return std::isfinite(f); }));
    CHECK(rel_error(out, want_out) <= 1e-2);
    CHECK(count_misses(out, want_out, kBf16Rel, 1e-6) == 0);
    // dgate and dup as two [N, F] halves of d_dgu (pitch F), then packed as gu (pitch 2F)
    for (const int64_t ld : {int64_t(F), int64_t(2) * F}) {
      CAPTURE(ld);
      const int64_t up_offset = ld == F ? n : F;
      d_dgu.poison();
      cuda::swiglu_backward(tc.ctx, d_dgu.ptr, d_dgu.ptr + up_offset, d_dout.ptr, d_gu.ptr, N, F,
                            ld);
      const std::vector<float> dgu = get(d_dgu);
      std::vector<float> want(size_t(2 * n));
      ops::swiglu_backward<float>(want.data(), want.data() + up_offset, dout.data(), gu.data(), N,
                                  F, ld);
      CHECK(std::all_of(dgu.begin(), dgu.end(), [](float f) { return std::isfinite(f); }));
      CHECK(rel_error(dgu, want) <= 1e-2);
      CHECK(count_misses(dgu, want, kBf16Rel, 1e-6) == 0);
    }
  }
}

TEST_CASE("gpu gather_rows and row_norms match the CPU, repeated rows included", "[gpu]") {
  gputest::TestContext tc;
  static std::mt19937 rng(std::random_device{}());
  for (const int D : {5461, 1024}) {
    const int64_t N = 3 * 77, k = 50;
    CAPTURE(D);
    const std::vector<float> x = gputest::bf16_rounded(gputest::randn(size_t(N) * D));
    std::vector<int32_t> rows(k);
    std::uniform_int_distribution<int32_t> row_of(0, int32_t(N) - 1);
    for (int32_t& r : rows) r = row_of(rng);
    rows[1] = rows[0];      // with replacement: a row drawn twice
    rows[k - 1] = int32_t(N) - 1;  // the last row
    std::vector<float> scale = gputest::randn(size_t(k), 4.0);
    DeviceBuffer<bf16> d_x(size_t(N) * D), d_out(size_t(k) * D);
    DeviceBuffer<int32_t> d_rows{size_t(k)};
    DeviceBuffer<float> d_scale{size_t(k)}, d_norms{size_t(N)};
    put(d_x, x);
    d_rows.upload(rows);
    d_scale.upload(scale);
    for (const bool scaled : {true, false}) {
      CAPTURE(scaled);
      d_out.poison();
      cuda::gather_rows(tc.ctx, d_out.ptr, d_x.ptr, d_rows.ptr, scaled ? d_scale.ptr : nullptr, k, D);
      std::vector<float> want(size_t(k) * D);
      ops::gather_rows<float>(want.data(), x.data(), rows.data(), scaled ? scale.data() : nullptr,
                              k, D);
      // one product rounded once to bf16 on both sides (the CPU's rounded here): the same bits
      CHECK(count_misses(get(d_out), gputest::bf16_rounded(want), 0.0, 0.0) == 0);
    }
    d_norms.poison();
    cuda::row_norms(tc.ctx, d_norms.ptr, d_x.ptr, N, D);
    const std::vector<float> norms = d_norms.download();
    std::vector<float> want(static_cast<size_t>(N));
    ops::row_norms<float>(want.data(), x.data(), N, D);
    // fp32 sums of D squares against the CPU's double: D·2^-24 relative at worst
    CHECK(count_misses(norms, want, D * 6e-8, 0.0) == 0);
    cuda::row_norms(tc.ctx, d_norms.ptr, d_x.ptr, N, D);
    CHECK(same_bits(d_norms.download(), norms));
  }
}

TEST_CASE("gpu draw_rows draws the CPU's rows and scales bit for bit", "[gpu][row_sampling]") {
  // Norms as activations give them (a few rows carrying most of the norm, so wta-crs keeps
  // winners), and the awkward ones: repeated values (the tie order), few rows of weight > 0 (the
  // winners hold them all: every score past them ties at 0), a NaN and all zeros (uniform
  // draws). N = 1000 leaves some of the 1,024 scan threads nothing; 3000 gives each three.
  gputest::TestContext tc;
  static std::mt19937_64 rng(std::random_device{}());
  enum Norms { Uneven, Repeated, Few, Nan, Zero };
  struct Case {
    Norms norms;
    int64_t N;
    int k;
    bool winners;
  };
  const Case cases[] = {{Uneven, 1000, 500, true},  {Uneven, 3000, 1500, true},
                        {Uneven, 1000, 37, false},  {Repeated, 257, 100, true},
                        {Few, 300, 150, true},      {Nan, 64, 10, true},
                        {Zero, 64, 10, false}};
  for (const Case& c : cases) {
    CAPTURE(int(c.norms), c.N, c.k, c.winners);
    const uint64_t seed = rng(), stream = rng();
    std::vector<float> norms(size_t(c.N), 0.0f);
    for (int64_t i = 0; i < c.N; i++) {
      const double g = normal(seed, uint64_t(i));
      norms[size_t(i)] = c.norms == Uneven     ? float(std::exp(2 * g))
                         : c.norms == Repeated ? float(1 + (rng() % 4))
                         : c.norms == Few      ? (i % 61 == 7 ? float(std::exp(g)) : 0.0f)
                         : c.norms == Nan      ? float(std::exp(g))
                                               : 0.0f;
    }
    if (c.norms == Nan) norms[size_t(c.N / 2)] = NAN;
    std::vector<int32_t> want_rows(size_t(c.k));
    std::vector<float> want_scale(size_t(c.k));
    const std::vector<double> weight(norms.begin(), norms.end());
    const int winners = ops::draw_rows(want_rows.data(), want_scale.data(), weight.data(), c.N, c.k,
                                       c.winners, stream);
    if (c.norms == Uneven && c.winners) CHECK(winners > 0);  // the winner rule is exercised
    if (c.norms == Few) CHECK(want_scale.back() == 0.0f);    // and the exact case

    DeviceBuffer<float> d_norms{size_t(c.N)}, d_scale{size_t(c.k)};
    DeviceBuffer<int32_t> d_rows{size_t(c.k)};
    DeviceBuffer<char> d_workspace{size_t(
        draw_rows_workspace_bytes(storage_for(PrecisionChoice::Bf16Mixed, true), c.N))};
    d_norms.upload(norms);
    d_rows.poison();
    d_scale.poison();
    d_workspace.poison();
    cuda::draw_rows(tc.ctx, d_rows.ptr, d_scale.ptr, d_norms.ptr, c.N, c.k, c.winners, stream,
                    d_workspace.ptr);
    CHECK(d_rows.download() == want_rows);
    CHECK(same_bits(d_scale.download(), want_scale));
  }
}
