// kernels/cuda/mma_ptx.cuh's instructions in small kernels (tests/gpu/mma_ptx_kernels.cu): an
// m16n8k16 tile with its fragments formed at the PTX ISA's positions and by every ldmatrix form,
// a 64 x 64 x 64 GEMM tile by ldmatrix (.x4, .x4.trans) and mma.sync, a two-stage cp.async
// pipeline, against the CPU. On a GPU the products are held to fp64 within a tolerance (the
// hardware's fp32 summation order is not specified); on the CUDA emulator, whose order is stated
// (tests/cuda_emu/include/cuda_runtime.h), also bit for bit to the CPU summing in that order.
// Emulator only: the late copies mode's NaN for a pipeline without its wait_group, and the
// misuses the emulator names (kernel, block, thread).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/mma_ptx_kernels.h"

#if __has_include(<cuda_emu.h>)
#include <cuda_emu.h>
#define GRASS_TEST_CUDA_EMU 1
#endif

using namespace grass::gputest;
using namespace grass::gputest::mma_ptx;

namespace {

// C[m x n] + A[m x k]·B[k x n] (row-major) as the emulator sums: from C, k ascending, one fmaf a
// step; and in fp64, with the sum of the terms' magnitudes for the GPU's tolerance.
struct Product {
  std::vector<float> emulator_order;
  std::vector<double> exact, magnitude;
};
Product reference(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c,
                  int m, int n, int k) {
  Product p{std::vector<float>(size_t(m) * n), std::vector<double>(size_t(m) * n),
            std::vector<double>(size_t(m) * n)};
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      float s = c[size_t(i) * n + j];
      double e = s, mag = std::fabs(s);
      for (int q = 0; q < k; q++) {
        const float x = a[size_t(i) * k + q], y = b[size_t(q) * n + j];
        s = std::fma(x, y, s);
        e += double(x) * y;
        mag += std::fabs(double(x) * y);
      }
      p.emulator_order[size_t(i) * n + j] = s;
      p.exact[size_t(i) * n + j] = e;
      p.magnitude[size_t(i) * n + j] = mag;
    }
  return p;
}

// Every element within 2^-16 of its terms' magnitude of the fp64 value: a bound for any fp32
// summation order of at most 64 terms (each rounding costs at most 2^-24 of the running sum),
// with room for the tensor cores' own rounding; a wrong fragment element misses it by far.
void require_close(const std::vector<float>& got, const Product& want) {
  REQUIRE(got.size() == want.exact.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (!(std::fabs(got[i] - want.exact[i]) <= 0x1p-16 * want.magnitude[i])) bad++;
  CHECK(bad == 0);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> transposed(const std::vector<float>& x, int rows, int cols) {
  std::vector<float> t(x.size());
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) t[size_t(j) * rows + i] = x[size_t(i) * cols + j];
  return t;
}

#ifdef GRASS_TEST_CUDA_EMU
// cp.async's late copies on or off for one scope (cuda_emu.h).
struct LateCopies {
  bool before;
  explicit LateCopies(bool late) : before(cuda_emu::set_cp_async_late(late)) {}
  ~LateCopies() { cuda_emu::set_cp_async_late(before); }
};
#endif

// The pipeline's sums as each thread makes them, in its order (plain fp32 adds: exact anywhere).
std::vector<float> pipeline_reference(const std::vector<float>& x, int blocks, int tiles) {
  std::vector<float> out(size_t(blocks) * kPipelineThreads);
  for (int b = 0; b < blocks; b++)
    for (int i = 0; i < kPipelineThreads; i++) {
      float sum = 0.0f;
      for (int t = 0; t < tiles; t++)
        for (int j = 0; j < 4; j++)
          sum += x[(size_t(b) * tiles + t) * kPipelineTile + kPipelineTile - 1 - 4 * i - j];
      out[size_t(b) * kPipelineThreads + i] = sum;
    }
  return out;
}

std::vector<float> run_pipeline(const std::vector<float>& x, int blocks, int tiles, bool wait) {
  DeviceBuffer<float> dx(x.size()), out(size_t(blocks) * kPipelineThreads);
  dx.upload(x);
  out.poison();
  check(cp_async_pipeline(dx.ptr, blocks, tiles, out.ptr, wait), "cp_async_pipeline");
  return out.download();
}

}  // namespace

