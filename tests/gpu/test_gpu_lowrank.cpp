// GaLore and FLORA on the GPU (kernels/cuda/lowrank.cu, through CudaBackend) against the CPU
// backend and the CPU ops (kernels/cpu/lowrank.cpp) on the same bf16-rounded inputs: the projected
// gradient from the activations (accumulating), the two projections (bit for bit: both are made
// on the host), FLORA's moment transfer and GaLore's Adam step with its dense update, in both
// storage schemes (bf16-mixed: fp32 R, moments and master; pure bf16: bf16 everything with
// stochastic rounding), rows and columns, at shapes with widths that are not multiples of 8.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/lowrank_ops.h"
#include "kernels/storage.h"
#include "src/core/error.h"
#include "src/train/run_resolution.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/subspace.h"

using namespace grass;
using namespace grass::gputest;
using bf16 = __nv_bfloat16;

namespace {

struct Shape {
  int out, in, r;
  int64_t N;
};
// 40 x 72 (multiples of 8) and 43 x 70 with r = 6 (odd rows, unaligned bf16 pitches)
const Shape kShapes[] = {{40, 72, 8, 100}, {43, 70, 6, 51}};

uint16_t bits(bf16 x) { return std::bit_cast<uint16_t>(x); }

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

std::vector<float> squares(std::vector<float> x) {
  for (float& v : x) v *= v;
  return x;
}

// A random projection [side, r] with N(0, 1/r) entries (FLORA's distribution): fresh every call.
std::vector<float> random_projection(int side, int r) {
  return randn(size_t(side) * size_t(r), 1.0 / std::sqrt(double(r)));
}

// The two backends of one precision: the CUDA backend under test and the CPU reference.
struct Backends {
  Storage gpu_storage, cpu_storage;
  std::unique_ptr<Backend> gpu, cpu;
  Arena gpu_arena;
  std::unique_ptr<ScratchLease> gpu_scratch;  // the cuBLASLt workspace; no model shapes
  explicit Backends(PrecisionChoice precision)
      : gpu_storage(storage_for(precision, true)), cpu_storage(storage_for(precision, false)),
        gpu(make_cuda_backend(gpu_storage)), cpu(make_cpu_backend(cpu_storage)),
        gpu_arena(false, *gpu), gpu_scratch(gpu->plan_scratch(gpu_arena, WorkspaceShape{})) {}
  bool pure() const { return gpu_storage.pure_bf16(); }
};

// A grad- or state-typed device buffer (fp32 in bf16-mixed, bf16 in pure bf16), read and written
// as floats.
struct TypedBuffer {
  bool f32;
  DeviceBuffer<float> f;
  DeviceBuffer<bf16> h;
  TypedBuffer(bool is_f32, size_t n) : f32(is_f32), f(is_f32 ? n : 0), h(is_f32 ? 0 : n) {}
  void* ptr() { return f32 ? static_cast<void*>(f.ptr) : static_cast<void*>(h.ptr); }
  std::vector<float> representable(const std::vector<float>& x) const {
    return f32 ? x : bf16_rounded(x);
  }
  void upload(const std::vector<float>& x) { f32 ? f.upload(x) : h.upload(to_bf16(x)); }
  void poison() { f32 ? f.poison() : h.poison(); }
  std::vector<float> download() const { return f32 ? f.download() : to_f32(h.download()); }
};

// The Adam hyperparameters of the update tests: step 3 (bias corrections not 1), clipping on,
// weight decay on.
AdamArgs adam_args() {
  return {.grad_scale = 0.7, .lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-6,
          .weight_decay = 0.1, .step = 3};
}

// The fraction of values whose bf16 rounding-to-nearest differs from that of the unrounded
// reference (stochastic rounding: about a quarter; round-to-nearest: none), and the mean signed
// rounding error in units of the bf16 spacing (stochastic rounding is unbiased: about 0). Each
// error is clamped to one spacing: a stochastic rounding lands within one spacing of its fp32
// value, and where b1·m + (1-b1)·g nearly cancels the GPU's fp32 value may sit many spacings of
// the small result from the CPU's (contraction), which would swamp the mean over a few hundred
// values (it did, in about 1 run in 20 without contraction).
struct RoundingStats {
  double not_nearest = 0, mean_ulps = 0;
};
RoundingStats rounding_stats(const std::vector<float>& got, const std::vector<float>& exact) {
  RoundingStats s;
  for (size_t i = 0; i < got.size(); i++) {
    s.not_nearest += bits(__float2bfloat16_rn(got[i])) != bits(__float2bfloat16_rn(exact[i]));
    const float spacing = std::ldexp(1.0f, std::ilogb(exact[i]) - 7);
    s.mean_ulps += std::clamp((double(got[i]) - exact[i]) / spacing, -1.0, 1.0);
  }
  s.not_nearest /= double(got.size());
  s.mean_ulps /= double(got.size());
  return s;
}

// GaLore's update is dense: every element whose reference change is clearly above what the GPU's
// arithmetic can lose must move. Left out: elements whose change is within 2% of the sum of the
// magnitudes of its terms (the decay's and the r products of back(N), which the bf16 copies of P
// and N perturb by ~0.4%: there the GPU's change may cancel to nothing in fp32) and, for bf16
// weights, within two bf16 spacings (which stochastic rounding may keep in place).
// N: the Adam direction of the CPU op (it leaves it in R). Returns {unmoved, counted}.
std::pair<int64_t, int64_t> unmoved_elements(const std::vector<float>& before,
                                             const std::vector<float>& after,
                                             const std::vector<float>& want_change,
                                             const std::vector<float>& P,
                                             const std::vector<float>& N, const Shape& s,
                                             bool rows, const AdamArgs& a, double alpha,
                                             bool bf16_weights) {
  const double t = double(a.step);
  const double decay = 1.0 - a.lr * a.weight_decay;
  const double scale =
      a.lr * std::sqrt(1.0 - std::pow(a.beta2, t)) / (1.0 - std::pow(a.beta1, t)) * alpha * decay;
  int64_t unmoved = 0, counted = 0;
  for (int o = 0; o < s.out; o++)
    for (int c = 0; c < s.in; c++) {
      const size_t e = size_t(o) * s.in + c;
      double terms = 0;  // Σ_k |P[o, k]·N[k, c]| (rows) or |N[o, k]·P[c, k]| (cols)
      for (int k = 0; k < s.r; k++)
        terms += rows ? std::abs(double(P[size_t(o) * s.r + k]) * N[size_t(k) * s.in + c])
                      : std::abs(double(N[size_t(o) * s.r + k]) * P[size_t(c) * s.r + k]);
      const double bound = (1.0 - decay) * std::abs(before[e]) + scale * terms;
      if (!(std::abs(want_change[e]) > 0.02 * bound)) continue;
      if (bf16_weights && std::abs(want_change[e]) <= std::ldexp(2.0, std::ilogb(before[e]) - 7))
        continue;
      counted++;
      unmoved += std::bit_cast<uint32_t>(after[e]) == std::bit_cast<uint32_t>(before[e]);
    }
  return {unmoved, counted};
}

}  // namespace

