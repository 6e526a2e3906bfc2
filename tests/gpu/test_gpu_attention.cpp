// The CUDA attention (kernels/cuda/attention.cu) against the CPU reference
// (ops::attention_forward/backward<float>) on the same bf16-rounded inputs: forward out and lse,
// backward dq, dk, dv. The shapes put T off the kernels' 64-row tiles (100, 257), at one token,
// and on one tile; GQA groups of 1, 2, 4 and 8; HD 64 and 128. Outputs are poisoned first, so an
// element a kernel forgot to write fails. The backward must also repeat bit for bit. With RoPE in
// the kernels' loads (the model's use), the forward gives the bits of rope_forward then attention,
// and the gradients of the unrotated q and k match the CPU's RoPE, attention, RoPE backward. q, k,
// v lie as three buffers or packed in one (the model's layout), and so do their gradients.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"
#include "src/core/error.h"
#include "tests/gpu/gpu_test_util.h"

#if __has_include(<cuda_emu.h>)
#include <cuda_emu.h>
#define GRASS_TEST_CUDA_EMU 1
#endif

namespace {

using grass::gputest::bf16_rounded;
using grass::gputest::DeviceBuffer;
using grass::gputest::gather_pitched;
using grass::gputest::randn;
using grass::gputest::rel_error;
using grass::gputest::TestContext;
using grass::gputest::to_bf16;
using grass::gputest::to_f32;
using bf16 = __nv_bfloat16;

struct Shape {
  int B, T, NH, NKV, HD;
};

std::string describe(const Shape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
         " NKV=" + std::to_string(s.NKV) + " HD=" + std::to_string(s.HD);
}

// lse[B,NH,T] = ln Σ_{s ≤ t} exp(q_t·k_s / sqrt(HD)) in double (the CPU forward keeps only the
// normalised probabilities).
std::vector<float> reference_lse(const std::vector<float>& q, const std::vector<float>& k,
                                 const Shape& s) {
  std::vector<float> lse(size_t(s.B) * s.NH * s.T);
  const double scale = 1.0 / std::sqrt(double(s.HD));
  std::vector<double> scores(s.T);
  for (int b = 0; b < s.B; b++)
    for (int h = 0; h < s.NH; h++) {
      const int g = h / (s.NH / s.NKV);
      for (int t = 0; t < s.T; t++) {
        const float* qt = &q[((size_t(b) * s.T + t) * s.NH + h) * s.HD];
        double mx = -INFINITY;
        for (int j = 0; j <= t; j++) {
          const float* kj = &k[((size_t(b) * s.T + j) * s.NKV + g) * s.HD];
          double dot = 0;
          for (int c = 0; c < s.HD; c++) dot += double(qt[c]) * kj[c];
          scores[j] = dot * scale;
          mx = std::max(mx, scores[j]);
        }
        double sum = 0;
        for (int j = 0; j <= t; j++) sum += std::exp(scores[j] - mx);
        lse[(size_t(b) * s.NH + h) * s.T + t] = float(mx + std::log(sum));
      }
    }
  return lse;
}

// A gradient against its reference. dq and dk vanish exactly when every query sees a single key
// (T = 1: P = 1, so dS = P·(dP - D) = 0); a relative error is 0/0 there, so the check is absolute.
void check_grad(const std::vector<float>& got, const std::vector<float>& want, const char* name) {
  INFO(name);
  const bool vanishing = std::all_of(want.begin(), want.end(), [](float x) { return x == 0.0f; });
  if (vanishing) {
    float worst = 0.0f;
    for (float x : got) worst = std::isnan(x) ? INFINITY : std::max(worst, std::fabs(x));
    CHECK(worst <= 1e-4f);
  } else {
    CHECK(rel_error(got, want) <= 1e-2);
  }
}

// One problem's random bf16-valued inputs and the CPU reference's forward and backward on them.
struct Reference {
  size_t nq, nkv;
  std::vector<float> q, k, v, dout, out, dq, dk, dv;
  explicit Reference(const Shape& s)
      : nq(size_t(s.B) * s.T * s.NH * s.HD),
        nkv(size_t(s.B) * s.T * s.NKV * s.HD),
        q(bf16_rounded(randn(nq))),
        k(bf16_rounded(randn(nkv))),
        v(bf16_rounded(randn(nkv))),
        dout(bf16_rounded(randn(nq))),
        out(nq),
        dq(nq),
        dk(nkv),
        dv(nkv) {
    // probs[B,NH,T,T] from the forward feed the backward
    const float *cq = q.data(), *ck = k.data(), *cv = v.data();
    const auto in = grass::separate_qkv(cq, ck, cv, s.NH, s.NKV, s.HD);
    std::vector<float> probs(size_t(s.B) * s.NH * s.T * s.T), scratch(probs.size());
    grass::ops::attention_forward<float>(out.data(), probs.data(), in, s.B, s.T, s.NH, s.NKV, s.HD);
    grass::ops::attention_backward<float>(
        grass::separate_qkv(dq.data(), dk.data(), dv.data(), s.NH, s.NKV, s.HD), scratch.data(),
        dout.data(), in, probs.data(), s.B, s.T, s.NH, s.NKV, s.HD);
  }
};

// One problem on the device: bf16 inputs uploaded, outputs allocated; q, k, v and their
// gradients in one buffer each, packed or as three.
struct DeviceAttention {
  Shape s;
  bool packed, grads_packed;
  size_t nq, nkv;
  DeviceBuffer<bf16> qkv, dout, out, dqkv;
  DeviceBuffer<float> lse, scratch;
  grass::cuda::RopeTable rope;  // none unless a test sets one
  std::vector<bf16> dqkv_host;  // the last backward's gradients
  DeviceAttention(const Shape& shape, const std::vector<float>& q_h, const std::vector<float>& k_h,
                  const std::vector<float>& v_h, const std::vector<float>& dout_h,
                  bool packed_rows = false, bool packed_grads = false)
      : s(shape),
        packed(packed_rows),
        grads_packed(packed_grads),
        nq(size_t(s.B) * s.T * s.NH * s.HD),
        nkv(size_t(s.B) * s.T * s.NKV * s.HD),
        qkv(nq + 2 * nkv),
        dout(nq),
        out(nq),
        dqkv(nq + 2 * nkv),
        lse(size_t(s.B) * s.NH * s.T),
        scratch(size_t(grass::cuda::attention_scratch_floats(s.B, s.T, s.NH, s.NKV, s.HD))) {
    std::vector<bf16> host(nq + 2 * nkv);
    grass::gputest::scatter_qkv(layout(host.data(), packed), to_bf16(q_h), to_bf16(k_h),
                                to_bf16(v_h), int64_t(s.B) * s.T);
    qkv.upload(host);
    dout.upload(to_bf16(dout_h));
  }
  template <typename T>
  grass::QkvRows<T*> layout(T* base, bool packed_layout) const {
    return grass::gputest::qkv_layout(base, int64_t(s.B) * s.T, s.NH, s.NKV, s.HD, packed_layout);
  }
  grass::QkvRows<bf16*> rows() { return layout(qkv.ptr, packed); }
  void forward(const grass::cuda::Context& ctx) {
    out.poison();
    lse.poison();
    grass::cuda::attention_forward(ctx, out.ptr, lse.ptr, grass::read_only(rows()), s.B, s.T, s.NH,
                                   s.NKV, s.HD, rope);
  }
  // The `attention: "mma"` forward (attention_mma.cu; no RoPE table)
  void forward_mma(const grass::cuda::Context& ctx) {
    out.poison();
    lse.poison();
    grass::cuda::attention_forward_mma(ctx, out.ptr, lse.ptr, grass::read_only(rows()), s.B, s.T,
                                       s.NH, s.NKV, s.HD);
  }
  void backward(const grass::cuda::Context& ctx) {
    dqkv.poison();
    scratch.poison();
    grass::cuda::attention_backward(ctx, layout(dqkv.ptr, grads_packed), scratch.ptr, dout.ptr,
                                    out.ptr, lse.ptr, grass::read_only(rows()), s.B, s.T, s.NH,
                                    s.NKV, s.HD, rope);
    dqkv_host = dqkv.download();
  }
  // The `attention: "mma"` backward (path A or B, or the old kernels where it hands over)
  void backward_mma(const grass::cuda::Context& ctx,
                    grass::cuda::MmaBackwardPath path = grass::cuda::MmaBackwardPath::Auto) {
    dqkv.poison();
    scratch.poison();
    grass::cuda::attention_backward_mma(ctx, layout(dqkv.ptr, grads_packed), scratch.ptr, dout.ptr,
                                        out.ptr, lse.ptr, grass::read_only(rows()), s.B, s.T, s.NH,
                                        s.NKV, s.HD, path);
    dqkv_host = dqkv.download();
  }
  // the last backward's gradients, each [B·T, H·HD]
  std::vector<bf16> dq() const {
    const auto d = layout(dqkv_host.data(), grads_packed);
    return gather_pitched(d.q, d.ldq, size_t(s.NH) * s.HD, int64_t(s.B) * s.T);
  }
  std::vector<bf16> dk() const {
    const auto d = layout(dqkv_host.data(), grads_packed);
    return gather_pitched(d.k, d.ldk, size_t(s.NKV) * s.HD, int64_t(s.B) * s.T);
  }
  std::vector<bf16> dv() const {
    const auto d = layout(dqkv_host.data(), grads_packed);
    return gather_pitched(d.v, d.ldv, size_t(s.NKV) * s.HD, int64_t(s.B) * s.T);
  }
};

}  // namespace

