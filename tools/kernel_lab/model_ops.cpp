// The model's ops in the kernel lab (lab.h): linear, RMSNorm, attention (with RoPE), SwiGLU, the
// residual add (o_proj's and down's epilogue), embedding and the head, forward and backward.
// Shapes as in kernels/ops.h: N = B·T rows, C hidden, F ffn width, V vocab, NH query heads, NKV
// key/value heads, HD head dim; A, W, G the bytes of an activation, a weight and a gradient
// element in the GPU's storage.
//
// Every input is fresh random values; an output the op overwrites is poisoned first; an output it
// accumulates into (parameter gradients, RMSNorm's dx) starts from random values. FLOPs count a
// multiply-add as 2; bytes are what the op must move at least (each input read once, each output
// written once), so GB/s against the peak says how close the kernel is to the memory's limit.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "tools/kernel_lab/lab.h"

namespace grass::lab {

// ---- linear -------------------------------------------------------------------------------------
// y[N,out] = x[N,in]·w[out,in]ᵀ;  backward dx[N,in] = dy·w, dw[out,in] += dyᵀ·x.
// FLOPs: 2·N·in·out per product. The CPU reference runs on sampled rows of x and dy, and for dw on
// sampled rows of dw (each a sum over all N tokens) as a layer with only those outputs.
void bench_linear(Lab& lab, const Model& m) {
  Backend &gpu = lab.gpu, &cpu = lab.cpu;
  const Storage& s = gpu.storage();
  const int64_t N = m.N();
  for (const LinearShape& l : linear_shapes(m, /*model_gemms=*/true)) {
    const std::string shape = dims({{"N", N}, {"in", l.in}, {"out", l.out}}) + " " + l.layers;
    const double product_flops = 2.0 * double(N) * l.in * l.out;
    const int64_t w_numel = int64_t(l.out) * l.in;
    const double a = 1 / std::sqrt(double(l.in));  // HF's init scale: y = O(1)
    const std::vector<float> x = lab.uniform(N * l.in, -1, 1, s.act_bytes);          // [N, in]
    const std::vector<float> w = lab.uniform(w_numel, -a, a, s.weight_bytes);          // [out, in]
    const std::vector<float> dy = lab.uniform(N * l.out, -1, 1, s.act_bytes);        // [N, out]
    const std::vector<float> dw0 = lab.uniform(w_numel, -1, 1, s.grad_bytes);          // [out, in]
    Buffer gx(gpu, x, s.act_bytes), gw(gpu, w, s.weight_bytes), gdy(gpu, dy, s.act_bytes),
        gdw(gpu, dw0, s.grad_bytes);
    Buffer gy(gpu, N * l.out, s.act_bytes), gdx(gpu, N * l.in, s.act_bytes);
    const std::vector<int64_t> rows = lab.sample_rows(N);        // of x, y, dy, dx
    const std::vector<int64_t> w_rows = lab.sample_rows(l.out);  // of dw
    const int64_t S = int64_t(rows.size()), Sw = int64_t(w_rows.size());
    const std::vector<float> x_s = rows_of(x, l.in, rows);    // [S, in]
    const std::vector<float> dy_s = rows_of(dy, l.out, rows);  // [S, out]

    auto forward = [&] { gpu.linear_forward(gy.ptr(), gx.ptr(), gw.ptr(), N, l.in, l.out); };
    gy.poison();
    forward();
    std::vector<float> y_ref(size_t(S * l.out));  // [S, out]
    cpu.linear_forward(y_ref.data(), x_s.data(), w.data(), S, l.in, l.out);
    const double y_err = max_row_error(gy.get(), y_ref, l.out, rows);
    lab.report(m, {.op = "linear.fwd", .shape = shape, .ms = lab.time_ms(forward),
                   .flops = product_flops, .err = y_err, .tol = kTolBf16});
    if (l.forward_only) continue;

    // dx alone (dw null): a frozen layer's backward, and half of the model's call
    auto backward_dx = [&] {
      gpu.linear_backward(gdx.ptr(), nullptr, gdy.ptr(), gx.ptr(), gw.ptr(), N, l.in, l.out, false);
    };
    gdx.poison();
    backward_dx();
    std::vector<float> dx_ref(size_t(S * l.in));  // [S, in]
    cpu.linear_backward(dx_ref.data(), nullptr, dy_s.data(), x_s.data(), w.data(), S, l.in, l.out,
                        false);
    const double dx_err = max_row_error(gdx.get(), dx_ref, l.in, rows);
    const double dx_ms = lab.time_ms(backward_dx);
    lab.report(m, {.op = "linear.bwd_dx", .shape = shape, .ms = dx_ms, .flops = product_flops,
                   .err = dx_err, .tol = kTolBf16});

    // dx and dw: the model's call
    auto backward = [&] {
      gpu.linear_backward(gdx.ptr(), gdw.ptr(), gdy.ptr(), gx.ptr(), gw.ptr(), N, l.in, l.out,
                          false);
    };
    gdx.poison();
    backward();
    std::vector<float> dw_ref = rows_of(dw0, l.in, w_rows);  // [Sw, in], accumulated into
    std::vector<float> dx_unused(size_t(N * l.in));           // [N, in]
    cpu.linear_backward(dx_unused.data(), dw_ref.data(), cols_of(dy, l.out, w_rows).data(),
                        x.data(), rows_of(w, l.in, w_rows).data(), N, l.in, int(Sw), false);
    const double dw_err = max_row_error(gdw.get(), dw_ref, l.in, w_rows);
    const double both_err = worst({max_row_error(gdx.get(), dx_ref, l.in, rows), dw_err});
    const double ms = lab.time_ms(backward);
    lab.report(m, {.op = "linear.bwd", .shape = shape, .ms = ms, .flops = 2 * product_flops,
                   .err = both_err, .tol = kTolBf16});
    lab.report(m, {.op = "linear.bwd_dw", .shape = shape, .ms = ms - dx_ms,
                   .flops = product_flops, .err = dw_err, .tol = kTolBf16, .derived = true});
  }
}

// ---- RMSNorm ------------------------------------------------------------------------------------
// out[N,C] = w ⊙ x·rstd, rstd[N] = 1/sqrt(mean(x²) + eps) (fp32, kept for the backward);
// backward dx[N,C] += ∂/∂x (RMSNorm sits on the residual stream), dw[C] += ∂/∂w.
// Bytes: the forward reads x and writes out (2·N·C·A) and writes rstd (4·N); the backward reads
// dout and x and reads and writes dx (4·N·C·A) and reads rstd (4·N); w and dw (C elements) are
// noise. The CPU reference runs on every row: O(N·C) is cheap on the host.
// The `_block` rows are the same calls on the block-per-row kernels that the warp-per-row ones
// replaced (issue 45), timed beside them until a GPU has measured which is faster.

// While alive, the GPU's RMSNorm calls take the block-per-row kernels.
struct BlockPerRowRmsnorm {
  BlockPerRowRmsnorm() { cuda::rmsnorm_force_block_kernels(true); }
  ~BlockPerRowRmsnorm() { cuda::rmsnorm_force_block_kernels(false); }
  BlockPerRowRmsnorm(const BlockPerRowRmsnorm&) = delete;
  BlockPerRowRmsnorm& operator=(const BlockPerRowRmsnorm&) = delete;
};

void bench_rmsnorm(Lab& lab, const Model& m) {
  Backend &gpu = lab.gpu, &cpu = lab.cpu;
  const Storage& s = gpu.storage();
  const int64_t N = m.N();
  const int C = m.C(), A = s.act_bytes;
  const double eps = m.config.rms_norm_eps;
  const std::string shape = dims({{"N", N}, {"C", C}});
  const std::vector<float> x = lab.uniform(N * C, -1, 1, A);              // [N, C]
  const std::vector<float> w = lab.uniform(C, 0.9, 1.1, s.weight_bytes);  // [C]
  Buffer gx(gpu, x, A), gw(gpu, w, s.weight_bytes), gout(gpu, N * C, A), grstd(gpu, N, 4);

  auto forward = [&] {
    gpu.rmsnorm_forward(gout.ptr(), grstd.f32(), gx.ptr(), gw.ptr(), N, C, eps);
  };
  std::vector<float> out_ref(size_t(N * C)), rstd_ref(static_cast<size_t>(N));
  cpu.rmsnorm_forward(out_ref.data(), rstd_ref.data(), x.data(), w.data(), N, C, eps);
  auto check_and_time_forward = [&](const std::string& op) {
    gout.poison();
    grstd.poison();
    forward();
    const double err =
        worst({max_row_error(gout.get(), out_ref, C), max_row_error(grstd.get(), rstd_ref, 1)});
    lab.report(m, {.op = op, .shape = shape, .ms = lab.time_ms(forward),
                   .bytes = 2.0 * A * N * C + 4.0 * N, .err = err, .tol = kTolBf16});
  };
  check_and_time_forward("rmsnorm.fwd");
  {
    const BlockPerRowRmsnorm old;
    check_and_time_forward("rmsnorm.fwd_block");
  }

  // The backward on its own: both sides read the CPU's rstd.
  const std::vector<float> dout = lab.uniform(N * C, -1, 1, A);           // [N, C]
  const std::vector<float> dx0 = lab.uniform(N * C, -1, 1, A);            // [N, C]
  const std::vector<float> dw0 = lab.uniform(C, -1, 1, s.grad_bytes);     // [C]
  Buffer gdout(gpu, dout, A), gdx(gpu, dx0, A), gdw(gpu, dw0, s.grad_bytes);
  grstd.put(rstd_ref);
  auto backward = [&] {
    gpu.rmsnorm_backward(gdx.ptr(), gdw.ptr(), gdout.ptr(), gx.ptr(), gw.ptr(), grstd.f32(), N, C);
  };
  std::vector<float> dx_ref = dx0, dw_ref = dw0;
  cpu.rmsnorm_backward(dx_ref.data(), dw_ref.data(), dout.data(), x.data(), w.data(),
                       rstd_ref.data(), N, C);
  auto check_and_time_backward = [&](const std::string& op) {
    gdx.put(dx0);  // the timed calls below keep accumulating
    gdw.put(dw0);
    backward();
    const double err =
        worst({max_row_error(gdx.get(), dx_ref, C), max_row_error(gdw.get(), dw_ref, C)});
    lab.report(m, {.op = op, .shape = shape, .ms = lab.time_ms(backward),
                   .bytes = 4.0 * A * N * C + 4.0 * N, .err = err, .tol = kTolBf16});
  };
  check_and_time_backward("rmsnorm.bwd");
  {
    const BlockPerRowRmsnorm old;
    check_and_time_backward("rmsnorm.bwd_block");
  }
}

// ---- attention ----------------------------------------------------------------------------------
// Causal attention with GQA and RoPE: q[B,T,NH,HD], k, v[B,T,NKV,HD] -> out[B,T,NH,HD], q and k
// rotated inside the op (the GPU as its kernels load them: RoPE has no pass of its own); `saved` is
// what the forward keeps for the backward (the GPU: logsumexp [B,NH,T]); the backward overwrites
// dq, dk, dv (those of the unrotated q, k). The rotation's few FLOPs per element are not counted.
// FLOPs count the T(T+1)/2 (query, key) pairs the mask leaves, per batch element and head: the
// forward's q·kᵀ and P·v take 2·HD each per pair (4·HD); the backward recomputes the scores (the
// GPU keeps no probabilities) and forms dv, dP, dq and dk: 10·HD, 2.5x the forward, as
// FlashAttention counts it. The CPU reference runs on the last batch element.
namespace {
// Batch element b of x[B,T,H,HD] as one row per head: [H, T·HD].
std::vector<float> heads_of(const std::vector<float>& x, int b, int T, int H, int HD) {
  std::vector<float> out(size_t(H) * T * HD);
  for (int h = 0; h < H; h++)
    for (int t = 0; t < T; t++)
      for (int d = 0; d < HD; d++)
        out[(size_t(h) * T + t) * HD + d] = x[((size_t(b) * T + t) * H + h) * HD + d];
  return out;
}
}  // namespace

void bench_attention(Lab& lab, const Model& m) {
  Backend &gpu = lab.gpu, &cpu = lab.cpu;
  const int A = gpu.storage().act_bytes;
  const int B = m.B, T = m.T, NH = m.NH(), NKV = m.NKV(), HD = m.HD();
  const double theta = m.config.rope_theta;
  const int64_t nq = m.N() * NH * HD, nkv = m.N() * NKV * HD;
  const double pairs = double(B) * NH * T * (T + 1) / 2;
  const std::string shape = dims({{"B", B}, {"T", T}, {"NH", NH}, {"NKV", NKV}, {"HD", HD}});
  const std::vector<float> q = lab.uniform(nq, -1, 1, A);      // [B, T, NH, HD]
  const std::vector<float> k = lab.uniform(nkv, -1, 1, A);     // [B, T, NKV, HD]
  const std::vector<float> v = lab.uniform(nkv, -1, 1, A);     // [B, T, NKV, HD]
  const std::vector<float> dout = lab.uniform(nq, -1, 1, A);   // [B, T, NH, HD]
  Buffer gq(gpu, q, A), gk(gpu, k, A), gv(gpu, v, A), gdout(gpu, dout, A);
  Buffer gout(gpu, nq, A), gdq(gpu, nq, A), gdk(gpu, nkv, A), gdv(gpu, nkv, A);
  Buffer gsaved(gpu, attention_saved_bytes(gpu.storage(), B, T, NH) / 4, 4);

  // The last batch element: [T, NH, HD] of q, out, dq; [T, NKV, HD] of k, v, dk, dv.
  const int b = B - 1;
  const std::vector<int64_t> q_rows = row_range(int64_t(b) * T * NH, int64_t(T) * NH);
  const std::vector<int64_t> kv_rows = row_range(int64_t(b) * T * NKV, int64_t(T) * NKV);
  // q and k mutable: the CPU rotates them in place (Backend::attention_forward)
  std::vector<float> q_b = rows_of(q, HD, q_rows), k_b = rows_of(k, HD, kv_rows);
  const std::vector<float> v_b = rows_of(v, HD, kv_rows), dout_b = rows_of(dout, HD, q_rows);
  const QkvRows<void*> g_rows = separate_qkv(gq.ptr(), gk.ptr(), gv.ptr(), NH, NKV, HD);
  const QkvRows<void*> c_rows =
      separate_qkv<void*>(q_b.data(), k_b.data(), const_cast<float*>(v_b.data()), NH, NKV, HD);

  auto forward = [&] {
    gpu.attention_forward(gout.ptr(), gsaved.ptr(), g_rows, B, T, NH, NKV, HD, theta);
  };
  gout.poison();
  gsaved.poison();
  forward();
  std::vector<float> out_b(q_b.size());
  std::vector<float> probs_b(size_t(attention_saved_bytes(cpu.storage(), 1, T, NH) / 4));
  cpu.attention_forward(out_b.data(), probs_b.data(), c_rows, 1, T, NH, NKV, HD, theta);
  const double fwd_err = max_row_error(gout.get(), out_b, HD, q_rows);
  lab.report(m, {.op = "attention.fwd", .shape = shape, .ms = lab.time_ms(forward),
                 .flops = 4 * HD * pairs, .err = fwd_err, .tol = kTolBf16});

  auto backward = [&] {
    gpu.attention_backward(separate_qkv(gdq.ptr(), gdk.ptr(), gdv.ptr(), NH, NKV, HD),
                           gdout.ptr(), gout.ptr(), gsaved.ptr(), read_only(g_rows), B, T, NH, NKV,
                           HD, theta);
  };
  // cuDNN's path rotates q and k in place at every forward: from the inputs again, rotated once
  gq.put(q);
  gk.put(k);
  forward();
  gdq.poison();
  gdk.poison();
  gdv.poison();
  backward();
  std::vector<float> dq_b(q_b.size()), dk_b(k_b.size()), dv_b(v_b.size());
  cpu.attention_backward(separate_qkv<void*>(dq_b.data(), dk_b.data(), dv_b.data(), NH, NKV, HD),
                         dout_b.data(), out_b.data(), probs_b.data(), read_only(c_rows), 1, T, NH,
                         NKV, HD, theta);
  // The gradients are compared a head at a time ([T·HD] rows), not a token at a time: an early
  // query's dS = P·(dP - D) nearly cancels (D = rowsum(dout ⊙ out), from the GPU's bf16 out), so
  // its small dq row is ~1% of the typical row off where the whole head is ~3e-3 off. A wrong token
  // still moves its head by ~1/sqrt(T) of it.
  const std::vector<float> got_dq = gdq.get(), got_dk = gdk.get(), got_dv = gdv.get();
  const int64_t head = int64_t(T) * HD;
  const double bwd_err = worst(
      {max_row_error(heads_of(got_dq, b, T, NH, HD), heads_of(dq_b, 0, T, NH, HD), head),
       max_row_error(heads_of(got_dk, b, T, NKV, HD), heads_of(dk_b, 0, T, NKV, HD), head),
       max_row_error(heads_of(got_dv, b, T, NKV, HD), heads_of(dv_b, 0, T, NKV, HD), head),
       nonfinite(got_dq), nonfinite(got_dk), nonfinite(got_dv)});
  lab.report(m, {.op = "attention.bwd", .shape = shape, .ms = lab.time_ms(backward),
                 .flops = 10 * HD * pairs, .err = bwd_err, .tol = kTolBf16});
}

// ---- SwiGLU -------------------------------------------------------------------------------------
// out[N,F] = silu(gate)·up, gate and up the halves of gu[N,2F] (the model's one gate-and-up GEMM
// writes them so); backward dgate, dup [N,F] overwritten.
// Bytes: the forward reads gu and writes out (3·N·F·A); the backward reads dout and gu and writes
// dgate and dup (5·N·F·A). The CPU reference runs on every element.
void bench_swiglu(Lab& lab, const Model& m) {
  Backend &gpu = lab.gpu, &cpu = lab.cpu;
  const int A = gpu.storage().act_bytes, F = m.F();
  const int64_t N = m.N(), n = N * F;
  const std::string shape = dims({{"N", N}, {"F", F}});
  // gate over the sigmoid's working range, up in [-1, 1]
  std::vector<float> gu = lab.uniform(2 * n, -1, 1, A);
  const std::vector<float> gate = lab.uniform(n, -4, 4, A);
  for (int64_t i = 0; i < n; i++) gu[size_t((i / F) * 2 * F + i % F)] = gate[size_t(i)];
  const std::vector<float> dout = lab.uniform(n, -1, 1, A);
  Buffer ggu(gpu, gu, A), gdout(gpu, dout, A);
  Buffer gout(gpu, n, A), gdgate(gpu, n, A), gdup(gpu, n, A);

  auto forward = [&] { gpu.swiglu_forward(gout.ptr(), ggu.ptr(), N, F); };
  gout.poison();
  forward();
  std::vector<float> out_ref(static_cast<size_t>(n));
  cpu.swiglu_forward(out_ref.data(), gu.data(), N, F);
  const double fwd_err = max_row_error(gout.get(), out_ref, F);
  lab.report(m, {.op = "swiglu.fwd", .shape = shape, .ms = lab.time_ms(forward),
                 .bytes = 3.0 * A * n, .err = fwd_err, .tol = kTolBf16});

  auto backward = [&] {
    gpu.swiglu_backward(gdgate.ptr(), gdup.ptr(), gdout.ptr(), ggu.ptr(), N, F, F);
  };
  gdgate.poison();
  gdup.poison();
  backward();
  std::vector<float> dgate_ref(static_cast<size_t>(n)), dup_ref(static_cast<size_t>(n));
  cpu.swiglu_backward(dgate_ref.data(), dup_ref.data(), dout.data(), gu.data(), N, F, F);
  const double bwd_err =
      worst({max_row_error(gdgate.get(), dgate_ref, F), max_row_error(gdup.get(), dup_ref, F)});
  lab.report(m, {.op = "swiglu.bwd", .shape = shape, .ms = lab.time_ms(backward),
                 .bytes = 5.0 * A * n, .err = bwd_err, .tol = kTolBf16});
}

// ---- residual -----------------------------------------------------------------------------------
// The residual add is o_proj's and down's GEMM epilogue: y[N,C] = r + x[N,in]·w[C,in]ᵀ
// (linear_residual_forward), at every linear shape with out = C. Its time beside linear.fwd's at
// the same shape is what the add costs: the epilogue reads r, N·C·A bytes. FLOPs 2·N·in·C; the
// CPU reference runs on sampled rows.
void bench_residual(Lab& lab, const Model& m) {
  Backend &gpu = lab.gpu, &cpu = lab.cpu;
  const Storage& s = gpu.storage();
  const int64_t N = m.N();
  for (const LinearShape& l : linear_shapes(m, /*model_gemms=*/true)) {
    if (l.out != m.C()) continue;
    const std::string shape = dims({{"N", N}, {"in", l.in}, {"out", l.out}}) + " " + l.layers;
    const double a = 1 / std::sqrt(double(l.in));  // HF's init scale: y = O(1)
    const std::vector<float> x = lab.uniform(N * l.in, -1, 1, s.act_bytes);          // [N, in]
    const std::vector<float> w = lab.uniform(int64_t(l.out) * l.in, -a, a, s.weight_bytes);
    const std::vector<float> r = lab.uniform(N * l.out, -1, 1, s.act_bytes);         // [N, C]
    Buffer gx(gpu, x, s.act_bytes), gw(gpu, w, s.weight_bytes), gr(gpu, r, s.act_bytes),
        gy(gpu, N * l.out, s.act_bytes);
    const std::vector<int64_t> rows = lab.sample_rows(N);
    const int64_t S = int64_t(rows.size());
    auto forward = [&] {
      gpu.linear_residual_forward(gy.ptr(), gx.ptr(), gw.ptr(), gr.ptr(), N, l.in, l.out);
    };
    gy.poison();
    forward();
    std::vector<float> y_ref(size_t(S * l.out));  // [S, C]
    cpu.linear_residual_forward(y_ref.data(), rows_of(x, l.in, rows).data(), w.data(),
                                rows_of(r, l.out, rows).data(), S, l.in, l.out);
    lab.report(m, {.op = "linear_residual.fwd", .shape = shape, .ms = lab.time_ms(forward),
                   .flops = 2.0 * double(N) * l.in * l.out,
                   .err = max_row_error(gy.get(), y_ref, l.out, rows), .tol = kTolBf16});
  }
}

// ---- embedding ----------------------------------------------------------------------------------
// out[N,C] = table[tokens[n], :] of table[V,C]; backward dtable[V,C] += dout's rows, summed per
// token (the GPU groups the positions by token on the host first: that host work is in its time).
// Bytes: the forward reads N rows of the table and writes N rows (N·C·(W + A)) and reads the tokens
// (4·N); the backward reads dout (N·C·A), reads and writes the rows of the U distinct tokens
// (2·U·C·G) and reads the tokens. The CPU reference runs on every element.
void bench_embedding(Lab& lab, const Model& m) {
  Backend &gpu = lab.gpu, &cpu = lab.cpu;
  const Storage& s = gpu.storage();
  const int64_t N = m.N();
  const int C = m.C(), V = m.V(), A = s.act_bytes, G = s.grad_bytes;
  const std::string shape = dims({{"N", N}, {"C", C}, {"V", V}});
  const std::vector<int32_t> tokens = lab.integers(N, V);                          // [N]
  const std::vector<float> table = lab.uniform(int64_t(V) * C, -1, 1, s.weight_bytes);  // [V, C]
  Buffer gtokens(gpu, tokens), gtable(gpu, table, s.weight_bytes), gout(gpu, N * C, A);

  auto forward = [&] { gpu.embedding_forward(gout.ptr(), gtokens.i32(), gtable.ptr(), N, C); };
  gout.poison();
  forward();
  std::vector<float> out_ref(size_t(N * C));
  cpu.embedding_forward(out_ref.data(), tokens.data(), table.data(), N, C);
  const double fwd_err = max_row_error(gout.get(), out_ref, C);
  lab.report(m, {.op = "embedding.fwd", .shape = shape, .ms = lab.time_ms(forward),
                 .bytes = double(N) * C * (s.weight_bytes + A) + 4.0 * N, .err = fwd_err,
                 .tol = kTolExact});

  std::vector<int32_t> distinct = tokens;
  std::sort(distinct.begin(), distinct.end());
  const int64_t U = std::unique(distinct.begin(), distinct.end()) - distinct.begin();
  const std::vector<float> dout = lab.uniform(N * C, -1, 1, A);                 // [N, C]
  const std::vector<float> dtable0 = lab.uniform(int64_t(V) * C, -1, 1, G);     // [V, C]
  Buffer gdout(gpu, dout, A), gdtable(gpu, dtable0, G);
  auto backward = [&] {
    gpu.embedding_backward(gdtable.ptr(), gdout.ptr(), gtokens.i32(), tokens.data(), N, C);
  };
  backward();
  std::vector<float> dtable_ref = dtable0;
  cpu.embedding_backward(dtable_ref.data(), dout.data(), tokens.data(), tokens.data(), N, C);
  const double bwd_err = max_row_error(gdtable.get(), dtable_ref, C);
  lab.report(m, {.op = "embedding.bwd", .shape = shape, .ms = lab.time_ms(backward),
                 .bytes = double(N) * C * A + 2.0 * U * C * G + 4.0 * N, .err = bwd_err,
                 .tol = kTolBf16});
}

// ---- head ---------------------------------------------------------------------------------------
// logits = nf[N,C]·w[V,C]ᵀ and the summed cross-entropy over the valid targets (forward); dnf
// (overwritten) and dw[V,C] += its gradient (backward). The GPU works in chunks of head_rows()
// tokens and recomputes each chunk's logits in the backward rather than keep [N, V]; training
// runs both in one pass (head_forward_backward), each chunk's logits computed once.
// FLOPs: the forward's logits GEMM, 2·N·C·V (the softmax's O(N·V) is not counted); the backward's
// 6·N·C·V: the logits again, dnf = dlogits·w and dw += dlogitsᵀ·nf; the one pass's also 6·N·C·V.
// The check ignores every target but the sampled rows' (target -1), so the loss and dw come from
// those rows alone and the CPU computes them exactly; the timed calls have every target valid.
void bench_head(Lab& lab, const Model& m) {
  Backend &gpu = lab.gpu, &cpu = lab.cpu;
  const Storage& s = gpu.storage();
  const int64_t N = m.N();
  const int C = m.C(), V = m.V(), A = s.act_bytes;
  const std::string shape = dims({{"N", N}, {"C", C}, {"V", V}});
  const double a = 1 / std::sqrt(double(C));  // HF's init scale: logits = O(1), loss ~ ln V
  const std::vector<float> nf = lab.uniform(N * C, -1, 1, A);                           // [N, C]
  const std::vector<float> w = lab.uniform(int64_t(V) * C, -a, a, s.weight_bytes);        // [V, C]
  // dw's rows gain ~1/V per sampled row: a start of that size keeps their change visible
  const std::vector<float> dw0 = lab.uniform(int64_t(V) * C, -1.0 / V, 1.0 / V, s.grad_bytes);
  const std::vector<int32_t> targets = lab.integers(N, V);                               // [N]
  const std::vector<int64_t> rows = lab.sample_rows(N);
  const int64_t S = int64_t(rows.size());
  std::vector<int32_t> check_targets(static_cast<size_t>(N), -1), targets_s;  // [N], [S]
  for (const int64_t r : rows) targets_s.push_back(check_targets[size_t(r)] = targets[size_t(r)]);
  Buffer gnf(gpu, nf, A), gw(gpu, w, s.weight_bytes), gdw(gpu, dw0, s.grad_bytes);
  Buffer gdnf(gpu, N * C, A), glogits(gpu, head_rows(s, N, V) * V, A), glse(gpu, N, 4);
  Buffer gcheck_targets(gpu, check_targets), gtargets(gpu, targets);
  Buffer gloss(gpu, 1, 8);  // the loss sum, fp64
  auto loss_of = [&] {
    double loss = 0;
    gpu.download(&loss, gloss.ptr(), sizeof loss);
    return loss;
  };

  gpu.head_forward(glogits.ptr(), glse.f32(), static_cast<double*>(gloss.ptr()), gnf.ptr(),
                   gw.ptr(), gcheck_targets.i32(), N, C, V);
  const double loss = loss_of();
  gdnf.poison();
  gpu.head_backward(gdnf.ptr(), gdw.ptr(), glogits.ptr(), glse.f32(), gnf.ptr(), gw.ptr(),
                    gcheck_targets.i32(), N, C, V, 1.0);
  const std::vector<float> nf_s = rows_of(nf, C, rows);  // [S, C]
  std::vector<float> logits_ref(size_t(S) * V), lse_ref(static_cast<size_t>(S));
  std::vector<float> dnf_ref(size_t(S * C)), dw_ref = dw0;
  double loss_ref = 0;
  cpu.head_forward(logits_ref.data(), lse_ref.data(), &loss_ref, nf_s.data(), w.data(),
                   targets_s.data(), S, C, V);
  cpu.head_backward(dnf_ref.data(), dw_ref.data(), logits_ref.data(), lse_ref.data(), nf_s.data(),
                    w.data(), targets_s.data(), S, C, V, 1.0);
  const double fwd_err = scalar_error(loss, loss_ref);
  const double bwd_err =
      worst({max_row_error(gdnf.get(), dnf_ref, C, rows), max_row_error(gdw.get(), dw_ref, C)});
  // the one pass from the same start: the same loss and gradients
  gdw.put(dw0);
  gdnf.poison();
  gpu.head_forward_backward(gdnf.ptr(), gdw.ptr(), glogits.ptr(), glse.f32(),
                            static_cast<double*>(gloss.ptr()), gnf.ptr(), gw.ptr(),
                            gcheck_targets.i32(), N, C, V, 1.0);
  const double one_pass_err = worst({scalar_error(loss_of(), loss_ref),
                                     max_row_error(gdnf.get(), dnf_ref, C, rows),
                                     max_row_error(gdw.get(), dw_ref, C)});

  auto forward = [&] {
    gpu.head_forward(glogits.ptr(), glse.f32(), static_cast<double*>(gloss.ptr()), gnf.ptr(),
                     gw.ptr(), gtargets.i32(), N, C, V);
  };
  auto backward = [&] {  // the loss averaged over the batch, as the trainer scales it
    gpu.head_backward(gdnf.ptr(), gdw.ptr(), glogits.ptr(), glse.f32(), gnf.ptr(), gw.ptr(),
                      gtargets.i32(), N, C, V, 1.0 / double(N));
  };
  auto one_pass = [&] {
    gpu.head_forward_backward(gdnf.ptr(), gdw.ptr(), glogits.ptr(), glse.f32(),
                              static_cast<double*>(gloss.ptr()), gnf.ptr(), gw.ptr(),
                              gtargets.i32(), N, C, V, 1.0 / double(N));
  };
  const double head_flops = 2.0 * double(N) * C * V;
  lab.report(m, {.op = "head.fwd", .shape = shape, .ms = lab.time_ms(forward),
                 .flops = head_flops, .err = fwd_err, .tol = kTolLoss});
  lab.report(m, {.op = "head.bwd", .shape = shape, .ms = lab.time_ms(backward),
                 .flops = 3 * head_flops, .err = bwd_err, .tol = kTolBf16});
  lab.report(m, {.op = "head.fwd_bwd", .shape = shape, .ms = lab.time_ms(one_pass),
                 .flops = 3 * head_flops, .err = one_pass_err, .tol = kTolBf16});
}

}  // namespace grass::lab