TEST_CASE("lowrank: the projected gradient accumulates from the activations", "[gpu][lowrank]") {
  for (const PrecisionChoice precision : {PrecisionChoice::Bf16Mixed, PrecisionChoice::Bf16}) {
    Backends be(precision);
    for (const Shape& s : kShapes)
      for (const bool rows : {true, false}) {
        INFO("pure=" << be.pure() << " out=" << s.out << " in=" << s.in << " rows=" << rows);
        const int side = rows ? s.out : s.in;
        const size_t R_numel = size_t(s.r) * (rows ? s.in : s.out);
        const std::vector<float> dy = bf16_rounded(randn(size_t(s.N) * s.out));
        const std::vector<float> x = bf16_rounded(randn(size_t(s.N) * s.in));
        const std::vector<float> P = random_projection(side, s.r);
        DeviceBuffer<bf16> d_dy(dy.size()), d_x(x.size()), scratch(size_t(s.N) * s.r);
        DeviceBuffer<float> d_P(P.size());
        DeviceBuffer<char> workspace(
            size_t(lowrank_workspace_bytes(be.gpu_storage, s.out, s.in, s.r)));
        d_dy.upload(to_bf16(dy));
        d_x.upload(to_bf16(x));
        d_P.upload(P);
        scratch.poison();
        workspace.poison();
        TypedBuffer R(!be.pure(), R_numel);
        // The earlier micro-batches' sum, as large as this one's: dropping it fails the bound.
        std::vector<float> want = R.representable(randn(R_numel, std::sqrt(double(s.N))));
        R.upload(want);
        const LowRankProjection gp{d_P.ptr, s.out, s.in, s.r, rows};
        be.gpu->lowrank_compressed_grad(R.ptr(), scratch.ptr, workspace.ptr, d_dy.ptr, d_x.ptr,
                                        s.N, gp);
        std::vector<float> cpu_scratch(size_t(s.N) * s.r);
        const LowRankProjection cp{P.data(), s.out, s.in, s.r, rows};
        be.cpu->lowrank_compressed_grad(want.data(), cpu_scratch.data(), nullptr, dy.data(),
                                        x.data(), s.N, cp);
        CHECK(rel_error(R.download(), want) <= 1e-2);
        CHECK(same_bits(d_P.download(), P));  // read only
      }
  }
}

TEST_CASE("lowrank: galore_basis is the CPU's SVD, bit for bit", "[gpu][lowrank]") {
  Backends be(PrecisionChoice::Bf16Mixed);
  for (const Shape& s : kShapes)
    for (const bool rows : {true, false}) {
      INFO("out=" << s.out << " in=" << s.in << " rows=" << rows);
      const int side = rows ? s.out : s.in;
      const std::vector<float> g = randn(size_t(s.out) * s.in);
      DeviceBuffer<float> d_g(g.size()), d_P(size_t(side) * s.r);
      d_g.upload(g);
      d_P.poison();
      be.gpu->galore_basis(d_P.ptr, d_g.ptr, s.out, s.in, s.r, rows, GaloreBasisMethod{}, nullptr,
                           nullptr);
      std::vector<float> want(d_P.n);
      ops::galore_basis<float>(want.data(), g.data(), s.out, s.in, s.r, rows);
      CHECK(same_bits(d_P.download(), want));
      CHECK(same_bits(d_g.download(), g));  // read only
    }
}

TEST_CASE("lowrank: the randomized galore_basis on the device spans the CPU's subspace",
          "[gpu][lowrank]") {
  // G = A·B + 0.01·noise, A [out, r] and B [r, in] Gaussian: a gap of about 100 after the r-th
  // singular value, so the top-r subspace is well defined and both range finders (the same test
  // matrix from the seed, other summation orders and another QR) reach it to float rounding.
  Backends be(PrecisionChoice::Bf16Mixed);
  for (const Shape& s : kShapes)
    for (const bool rows : {true, false}) {
      INFO("out=" << s.out << " in=" << s.in << " r=" << s.r << " rows=" << rows);
      const int side = rows ? s.out : s.in;
      const std::vector<float> A = randn(size_t(s.out) * s.r), B = randn(size_t(s.r) * s.in),
                               noise = randn(size_t(s.out) * s.in, 0.01);
      std::vector<float> g(noise);
      for (int i = 0; i < s.out; i++)
        for (int j = 0; j < s.in; j++)
          for (int c = 0; c < s.r; c++)
            g[size_t(i) * s.in + j] += A[size_t(i) * s.r + c] * B[size_t(c) * s.in + j];
      GaloreBasisMethod how;
      how.randomized = true;
      how.seed = 4242;
      const int64_t bytes = galore_basis_workspace_bytes(be.gpu_storage, s.out, s.in, s.r, how);
      REQUIRE(bytes > 0);
      DeviceBuffer<float> d_g(g.size()), d_P(size_t(side) * s.r);
      DeviceBuffer<char> workspace{size_t(bytes)};
      DeviceBuffer<int> status(4);
      d_g.upload(g);
      d_P.poison();
      status.upload({0, 0, 0, 0});
      be.gpu->galore_basis(d_P.ptr, d_g.ptr, s.out, s.in, s.r, rows, how, workspace.ptr,
                           status.ptr);
      const std::vector<float> got = d_P.download();
      CHECK(status.download() == std::vector<int>{0, 0, 0, 0});  // cuSOLVER's: every call succeeded
      std::vector<float> cpu(got.size()), exact(got.size());
      be.cpu->galore_basis(cpu.data(), g.data(), s.out, s.in, s.r, rows, how, nullptr, nullptr);
      ops::galore_basis<float>(exact.data(), g.data(), s.out, s.in, s.r, rows);
      const double sine = test::subspace_sine(exact, s.r, got, side, s.r);
      INFO("sin(largest principal angle) to the exact SVD's subspace <= " << sine);
      CHECK(sine <= 1e-4);
      CHECK(test::subspace_sine(cpu, s.r, got, side, s.r) <= 1e-4);
      // each vector, its sign normalised as the CPU's: the singular values are apart
      CHECK(rel_error(got, cpu) <= 1e-3);
      CHECK(same_bits(d_g.download(), g));  // read only
      // a function of (G, seed): the same bits again; a status an earlier target left is kept
      status.upload({0, 0, 7, 0});
      be.gpu->galore_basis(d_P.ptr, d_g.ptr, s.out, s.in, s.r, rows, how, workspace.ptr,
                           status.ptr);
      CHECK(same_bits(d_P.download(), got));
      CHECK(status.download() == std::vector<int>{0, 0, 7, 0});
    }
}

