// cuDNN's fused flash attention (run config `attention: "cudnn"`, kernels/cudnn/) against the
// engine's own attention kernels, both through the CUDA backend as the model calls them (RoPE
// included): the outputs, the saved row statistics (both natural-log logsumexp) and the
// gradients agree within bf16's tolerance, and cuDNN's backward repeats bit for bit. Built only
// where cuDNN's headers were found (GRASS_HAVE_CUDNN), run only on a GPU with libcudnn.so.9; the
// emulator has no cuDNN, so these never run there.
#include <catch2/catch.hpp>

#ifdef GRASS_HAVE_CUDNN
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/storage.h"
#include "src/train/run_resolution.h"
#include "tests/gpu/attention_backend.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

using grass::AttentionKernel;
using grass::gputest::DeviceBuffer;
using bf16 = __nv_bfloat16;
using grass::gputest::AttentionBackend;
using Shape = grass::gputest::AttentionShape;

// One forward and backward on q, k, v packed as the model's (uploaded afresh: cuDNN's path rotates
// q and k in place), dq, dk, dv packed or as three buffers: out, the saved statistics, dq, dk, dv.
struct Result {
  std::vector<float> out, saved, dq, dk, dv;
};

Result run(AttentionBackend& a, const Shape& s, const std::vector<bf16>& qkv_host,
           const DeviceBuffer<bf16>& dout, bool grads_packed) {
  using grass::gputest::gather_pitched;
  using grass::gputest::qkv_layout;
  using grass::gputest::to_f32;
  const int64_t N = int64_t(s.B) * s.T;
  DeviceBuffer<bf16> qkv(qkv_host.size()), out(dout.n), dqkv(qkv_host.size());
  DeviceBuffer<float> saved(size_t(s.B) * s.NH * s.T);
  qkv.upload(qkv_host);
  for (auto* b : {&out, &dqkv}) b->poison();
  saved.poison();
  const grass::QkvRows<bf16*> r = qkv_layout(qkv.ptr, N, s.NH, s.NKV, s.HD, true);
  const grass::QkvRows<bf16*> d = qkv_layout(dqkv.ptr, N, s.NH, s.NKV, s.HD, grads_packed);
  const grass::QkvRows<void*> rows{r.q, r.k, r.v, r.ldq, r.ldk, r.ldv};
  a.backend->attention_forward(out.ptr, saved.ptr, rows, s.B, s.T, s.NH, s.NKV, s.HD, 10000.0);
  a.backend->attention_backward({d.q, d.k, d.v, d.ldq, d.ldk, d.ldv}, dout.ptr, out.ptr,
                                saved.ptr, grass::read_only(rows), s.B, s.T, s.NH, s.NKV, s.HD,
                                10000.0);
  const std::vector<bf16> grads = dqkv.download();
  const grass::QkvRows<const bf16*> g =
      qkv_layout(grads.data(), N, s.NH, s.NKV, s.HD, grads_packed);
  const size_t wq = size_t(s.NH) * s.HD, wkv = size_t(s.NKV) * s.HD;
  return {to_f32(out.download()), saved.download(), to_f32(gather_pitched(g.q, g.ldq, wq, N)),
          to_f32(gather_pitched(g.k, g.ldk, wkv, N)), to_f32(gather_pitched(g.v, g.ldv, wkv, N))};
}

}  // namespace

TEST_CASE("cuDNN attention matches the engine's kernels, RoPE included", "[gpu][cudnn]") {
  using grass::gputest::rel_error;
  const Shape shapes[] = {{2, 100, 8, 2, 64}, {1, 256, 16, 16, 128}, {4, 64, 4, 1, 64}};
  for (const Shape& s : shapes) {
    INFO("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.NKV << " HD=" << s.HD);
    const size_t nq = size_t(s.B) * s.T * s.NH * s.HD;
    const std::vector<bf16> qkv = grass::gputest::to_bf16(
        grass::gputest::randn(nq + 2 * size_t(s.B) * s.T * s.NKV * s.HD));
    DeviceBuffer<bf16> dout(nq);
    dout.upload(grass::gputest::to_bf16(grass::gputest::randn(nq)));
    AttentionBackend engine(AttentionKernel::Grass, s), cudnn(AttentionKernel::Cudnn, s);
    for (const bool grads_packed : {true, false}) {
      INFO((grads_packed ? "dq, dk, dv packed" : "dq, dk, dv as three buffers"));
      const Result want = run(engine, s, qkv, dout, grads_packed),
                   got = run(cudnn, s, qkv, dout, grads_packed);
      CHECK(rel_error(got.out, want.out) <= 1e-2);
      CHECK(rel_error(got.saved, want.saved) <= 1e-3);  // logsumexp per row, natural log
      CHECK(rel_error(got.dq, want.dq) <= 1e-2);
      CHECK(rel_error(got.dk, want.dk) <= 1e-2);
      CHECK(rel_error(got.dv, want.dv) <= 1e-2);
      const Result again = run(cudnn, s, qkv, dout, grads_packed);  // the deterministic backward
      CHECK(std::memcmp(again.dq.data(), got.dq.data(), got.dq.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(again.dk.data(), got.dk.data(), got.dk.size() * sizeof(float)) == 0);
    }
  }
}
#endif
