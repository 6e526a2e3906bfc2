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
#include "tests/gpu/gpu_test_util.h"

namespace {

using grass::AttentionKernel;
using grass::gputest::DeviceBuffer;
using bf16 = __nv_bfloat16;

struct Shape {
  int B, T, NH, NKV, HD;
};

// A CUDA backend with the given attention kernels, its scratch planned for one shape.
struct AttentionBackend {
  std::unique_ptr<grass::Backend> backend;
  grass::Arena arena;
  std::unique_ptr<grass::ScratchLease> scratch;
  AttentionBackend(AttentionKernel kernel, const Shape& s)
      : backend(grass::make_cuda_backend(
            grass::storage_for(grass::PrecisionChoice::Bf16Mixed, true), 0, kernel)),
        arena(false, *backend),
        scratch(backend->plan_scratch(
            arena, {s.B, s.T, s.NH * s.HD, 8, 8, s.NH, s.NKV, s.HD, 10000.0, kernel})) {}
};

// One forward and backward: out, the saved statistics, dq, dk, dv.
struct Result {
  std::vector<float> out, saved, dq, dk, dv;
};

Result run(AttentionBackend& a, const Shape& s, const DeviceBuffer<bf16>& q,
           const DeviceBuffer<bf16>& k, const DeviceBuffer<bf16>& v,
           const DeviceBuffer<bf16>& dout) {
  const size_t nq = q.n, nkv = k.n;
  DeviceBuffer<bf16> out(nq), dq(nq), dk(nkv), dv(nkv);
  DeviceBuffer<float> saved(size_t(s.B) * s.NH * s.T);
  for (auto* b : {&out, &dq, &dk, &dv}) b->poison();
  saved.poison();
  a.backend->attention_forward(out.ptr, saved.ptr, q.ptr, k.ptr, v.ptr, s.B, s.T, s.NH, s.NKV,
                               s.HD, 10000.0);
  a.backend->attention_backward(dq.ptr, dk.ptr, dv.ptr, dout.ptr, out.ptr, saved.ptr, q.ptr,
                                k.ptr, v.ptr, s.B, s.T, s.NH, s.NKV, s.HD, 10000.0);
  using grass::gputest::to_f32;
  return {to_f32(out.download()), saved.download(), to_f32(dq.download()),
          to_f32(dk.download()), to_f32(dv.download())};
}

}  // namespace

TEST_CASE("cuDNN attention matches the engine's kernels, RoPE included", "[gpu][cudnn]") {
  using grass::gputest::rel_error;
  const Shape shapes[] = {{2, 100, 8, 2, 64}, {1, 256, 16, 16, 128}, {4, 64, 4, 1, 64}};
  for (const Shape& s : shapes) {
    INFO("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.NKV << " HD=" << s.HD);
    const size_t nq = size_t(s.B) * s.T * s.NH * s.HD, nkv = size_t(s.B) * s.T * s.NKV * s.HD;
    DeviceBuffer<bf16> q(nq), k(nkv), v(nkv), dout(nq);
    q.upload(grass::gputest::to_bf16(grass::gputest::randn(nq)));
    k.upload(grass::gputest::to_bf16(grass::gputest::randn(nkv)));
    v.upload(grass::gputest::to_bf16(grass::gputest::randn(nkv)));
    dout.upload(grass::gputest::to_bf16(grass::gputest::randn(nq)));
    AttentionBackend engine(AttentionKernel::Grass, s), cudnn(AttentionKernel::Cudnn, s);
    const Result want = run(engine, s, q, k, v, dout), got = run(cudnn, s, q, k, v, dout);
    CHECK(rel_error(got.out, want.out) <= 1e-2);
    CHECK(rel_error(got.saved, want.saved) <= 1e-3);  // logsumexp per row, natural log
    CHECK(rel_error(got.dq, want.dq) <= 1e-2);
    CHECK(rel_error(got.dk, want.dk) <= 1e-2);
    CHECK(rel_error(got.dv, want.dv) <= 1e-2);
    const Result again = run(cudnn, s, q, k, v, dout);  // the deterministic backward
    CHECK(std::memcmp(again.dq.data(), got.dq.data(), got.dq.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(again.dk.data(), got.dk.data(), got.dk.size() * sizeof(float)) == 0);
  }
}
#endif
