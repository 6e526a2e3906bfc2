// Pure bf16's stochastic rounding draws the same bits on the CPU backend, which emulates bf16
// storage in fp32 memory, as on the CUDA backend: every optimizer store (the weight, m and v of the
// AdamW, GRASS and GaLore/FLORA updates, and FLORA's moment transfer) takes its stream from
// rounding_stream_seed(seed, step, stream) (kernels/stochastic_round.h) and the element's index in
// its buffer as the counter. Each update here is chosen so that both backends compute the same
// fp32 values before rounding: β = 0.5, so m and v are sums of exact products; a weight decay
// factor of 0.75 (exact on bf16 weights); and, where the step goes through a product the GPU may
// fuse into its subtraction (GRASS) or through a GEMM (GaLore), alpha = 0. The stored bf16 must
// then agree bit for bit, and a stream or an index that differs disagrees on about a third of the
// values that fall between two bf16 values: the test counts those, so it cannot pass vacuously.
// The last test checks the one bf16 store that rounds to nearest instead: an accumulated gradient.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/lowrank_ops.h"
#include "kernels/ops.h"
#include "kernels/storage.h"
#include "src/core/bf16.h"
#include "tests/gpu/gpu_test_util.h"

using namespace grass;
using namespace grass::gputest;
using bf16 = __nv_bfloat16;

namespace {

// The CUDA backend under test and the CPU backend, both in pure bf16.
struct PureBf16Backends {
  Storage gpu_storage = make_storage(Precision::Bf16, true);
  Storage cpu_storage = make_storage(Precision::Bf16, false);
  std::unique_ptr<Backend> gpu = make_cuda_backend(gpu_storage);
  std::unique_ptr<Backend> cpu = make_cpu_backend(cpu_storage);
  Arena gpu_arena{false, *gpu};
  std::unique_ptr<ScratchLease> gpu_scratch = gpu->plan_scratch(gpu_arena, WorkspaceShape{});  // cuBLASLt's
};

// β = 0.5 (1 - β = 0.5: m and v are sums of exact products); weight decay 0.75 = 1 - lr·wd;
// step 3, so the bias corrections are not 1.
AdamArgs exact_adam_args() {
  return {.grad_scale = 1, .lr = 0.5, .beta1 = 0.5, .beta2 = 0.5, .eps = 1e-3,
          .weight_decay = 0.5, .step = 3};
}

std::vector<float> squares(std::vector<float> x) {
  for (float& v : x) v *= v;
  return x;
}

// A buffer the GPU stores in bf16 and the CPU in fp32 memory, compared by their bits.
struct Stored {
  const char* name;
  std::vector<float> gpu, cpu;
  std::vector<float> exact;  // the fp32 value before the rounding
};

void check_same_rounding(const std::vector<Stored>& buffers) {
  for (const Stored& s : buffers) {
    INFO(s.name);
    REQUIRE(s.gpu.size() == s.cpu.size());
    REQUIRE(s.exact.size() == s.cpu.size());
    int64_t different = 0, between = 0;
    for (size_t i = 0; i < s.cpu.size(); i++) {
      different += std::bit_cast<uint32_t>(s.gpu[i]) != std::bit_cast<uint32_t>(s.cpu[i]);
      between += s.exact[i] != __bfloat162float(__float2bfloat16_rn(s.exact[i]));
    }
    INFO(different << " of " << s.cpu.size() << " stored values differ; " << between
                   << " fall between two bf16 values");
    CHECK(different == 0);
    CHECK(between >= 50);  // many rounding decisions were compared
  }
}

}  // namespace

TEST_CASE("pure bf16: AdamW's weight, m and v round as on the CPU backend", "[gpu][rounding]") {
  PureBf16Backends be;
  const AdamArgs a = exact_adam_args();
  const int64_t n = 1000;  // not a multiple of the block size
  const std::vector<float> p0 = bf16_rounded(randn(n)), g = bf16_rounded(randn(n)),
                           m0 = bf16_rounded(randn(n, 0.1)),
                           v0 = bf16_rounded(squares(randn(n, 0.1)));
  DeviceBuffer<bf16> d_p(n), d_g(n), d_m(n), d_v(n);
  d_p.upload(to_bf16(p0));
  d_g.upload(to_bf16(g));
  d_m.upload(to_bf16(m0));
  d_v.upload(to_bf16(v0));
  be.gpu->adamw_update({d_p.ptr, nullptr}, d_g.ptr, d_m.ptr, d_v.ptr, n, a, 1234);

  std::vector<float> p = p0, m = m0, v = v0, p_exact = p0, m_exact = m0, v_exact = v0;
  be.cpu->adamw_update({p.data(), nullptr}, g.data(), m.data(), v.data(), n, a, 1234);
  ops::adamw_update<float>(p_exact.data(), g.data(), m_exact.data(), v_exact.data(), n, a);
  check_same_rounding({{"weight", to_f32(d_p.download()), p, p_exact},
                       {"m", to_f32(d_m.download()), m, m_exact},
                       {"v", to_f32(d_v.download()), v, v_exact}});
}