TEST_CASE("cuda attention forward and backward match the CPU reference", "[gpu]") {
  const Shape shapes[] = {
      {2, 100, 8, 2, 64}, {1, 257, 4, 4, 128}, {3, 1, 2, 1, 64}, {1, 64, 8, 1, 128}};
  TestContext tc;
  // q, k, v and their gradients as three buffers; both packed (the model with q_proj, k_proj and
  // v_proj dense); q, k, v packed and their gradients apart (the model with one projected)
  for (const Shape& s : shapes)
    for (const auto& [packed, grads_packed] :
         {std::pair{false, false}, {true, true}, {true, false}}) {
      INFO(describe(s) << (packed ? ", q, k, v packed" : ", q, k, v as three buffers")
                       << (grads_packed ? ", their gradients packed" : ""));
      const Reference r(s);
      DeviceAttention dev(s, r.q, r.k, r.v, r.dout, packed, grads_packed);
      dev.forward(tc.ctx);
      CHECK(rel_error(to_f32(dev.out.download()), r.out) <= 1e-2);
      CHECK(rel_error(dev.lse.download(), reference_lse(r.q, r.k, s)) <= 1e-2);

      // The backward runs on the GPU's own out and lse, as in training.
      dev.backward(tc.ctx);
      check_grad(to_f32(dev.dq()), r.dq, "dq");
      check_grad(to_f32(dev.dk()), r.dk, "dk");
      check_grad(to_f32(dev.dv()), r.dv, "dv");
    }
}