// GaLore's svd_batch "layer": targets of three shapes that share k (each side projected, both
// orientations) sketched into the slots of one batch, then one galore_finish. Each P is the
// target's galore_basis: bit for bit on the CPU backend and on the emulator (whose batched
// eigensolver is syevd for each matrix), and on a GPU (cuSOLVER's batched eigensolver, another
// algorithm) to within the subspace test above. A NaN gradient in the middle slot leaves its
// statuses (the Cholesky factorisation's and the eigensolver's info) for the one read.
TEST_CASE("lowrank: galore_finish solves a batch of sketches in one call, each P as "
          "galore_basis's", "[gpu][lowrank]") {
  Backends be(PrecisionChoice::Bf16Mixed);
  struct Target {
    int out, in;
    bool rows;
  };
  const Target targets[] = {{40, 72, true}, {43, 70, false}, {72, 40, true}};
  const int r = 6, oversample = 4, k = r + oversample, count = 3;
  int max_side = 0;
  int64_t workspace_bytes = 0;
  GaloreBasisMethod how;
  how.randomized = true;
  how.power_iters = 1;
  how.oversample = oversample;
  for (const Target& t : targets) {
    REQUIRE(ops::galore_sketch_columns(t.out, t.in, r, oversample) == k);
    max_side = std::max(max_side, t.rows ? t.out : t.in);
    workspace_bytes = std::max(workspace_bytes,
                               galore_basis_workspace_bytes(be.gpu_storage, t.out, t.in, r, how));
  }
  const GaloreBatchLayout layout = galore_batch_layout(be.gpu_storage, max_side, k, count);
  const GaloreBatchLayout cpu_layout = galore_batch_layout(be.cpu_storage, max_side, k, count);
  be.gpu->prepare_galore_batch(k, count, layout);  // cuSOLVER's work space fits the plan
  GaloreBatchLayout short_layout = layout;
  short_layout.work_bytes = 16;
  CHECK_THROWS_AS(be.gpu->prepare_galore_batch(k, count, short_layout), UserError);
  std::vector<std::vector<float>> g(count);
  for (int i = 0; i < count; i++) {  // a gap after the r-th singular value, as above
    const Target& t = targets[i];
    const std::vector<float> A = randn(size_t(t.out) * r), B = randn(size_t(r) * t.in);
    g[size_t(i)] = randn(size_t(t.out) * t.in, 0.01);
    for (int a = 0; a < t.out; a++)
      for (int b = 0; b < t.in; b++)
        for (int c = 0; c < r; c++)
          g[size_t(i)][size_t(a) * t.in + b] += A[size_t(a) * r + c] * B[size_t(c) * t.in + b];
  }
  const auto seeded = [&](int i) {
    GaloreBasisMethod h = how;
    h.seed = 700 + uint64_t(i);
    return h;
  };
  DeviceBuffer<char> batch{size_t(layout.bytes)}, workspace{size_t(workspace_bytes)};
  DeviceBuffer<int> status(4);
  std::deque<DeviceBuffer<float>> d_g, d_P;  // not movable: a deque never moves them
  std::vector<float*> P;
  std::vector<int> sides;
  for (int i = 0; i < count; i++) {
    const Target& t = targets[i];
    d_g.emplace_back(g[size_t(i)].size());
    d_g.back().upload(g[size_t(i)]);
    sides.push_back(t.rows ? t.out : t.in);
    d_P.emplace_back(size_t(sides.back()) * r);
    d_P.back().poison();
    P.push_back(d_P.back().ptr);
  }
  const auto run_batch = [&] {
    batch.poison();
    status.upload({0, 0, 0, 0});
    for (int i = 0; i < count; i++) {
      const Target& t = targets[i];
      be.gpu->galore_sketch(d_g[size_t(i)].ptr, t.out, t.in, r, t.rows, seeded(i), batch.ptr,
                            layout, i, workspace.ptr, status.ptr);
    }
    be.gpu->galore_finish(P.data(), sides.data(), count, k, r, batch.ptr, layout, workspace.ptr,
                          status.ptr);
  };
  run_batch();
  CHECK(status.download() == std::vector<int>{0, 0, 0, 0});
  std::vector<char> cpu_batch(size_t(cpu_layout.bytes));
  std::vector<std::vector<float>> cpu_P(count);
  std::vector<float*> cpu_ptrs;
  for (int i = 0; i < count; i++) {
    const Target& t = targets[i];
    cpu_P[size_t(i)].assign(size_t(sides[size_t(i)]) * r, std::nanf(""));
    cpu_ptrs.push_back(cpu_P[size_t(i)].data());
    be.cpu->galore_sketch(g[size_t(i)].data(), t.out, t.in, r, t.rows, seeded(i), cpu_batch.data(),
                          cpu_layout, i, nullptr, nullptr);
  }
  be.cpu->galore_finish(cpu_ptrs.data(), sides.data(), count, k, r, cpu_batch.data(), cpu_layout,
                        nullptr, nullptr);
  for (int i = 0; i < count; i++) {
    const Target& t = targets[i];
    INFO("target " << i << ": " << t.out << " x " << t.in << (t.rows ? ", rows" : ", columns"));
    // the one-target refresh on each backend
    std::vector<float> cpu_one(cpu_P[size_t(i)].size());
    be.cpu->galore_basis(cpu_one.data(), g[size_t(i)].data(), t.out, t.in, r, t.rows, seeded(i),
                         nullptr, nullptr);
    CHECK(same_bits(cpu_P[size_t(i)], cpu_one));
    DeviceBuffer<float> one(cpu_one.size());
    one.poison();
    be.gpu->galore_basis(one.ptr, d_g[size_t(i)].ptr, t.out, t.in, r, t.rows, seeded(i),
                         workspace.ptr, status.ptr);
    const std::vector<float> got = d_P[size_t(i)].download(), want = one.download();
#ifdef GRASS_TEST_CUDA_EMU
    CHECK(same_bits(got, want));
#else
    CHECK(test::subspace_sine(want, r, got, sides[size_t(i)], r) <= 1e-4);
    CHECK(rel_error(got, want) <= 1e-3);
#endif
    CHECK(test::subspace_sine(cpu_one, r, got, sides[size_t(i)], r) <= 1e-4);
  }
  CHECK(status.download() == std::vector<int>{0, 0, 0, 0});
  // a function of (G, seed): the same bits again
  std::vector<std::vector<float>> first;
  for (const auto& d : d_P) first.push_back(d.download());
  run_batch();
  for (int i = 0; i < count; i++) CHECK(same_bits(d_P[size_t(i)].download(), first[size_t(i)]));
  // a non-finite gradient in slot 1: its potrf fails on the first column, its eigensolver too
  g[1][5] = std::numeric_limits<float>::quiet_NaN();
  d_g[1].upload(g[1]);
  run_batch();
  const std::vector<int> failed = status.download();
  CHECK(failed[2] != 0);
  CHECK(failed[3] == 1);
}

TEST_CASE("lowrank: the randomized galore_basis keeps a failed eigensolver's status",
          "[gpu][lowrank]") {
  // A non-finite gradient: the first CholeskyQR2 pass's Gram has a non-finite trace, which the
  // shift kernel turns into a diagonal of -1, so potrf fails on its first column (info 1) on any
  // cuSOLVER; the eigensolver does not converge either (LAPACK's, the emulator's, says so with
  // info > 0), and the status ints keep both for the refresh's one read.
  Backends be(PrecisionChoice::Bf16Mixed);
  const Shape s = kShapes[1];
  GaloreBasisMethod how;
  how.randomized = true;
  const int64_t bytes = galore_basis_workspace_bytes(be.gpu_storage, s.out, s.in, s.r, how);
  std::vector<float> g = randn(size_t(s.out) * s.in);
  g[3] = std::numeric_limits<float>::quiet_NaN();
  DeviceBuffer<float> d_g(g.size()), d_P(size_t(s.out) * s.r);
  DeviceBuffer<char> workspace{size_t(bytes)};
  DeviceBuffer<int> status(4);
  d_g.upload(g);
  status.upload({0, 0, 0, 0});
  be.gpu->galore_basis(d_P.ptr, d_g.ptr, s.out, s.in, s.r, true, how, workspace.ptr, status.ptr);
  const std::vector<int> got = status.download();
  CHECK(got[2] != 0);
  CHECK(got[3] == 1);
}

