// `attention: "mma"` through the CUDA backend, as the model calls it: q and k rotated in place by
// RoPE, the FA2-style forward and backward (kernels/cuda/attention_mma.cu: path A at HD 64 and 32,
// path B at HD 128), dq and dk rotated back. Against the engine's kernels (RoPE in their loads), which
// test_gpu_attention.cpp holds to the CPU: the outputs, the saved logsumexp and the gradients agree
// within bf16's tolerance, and a second run gives the same bits.
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/storage.h"
#include "src/core/arena.h"
#include "src/train/run_resolution.h"
#include "tests/gpu/attention_backend.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

using grass::AttentionKernel;
using grass::gputest::DeviceBuffer;
using bf16 = __nv_bfloat16;
using grass::gputest::AttentionBackend;
using Shape = grass::gputest::AttentionShape;

struct Result {
  std::vector<bf16> out, dqkv;
  std::vector<float> saved;
};

// One forward and backward on q, k, v packed as the model's (uploaded afresh: the path rotates q
// and k in place), dq, dk, dv packed.
Result run(AttentionBackend& a, const Shape& s, const std::vector<bf16>& qkv_host,
           const DeviceBuffer<bf16>& dout) {
  const int64_t N = int64_t(s.B) * s.T;
  DeviceBuffer<bf16> qkv(qkv_host.size()), out(dout.n), dqkv(qkv_host.size());
  DeviceBuffer<float> saved(size_t(s.B) * s.NH * s.T);
  qkv.upload(qkv_host);
  out.poison();
  dqkv.poison();
  saved.poison();
  const auto r = grass::gputest::qkv_layout(qkv.ptr, N, s.NH, s.NKV, s.HD, true);
  const auto d = grass::gputest::qkv_layout(dqkv.ptr, N, s.NH, s.NKV, s.HD, true);
  const grass::QkvRows<void*> rows{r.q, r.k, r.v, r.ldq, r.ldk, r.ldv};
  a.backend->attention_forward(out.ptr, saved.ptr, rows, s.B, s.T, s.NH, s.NKV, s.HD, 10000.0);
  a.backend->attention_backward({d.q, d.k, d.v, d.ldq, d.ldk, d.ldv}, dout.ptr, out.ptr,
                                saved.ptr, grass::read_only(rows), s.B, s.T, s.NH, s.NKV, s.HD,
                                10000.0);
  return {out.download(), dqkv.download(), saved.download()};
}

}  // namespace

TEST_CASE("cuda attention mma through the backend matches the engine's kernels, RoPE included",
          "[gpu][attention]") {
  using grass::gputest::rel_error;
  using grass::gputest::to_f32;
  const Shape shapes[] = {{1, 70, 2, 1, 64}, {2, 33, 2, 2, 32}, {1, 80, 2, 1, 128}};
  for (const Shape& s : shapes) {
    INFO("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.NKV << " HD=" << s.HD);
    const size_t nq = size_t(s.B) * s.T * s.NH * s.HD;
    const std::vector<bf16> qkv = grass::gputest::to_bf16(
        grass::gputest::randn(nq + 2 * size_t(s.B) * s.T * s.NKV * s.HD));
    DeviceBuffer<bf16> dout(nq);
    dout.upload(grass::gputest::to_bf16(grass::gputest::randn(nq)));
    AttentionBackend engine(AttentionKernel::Grass, s), mma(AttentionKernel::Mma, s);
    const Result want = run(engine, s, qkv, dout), got = run(mma, s, qkv, dout);
    CHECK(rel_error(to_f32(got.out), to_f32(want.out)) <= 1e-2);
    CHECK(rel_error(got.saved, want.saved) <= 1e-3);  // logsumexp per row, natural log
    // dq, dk, dv packed: one relative error over the three (each row's dq | dk | dv)
    CHECK(rel_error(to_f32(got.dqkv), to_f32(want.dqkv)) <= 1e-2);
    const Result again = run(mma, s, qkv, dout);
    CHECK(std::memcmp(again.out.data(), got.out.data(), got.out.size() * sizeof(bf16)) == 0);
    CHECK(std::memcmp(again.dqkv.data(), got.dqkv.data(), got.dqkv.size() * sizeof(bf16)) == 0);
    CHECK(again.saved == got.saved);
  }
}