TEST_CASE("cuda attention backward is bitwise repeatable", "[gpu]") {
  const Shape shapes[] = {{2, 100, 8, 2, 64}, {1, 257, 4, 4, 128}};
  TestContext tc;
  for (const Shape& s : shapes) {
    INFO(describe(s));
    const size_t nq = size_t(s.B) * s.T * s.NH * s.HD, nkv = size_t(s.B) * s.T * s.NKV * s.HD;
    DeviceAttention dev(s, randn(nq), randn(nkv), randn(nkv), randn(nq), true, true);
    dev.forward(tc.ctx);
    dev.backward(tc.ctx);
    const std::vector<bf16> first = dev.dqkv_host;
    dev.backward(tc.ctx);  // poisons its outputs again first
    CHECK(std::memcmp(first.data(), dev.dqkv_host.data(), first.size() * sizeof(bf16)) == 0);
  }
}

TEST_CASE("cuda attention rejects an unsupported head dim, naming HD", "[gpu]") {
  TestContext tc;
  for (int HD : {60, 264}) {
    INFO("HD=" << HD);
    // The shape check comes before any pointer is touched or any kernel launched.
    try {
      grass::cuda::attention_forward(tc.ctx, nullptr, nullptr, {}, 1, 8, 2, 1, HD);
      FAIL("accepted");
    } catch (const grass::InternalError& e) {
      CHECK(std::string(e.what()).find("HD = " + std::to_string(HD)) != std::string::npos);
    }
  }
}