TEST_CASE("lowrank: the randomized galore_basis takes a rank-deficient gradient",
          "[gpu][lowrank]") {
  // G = A·B of rank 5 < r = 8 < k = 16: the power iterations' Grams are singular, and only the
  // CholeskyQR2 shift lets potrf factor them (every status stays 0). P is orthonormal and holds
  // G's range, as the CPU's does.
  Backends be(PrecisionChoice::Bf16Mixed);
  const Shape s = kShapes[0];
  const int rank = 5;
  for (const bool rows : {true, false}) {
    INFO("rows=" << rows);
    const int side = rows ? s.out : s.in;
    const std::vector<float> A = randn(size_t(s.out) * rank), B = randn(size_t(rank) * s.in);
    std::vector<float> g(size_t(s.out) * s.in, 0.0f);
    for (int i = 0; i < s.out; i++)
      for (int j = 0; j < s.in; j++)
        for (int c = 0; c < rank; c++)
          g[size_t(i) * s.in + j] += A[size_t(i) * rank + c] * B[size_t(c) * s.in + j];
    GaloreBasisMethod how;
    how.randomized = true;
    how.seed = 99;
    const int64_t bytes = galore_basis_workspace_bytes(be.gpu_storage, s.out, s.in, s.r, how);
    DeviceBuffer<float> d_g(g.size()), d_P(size_t(side) * s.r);
    DeviceBuffer<char> workspace{size_t(bytes)};
    DeviceBuffer<int> status(4);
    d_g.upload(g);
    d_P.poison();
    status.upload({0, 0, 0, 0});
    be.gpu->galore_basis(d_P.ptr, d_g.ptr, s.out, s.in, s.r, rows, how, workspace.ptr, status.ptr);
    const std::vector<float> got = d_P.download();
    CHECK(status.download() == std::vector<int>{0, 0, 0, 0});
    // the exact top-`rank` vectors (G's range), padded with zero columns to P's r
    std::vector<float> exact(size_t(side) * rank), range(got.size(), 0.0f), cpu(got.size());
    ops::galore_basis<float>(exact.data(), g.data(), s.out, s.in, rank, rows);
    for (int i = 0; i < side; i++)
      for (int c = 0; c < rank; c++) range[size_t(i) * s.r + c] = exact[size_t(i) * rank + c];
    CHECK(test::subspace_sine(got, s.r, range, side, s.r) <= 1e-4);  // ‖(I − P·Pᵀ)·range‖
    be.cpu->galore_basis(cpu.data(), g.data(), s.out, s.in, s.r, rows, how, nullptr, nullptr);
    CHECK(test::subspace_sine(cpu, s.r, range, side, s.r) <= 1e-4);
    double worst = 0;  // PᵀP = I
    for (int a = 0; a < s.r; a++)
      for (int b = 0; b < s.r; b++) {
        double dot = 0;
        for (int i = 0; i < side; i++) dot += double(got[size_t(i) * s.r + a]) * got[size_t(i) * s.r + b];
        worst = std::max(worst, std::abs(dot - (a == b ? 1.0 : 0.0)));
      }
    CHECK(worst <= 1e-5);
  }
}

TEST_CASE("lowrank: GRASS_GALORE_TIMERS times the device refresh's phases", "[gpu][lowrank]") {
  Backends be(PrecisionChoice::Bf16Mixed);
  const Shape s = kShapes[1];
  GaloreBasisMethod how;
  how.randomized = true;
  const int64_t bytes = galore_basis_workspace_bytes(be.gpu_storage, s.out, s.in, s.r, how);
  DeviceBuffer<float> d_g(size_t(s.out) * s.in), d_P(size_t(s.out) * s.r);
  DeviceBuffer<char> workspace{size_t(bytes)};
  DeviceBuffer<int> status(4);
  d_g.upload(randn(d_g.n));
  status.upload({0, 0, 0, 0});
  ::setenv("GRASS_GALORE_TIMERS", "1", 1);
  be.gpu->take_galore_refresh_times();  // whatever an earlier test left
  for (int target = 0; target < 2; target++)
    be.gpu->galore_basis(d_P.ptr, d_g.ptr, s.out, s.in, s.r, true, how, workspace.ptr, status.ptr);
  const ops::GaloreRefreshTimes times = be.gpu->take_galore_refresh_times();
  ::unsetenv("GRASS_GALORE_TIMERS");
  CHECK(times.targets == 2);
  double total = 0;
  for (const double ms : times.ms) {
    CHECK(ms >= 0);
    total += ms;
  }
  CHECK(total > 0);
  CHECK(be.gpu->take_galore_refresh_times().targets == 0);  // taken: reset
  // off: no events
  be.gpu->galore_basis(d_P.ptr, d_g.ptr, s.out, s.in, s.r, true, how, workspace.ptr, status.ptr);
  CHECK(be.gpu->take_galore_refresh_times().targets == 0);
  CHECK(status.download() == std::vector<int>{0, 0, 0, 0});
}

TEST_CASE("lowrank: the randomized galore_basis refuses a workspace smaller than planned",
          "[gpu][lowrank]") {
  TestContext tc;
  const cusolverDnHandle_t solver = cuda::create_solver_handle(tc.ctx.stream);
  const Shape s = kShapes[1];
  GaloreBasisMethod how;
  how.randomized = true;
  const int64_t bytes =
      galore_basis_workspace_bytes(storage_for(PrecisionChoice::Bf16Mixed, true), s.out, s.in, s.r, how);
  DeviceBuffer<float> d_g(size_t(s.out) * s.in), d_P(size_t(s.out) * s.r);
  DeviceBuffer<char> workspace{size_t(bytes)};
  d_g.upload(randn(d_g.n));
  // the layout's last region, cuSOLVER's work space, one float short
  DeviceBuffer<int> status(4);
  status.upload({0, 0, 0, 0});
  CHECK_THROWS_WITH(cuda::galore_basis_randomized(tc.ctx, solver, d_P.ptr, d_g.ptr, s.out, s.in,
                                                  s.r, true, 1, 2, 8, workspace.ptr, bytes - 257,
                                                  status.ptr),
                    Catch::Contains("smaller than galore_basis_workspace_bytes"));
  CHECK_NOTHROW(cuda::galore_basis_randomized(tc.ctx, solver, d_P.ptr, d_g.ptr, s.out, s.in, s.r,
                                              true, 1, 2, 8, workspace.ptr, bytes, status.ptr));
  check(cudaDeviceSynchronize(), "galore_basis");
  cuda::destroy_solver_handle(solver);
}

