// The linear layer's GEMMs (kernels/cuda/linear.cu, through kernels/cuda/gemm.cu's cuBLASLt)
// against the CPU reference (kernels/cpu/linear.cpp) on the same bf16-rounded inputs: forward
// (and with the residual stream added in the epilogue), dx (overwrite and accumulate), dw (fp32 and bf16, always accumulating), the transient full
// gradient; at the model's awkward widths (5461, token counts like 3·77, a single token) and with
// operands that start at 2-byte boundaries.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/ops.h"
#include "tests/gpu/gpu_test_util.h"

#if __has_include(<cuda_emu.h>)
#include <cuda_emu.h>
#define GRASS_TEST_CUDA_EMU 1
#endif

using namespace grass;
using namespace grass::gputest;
using bf16 = __nv_bfloat16;

namespace {

struct Shape {
  int64_t N;
  int in, out;
};
// 5461 as in (a row pitch of 10922 bytes), as out, and as the inner dimension of dx; one token.
const Shape kShapes[] = {
    {3 * 77, 5461, 96}, {3 * 77, 96, 5461}, {64, 2048, 5461}, {1, 5461, 33}, {5, 7, 3}};

// A bf16 device copy of x (whose values are already bf16).
void upload_bf16(DeviceBuffer<bf16>& d, const std::vector<float>& x) { d.upload(to_bf16(x)); }

// v behind `shift` elements of 1: a pointer `shift` elements into a buffer of these holds v at
// that many 2-byte steps off the buffer's alignment, as a view into a buffer may be.
std::vector<float> behind(int shift, const std::vector<float>& v) {
  std::vector<float> out(size_t(shift), 1.0f);
  out.insert(out.end(), v.begin(), v.end());
  return out;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

TEST_CASE("gemm: linear_forward matches the CPU at awkward shapes", "[gpu]") {
  TestContext tc;
  for (const Shape& s : kShapes) {
    INFO("N=" << s.N << " in=" << s.in << " out=" << s.out);
    const std::vector<float> x = bf16_rounded(randn(s.N * s.in));
    const std::vector<float> w = bf16_rounded(randn(size_t(s.out) * s.in, 0.05));
    DeviceBuffer<bf16> dx(x.size()), dw(w.size()), dy(s.N * s.out);
    upload_bf16(dx, x);
    upload_bf16(dw, w);
    dy.poison();
    cuda::linear_forward(tc.ctx, dy.ptr, dx.ptr, dw.ptr, s.N, s.in, s.out);
    std::vector<float> want(s.N * s.out);
    ops::linear_forward(want.data(), x.data(), w.data(), s.N, s.in, s.out);
    CHECK(rel_error(to_f32(dy.download()), want) <= 1e-2);
  }
}

TEST_CASE("gemm: linear_backward_dx overwrites or accumulates as asked", "[gpu]") {
  TestContext tc;
  for (const Shape& s : kShapes)
    for (const bool accumulate : {false, true}) {
      INFO("N=" << s.N << " in=" << s.in << " out=" << s.out << " accumulate=" << accumulate);
      const std::vector<float> dy = bf16_rounded(randn(s.N * s.out));
      const std::vector<float> w = bf16_rounded(randn(size_t(s.out) * s.in, 0.05));
      std::vector<float> dx = bf16_rounded(randn(s.N * s.in));  // what accumulate adds to
      DeviceBuffer<bf16> d_dy(dy.size()), d_w(w.size()), d_dx(dx.size());
      upload_bf16(d_dy, dy);
      upload_bf16(d_w, w);
      if (accumulate)
        upload_bf16(d_dx, dx);
      else
        d_dx.poison();
      cuda::linear_backward_dx(tc.ctx, d_dx.ptr, d_dy.ptr, d_w.ptr, s.N, s.in, s.out, accumulate);
      ops::linear_backward<float>(dx.data(), nullptr, dy.data(), nullptr, w.data(), s.N, s.in,
                                  s.out, accumulate);
      CHECK(rel_error(to_f32(d_dx.download()), dx) <= 1e-2);
    }
}

TEST_CASE("gemm: linear_backward_dw accumulates into fp32 and bf16 gradients", "[gpu]") {
  TestContext tc;
  for (const Shape& s : kShapes)
    for (const cuda::GradType gtype : {cuda::GradType::F32, cuda::GradType::BF16}) {
      const bool f32 = gtype == cuda::GradType::F32;
      INFO("N=" << s.N << " in=" << s.in << " out=" << s.out << " fp32=" << f32);
      const std::vector<float> dy = bf16_rounded(randn(s.N * s.out));
      const std::vector<float> x = bf16_rounded(randn(s.N * s.in));
      // The earlier micro-batches' sum, as large as this one's: dropping it fails the bound.
      std::vector<float> dw = randn(size_t(s.out) * s.in, std::sqrt(double(s.N)));
      if (!f32) dw = bf16_rounded(dw);
      DeviceBuffer<bf16> d_dy(dy.size()), d_x(x.size());
      upload_bf16(d_dy, dy);
      upload_bf16(d_x, x);
      DeviceBuffer<float> dw_f32(f32 ? dw.size() : 0);
      DeviceBuffer<bf16> dw_bf16(f32 ? 0 : dw.size());
      if (f32)
        dw_f32.upload(dw);
      else
        upload_bf16(dw_bf16, dw);
      void* d_dw = f32 ? static_cast<void*>(dw_f32.ptr) : static_cast<void*>(dw_bf16.ptr);
      cuda::linear_backward_dw(tc.ctx, d_dw, gtype, d_dy.ptr, d_x.ptr, s.N, s.in, s.out);
      ops::linear_backward<float>(nullptr, dw.data(), dy.data(), x.data(), nullptr, s.N, s.in,
                                  s.out, false);
      const std::vector<float> got = f32 ? dw_f32.download() : to_f32(dw_bf16.download());
      CHECK(rel_error(got, dw) <= 1e-2);
    }
}

TEST_CASE("gemm: linear_full_grad_f32 writes the whole gradient, or a chunk of its rows", "[gpu]") {
  TestContext tc;
  for (const Shape& s : kShapes) {
    INFO("N=" << s.N << " in=" << s.in << " out=" << s.out);
    const std::vector<float> dy = bf16_rounded(randn(s.N * s.out));
    const std::vector<float> x = bf16_rounded(randn(s.N * s.in));
    DeviceBuffer<bf16> d_dy(dy.size()), d_x(x.size());
    upload_bf16(d_dy, dy);
    upload_bf16(d_x, x);
    std::vector<float> want(size_t(s.out) * s.in, 0.0f);
    ops::linear_backward<float>(nullptr, want.data(), dy.data(), x.data(), nullptr, s.N, s.in,
                                s.out, false);
    // whole, then rows [8, 8 + rows) (a refresh's chunk: dy's columns at an aligned offset)
    for (const int row0 : {0, 8}) {
      if (row0 >= s.out) continue;
      const int rows = row0 == 0 ? s.out : std::min(s.out - row0, 16);
      INFO("rows " << row0 << " .. " << row0 + rows);
      DeviceBuffer<float> g(size_t(rows) * s.in);
      g.poison();
      cuda::linear_full_grad_f32(tc.ctx, g.ptr, d_dy.ptr, d_x.ptr, s.N, s.in, s.out, row0, rows);
      const std::vector<float> chunk(want.begin() + int64_t(row0) * s.in,
                                     want.begin() + int64_t(row0 + rows) * s.in);
      CHECK(rel_error(g.download(), chunk) <= 1e-2);
    }
  }
}

// o_proj's and down's output added to the residual stream in the GEMM's epilogue, against the
// exact sum in double. The stream r is made to cancel most of the product (r ≈ -x·wᵀ), so that a
// product rounded to bf16 before the add would be off by up to half a bf16 spacing of the product,
// far outside the bound of one rounding: 2⁻⁸ of |e| plus the fp32 sum's error (K + 2)·2⁻²⁴ of
// Σ|x·w| + |r|, in any summation order. Shift 1 puts every operand 2 bytes into its buffer, which
// cuBLASLt takes no kernel for: cublasGemmEx's path (C copied to D, then added in place).
TEST_CASE("gemm: linear_residual_forward adds the stream to the fp32 product and rounds once",
          "[gpu]") {
  TestContext tc;
  struct Case {
    Shape s;
    int shift;
  };
  for (const auto& [s, shift] : {Case{{3 * 77, 64, 96}, 0}, Case{{3 * 77, 64, 96}, 1},
                                 Case{{64, 40, 5461}, 0}, Case{{5, 7, 3}, 0}}) {
    INFO("N=" << s.N << " in=" << s.in << " out=" << s.out << " shift=" << shift);
    const size_t ny = size_t(s.N) * s.out;
    const std::vector<float> x = bf16_rounded(randn(s.N * s.in));
    const std::vector<float> w = bf16_rounded(randn(size_t(s.out) * s.in));
    std::vector<double> product(ny), magnitude(ny);  // Σ x·w and Σ |x·w|, exact in double
    for (int64_t n = 0; n < s.N; n++)
      for (int o = 0; o < s.out; o++)
        for (int k = 0; k < s.in; k++) {
          const double t = double(x[size_t(n * s.in + k)]) * w[size_t(o) * s.in + k];
          product[size_t(n * s.out + o)] += t;
          magnitude[size_t(n * s.out + o)] += std::fabs(t);
        }
    std::vector<float> r(ny);
    const std::vector<float> noise = randn(ny, 0.25);
    for (size_t i = 0; i < ny; i++) r[i] = float(-product[i] + noise[i]);
    r = bf16_rounded(r);

    DeviceBuffer<bf16> d_x(shift + x.size()), d_w(shift + w.size()), d_r(shift + ny),
        d_y(shift + ny);
    upload_bf16(d_x, behind(shift, x));
    upload_bf16(d_w, behind(shift, w));
    upload_bf16(d_r, behind(shift, r));
    const std::vector<bf16> r_before = d_r.download();
    std::vector<std::vector<bf16>> y(2);
    for (int run = 0; run < 2; run++) {
      d_y.poison();
      cuda::linear_residual_forward(tc.ctx, d_y.ptr + shift, d_x.ptr + shift, d_w.ptr + shift,
                                    d_r.ptr + shift, s.N, s.in, s.out);
      y[run] = d_y.download();
    }
    CHECK(same_bits(y[0], y[1]));
    CHECK(same_bits(d_r.download(), r_before));  // C is read only

    std::vector<float> cpu(ny);
    ops::linear_residual_forward(cpu.data(), x.data(), w.data(), r.data(), s.N, s.in, s.out);
    const std::vector<float> got = to_f32(y[0]);
    int64_t gpu_misses = 0, cpu_misses = 0;
    double cancelled = 0;  // how far the stream cancels the product: |e| / |x·wᵀ|, the median
    for (size_t i = 0; i < ny; i++) {
      const double e = product[i] + r[i];
      const double fp32_sum = (s.in + 2) * std::ldexp(magnitude[i] + std::fabs(r[i]), -24);
      if (!(std::fabs(got[shift + i] - e) <= std::ldexp(std::fabs(e) + fp32_sum, -8) + fp32_sum))
        gpu_misses++;
      if (!(std::fabs(cpu[i] - e) <= std::ldexp(std::fabs(e), -24) + fp32_sum)) cpu_misses++;
      if (std::fabs(e) < 0.25 * std::fabs(product[i])) cancelled++;
    }
    CHECK(gpu_misses == 0);
    CHECK(cpu_misses == 0);
    if (s.in >= 40) CHECK(cancelled >= 0.5 * double(ny));  // the case the test is for
  }
}

TEST_CASE("gemm: linear_residual_forward refuses a stream that overlaps its output", "[gpu]") {
  TestContext tc;
  const Shape s{4, 16, 8};
  DeviceBuffer<bf16> d_x(s.N * s.in), d_w(size_t(s.out) * s.in), d_y(s.N * s.out + 1);
  upload_bf16(d_x, bf16_rounded(randn(d_x.n)));
  upload_bf16(d_w, bf16_rounded(randn(d_w.n)));
  CHECK_THROWS(cuda::linear_residual_forward(tc.ctx, d_y.ptr + 1, d_x.ptr, d_w.ptr, d_y.ptr, s.N,
                                             s.in, s.out));
}

TEST_CASE("gemm: operands at 2-byte boundaries, as views into a buffer are", "[gpu]") {
  TestContext tc;
  for (const Shape& s : {Shape{3 * 77, 64, 40}, Shape{3 * 77, 5461, 96}}) {
    INFO("N=" << s.N << " in=" << s.in << " out=" << s.out);
    const std::vector<float> x = bf16_rounded(randn(s.N * s.in));
    const std::vector<float> w = bf16_rounded(randn(size_t(s.out) * s.in, 0.05));
    // One element in front of each: every pointer below is base + 2 bytes.
    DeviceBuffer<bf16> dx(1 + x.size()), dw(1 + w.size()), dy(1 + s.N * s.out);
    upload_bf16(dx, behind(1, x));
    upload_bf16(dw, behind(1, w));
    dy.poison();
    cuda::linear_forward(tc.ctx, dy.ptr + 1, dx.ptr + 1, dw.ptr + 1, s.N, s.in, s.out);
    std::vector<float> want(s.N * s.out);
    ops::linear_forward(want.data(), x.data(), w.data(), s.N, s.in, s.out);
    const std::vector<float> got = to_f32(dy.download());
    CHECK(rel_error(std::vector<float>(got.begin() + 1, got.end()), want) <= 1e-2);
  }
}

TEST_CASE("gemm: the same call twice gives the same bits", "[gpu]") {
  TestContext tc;
  const Shape s{3 * 77, 5461, 96};
  const std::vector<float> x = bf16_rounded(randn(s.N * s.in));
  const std::vector<float> dy = bf16_rounded(randn(s.N * s.out));
  const std::vector<float> w = bf16_rounded(randn(size_t(s.out) * s.in, 0.05));
  const std::vector<float> dw_start = randn(size_t(s.out) * s.in);
  DeviceBuffer<bf16> d_x(x.size()), d_dy(dy.size()), d_w(w.size()), d_y(s.N * s.out);
  upload_bf16(d_x, x);
  upload_bf16(d_dy, dy);
  upload_bf16(d_w, w);
  DeviceBuffer<float> d_dw(dw_start.size());

  std::vector<std::vector<bf16>> y(2);
  std::vector<std::vector<float>> dw(2);
  for (int run = 0; run < 2; run++) {
    d_y.poison();
    cuda::linear_forward(tc.ctx, d_y.ptr, d_x.ptr, d_w.ptr, s.N, s.in, s.out);
    y[run] = d_y.download();
    d_dw.upload(dw_start);
    cuda::linear_backward_dw(tc.ctx, d_dw.ptr, cuda::GradType::F32, d_dy.ptr, d_x.ptr, s.N, s.in,
                             s.out);
    dw[run] = d_dw.download();
  }
  CHECK(same_bits(y[0], y[1]));
  CHECK(same_bits(dw[0], dw[1]));
}

#ifdef GRASS_TEST_CUDA_EMU
TEST_CASE("gemm: D apart from C takes the heuristic's best algorithm that writes it so", "[gpu]") {
  // Not every cuBLASLt algorithm writes D apart from C, and the heuristic sees only layouts. With
  // the first 3 offered taking C = D only, the plan must take the 4th (no cublasGemmEx); with all
  // 8 it asks for taking C = D only, cublasGemmEx runs it. The sums are right either way.
  TestContext tc;
  for (const int in_place_only : {3, 8}) {
    INFO(in_place_only << " in-place-only algorithms first");
    const Shape s{7, 24, 16 + 8 * in_place_only};  // shapes no other test plans
    const std::vector<float> x = bf16_rounded(randn(s.N * s.in));
    const std::vector<float> w = bf16_rounded(randn(size_t(s.out) * s.in));
    const std::vector<float> r = bf16_rounded(randn(s.N * s.out));
    DeviceBuffer<bf16> d_x(x.size()), d_w(w.size()), d_r(r.size()), d_y(r.size());
    upload_bf16(d_x, x);
    upload_bf16(d_w, w);
    upload_bf16(d_r, r);
    d_y.poison();
    cuda_emu::lt_in_place_only_algorithms(in_place_only);
    const uint64_t before = cuda_emu::gemm_ex_calls();
    cuda::linear_residual_forward(tc.ctx, d_y.ptr, d_x.ptr, d_w.ptr, d_r.ptr, s.N, s.in, s.out);
    const uint64_t fallbacks = cuda_emu::gemm_ex_calls() - before;
    cuda_emu::lt_in_place_only_algorithms(0);
    CHECK(fallbacks == (in_place_only < 8 ? 0u : 1u));
    std::vector<float> want(r.size());
    ops::linear_residual_forward(want.data(), x.data(), w.data(), r.data(), s.N, s.in, s.out);
    CHECK(rel_error(to_f32(d_y.download()), want) <= 1e-2);
  }
}

TEST_CASE("gemm: a cuBLASLt launch that fails runs through cublasGemmEx, and keeps to it", "[gpu]") {
  // The heuristic offered a kernel (16-byte rows), whose launch then fails (the emulator's fault):
  // the product must still be right, added once to what dw held, and the shape's later calls go
  // straight to the fallback.
  TestContext tc;
  const Shape s{13, 48, 24};  // a shape no other test plans
  const std::vector<float> dy = bf16_rounded(randn(s.N * s.out));
  const std::vector<float> x = bf16_rounded(randn(s.N * s.in));
  std::vector<float> dw = randn(size_t(s.out) * s.in);
  DeviceBuffer<bf16> d_dy(dy.size()), d_x(x.size());
  upload_bf16(d_dy, dy);
  upload_bf16(d_x, x);
  DeviceBuffer<float> d_dw(dw.size());
  d_dw.upload(dw);
  for (int call = 0; call < 2; call++) {
    INFO("call " << call);
    const uint64_t before = cuda_emu::gemm_ex_calls();
    if (call == 0) cuda_emu::fail_next_lt_matmuls(1);
    cuda::linear_backward_dw(tc.ctx, d_dw.ptr, cuda::GradType::F32, d_dy.ptr, d_x.ptr, s.N, s.in,
                             s.out);
    ops::linear_backward<float>(nullptr, dw.data(), dy.data(), x.data(), nullptr, s.N, s.in, s.out,
                                false);
    CHECK(rel_error(d_dw.download(), dw) <= 1e-5);
    CHECK(cuda_emu::gemm_ex_calls() - before == 1);
  }
  cuda_emu::fail_next_lt_matmuls(0);
}
#endif