TEST_CASE("pure bf16: GRASS's selected slices, m and v round as on the CPU backend",
          "[gpu][rounding]") {
  PureBf16Backends be;
  const AdamArgs a = exact_adam_args();
  const double alpha = 0;  // the weights change by the decay alone: 0.75·w, exact on both
  const int out = 37, in = 45, r = 5;
  const std::vector<int32_t> sigma = {2, 7, 7, 20, 30};  // sorted, one slice drawn twice
  const std::vector<float> scale = {1, 2, 2, 1, 3};
  for (const bool rows : {true, false}) {
    INFO("rows=" << rows);
    const size_t numel = size_t(out) * in, state = size_t(r) * (rows ? in : out);
    const std::vector<float> w0 = bf16_rounded(randn(numel)), gc0 = bf16_rounded(randn(state)),
                             m0 = bf16_rounded(randn(state, 0.1)),
                             v0 = bf16_rounded(squares(randn(state, 0.1)));
    DeviceBuffer<bf16> d_w(numel), d_gc(state), d_m(state), d_v(state);
    DeviceBuffer<int32_t> d_sigma(sigma.size());
    DeviceBuffer<float> d_scale(scale.size());
    d_w.upload(to_bf16(w0));
    d_gc.upload(to_bf16(gc0));
    d_m.upload(to_bf16(m0));
    d_v.upload(to_bf16(v0));
    d_sigma.upload(sigma);
    d_scale.upload(scale);
    be.gpu->grass_adam_update({d_w.ptr, nullptr}, d_gc.ptr, d_m.ptr, d_v.ptr,
                              {d_sigma.ptr, d_scale.ptr, out, in, r, rows}, alpha, a, 5678);

    std::vector<float> w = w0, gc = gc0, m = m0, v = v0;
    std::vector<float> w_exact = w0, gc_exact = gc0, m_exact = m0, v_exact = v0;
    be.cpu->grass_adam_update({w.data(), nullptr}, gc.data(), m.data(), v.data(),
                              {sigma.data(), scale.data(), out, in, r, rows}, alpha, a, 5678);
    ops::grass_adam_update<float>(w_exact.data(), gc_exact.data(), m_exact.data(), v_exact.data(),
                                  sigma.data(), scale.data(), out, in, r, rows, alpha, a);
    check_same_rounding({{"weight", to_f32(d_w.download()), w, w_exact},
                         {"m", to_f32(d_m.download()), m, m_exact},
                         {"v", to_f32(d_v.download()), v, v_exact}});
  }
}

TEST_CASE("pure bf16: GaLore's weight, m and v round as on the CPU backend", "[gpu][rounding]") {
  PureBf16Backends be;
  const AdamArgs a = exact_adam_args();
  const double alpha = 0;  // no back-projection: the weights change by the decay alone
  const int out = 43, in = 70, r = 6;
  for (const bool rows : {true, false}) {
    INFO("rows=" << rows);
    const int side = rows ? out : in;
    const size_t numel = size_t(out) * in, state = size_t(r) * (rows ? in : out);
    const std::vector<float> P = randn(size_t(side) * r);
    const std::vector<float> w0 = bf16_rounded(randn(numel)), R0 = bf16_rounded(randn(state)),
                             m0 = bf16_rounded(randn(state, 0.1)),
                             v0 = bf16_rounded(squares(randn(state, 0.1)));
    DeviceBuffer<float> d_P(P.size());
    DeviceBuffer<bf16> d_w(numel), d_R(state), d_m(state), d_v(state);
    DeviceBuffer<char> workspace(size_t(lowrank_workspace_bytes(be.gpu_storage, out, in, r)));
    d_P.upload(P);
    d_w.upload(to_bf16(w0));
    d_R.upload(to_bf16(R0));
    d_m.upload(to_bf16(m0));
    d_v.upload(to_bf16(v0));
    be.gpu->lowrank_adam_update({d_w.ptr, nullptr}, d_R.ptr, d_m.ptr, d_v.ptr, workspace.ptr,
                                {d_P.ptr, out, in, r, rows}, alpha, 0.0, a, 9012);

    std::vector<float> w = w0, R = R0, m = m0, v = v0;
    std::vector<float> w_exact = w0, R_exact = R0, m_exact = m0, v_exact = v0;
    be.cpu->lowrank_adam_update({w.data(), nullptr}, R.data(), m.data(), v.data(), nullptr,
                                {P.data(), out, in, r, rows}, alpha, 0.0, a, 9012);
    ops::lowrank_adam_update<float>(w_exact.data(), R_exact.data(), m_exact.data(),
                                    v_exact.data(), P.data(), out, in, r, rows, alpha, 0.0, a);
    check_same_rounding({{"weight", to_f32(d_w.download()), w, w_exact},
                         {"m", to_f32(d_m.download()), m, m_exact},
                         {"v", to_f32(d_v.download()), v, v_exact}});
  }
}