TEST_CASE("lowrank: cuSOLVER's work space fits the plan", "[gpu][lowrank]") {
  // Sides from the tests' toy shapes to 13B's widths, k from a toy rank + oversample to 1024 + 8.
  // Each side's figures are printed: on a GPU they are cuSOLVER's own, what the plan's formula
  // (galore_solver_work_floats) must cover.
  TestContext tc;
  const cusolverDnHandle_t solver = cuda::create_solver_handle(tc.ctx.stream);
  const int sides[] = {8, 16, 40, 43, 64, 70, 100, 128, 256, 344, 512, 1000, 1376,
                       2048, 4096, 5120, 5464, 8192, 13824};
  const int ks[] = {8, 14, 16, 64, 136, 264, 520, 1032};
  for (const int m : sides) {
    std::string line = "cuSOLVER work floats at side " + std::to_string(m) + ":";
    for (const int k : ks) {
      if (k > m) continue;
      const int64_t asked = cuda::solver_work_floats(solver, m, k);
      const int64_t planned = galore_solver_work_floats(m, k);
      line += " k " + std::to_string(k) + " asks " + std::to_string(asked) + ";";
      INFO("side " << m << ", k " << k << ": cuSOLVER asks " << asked << " floats, the plan has "
                   << planned);
      CHECK(asked <= planned);
    }
    std::printf("%s\n", line.c_str());
  }
  // the batched eigensolver of svd_batch "layer": a layer's 7 targets (and fewer) at each k
  const cusolverDnParams_t params = cuda::create_solver_params();
  const Storage storage = storage_for(PrecisionChoice::Bf16, true);
  for (const int k : ks) {
    std::string line = "cuSOLVER batched eigensolver bytes at k " + std::to_string(k) + ":";
    for (const int count : {1, 3, 7}) {
      const int64_t asked = cuda::batched_eig_work_bytes(solver, params, k, count);
      const int64_t planned = galore_batch_layout(storage, k, k, count).work_bytes;
      line += " " + std::to_string(count) + " asks " + std::to_string(asked) + ";";
      INFO("k " << k << ", " << count << " matrices: cuSOLVER asks " << asked
                << " bytes, the plan has " << planned);
      CHECK(asked <= planned);
    }
    std::printf("%s\n", line.c_str());
  }
  cuda::destroy_solver_params(params);
  cuda::destroy_solver_handle(solver);
}

TEST_CASE("lowrank: flora_projection draws the CPU's stream", "[gpu][lowrank]") {
  Backends be(PrecisionChoice::Bf16);
  for (const Shape& s : kShapes)
    for (const int64_t refresh : {0, 3}) {
      INFO("side=" << s.in << " refresh=" << refresh);
      DeviceBuffer<float> d_P(size_t(s.in) * s.r);
      d_P.poison();
      be.gpu->flora_projection(d_P.ptr, 1234, 5, refresh, s.in, s.r);
      std::vector<float> want(d_P.n);
      be.cpu->flora_projection(want.data(), 1234, 5, refresh, s.in, s.r);
      // the device's double log and cos may differ from the host's in the last bits: after
      // rounding to fp32 that is at most an ulp (the emulator uses the host's: exact there)
      CHECK(rel_error(d_P.download(), want) <= 1e-6);
    }
}

TEST_CASE("lowrank: flora_transfer carries the first moment to the new projection",
          "[gpu][lowrank]") {
  for (const PrecisionChoice precision : {PrecisionChoice::Bf16Mixed, PrecisionChoice::Bf16}) {
    Backends be(precision);
    for (const Shape& s : kShapes)
      for (const bool rows : {true, false}) {
        INFO("pure=" << be.pure() << " out=" << s.out << " in=" << s.in << " rows=" << rows);
        const int side = rows ? s.out : s.in;
        const size_t numel = size_t(s.r) * (rows ? s.in : s.out);
        const std::vector<float> P_old = random_projection(side, s.r);
        const std::vector<float> P_new = random_projection(side, s.r);
        TypedBuffer m(!be.pure(), numel);
        const std::vector<float> m0 = m.representable(randn(numel, 0.1));
        m.upload(m0);
        DeviceBuffer<float> d_old(P_old.size()), d_new(P_new.size());
        DeviceBuffer<float> scratch(size_t(s.r) * s.r + numel);
        d_old.upload(P_old);
        d_new.upload(P_new);
        scratch.poison();
        be.gpu->flora_transfer(m.ptr(), scratch.ptr, d_old.ptr, {d_new.ptr, s.out, s.in, s.r, rows},
                               99);
        const std::vector<float> got = m.download();

        // the exact transfer in fp32, and the CPU backend's (which rounds in pure bf16)
        std::vector<float> exact = m0, cpu = m0, cpu_scratch(scratch.n);
        ops::flora_transfer<float>(exact.data(), cpu_scratch.data(), P_old.data(), P_new.data(),
                                   s.out, s.in, s.r, rows);
        be.cpu->flora_transfer(cpu.data(), cpu_scratch.data(), P_old.data(),
                               {P_new.data(), s.out, s.in, s.r, rows}, 99);
        if (!be.pure()) {
          CHECK(rel_error(got, exact) <= 1e-5);
          CHECK(rel_error(got, cpu) <= 1e-5);
        } else {
          CHECK(rel_error(got, cpu) <= 1e-2);
          const RoundingStats st = rounding_stats(got, exact);
          CHECK(st.not_nearest >= 0.12);
          CHECK(st.not_nearest <= 0.38);
          CHECK(std::abs(st.mean_ulps) <= 0.15);
        }
      }
  }
}

TEST_CASE("lowrank: Adam in bf16-mixed updates every weight through the projection",
          "[gpu][lowrank]") {
  Backends be(PrecisionChoice::Bf16Mixed);
  const AdamArgs a = adam_args();
  const double alpha = 0.25;
  for (const Shape& s : kShapes)
    for (const bool rows : {true, false}) {
      INFO("out=" << s.out << " in=" << s.in << " rows=" << rows);
      const int side = rows ? s.out : s.in;
      const size_t numel = size_t(s.out) * s.in, state = size_t(s.r) * (rows ? s.in : s.out);
      const std::vector<float> master0 = randn(numel);
      const std::vector<float> P = random_projection(side, s.r);
      const std::vector<float> R0 = randn(state), m0 = randn(state, 0.1),
                               v0 = squares(randn(state, 0.1));
      DeviceBuffer<float> d_master(numel), d_P(P.size()), d_R(state), d_m(state), d_v(state);
      DeviceBuffer<bf16> d_param(numel);
      DeviceBuffer<char> workspace(
          size_t(lowrank_workspace_bytes(be.gpu_storage, s.out, s.in, s.r)));
      d_master.upload(master0);
      d_param.upload(to_bf16(master0));
      d_P.upload(P);
      d_R.upload(R0);
      d_m.upload(m0);
      d_v.upload(v0);
      workspace.poison();
      be.gpu->lowrank_adam_update({d_param.ptr, d_master.ptr}, d_R.ptr, d_m.ptr, d_v.ptr,
                                  workspace.ptr, {d_P.ptr, s.out, s.in, s.r, rows}, alpha, 0.0, a, 7);

      std::vector<float> master = master0, weights = bf16_rounded(master0), R = R0, m = m0, v = v0;
      be.cpu->lowrank_adam_update({weights.data(), master.data()}, R.data(), m.data(), v.data(),
                                  nullptr, {P.data(), s.out, s.in, s.r, rows}, alpha, 0.0, a, 7);
      CHECK(rel_error(d_m.download(), m) <= 1e-5);
      CHECK(rel_error(d_v.download(), v) <= 1e-5);

      const std::vector<float> got_master = d_master.download();
      const std::vector<bf16> got_param = d_param.download();
      int64_t param_not_nearest = 0;
      std::vector<float> change(numel), want_change(numel);
      for (size_t e = 0; e < numel; e++) {
        param_not_nearest += bits(got_param[e]) != bits(__float2bfloat16_rn(got_master[e]));
        change[e] = got_master[e] - master0[e];
        want_change[e] = master[e] - master0[e];
      }
      const auto [unmoved, counted] =
          unmoved_elements(master0, got_master, want_change, P, R, s, rows, a, alpha, false);
      CHECK(unmoved == 0);
      CHECK(counted >= int64_t(numel) * 3 / 4);
      CHECK(param_not_nearest == 0);
      CHECK(rel_error(change, want_change) <= 1e-2);
      CHECK(rel_error(to_f32(got_param), weights) <= 1e-2);
    }
}