TEST_CASE("mma_ptx: one m16n8k16 tile, its fragments by index and by every ldmatrix form, as the CPU's",
          "[gpu][mma_ptx][cp_async]") {
  const std::vector<float> a = bf16_rounded(randn(16 * 16)), b = bf16_rounded(randn(16 * 8));
  const std::vector<float> c = randn(16 * 8);
  const Product want = reference(a, b, c, 16, 8, 16);
  DeviceBuffer<bf16> da(a.size()), db_nk(b.size()), db_kn(b.size());
  DeviceBuffer<float> dc(c.size()), dd(16 * 8);
  da.upload(to_bf16(a));
  db_nk.upload(to_bf16(transposed(b, 16, 8)));
  db_kn.upload(to_bf16(b));
  dc.upload(c);
  std::vector<float> by_index;
  for (const FragmentLoad load : kFragmentLoads) {
    INFO("fragment load " << int(load));
    dd.poison();
    check(mma_16x8x16(da.ptr, db_nk.ptr, db_kn.ptr, dc.ptr, dd.ptr, load), "mma_16x8x16");
    const std::vector<float> d = dd.download();
    require_close(d, want);
#ifdef GRASS_TEST_CUDA_EMU
    CHECK(same_bits(d, want.emulator_order));
#endif
    // the same registers into the same instruction: the same bits, on any device
    if (load == FragmentLoad::by_index)
      by_index = d;
    else
      CHECK(same_bits(d, by_index));
  }
}

TEST_CASE("mma_ptx: a 64x64x64 GEMM tile by ldmatrix (x4, x4.trans) and mma.sync, as the CPU's",
          "[gpu][mma_ptx][cp_async]") {
  const std::vector<float> a = bf16_rounded(randn(64 * 64)), b = bf16_rounded(randn(64 * 64));
  const Product want = reference(a, b, std::vector<float>(64 * 64, 0.0f), 64, 64, 64);
  DeviceBuffer<bf16> da(a.size()), db_kn(b.size()), db_nk(b.size());
  DeviceBuffer<float> dd(64 * 64);
  da.upload(to_bf16(a));
  db_kn.upload(to_bf16(b));
  db_nk.upload(to_bf16(transposed(b, 64, 64)));
  dd.poison();
  check(gemm_64x64x64(da.ptr, db_kn.ptr, true, dd.ptr), "gemm_64x64x64 [k][n]");
  const std::vector<float> d_kn = dd.download();
  dd.poison();
  check(gemm_64x64x64(da.ptr, db_nk.ptr, false, dd.ptr), "gemm_64x64x64 [n][k]");
  const std::vector<float> d_nk = dd.download();
  require_close(d_kn, want);
  require_close(d_nk, want);
  CHECK(same_bits(d_kn, d_nk));  // .trans delivers the registers the plain load does
#ifdef GRASS_TEST_CUDA_EMU
  // 4 chained instructions, each from the last one's accumulators: k ascending over all 64
  CHECK(same_bits(d_kn, want.emulator_order));
#endif
}

TEST_CASE("mma_ptx: a two-stage cp.async pipeline through shared memory sums every tile",
          "[gpu][mma_ptx][cp_async]") {
  const int blocks = 3, tiles = 5;
  const std::vector<float> x = randn(size_t(blocks) * tiles * kPipelineTile);
  const std::vector<float> want = pipeline_reference(x, blocks, tiles);
  CHECK(same_bits(run_pipeline(x, blocks, tiles, true), want));  // this run's mode
#ifdef GRASS_TEST_CUDA_EMU
  for (const bool late : {false, true}) {
    INFO("late copies " << late);
    const LateCopies mode(late);
    CHECK(same_bits(run_pipeline(x, blocks, tiles, true), want));
  }
#endif
}