TEST_CASE("cuda attention with RoPE in its loads equals RoPE then attention", "[gpu]") {
  struct Case {
    Shape s;
    double theta;
  };
  // HD 8 and 24: pairs of 4 and 12 channels, a zero pad chunk to HDP 16 and 32
  const Case cases[] = {{{2, 100, 8, 2, 64}, 10000.0},
                        {{1, 70, 4, 4, 128}, 500000.0},
                        {{2, 33, 4, 2, 32}, 10000.0},
                        {{1, 40, 2, 1, 8}, 10000.0},
                        {{1, 65, 3, 1, 24}, 10000.0}};
  TestContext tc;
  for (const Case& c : cases) {
    const Shape& s = c.s;
    const bool packed = s.NKV != s.NH;  // the model's packed layouts, and three buffers
    INFO(describe(s) << " theta=" << c.theta << (packed ? ", q, k, v packed" : ""));
    const size_t nq = size_t(s.B) * s.T * s.NH * s.HD, nkv = size_t(s.B) * s.T * s.NKV * s.HD;
    const std::vector<float> q = bf16_rounded(randn(nq)), k = bf16_rounded(randn(nkv)),
                             v = bf16_rounded(randn(nkv)), dout = bf16_rounded(randn(nq));
    DeviceBuffer<float> table(size_t(s.T) * s.HD);  // cos and sin [T, HD/2]
    table.poison();
    grass::cuda::rope_table(tc.ctx, table.ptr, s.T, s.HD, float(c.theta));

    // Fused: q and k as the projections give them; unfused: rotated first, then plain attention.
    DeviceAttention fused(s, q, k, v, dout, packed, packed);
    fused.rope = {table.ptr, s.T};
    fused.forward(tc.ctx);
    fused.backward(tc.ctx);
    DeviceAttention unfused(s, q, k, v, dout, packed, packed);
    const grass::QkvRows<bf16*> rows = unfused.rows();  // rotated in place, as the cuDNN path does
    grass::cuda::rope_forward(tc.ctx, rows.q, s.B, s.T, s.NH, s.HD, float(c.theta), rows.ldq);
    grass::cuda::rope_forward(tc.ctx, rows.k, s.B, s.T, s.NKV, s.HD, float(c.theta), rows.ldk);
    unfused.forward(tc.ctx);
    unfused.backward(tc.ctx);
    const std::vector<bf16> out_f = fused.out.download(), out_u = unfused.out.download();
    CHECK(std::memcmp(out_f.data(), out_u.data(), nq * sizeof(bf16)) == 0);
    CHECK(fused.lse.download() == unfused.lse.download());
    // dv reads only the rotated tiles: the same bits
    const std::vector<bf16> dv_f = fused.dv(), dv_u = unfused.dv();
    CHECK(std::memcmp(dv_f.data(), dv_u.data(), nkv * sizeof(bf16)) == 0);

    // dq and dk against the CPU: RoPE, attention, attention backward, RoPE backward
    std::vector<float> qr(nq), kr(nkv);
    grass::ops::rope_forward<float>(qr.data(), q.data(), s.B, s.T, s.NH, s.HD, c.theta);
    grass::ops::rope_forward<float>(kr.data(), k.data(), s.B, s.T, s.NKV, s.HD, c.theta);
    std::vector<float> out_ref(nq), probs(size_t(s.B) * s.NH * s.T * s.T), scratch(probs.size());
    const auto in =
        grass::separate_qkv<const float*>(qr.data(), kr.data(), v.data(), s.NH, s.NKV, s.HD);
    grass::ops::attention_forward<float>(out_ref.data(), probs.data(), in, s.B, s.T, s.NH, s.NKV,
                                         s.HD);
    CHECK(rel_error(to_f32(out_f), out_ref) <= 1e-2);
    std::vector<float> dq_ref(nq), dk_ref(nkv), dv_ref(nkv);
    grass::ops::attention_backward<float>(
        grass::separate_qkv(dq_ref.data(), dk_ref.data(), dv_ref.data(), s.NH, s.NKV, s.HD),
        scratch.data(), dout.data(), in, probs.data(), s.B, s.T, s.NH, s.NKV, s.HD);
    grass::ops::rope_backward<float>(dq_ref.data(), dq_ref.data(), s.B, s.T, s.NH, s.HD, c.theta);
    grass::ops::rope_backward<float>(dk_ref.data(), dk_ref.data(), s.B, s.T, s.NKV, s.HD, c.theta);
    check_grad(to_f32(fused.dq()), dq_ref, "dq");
    check_grad(to_f32(fused.dk()), dk_ref, "dk");
    check_grad(to_f32(dv_f), dv_ref, "dv");
  }
}

// The FA2-style forward of `attention: "mma"` (kernels/cuda/attention_mma.cu), on shapes small
// enough for the emulator: T off its 64-row tiles (37, 65, 80: a diagonal block with rows past T,
// and a full block before it), one token, GQA groups of 1 and 2, each head dim it takes (16, 32,
// 64, 128) and one it hands to the old kernel (8). Its out and lse match the CPU reference, and the
// old backward (no RoPE table) on them gives the CPU's gradients: what "mma" runs for the shapes
// its own backward hands over. Out and lse repeat bit for bit.
TEST_CASE("cuda attention mma forward matches the CPU reference and feeds the old backward",
          "[gpu][attention]") {
  const Shape shapes[] = {{1, 80, 2, 1, 64}, {2, 37, 2, 2, 32}, {1, 70, 2, 1, 128},
                          {1, 65, 2, 2, 16}, {2, 1, 2, 1, 64},  {1, 40, 2, 1, 8}};
  TestContext tc;
  for (const Shape& s : shapes) {
    const bool packed = s.NKV != s.NH;  // the model's packed rows, and three buffers
    INFO(describe(s) << (packed ? ", q, k, v packed" : ""));
    const Reference r(s);
    DeviceAttention dev(s, r.q, r.k, r.v, r.dout, packed, packed);
    dev.forward_mma(tc.ctx);
    const std::vector<bf16> out = dev.out.download();
    const std::vector<float> lse = dev.lse.download();
    CHECK(rel_error(to_f32(out), r.out) <= 1e-2);
    CHECK(rel_error(lse, reference_lse(r.q, r.k, s)) <= 1e-2);
    dev.forward_mma(tc.ctx);  // poisons out and lse first
    const std::vector<bf16> again = dev.out.download();
    CHECK(std::memcmp(out.data(), again.data(), r.nq * sizeof(bf16)) == 0);
    CHECK(dev.lse.download() == lse);

    dev.backward(tc.ctx);
    check_grad(to_f32(dev.dq()), r.dq, "dq");
    check_grad(to_f32(dev.dk()), r.dk, "dk");
    check_grad(to_f32(dev.dv()), r.dv, "dv");
  }
}