// FLORA's RMS bound (ops::lowrank_adam_update's max_rms): the GPU measures it on its bf16
// direction and scales that direction on the device; the update then matches the CPU's bounded one
// at bf16 accuracy, in both storage schemes, and is smaller than the unbounded one by the factor.
TEST_CASE("lowrank: the RMS bound scales the update as the CPU's does", "[gpu][lowrank]") {
  const AdamArgs a = adam_args();
  const double alpha = 1.0, max_rms = 0.05;  // well below this step's RMS: the bound binds
  for (const PrecisionChoice precision : {PrecisionChoice::Bf16Mixed, PrecisionChoice::Bf16}) {
    Backends be(precision);
    const bool pure = precision == PrecisionChoice::Bf16;
    for (const Shape& s : kShapes)
      for (const bool rows : {true, false}) {
        INFO("pure bf16 " << pure << " out=" << s.out << " in=" << s.in << " rows=" << rows);
        const int side = rows ? s.out : s.in;
        const size_t numel = size_t(s.out) * s.in, state = size_t(s.r) * (rows ? s.in : s.out);
        // weights of size 0.01: the bounded steps stay well above their bf16 spacing
        const std::vector<float> w0 = bf16_rounded(randn(numel, 0.01));
        const std::vector<float> P = random_projection(side, s.r);
        const std::vector<float> R0 = bf16_rounded(randn(state)),
                                 m0 = bf16_rounded(randn(state, 0.1)),
                                 v0 = bf16_rounded(squares(randn(state, 0.1)));
        DeviceBuffer<float> d_master(pure ? 1 : numel), d_P(P.size());
        DeviceBuffer<char> d_R(state * 4), d_m(state * 4), d_v(state * 4);
        DeviceBuffer<bf16> d_param(numel);
        DeviceBuffer<char> workspace(
            size_t(lowrank_workspace_bytes(be.gpu_storage, s.out, s.in, s.r)));
        const auto upload_state = [&](DeviceBuffer<char>& d, const std::vector<float>& x) {
          const std::vector<bf16> b = to_bf16(x);
          const void* src = pure ? static_cast<const void*>(b.data()) : x.data();
          check(cudaMemcpy(d.ptr, src, x.size() * (pure ? 2 : 4), cudaMemcpyHostToDevice),
                "upload");
        };
        if (!pure) d_master.upload(w0);
        d_param.upload(to_bf16(w0));
        d_P.upload(P);
        upload_state(d_R, R0);
        upload_state(d_m, m0);
        upload_state(d_v, v0);
        workspace.poison();
        be.gpu->lowrank_adam_update({d_param.ptr, pure ? nullptr : d_master.ptr}, d_R.ptr, d_m.ptr,
                                    d_v.ptr, workspace.ptr, {d_P.ptr, s.out, s.in, s.r, rows},
                                    alpha, max_rms, a, 7);
        const std::vector<float> got = pure ? to_f32(d_param.download()) : d_master.download();

        std::vector<float> change(numel), want(numel), unbounded(numel);
        for (const double bound : {max_rms, 0.0}) {
          std::vector<float> master = w0, weights = w0, R = R0, m = m0, v = v0;
          be.cpu->lowrank_adam_update({weights.data(), pure ? nullptr : master.data()}, R.data(),
                                      m.data(), v.data(), nullptr,
                                      {P.data(), s.out, s.in, s.r, rows}, alpha, bound, a, 7);
          for (size_t e = 0; e < numel; e++)
            (bound > 0 ? want : unbounded)[e] = (pure ? weights[e] : master[e]) - w0[e];
        }
        for (size_t e = 0; e < numel; e++) change[e] = got[e] - w0[e];
        if (pure) {
          // Both sides round w + Δ to bf16 stochastically, each to one of the two bf16 neighbours
          // of its own fp32 value, and the GPU forms the direction in bf16 (relative 2^-9, and
          // the bound's scale from it): ‖got - want‖ ≤ 2·(Σ spacing(w + Δ)²)^½ + 2^-7·‖Δ‖. The
          // update is about nine spacings, so this worst case is 0.22-0.25 of ‖Δ‖; the fixed 2e-2
          // it replaces (typically 0.010-0.016) read 0.0216 in one run of fresh random inputs. An
          // update without the bound is off by more than 1 (the check below).
          double spacing_sq = 0, want_sq = 0;
          for (size_t e = 0; e < numel; e++) {
            const double spacing = std::ldexp(1.0, std::ilogb(w0[e] + want[e]) - 7);  // 8 bits
            spacing_sq += spacing * spacing;
            want_sq += double(want[e]) * want[e];
          }
          const double bound =
              (2 * std::sqrt(spacing_sq) + std::ldexp(std::sqrt(want_sq), -7)) / std::sqrt(want_sq);
          CAPTURE(bound);
          CHECK(rel_error(change, want) <= bound);
        } else {
          CHECK(rel_error(change, want) <= 2e-2);  // fp32 master weights: fp32 sums in other orders
        }
        double bounded_norm = 0, unbounded_norm = 0;
        for (size_t e = 0; e < numel; e++) {
          bounded_norm += double(want[e]) * want[e];
          unbounded_norm += double(unbounded[e]) * unbounded[e];
        }
        CHECK(std::sqrt(bounded_norm) < 0.5 * std::sqrt(unbounded_norm));
      }
  }
}