#ifdef GRASS_TEST_CUDA_EMU
TEST_CASE("mma_ptx: with late copies a pipeline without its wait_group reads NaN", "[gpu][mma_ptx]") {
  const int blocks = 2, tiles = 3;
  const std::vector<float> x = randn(size_t(blocks) * tiles * kPipelineTile);
  {
    const LateCopies mode(false);  // copies at issue hide the missing wait
    CHECK(same_bits(run_pipeline(x, blocks, tiles, false), pipeline_reference(x, blocks, tiles)));
  }
  const LateCopies mode(true);
  for (const float v : run_pipeline(x, blocks, tiles, false)) REQUIRE(std::isnan(v));
}

TEST_CASE("mma_ptx: late copies land group by group, as wait_group asks, and never uncommitted",
          "[gpu][mma_ptx]") {
  const std::vector<float> x = randn(4 * 128);
  DeviceBuffer<float> dx(x.size()), out(3 * 512);
  dx.upload(x);
  for (const bool late : {false, true}) {
    INFO("late copies " << late);
    const LateCopies mode(late);
    out.poison();
    check(cp_async_groups(dx.ptr, out.ptr), "cp_async_groups");
    const std::vector<float> got = out.download();
    for (int r = 0; r < 3; r++)  // after wait_group 2 - r
      for (int k = 0; k < 4; k++) {
        INFO("after wait_group " << 2 - r << ", stage " << k);
        // late: the r + 1 oldest groups landed; the uncommitted stage 3 never does
        const bool landed = !late || (k < 3 && k <= r);
        for (int e = 0; e < 128; e++) {
          const float v = got[size_t(r) * 512 + size_t(k) * 128 + size_t(e)];
          if (landed)
            REQUIRE(v == x[size_t(k) * 128 + size_t(e)]);
          else
            REQUIRE(std::isnan(v));
        }
      }
  }
}

TEST_CASE("mma_ptx: the emulator names the kernel, block and thread of a misused mma, ldmatrix or cp.async",
          "[gpu][mma_ptx]") {
  DeviceBuffer<bf16> tile(16 * 16);
  tile.upload(to_bf16(randn(tile.n)));
  const std::string kNotShared = "is not 16 aligned bytes of the block's shared memory";
  const struct {
    Misuse kind;
    std::vector<std::string> said;  // each in the fault's line, in any thread order
  } cases[] = {
      {Misuse::mma_half_warp, {"mma.sync.m16n8k16", "thread ("}},
      {Misuse::mma_short_warp, {"mma.sync.m16n8k16 by thread (", "in a warp of fewer than 32 threads"}},
      {Misuse::ldmatrix_and_mma,  // both named, whichever lanes came first
       {"ldmatrix.x4", "mma.sync.m16n8k16", " lanes of its warp wait at ", "reached by thread ("}},
      {Misuse::ldmatrix_unaligned, {"ldmatrix.x4: the row address", kNotShared, "of thread ("}},
      {Misuse::ldmatrix_global, {"ldmatrix.x4: the row address", kNotShared, "of thread ("}},
      {Misuse::cp_async_unaligned, {"cp.async of 16 bytes", "must be 16-byte aligned", "by thread ("}},
      {Misuse::cp_async_global_dst,
       {"cp.async of 16 bytes", "the destination is not in the block's shared memory", "by thread ("}},
  };
  for (const auto& c : cases) {
    INFO("misuse " << int(c.kind));
    REQUIRE(misuse(c.kind, tile.ptr) == cudaSuccess);  // a valid launch that fails as it runs
    CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
    const std::string fault = cuda_emu::last_kernel_fault();
    CHECK_THAT(fault, Catch::StartsWith("kernel misuse_kernel: block (0,0,0): "));
    for (const std::string& part : c.said) CHECK_THAT(fault, Catch::Contains(part));
  }
}
#endif