TEST_CASE("pure bf16: FLORA's moment transfer rounds as on the CPU backend", "[gpu][rounding]") {
  PureBf16Backends be;
  const int out = 43, in = 70, r = 6;
  for (const bool rows : {true, false}) {
    INFO("rows=" << rows);
    const int side = rows ? out : in;
    const size_t numel = size_t(r) * (rows ? in : out);
    // P_old = [I; 0] and P_new = 0.75·P_old: the transfer C = P_oldᵀ·P_new = 0.75·I multiplies
    // the moment by 0.75, exactly on both backends.
    std::vector<float> P_old(size_t(side) * r, 0.0f), P_new(P_old.size(), 0.0f);
    for (int j = 0; j < r; j++) {
      P_old[size_t(j) * r + j] = 1.0f;
      P_new[size_t(j) * r + j] = 0.75f;
    }
    const std::vector<float> m0 = bf16_rounded(randn(numel, 0.1));
    DeviceBuffer<float> d_old(P_old.size()), d_new(P_new.size()), scratch(size_t(r) * r + numel);
    DeviceBuffer<bf16> d_m(numel);
    d_old.upload(P_old);
    d_new.upload(P_new);
    d_m.upload(to_bf16(m0));
    be.gpu->flora_transfer(d_m.ptr, scratch.ptr, d_old.ptr, {d_new.ptr, out, in, r, rows}, 3456);

    std::vector<float> m = m0, m_exact = m0, cpu_scratch(scratch.n);
    be.cpu->flora_transfer(m.data(), cpu_scratch.data(), P_old.data(),
                           {P_new.data(), out, in, r, rows}, 3456);
    ops::flora_transfer<float>(m_exact.data(), cpu_scratch.data(), P_old.data(), P_new.data(), out,
                               in, r, rows);
    check_same_rounding({{"m", to_f32(d_m.download()), m, m_exact}});
  }
}

// The one bf16 store that rounds to nearest on both backends (issue 24, item 5; docs/memory.md):
// a gradient accumulated across micro-batches. The GPU's GEMM adds into its bf16 output with
// β = 1 and its epilogue rounds to nearest; the CPU rounds its fp32 sum so. Each accumulated value
// lies within half a bf16 spacing of the exact sum of the stored value and the new term, plus the
// fp32 GEMM's own error, at most γ_{N+1} = (N+1)·2⁻²⁴ of the sum of the terms' magnitudes in any
// summation order (not of the sum itself: with cancellation that is far smaller, and cuBLAS's
// order, like the emulator's, follows the shape). Where that error is under a tenth of a spacing
// the bound is decisive: stochastic rounding would miss it on about half of those.
TEST_CASE("pure bf16: a gradient accumulated across micro-batches rounds to nearest on the GPU",
          "[gpu][rounding]") {
  PureBf16Backends be;
  const int N = 64, in = 72, out = 40, r = 6;
  const std::vector<int32_t> sigma = {3, 7, 0, 39, 11, 20};
  DeviceBuffer<bf16> d_gc(size_t(r) * in), d_dy(size_t(N) * out), d_x(size_t(N) * in),
      scratch(size_t(N) * r);
  DeviceBuffer<int32_t> d_sigma(r);
  DeviceBuffer<float> d_rho(r);
  d_sigma.upload(sigma);
  d_rho.upload(std::vector<float>(r, 1.0f));
  d_gc.upload(to_bf16(std::vector<float>(size_t(r) * in, 0.0f)));
  int64_t between = 0;
  for (int micro_batch = 0; micro_batch < 3; micro_batch++) {
    const std::vector<float> previous = to_f32(d_gc.download());
    const std::vector<float> dy = bf16_rounded(randn(size_t(N) * out)),
                             x = bf16_rounded(randn(size_t(N) * in));
    d_dy.upload(to_bf16(dy));
    d_x.upload(to_bf16(x));
    be.gpu->grass_compressed_grad(d_gc.ptr, scratch.ptr, d_dy.ptr, d_x.ptr, d_sigma.ptr, d_rho.ptr,
                                  N, in, out, r, true);
    const std::vector<float> stored = to_f32(d_gc.download());
    for (int j = 0; j < r; j++)
      for (int c = 0; c < in; c++) {
        double exact = previous[size_t(j) * in + c], magnitudes = std::abs(exact);
        for (int n = 0; n < N; n++) {
          const double term = double(dy[size_t(n) * out + sigma[j]]) * x[size_t(n) * in + c];
          exact += term;
          magnitudes += std::abs(term);
        }
        const double fp32_error = (N + 1) * 0x1p-24 * magnitudes;
        const float got = stored[size_t(j) * in + c];
        INFO("micro-batch " << micro_batch << " slice " << j << " column " << c << ": " << got
                            << " for " << exact << " (fp32 error bound " << fp32_error << ")");
        REQUIRE(std::abs(got - exact) <= 0.5 * bf16_spacing(exact) + fp32_error);
        between += got != float(exact) && fp32_error < 0.1 * bf16_spacing(exact);
      }
  }
  CHECK(between > 1000);  // most sums fell between two bf16 values, decisively: the rounding was tested
}