TEST_CASE("lowrank: Adam in pure bf16 rounds stochastically and matches the CPU",
          "[gpu][lowrank]") {
  Backends be(PrecisionChoice::Bf16);
  const AdamArgs a = adam_args();
  const double alpha = 1.0;  // steps well above the bf16 spacing of weights of size 0.01
  for (const Shape& s : kShapes)
    for (const bool rows : {true, false}) {
      INFO("out=" << s.out << " in=" << s.in << " rows=" << rows);
      const int side = rows ? s.out : s.in;
      const size_t numel = size_t(s.out) * s.in, state = size_t(s.r) * (rows ? s.in : s.out);
      const std::vector<float> param0 = bf16_rounded(randn(numel, 0.01));
      const std::vector<float> P = random_projection(side, s.r);
      const std::vector<float> R0 = bf16_rounded(randn(state)),
                               m0 = bf16_rounded(randn(state, 0.1)),
                               v0 = bf16_rounded(squares(randn(state, 0.1)));
      DeviceBuffer<float> d_P(P.size());
      DeviceBuffer<bf16> d_param(numel), d_R(state), d_m(state), d_v(state);
      DeviceBuffer<char> workspace(
          size_t(lowrank_workspace_bytes(be.gpu_storage, s.out, s.in, s.r)));
      d_param.upload(to_bf16(param0));
      d_P.upload(P);
      d_R.upload(to_bf16(R0));
      d_m.upload(to_bf16(m0));
      d_v.upload(to_bf16(v0));
      workspace.poison();
      be.gpu->lowrank_adam_update({d_param.ptr, nullptr}, d_R.ptr, d_m.ptr, d_v.ptr, workspace.ptr,
                                  {d_P.ptr, s.out, s.in, s.r, rows}, alpha, 0.0, a, 77);

      // the exact fp32 step (the moments before their rounding), and the CPU backend's
      std::vector<float> w_exact = param0, R = R0, m_exact = m0, v_exact = v0;
      ops::lowrank_adam_update<float>(w_exact.data(), R.data(), m_exact.data(), v_exact.data(),
                                      P.data(), s.out, s.in, s.r, rows, alpha, 0.0, a);
      const std::vector<float> N_exact = R;  // the op leaves its direction in R
      std::vector<float> w = param0, m = m0, v = v0;
      R = R0;
      be.cpu->lowrank_adam_update({w.data(), nullptr}, R.data(), m.data(), v.data(), nullptr,
                                  {P.data(), s.out, s.in, s.r, rows}, alpha, 0.0, a, 77);
      const std::vector<float> got_m = to_f32(d_m.download()), got_v = to_f32(d_v.download());
      CHECK(rel_error(got_m, m) <= 1e-2);
      CHECK(rel_error(got_v, v) <= 1e-2);
      for (const auto& [got, exact] : {std::pair(&got_m, &m_exact), std::pair(&got_v, &v_exact)}) {
        const RoundingStats st = rounding_stats(*got, *exact);
        CHECK(st.not_nearest >= 0.12);
        CHECK(st.not_nearest <= 0.38);
        CHECK(std::abs(st.mean_ulps) <= 0.15);
      }

      const std::vector<float> param = to_f32(d_param.download());
      std::vector<float> change(numel), want_change(numel);
      for (size_t e = 0; e < numel; e++) {
        change[e] = param[e] - param0[e];
        want_change[e] = w_exact[e] - param0[e];
      }
      const auto [unmoved, counted] =
          unmoved_elements(param0, param, want_change, P, N_exact, s, rows, a, alpha, true);
      CHECK(unmoved == 0);
      CHECK(counted >= int64_t(numel) * 3 / 4);
      CHECK(rel_error(change, want_change) <= 1e-2);
      CHECK(rel_error(param, w) <= 1e-2);
    }
}

TEST_CASE("lowrank: pure bf16's back-projection in row chunks, and a short workspace",
          "[gpu][lowrank]") {
  TestContext tc;
  const AdamArgs a = adam_args();
  const Shape s = kShapes[1];  // out 43: chunks of 8 rows leave a partial one
  for (const bool rows : {true, false}) {
    INFO("rows=" << rows);
    const int side = rows ? s.out : s.in;
    const size_t numel = size_t(s.out) * s.in, state = size_t(s.r) * (rows ? s.in : s.out);
    const std::vector<float> param0 = bf16_rounded(randn(numel, 0.01));
    const std::vector<float> P = random_projection(side, s.r);
    const std::vector<float> R0 = bf16_rounded(randn(state)), m0 = bf16_rounded(randn(state, 0.1)),
                             v0 = bf16_rounded(squares(randn(state, 0.1)));
    DeviceBuffer<float> d_P(P.size());
    DeviceBuffer<bf16> d_param(numel), d_R(state), d_m(state), d_v(state);
    const int64_t prefix = cuda::lowrank_workspace_prefix_bytes(s.out, s.in, s.r);
    // room for 11 rows: chunks of 8 (rounded down to aligned rows), 6 chunks for 43 rows
    const int64_t bytes = prefix + 4 * int64_t(11) * s.in;
    DeviceBuffer<char> workspace(static_cast<size_t>(bytes));
    d_param.upload(to_bf16(param0));
    d_P.upload(P);
    d_R.upload(to_bf16(R0));
    d_m.upload(to_bf16(m0));
    d_v.upload(to_bf16(v0));
    workspace.poison();
    cuda::lowrank_adam_update(tc.ctx, d_param.ptr, nullptr, d_R.ptr, d_m.ptr, d_v.ptr,
                              workspace.ptr, bytes, nullptr, d_P.ptr, s.out, s.in, s.r, rows, 1.0, 0.0,
                              a, 5);
    std::vector<float> w = param0, R = R0, m = m0, v = v0;
    ops::lowrank_adam_update<float>(w.data(), R.data(), m.data(), v.data(), P.data(), s.out, s.in,
                                    s.r, rows, 1.0, 0.0, a);
    const std::vector<float> param = to_f32(d_param.download());
    std::vector<float> change(numel), want_change(numel);
    for (size_t e = 0; e < numel; e++) {
      change[e] = param[e] - param0[e];
      want_change[e] = w[e] - param0[e];
    }
    CHECK(rel_error(change, want_change) <= 1e-2);

    // no room for one fp32 row: refused, before anything is written
    CHECK_THROWS_AS(cuda::lowrank_adam_update(tc.ctx, d_param.ptr, nullptr, d_R.ptr, d_m.ptr,
                                              d_v.ptr, workspace.ptr, prefix + 4 * s.in - 1,
                                              nullptr, d_P.ptr, s.out, s.in, s.r, rows, 1.0,
                                              0.0, a, 5),
                    InternalError);
    CHECK_THROWS_AS(cuda::lowrank_compressed_grad(tc.ctx, d_R.ptr, cuda::GradType::BF16, nullptr,
                                                  workspace.ptr, prefix - 1, nullptr, nullptr,
                                                  d_P.ptr, 10, s.in, s.out, s.r, rows),
                    InternalError);
  }
}

TEST_CASE("lowrank: the same calls twice give the same bits", "[gpu][lowrank]") {
  Backends be(PrecisionChoice::Bf16);
  const AdamArgs a = adam_args();
  const Shape s = kShapes[1];
  const bool rows = false;
  const size_t numel = size_t(s.out) * s.in, state = size_t(s.out) * s.r;
  const std::vector<float> dy = randn(size_t(s.N) * s.out), x = randn(size_t(s.N) * s.in);
  const std::vector<float> P = random_projection(s.in, s.r), P_old = random_projection(s.in, s.r);
  const std::vector<float> param0 = randn(numel, 0.01), R0 = randn(state), m0 = randn(state, 0.1),
                           v0 = squares(randn(state, 0.1));
  DeviceBuffer<bf16> d_dy(dy.size()), d_x(x.size()), scratch(size_t(s.N) * s.r);
  DeviceBuffer<bf16> d_param(numel), d_R(state), d_m(state), d_v(state);
  DeviceBuffer<float> d_P(P.size()), d_old(P_old.size()), transfer(size_t(s.r) * s.r + state);
  DeviceBuffer<char> workspace(size_t(lowrank_workspace_bytes(be.gpu_storage, s.out, s.in, s.r)));
  d_dy.upload(to_bf16(dy));
  d_x.upload(to_bf16(x));
  d_P.upload(P);
  d_old.upload(P_old);
  const LowRankProjection p{d_P.ptr, s.out, s.in, s.r, rows};

  std::vector<std::vector<bf16>> R(2), param(2), m(2), v(2);
  for (int run = 0; run < 2; run++) {
    d_R.upload(to_bf16(R0));
    d_m.upload(to_bf16(m0));
    d_v.upload(to_bf16(v0));
    d_param.upload(to_bf16(param0));
    be.gpu->lowrank_compressed_grad(d_R.ptr, scratch.ptr, workspace.ptr, d_dy.ptr, d_x.ptr, s.N, p);
    R[run] = d_R.download();
    be.gpu->flora_transfer(d_m.ptr, transfer.ptr, d_old.ptr, p, 3);
    be.gpu->lowrank_adam_update({d_param.ptr, nullptr}, d_R.ptr, d_m.ptr, d_v.ptr, workspace.ptr,
                                p, 0.25, 0.0, a, 5);
    param[run] = d_param.download();
    m[run] = d_m.download();
    v[run] = d_v.download();
  }
  CHECK(same_bits(R[0], R[1]));
  CHECK(same_bits(param[0], param[1]));
  CHECK(same_bits(m[0], m[1]));
  CHECK(same_bits(v[0], v[1]));
}