// The backward of `attention: "mma"` (kernels/cuda/attention_mma.cu) on the mma forward's out and
// lse, by both paths: A (one CTA per kv head and batch, dQ summed in shared memory) and B (a dK/dV
// kernel per key block, a dQ kernel per query block). Both run on the shapes A takes: T off the
// 64-row tiles (a diagonal block with rows past T, and key blocks before it), one token, GQA
// groups of 1, 2 and 4, HD 16, 32 and 64. B alone, as "auto" runs it, on HD 128 (groups of 1, 2
// and 4; one token; three key blocks) and on T over 256 (five blocks, the last of one row; a
// group of 8). dq, dk, dv match the CPU reference, repeat
// bit for bit, and "auto" gives the bits of the path it should take. On the emulator, whose
// mma.sync sums an element's products in a stated order (the same for Sᵀ = K·Qᵀ as for S = Q·Kᵀ),
// B gives A's bits: both form the same products and sum them in the same order. A GPU's order
// within an mma is not specified, so there the paths are held to the reference only.
TEST_CASE("cuda attention mma backward by both paths matches the CPU reference and repeats bit for bit",
          "[gpu][attention]") {
  using grass::cuda::MmaBackwardPath;
  const Shape shapes[] = {{1, 80, 2, 1, 64},  {2, 37, 2, 2, 32},  {1, 65, 2, 2, 16},
                          {2, 1, 2, 1, 64},   {1, 40, 1, 1, 128}, {1, 130, 4, 1, 128},
                          {2, 1, 2, 2, 128},  {1, 300, 2, 2, 16}, {1, 257, 8, 1, 32},
                          {2, 70, 4, 2, 32}};
  TestContext tc;
  for (const Shape& s : shapes) {
    const bool packed = s.NKV != s.NH;
    const bool a_takes = grass::cuda::attention_backward_mma_path_a_takes(s.T, s.NH, s.NKV, s.HD);
    const Reference r(s);
    DeviceAttention dev(s, r.q, r.k, r.v, r.dout, packed, packed);
    dev.forward_mma(tc.ctx);
    std::vector<bf16> path_a;
    for (const MmaBackwardPath path : {MmaBackwardPath::A, MmaBackwardPath::B}) {
      if (path == MmaBackwardPath::A && !a_takes) continue;
      INFO(describe(s) << (packed ? ", q, k, v and their gradients packed" : "")
                       << (path == MmaBackwardPath::A ? ", path A" : ", path B"));
      dev.backward_mma(tc.ctx, path);
      check_grad(to_f32(dev.dq()), r.dq, "dq");
      check_grad(to_f32(dev.dk()), r.dk, "dk");
      check_grad(to_f32(dev.dv()), r.dv, "dv");
      const std::vector<bf16> first = dev.dqkv_host;
      dev.backward_mma(tc.ctx, path);  // poisons its outputs and the scratch again first
      CHECK(std::memcmp(first.data(), dev.dqkv_host.data(), first.size() * sizeof(bf16)) == 0);
#ifdef GRASS_TEST_CUDA_EMU
      if (path == MmaBackwardPath::A) path_a = first;
      if (path == MmaBackwardPath::B && a_takes)
        CHECK(std::memcmp(path_a.data(), first.data(), first.size() * sizeof(bf16)) == 0);
#endif
      if (path == (a_takes ? MmaBackwardPath::A : MmaBackwardPath::B)) {
        dev.backward_mma(tc.ctx, MmaBackwardPath::Auto);
        CHECK(std::memcmp(first.data(), dev.dqkv_host.data(), first.size() * sizeof(bf16)) == 0);
      }
    }
  }
}
