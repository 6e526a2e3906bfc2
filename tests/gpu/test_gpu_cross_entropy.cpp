// cross_entropy_fused (kernels/cuda/cross_entropy.cu) against the CPU reference
// (cross_entropy_forward, then cross_entropy_backward) on the same bf16 logits: the loss per row,
// the in-place gradient (its softmax part checked apart from the large target entries), ignored
// rows giving exact zeros, at LLaMA's vocabulary (32000: every row 16-byte aligned, all packs), at
// T5's (32100: rows alternately 16- and 8-byte aligned), at odd V (every alignment of a row's
// start) and V below the block size, and twice for identical bits.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "tests/gpu/gpu_test_util.h"

using namespace grass;
using namespace grass::gputest;
using bf16 = __nv_bfloat16;

namespace {

struct Case {
  int64_t n;
  int V;
};
const Case kCases[] = {{3 * 77, 32100}, {4, 32000}, {5, 7}, {3, 1001}, {9, 13}};

// Targets in [0, V), with row 2 and every 5th row after it ignored (-1).
std::vector<int32_t> targets_with_ignored(int64_t n, int V) {
  static std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int32_t> pick(0, V - 1);
  std::vector<int32_t> targets(n);
  for (int64_t i = 0; i < n; i++) targets[i] = i % 5 == 2 ? -1 : pick(rng);
  return targets;
}

}  // namespace

TEST_CASE("cross-entropy: fused loss and in-place gradient match the CPU", "[gpu]") {
  TestContext tc;
  for (const Case& c : kCases) {
    INFO("n=" << c.n << " V=" << c.V);
    const std::vector<float> logits = bf16_rounded(randn(c.n * c.V, 2.0));
    const std::vector<int32_t> targets = targets_with_ignored(c.n, c.V);
    DeviceBuffer<bf16> d_logits(logits.size());
    DeviceBuffer<int32_t> d_targets(targets.size());
    DeviceBuffer<float> loss(c.n);
    d_logits.upload(to_bf16(logits));
    d_targets.upload(targets);
    loss.poison();

    std::vector<float> lse(c.n);
    int64_t valid = 0;
    ops::cross_entropy_forward<float>(lse.data(), &valid, logits.data(), targets.data(), c.n, c.V);
    REQUIRE(valid > 0);
    const float scale = 1.0f / float(valid);
    cuda::cross_entropy_fused(tc.ctx, d_logits.ptr, loss.ptr, d_targets.ptr, c.n, c.V, scale);
    std::vector<float> want_grad(logits.size());
    ops::cross_entropy_backward<float>(want_grad.data(), logits.data(), lse.data(), targets.data(),
                                       c.n, c.V, scale);
    std::vector<float> want_loss(c.n, 0.0f);
    for (int64_t i = 0; i < c.n; i++)
      if (targets[i] >= 0) want_loss[i] = lse[i] - logits[i * c.V + targets[i]];

    const std::vector<float> got_loss = loss.download();
    const std::vector<float> got_grad = to_f32(d_logits.download());
    CHECK(rel_error(got_loss, want_loss) <= 1e-4);
    CHECK(rel_error(got_grad, want_grad) <= 1e-2);

    // Ignored rows: exactly zero loss and gradient (they held random logits before).
    int64_t nonzero = 0;
    for (int64_t i = 0; i < c.n; i++) {
      if (targets[i] >= 0) continue;
      nonzero += got_loss[i] != 0.0f;
      for (int k = 0; k < c.V; k++) nonzero += got_grad[i * c.V + k] != 0.0f;
    }
    CHECK(nonzero == 0);

    // The softmax part alone: the target entries (≈ -scale) would hide its errors.
    std::vector<float> got_soft = got_grad, want_soft = want_grad;
    for (int64_t i = 0; i < c.n; i++)
      if (targets[i] >= 0) got_soft[i * c.V + targets[i]] = want_soft[i * c.V + targets[i]] = 0.0f;
    CHECK(rel_error(got_soft, want_soft) <= 1e-2);
  }
}

TEST_CASE("cross-entropy: the same call twice gives the same bits", "[gpu]") {
  TestContext tc;
  const Case c{3 * 77, 32100};
  const std::vector<bf16> logits = to_bf16(randn(c.n * c.V, 2.0));
  const std::vector<int32_t> targets = targets_with_ignored(c.n, c.V);
  DeviceBuffer<bf16> d_logits(logits.size());
  DeviceBuffer<int32_t> d_targets(targets.size());
  DeviceBuffer<float> loss(c.n);
  d_targets.upload(targets);
  std::vector<std::vector<bf16>> grad(2);
  std::vector<std::vector<float>> losses(2);
  for (int run = 0; run < 2; run++) {
    d_logits.upload(logits);
    loss.poison();
    cuda::cross_entropy_fused(tc.ctx, d_logits.ptr, loss.ptr, d_targets.ptr, c.n, c.V, 0.01f);
    grad[run] = d_logits.download();
    losses[run] = loss.download();
  }
  CHECK(std::memcmp(grad[0].data(), grad[1].data(), grad[0].size() * sizeof(bf16)) == 0);
  CHECK(std::memcmp(losses[0].data(), losses[1].data(), losses[0].size() * sizeof(float)) == 0);
}