// 8-bit moments (kernels/quant8.h): the GPU's GaLore/FLORA step and FLORA's transfer against the
// CPU backend's, in both storage schemes, flat and per-feature blocks: the step's codes and absmax
// bit for bit (adam_moments_rn), the transfer's codes equal or one off where its sums (fp32 in
// another order) differ, and the weight change to bf16 accuracy (the direction is bf16 on the GPU).
// Blocks of 64 and 256 (flat: kernels/cuda/quant8.cuh's warp driver, then its thread-block driver
// on the ragged tail; R has 420 or 258 elements) and 2,048 (the thread-block driver alone).
TEST_CASE("lowrank: 8-bit moments, the CPU's step and transfer", "[gpu][lowrank][quant8]") {
  for (const PrecisionChoice precision : {PrecisionChoice::Bf16Mixed, PrecisionChoice::Bf16}) {
    Backends be(precision);
    const AdamArgs a = adam_args();
    const Shape s = kShapes[1];
    for (const int block : {64, 256, 2048})
      for (const bool rows : {true, false})
        for (const bool by_columns : {false, true}) {
          INFO((be.pure() ? "pure bf16" : "bf16-mixed") << ", blocks of " << block
                                                         << (rows ? ", rows" : ", cols")
                                                         << (by_columns ? ", per feature" : ", flat"));
          const int side = rows ? s.out : s.in;
          const Quant8Layout L = projected_quant8_layout(s.out, s.in, s.r, rows, block, by_columns);
          const size_t numel = size_t(s.out) * s.in, state = size_t(L.rows * L.cols),
                       blocks = size_t(L.blocks());
          // pure bf16: weights of 0.01 and alpha 1, so the steps stand well above the bf16 spacing
          const double alpha = be.pure() ? 1.0 : 0.25;
          const std::vector<float> w0 = bf16_rounded(randn(numel, be.pure() ? 0.01 : 1.0)),
                                   P = random_projection(side, s.r),
                                   P_new = random_projection(side, s.r);
          std::vector<float> R0 = randn(state), m0 = randn(state, 0.1), v0 = squares(randn(state, 0.1));
          if (be.pure()) R0 = bf16_rounded(R0);
          std::vector<uint8_t> m(state), v(state);
          std::vector<float> am(blocks), av(blocks);
          ops::quantize_layout(quant8_map(true), m0.data(), L, m.data(), am.data());
          ops::quantize_layout(quant8_map(false), v0.data(), L, v.data(), av.data());

          DeviceBuffer<uint8_t> d_m(state), d_v(state);
          DeviceBuffer<float> d_am(blocks), d_av(blocks), d_P(P.size()), d_P_new(P.size()),
              d_master(numel), d_scratch(size_t(s.r) * s.r + 2 * state);
          DeviceBuffer<bf16> d_param(numel);
          TypedBuffer d_R(!be.pure(), state);
          DeviceBuffer<char> workspace(size_t(lowrank_workspace_bytes(be.gpu_storage, s.out, s.in, s.r)));
          d_m.upload(m);
          d_v.upload(v);
          d_am.upload(am);
          d_av.upload(av);
          d_P.upload(P);
          d_P_new.upload(P_new);
          d_R.upload(R0);
          d_param.upload(to_bf16(w0));
          d_master.upload(w0);
          workspace.poison();
          const Quant8Moments dq{.m = d_m.ptr, .v = d_v.ptr, .absmax_m = d_am.ptr, .absmax_v = d_av.ptr,
                                 .block = block};
          const WeightRef gw{d_param.ptr, be.pure() ? nullptr : d_master.ptr};
          be.gpu->lowrank_adam_update_q8(gw, d_R.ptr(), dq, by_columns, workspace.ptr,
                                         {d_P.ptr, s.out, s.in, s.r, rows}, alpha, 0.0, a, 7);
          const std::vector<uint8_t> step_m = d_m.download(), step_v = d_v.download();
          const std::vector<float> step_am = d_am.download(), step_av = d_av.download();
          be.gpu->flora_transfer_q8(dq, by_columns, d_scratch.ptr, d_P.ptr,
                                    {d_P_new.ptr, s.out, s.in, s.r, rows});

          std::vector<float> master = w0, weights = w0, R = R0;
          const Quant8Moments cq{.m = m.data(), .v = v.data(), .absmax_m = am.data(),
                                 .absmax_v = av.data(), .block = block};
          std::vector<float> scratch(size_t(s.r) * s.r + 2 * state);
          be.cpu->lowrank_adam_update_q8({weights.data(), be.pure() ? nullptr : master.data()}, R.data(),
                                         cq, by_columns, nullptr, {P.data(), s.out, s.in, s.r, rows},
                                         alpha, 0.0, a, 7);
          CHECK(step_m == m);
          CHECK(step_v == v);
          CHECK(step_am == am);
          CHECK(step_av == av);
          be.cpu->flora_transfer_q8(cq, by_columns, scratch.data(), P.data(),
                                    {P_new.data(), s.out, s.in, s.r, rows});

          CHECK(rel_error(d_am.download(), am) <= 1e-5);
          CHECK(rel_error(d_av.download(), av) <= 1e-5);
          const std::vector<uint8_t> gm = d_m.download(), gv = d_v.download();
          int64_t differ = 0, far = 0;
          for (size_t i = 0; i < state; i++) {
            differ += (gm[i] != m[i]) + (gv[i] != v[i]);
            far += std::abs(gm[i] - m[i]) > 1 || std::abs(gv[i] - v[i]) > 1;
          }
          CHECK(far == 0);
          CHECK(differ <= int64_t(state) / 50);
          const std::vector<float> got = be.pure() ? to_f32(d_param.download()) : d_master.download();
          const std::vector<float>& want = be.pure() ? weights : master;
          std::vector<float> change(numel), want_change(numel);
          for (size_t e = 0; e < numel; e++) {
            change[e] = got[e] - w0[e];
            want_change[e] = want[e] - w0[e];
          }
          CHECK(rel_error(change, want_change) <= (be.pure() ? 2e-2 : 1e-2));
        }
  }
}
