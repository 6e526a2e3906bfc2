// The optimizer's ops in the kernel lab (lab.h): AdamW, the sum of squares behind clipping, GRASS's
// compressed gradient and sparse Adam step, and GaLore's and FLORA's projected gradient and Adam
// step. G, S, W: the bytes of a gradient (dense, G_C, R), a moment and a weight element in the
// GPU's storage (fp32, fp32, bf16 in bf16-mixed, with an fp32 master copy of the weights; bf16
// everywhere in pure bf16).
//
// An update's check compares the change it made to the weights (and the new moments) with the
// CPU's, from the same start and with the same step; the CPU reference runs on every element.
// With --state-dtype q8 the updates are the 8-bit steps (adamw_update_q8, grass_adam_update_q8,
// lowrank_adam_update_q8), whose codes and absmax must be the CPU's bit for bit (kernels/quant8.h):
// their check is the weights' error, or 1 where any code or absmax differs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/quant8.h"
#include "src/core/bf16.h"
#include "src/model/llama.h"
#include "tools/kernel_lab/lab.h"

namespace grass::lab {

namespace {

constexpr uint64_t kSeed = 7;  // pure bf16's stochastic rounding streams

// The step every update takes: clipping active (grad_scale < 1), weight decay on, Adam's t = 3 so
// the bias corrections are not 1. lr 1e-2 moves weights of at most 0.01 by ~100 bf16 spacings or
// more, so pure bf16's stochastic rounding is well under 1% of the change rather than all of it.
AdamArgs adam_args() {
  return {.grad_scale = 0.7, .lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
          .weight_decay = 0.1, .step = 3};
}

// m [rows, width] transposed: [width, rows]
std::vector<float> transposed(const std::vector<float>& m, int64_t width) {
  const int64_t rows = int64_t(m.size()) / width;
  std::vector<float> t(m.size());
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < width; c++) t[size_t(c * rows + r)] = m[size_t(r * width + c)];
  return t;
}

// Slices J of gc or R, one per row: rows J of [r, in] (rows), or columns J of [out, r] (columns).
// A GRASS slice or a projected dimension is the unit of these ops.
std::vector<float> slices(const std::vector<float>& m, bool rows, int64_t width,
                          const std::vector<int64_t>& J) {
  return rows ? rows_of(m, width, J) : rows_of(transposed(m, width), int64_t(m.size()) / width, J);
}

// The tensors an update writes, on the GPU and as the CPU's copy, from the same random start: the
// weight w[rows, width] (weight-typed, with its fp32 master copy when the storage has one) and the
// moments m, v[moment_rows, moment_width] (state-typed, v positive).
class UpdateTensors {
 public:
  UpdateTensors(Lab& lab, int64_t rows, int64_t width, int64_t moment_rows, int64_t moment_width)
      : s_(lab.gpu.storage()),
        width_(width),
        moment_width_(moment_width),
        w0_(lab.uniform(rows * width, -0.01, 0.01, s_.weight_bytes)),
        w_(w0_),
        master_(s_.master ? w0_ : std::vector<float>()),
        m_(lab.uniform(moment_rows * moment_width, -0.1, 0.1, s_.state_bytes)),
        v_(lab.uniform(moment_rows * moment_width, 0, 0.01, s_.state_bytes)),
        gw_(lab.gpu, w0_, s_.weight_bytes),
        gmaster_(lab.gpu, master_, 4),
        gm_(lab.gpu, m_, s_.state_bytes),
        gv_(lab.gpu, v_, s_.state_bytes) {}

  WeightRef gpu_weight() const { return {gw_.ptr(), s_.master ? gmaster_.f32() : nullptr}; }
  void* gpu_m() const { return gm_.ptr(); }
  void* gpu_v() const { return gv_.ptr(); }
  WeightRef cpu_weight() { return {w_.data(), s_.master ? master_.data() : nullptr}; }
  float* cpu_m() { return m_.data(); }
  float* cpu_v() { return v_.data(); }

  // The GPU's step against the CPU's: the change it made to the weights (of the master copy when
  // there is one; the change, not the weights, since an error in a step is a fraction of the
  // step) and the new m and v; with a master copy, also the bf16 weights against the GPU's own master rounded to
  // nearest (against the CPU's, a master one fp32 ulp away may round to the other neighbour).
  // Rows the step must leave alone (GRASS's unselected slices) have a zero change: any change
  // there counts against the typical row's (max_row_error). by_columns: the unit is a column of w
  // and of the moments [out, r], a projected layer's slice when it projects columns, rather than
  // a row of r elements.
  double error(bool by_columns) const {
    auto compare = [&](const std::vector<float>& got, const std::vector<float>& want,
                       int64_t width) {
      if (!by_columns) return max_row_error(got, want, width);
      return max_row_error(transposed(got, width), transposed(want, width),
                           int64_t(got.size()) / width);
    };
    const double moments =
        worst({compare(gm_.get(), m_, moment_width_), compare(gv_.get(), v_, moment_width_)});
    return worst({weight_error(by_columns), moments});
  }
  // ... the weights alone (an 8-bit step's moments are Q8State's)
  double weight_error(bool by_columns) const {
    auto compare = [&](const std::vector<float>& got, const std::vector<float>& want) {
      if (!by_columns) return max_row_error(got, want, width_);
      return max_row_error(transposed(got, width_), transposed(want, width_),
                           int64_t(got.size()) / width_);
    };
    if (!s_.master) return compare(change(gw_.get()), change(w_));
    const std::vector<float> got_master = gmaster_.get();
    return worst({compare(change(got_master), change(master_)),
                  compare(gw_.get(), bf16_rounded(got_master))});
  }

 private:
  static std::vector<float> bf16_rounded(std::vector<float> x) {
    for (float& v : x) v = bf16_to_float(float_to_bf16(v));
    return x;
  }
  std::vector<float> change(std::vector<float> w) const {
    for (size_t i = 0; i < w.size(); i++) w[i] -= w0_[i];
    return w;
  }
  const Storage& s_;
  int64_t width_, moment_width_;
  std::vector<float> w0_, w_, master_, m_, v_;  // the start, and the CPU's copies
  Buffer gw_, gmaster_, gm_, gv_;
};

// 8-bit moments (kernels/quant8.h) of a state laid out as `layout`, on the GPU and as the CPU's
// copy, from the same random start (m in ±0.1, v in [0, 0.01), quantized on the CPU).
class Q8State {
 public:
  Q8State(Lab& lab, const Quant8Layout& layout)
      : gpu_(lab.gpu),
        layout_(layout),
        n_(layout.rows * layout.cols),
        blocks_(layout.blocks()),
        m_(size_t(n_)),
        v_(size_t(n_)),
        absmax_m_(size_t(blocks_)),
        absmax_v_(size_t(blocks_)),
        gm_(lab.gpu, n_, 1),
        gv_(lab.gpu, n_, 1),
        gabsmax_m_(lab.gpu, blocks_, 4),
        gabsmax_v_(lab.gpu, blocks_, 4) {
    const std::vector<float> m = lab.uniform(n_, -0.1, 0.1, 4), v = lab.uniform(n_, 0, 0.01, 4);
    ops::quantize_layout(quant8_map(true), m.data(), layout, m_.data(), absmax_m_.data());
    ops::quantize_layout(quant8_map(false), v.data(), layout, v_.data(), absmax_v_.data());
    gpu_.upload(gm_.ptr(), m_.data(), m_.size());
    gpu_.upload(gv_.ptr(), v_.data(), v_.size());
    gabsmax_m_.put(absmax_m_);
    gabsmax_v_.put(absmax_v_);
  }

  Quant8Moments gpu() const {
    return {.m = static_cast<uint8_t*>(gm_.ptr()), .v = static_cast<uint8_t*>(gv_.ptr()),
            .absmax_m = gabsmax_m_.f32(), .absmax_v = gabsmax_v_.f32(), .block = layout_.block};
  }
  Quant8Moments cpu() {
    return {.m = m_.data(), .v = v_.data(), .absmax_m = absmax_m_.data(),
            .absmax_v = absmax_v_.data(), .block = layout_.block};
  }
  // 0 when the GPU's codes and absmax are the CPU's bit for bit, else 1
  double error() const {
    std::vector<uint8_t> m(m_.size()), v(v_.size());
    gpu_.download(m.data(), gm_.ptr(), m.size());
    gpu_.download(v.data(), gv_.ptr(), v.size());
    const std::vector<float> absmax_m = gabsmax_m_.get(), absmax_v = gabsmax_v_.get();
    const bool same = m == m_ && v == v_ &&
                      std::memcmp(absmax_m.data(), absmax_m_.data(), 4 * absmax_m.size()) == 0 &&
                      std::memcmp(absmax_v.data(), absmax_v_.data(), 4 * absmax_v.size()) == 0;
    return same ? 0 : 1;
  }
  // What a step moves in them: every code read and written, every absmax read and written.
  double bytes() const { return 4.0 * double(n_) + 16.0 * double(blocks_); }

 private:
  Backend& gpu_;
  Quant8Layout layout_;
  int64_t n_, blocks_;
  std::vector<uint8_t> m_, v_;           // the CPU's copy
  std::vector<float> absmax_m_, absmax_v_;
  Buffer gm_, gv_, gabsmax_m_, gabsmax_v_;
};

// r distinct indices in [0, bound), sorted: an 8-bit GRASS step's σ (each weight element then
// has one state element), from the lab's random stream.
std::vector<int32_t> distinct_sorted(Lab& lab, int r, int bound) {
  const std::vector<float> keys = lab.uniform(bound, 0, 1, 4);
  std::vector<int32_t> order(static_cast<size_t>(bound));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return keys[size_t(a)] < keys[size_t(b)] || (keys[size_t(a)] == keys[size_t(b)] && a < b);
  });
  order.resize(size_t(r));
  std::sort(order.begin(), order.end());
  return order;
}

// The GPU's gc or R [r, in] or [out, r] against the CPU's slices J of it (want_J [J, in] or
// [out, J]): the error over those slices.
double slice_error(const std::vector<float>& got, const std::vector<float>& want_J,
                   const std::vector<int64_t>& J, bool rows, int64_t in, int64_t r) {
  const int64_t width = rows ? in : r, slice = rows ? in : int64_t(got.size()) / r;
  const std::vector<float> want = slices(want_J, rows, rows ? in : int64_t(J.size()),
                                         row_range(0, int64_t(J.size())));
  return worst({max_row_error(slices(got, rows, width, J), want, slice), nonfinite(got)});
}

// q+k+v and gate+up formed together: bench_grass's last rows (below).
void bench_grass_stacks(Lab& lab, const Model& m);

}  // namespace

// ---- AdamW --------------------------------------------------------------------------------------
// One AdamW step on n = V·C elements (the embedding's size: the largest tensor AdamW trains in a
// GRASS run), viewed as [V, C]. Bytes: reads g (n·G), reads and writes m and v (4·n·S) and the
// weights (n·weight_update_bytes).
//   --state-dtype q8: adamw_update_q8 on n = C·C (a square projection's size: 2048² at 1B) and
//   n = V·C, flat blocks of --state-block. Bytes: n·(G + upd) + 4·n (each code read and written)
//   + 16 per block (each absmax read and written).
void bench_adamw_q8(Lab& lab, const Model& m) {
  Backend &gpu = lab.gpu, &cpu = lab.cpu;
  const Storage& s = gpu.storage();
  const int C = m.C();
  for (const auto& [rows, what] : {std::pair{C, "C x C"}, std::pair{m.V(), "V x C"}}) {
    const int64_t n = int64_t(rows) * C;
    UpdateTensors u(lab, rows, C, 0, 0);
    Q8State q(lab, {.rows = rows, .cols = C, .block = lab.options.state_block});  // flat blocks
    const std::vector<float> g = lab.uniform(n, -1, 1, s.grad_bytes);
    Buffer gg(gpu, g, s.grad_bytes);
    const AdamArgs a = adam_args();
    auto step = [&] { gpu.adamw_update_q8(u.gpu_weight(), gg.ptr(), q.gpu(), n, a, kSeed); };
    step();
    cpu.adamw_update_q8(u.cpu_weight(), g.data(), q.cpu(), n, a, kSeed);
    const double err = worst({u.weight_error(/*by_columns=*/false), q.error()});
    lab.report(m, {.op = "adamw_update_q8",
                   .shape = dims({{"n", n}}) + " (" + what + "), blocks of " +
                            std::to_string(lab.options.state_block),
                   .ms = lab.time_ms(step),
                   .bytes = double(n) * (s.grad_bytes + weight_update_bytes(s)) + q.bytes(),
                   .err = err, .tol = s.pure_bf16() ? kTolUpdateBf16 : kTolUpdateF32});
  }
}

void bench_adamw(Lab& lab, const Model& m) {
  if (lab.options.q8) return bench_adamw_q8(lab, m);
  Backend &gpu = lab.gpu, &cpu = lab.cpu;
  const Storage& s = gpu.storage();
  const int V = m.V(), C = m.C();
  const int64_t n = int64_t(V) * C;
  UpdateTensors u(lab, V, C, V, C);
  const std::vector<float> g = lab.uniform(n, -1, 1, s.grad_bytes);  // [V, C]
  Buffer gg(gpu, g, s.grad_bytes);
  const AdamArgs a = adam_args();
  auto step = [&] {
    gpu.adamw_update(u.gpu_weight(), gg.ptr(), u.gpu_m(), u.gpu_v(), n, a, kSeed);
  };
  step();
  cpu.adamw_update(u.cpu_weight(), g.data(), u.cpu_m(), u.cpu_v(), n, a, kSeed);
  const double err = u.error(/*by_columns=*/false);
  lab.report(m, {.op = "adamw_update", .shape = dims({{"n", n}}) + " (V x C)",
                 .ms = lab.time_ms(step),
                 .bytes = double(n) * (s.grad_bytes + 4 * s.state_bytes + weight_update_bytes(s)),
                 .err = err, .tol = s.pure_bf16() ? kTolUpdateBf16 : kTolUpdateF32});
}

// ---- sum of squares -----------------------------------------------------------------------------
// Σ g² over n = V·C gradient elements, deterministic, added to an fp64 of backend memory: the
// global norm that clipping needs. Bytes: reads g once (n·G).
void bench_sum_squares(Lab& lab, const Model& m) {
  Backend &gpu = lab.gpu, &cpu = lab.cpu;
  const int G = gpu.storage().grad_bytes;
  const int64_t n = int64_t(m.V()) * m.C();
  const std::vector<float> g = lab.uniform(n, -1, 1, G);  // [n]
  Buffer gg(gpu, g, G), gsum(gpu, 1, 8);
  auto op = [&] { gpu.sum_squares(static_cast<double*>(gsum.ptr()), gg.ptr(), n); };
  gpu.zero(gsum.ptr(), sizeof(double));
  op();
  double sum = 0, want = 0;
  gpu.download(&sum, gsum.ptr(), sizeof sum);
  cpu.sum_squares(&want, g.data(), n);
  const double err = scalar_error(sum, want);
  lab.report(m, {.op = "sum_squares", .shape = dims({{"n", n}}) + " (V x C)",
                 .ms = lab.time_ms(op), .bytes = double(n) * G, .err = err, .tol = kTolReduce});
}

// ---- GRASS --------------------------------------------------------------------------------------
// A GRASS layer w[out, in] trains r slices σ: rows (σ ⊂ [out]) or columns (σ ⊂ [in]), as the
// engine chooses (ProjectionConfig::selects_rows: the shorter side, rows when square); σ drawn with
// replacement and sorted, as the multinomial rule draws it.
//   grass_compressed_grad: gc += ρ ⊙ dy[:, σ]ᵀ·x [r, in] (rows) or dyᵀ·(x[:, σ] ⊙ ρ) [out, r]
//     (columns), straight from the activations. FLOPs: 2·N·r·in or 2·N·out·r. The CPU reference
//     computes sampled slices j (its op on σ_j, ρ_j alone).
//   grass_adam_update: Adam on gc and the update of the selected slices of w. Bytes over the
//     E = r·in or out·r elements: reads gc (E·G), reads and writes m and v (4·E·S) and the slices
//     of the weights (E·weight_update_bytes).
//   --state-dtype q8: grass_adam_update_q8 instead, σ distinct (its requirement), the states
//   blocked per feature. Bytes: E·(G + upd) + 4·E + 16 per block (codes and absmax, as AdamW's).
void bench_grass_adam_q8(Lab& lab, const Model& m, const LinearShape& l, bool rows,
                         const std::string& shape, const std::vector<float>& gc,
                         const std::vector<float>& scale) {
  Backend &gpu = lab.gpu, &cpu = lab.cpu;
  const Storage& s = gpu.storage();
  const int r = m.rank;
  const int64_t E = int64_t(gc.size());
  const std::vector<int32_t> sigma = distinct_sorted(lab, r, rows ? l.out : l.in);
  Buffer gsigma(gpu, sigma), gscale(gpu, scale, 4), ggc(gpu, gc, s.grad_bytes);
  const GrassSlices gpu_slices{gsigma.i32(), gscale.f32(), l.out, l.in, r, rows};
  const GrassSlices cpu_slices{sigma.data(), scale.data(), l.out, l.in, r, rows};
  UpdateTensors u(lab, l.out, l.in, 0, 0);
  Q8State q(lab, projected_quant8_layout(l.out, l.in, r, rows, lab.options.state_block, true));
  const AdamArgs a = adam_args();
  auto step = [&] {
    gpu.grass_adam_update_q8(u.gpu_weight(), ggc.ptr(), q.gpu(), true, gpu_slices, 1.0, a, kSeed);
  };
  step();
  cpu.grass_adam_update_q8(u.cpu_weight(), gc.data(), q.cpu(), true, cpu_slices, 1.0, a, kSeed);
  const double err = worst({u.weight_error(/*by_columns=*/!rows), q.error()});
  lab.report(m, {.op = "grass_adam_update_q8", .shape = shape, .ms = lab.time_ms(step),
                 .bytes = double(E) * (s.grad_bytes + weight_update_bytes(s)) + q.bytes(),
                 .err = err, .tol = s.pure_bf16() ? kTolUpdateBf16 : kTolUpdateF32});
}

void bench_grass(Lab& lab, const Model& m) {
  Backend &gpu = lab.gpu, &cpu = lab.cpu;
  const Storage& s = gpu.storage();
  const int64_t N = m.N();
  const int r = m.rank;
  for (const LinearShape& l : linear_shapes(m, /*model_gemms=*/false)) {
    const bool rows = ProjectionConfig{}.selects_rows(l.out, l.in);
    const int side = rows ? l.out : l.in, other = rows ? l.in : l.out;
    const int64_t E = int64_t(r) * other;  // gc [r, in] or [out, r]
    const std::string shape = dims({{"N", N}, {"in", l.in}, {"out", l.out}, {"r", r}}) +
                              (rows ? " rows " : " cols ") + l.layers;
    const std::vector<int32_t> sigma = lab.integers(r, side, /*sorted=*/true);  // [r]
    const std::vector<float> rho = lab.uniform(r, 0.5, 1.5, 4);                  // [r]
    const std::vector<float> x = lab.uniform(N * l.in, -1, 1, s.act_bytes);      // [N, in]
    const std::vector<float> dy = lab.uniform(N * l.out, -1, 1, s.act_bytes);    // [N, out]
    const std::vector<float> gc0 = lab.uniform(E, -1, 1, s.grad_bytes);          // gc's start
    Buffer gsigma(gpu, sigma), grho(gpu, rho, 4), gx(gpu, x, s.act_bytes),
        gdy(gpu, dy, s.act_bytes), ggc(gpu, gc0, s.grad_bytes), gscratch(gpu, N * r, s.act_bytes);

    auto compress = [&] {
      gpu.grass_compressed_grad(ggc.ptr(), gscratch.ptr(), gdy.ptr(), gx.ptr(), gsigma.i32(),
                                grho.f32(), N, l.in, l.out, r, rows);
    };
    compress();
    const std::vector<int64_t> J = lab.sample_rows(r);
    const int rJ = int(J.size());
    std::vector<int32_t> sigma_J;
    std::vector<float> rho_J, scratch_J(size_t(N) * rJ);
    for (const int64_t j : J) {
      sigma_J.push_back(sigma[size_t(j)]);
      rho_J.push_back(rho[size_t(j)]);
    }
    std::vector<float> gc_J = rows ? rows_of(gc0, l.in, J) : cols_of(gc0, r, J);
    cpu.grass_compressed_grad(gc_J.data(), scratch_J.data(), dy.data(), x.data(), sigma_J.data(),
                              rho_J.data(), N, l.in, l.out, rJ, rows);
    const double compress_err = slice_error(ggc.get(), gc_J, J, rows, l.in, r);
    lab.report(m, {.op = "grass_compressed_grad", .shape = shape, .ms = lab.time_ms(compress),
                   .flops = 2.0 * double(N) * r * other, .err = compress_err, .tol = kTolBf16});

    const std::vector<float> gc = lab.uniform(E, -1, 1, s.grad_bytes);
    const std::vector<float> scale = lab.uniform(r, 0.5, 1.5, 4);  // [r]: each slice's step factor
    if (lab.options.q8) {
      bench_grass_adam_q8(lab, m, l, rows, shape, gc, scale);
      continue;
    }
    Buffer gupdate_gc(gpu, gc, s.grad_bytes), gscale(gpu, scale, 4);
    const AdamArgs a = adam_args();
    UpdateTensors u(lab, l.out, l.in, rows ? r : l.out, rows ? l.in : r);
    const GrassSlices gpu_slices{gsigma.i32(), gscale.f32(), l.out, l.in, r, rows};
    const GrassSlices cpu_slices{sigma.data(), scale.data(), l.out, l.in, r, rows};
    auto step = [&] {
      gpu.grass_adam_update(u.gpu_weight(), gupdate_gc.ptr(), u.gpu_m(), u.gpu_v(), gpu_slices,
                            1.0, a, kSeed);
    };
    step();
    std::vector<float> cpu_gc = gc;  // the update may overwrite it
    cpu.grass_adam_update(u.cpu_weight(), cpu_gc.data(), u.cpu_m(), u.cpu_v(), cpu_slices, 1.0, a,
                          kSeed);
    const double update_err = u.error(/*by_columns=*/!rows);
    lab.report(m, {.op = "grass_adam_update", .shape = shape, .ms = lab.time_ms(step),
                   .bytes = double(E) * (s.grad_bytes + 4 * s.state_bytes + weight_update_bytes(s)),
                   .err = update_err, .tol = s.pure_bf16() ? kTolUpdateBf16 : kTolUpdateF32});
  }
  bench_grass_stacks(lab, m);
}

// ---- GRASS stacks --------------------------------------------------------------------------------
// The targets the engine forms together (Grass::accumulate_stack), from the packed dy the backward
// leaves for them: q+k+v, and gate+up at the width the GPU stores (pad_ffn). Rows: one gather of
// every target's r selected columns (σ offset into the packed dy) and one GEMM [count·r, N]·[N, in]
// into their adjacent G_C; columns: each target's gather and GEMM [out, N]·[N, r], its dy read in
// place. FLOPs: the targets' sum, so the row's rate compares with the per-target rows above. The
// CPU reference: each target's own op on sampled slices.
namespace {
void bench_grass_stacks(Lab& lab, const Model& m) {
  Backend &gpu = lab.gpu, &cpu = lab.cpu;
  const Storage& s = gpu.storage();
  const int64_t N = m.N();
  const int r = m.rank, C = m.C();
  const int F = m.F(), padded = (F + kFfnRowMultiple - 1) / kFfnRowMultiple * kFfnRowMultiple;
  struct Stack {
    std::string name;
    std::vector<int> out;
  };
  const int qd = m.config.linear_shape(ProjectionTarget::Q).first;
  const int kvd = m.config.linear_shape(ProjectionTarget::K).first;
  for (const Stack& stack : {Stack{"q+k+v", {qd, kvd, kvd}},
                             Stack{F == padded ? "gate+up" : "gate+up(padded)", {padded, padded}}}) {
    const int count = int(stack.out.size());
    const bool rows = ProjectionConfig{}.selects_rows(stack.out[0], C);
    int width = 0;  // of the packed dy
    for (const int out : stack.out) width += out;
    std::vector<int64_t> gc_offset;  // each target's G_C in the stack's, r slices of room
    int64_t gc_numel = 0;
    for (const int out : stack.out) {
      gc_offset.push_back(gc_numel);
      gc_numel += int64_t(r) * (rows ? C : out);
    }
    const std::string shape = dims({{"N", N}, {"in", C}, {"out", width}, {"r", r}}) +
                              (rows ? " rows " : " cols ") + stack.name;
    std::vector<std::vector<int32_t>> sigma;
    std::vector<std::vector<float>> rho;
    std::vector<int32_t> stack_sigma;  // rows: σ offset into the packed dy, as the engine's
    std::vector<float> stack_rho;
    for (int t = 0, offset = 0; t < count; offset += stack.out[size_t(t)], t++) {
      sigma.push_back(lab.integers(r, rows ? stack.out[size_t(t)] : C, /*sorted=*/true));
      rho.push_back(lab.uniform(r, 0.5, 1.5, 4));
      for (int j = 0; j < r; j++) {
        stack_sigma.push_back(offset + sigma.back()[size_t(j)]);
        stack_rho.push_back(rho.back()[size_t(j)]);
      }
    }
    const std::vector<float> x = lab.uniform(N * C, -1, 1, s.act_bytes);       // [N, C]
    const std::vector<float> dy = lab.uniform(N * width, -1, 1, s.act_bytes);  // packed [N, Σ out]
    const std::vector<float> gc0 = lab.uniform(gc_numel, -1, 1, s.grad_bytes);
    Buffer gx(gpu, x, s.act_bytes), gdy(gpu, dy, s.act_bytes), ggc(gpu, gc0, s.grad_bytes),
        gscratch(gpu, N * r * (rows ? count : 1), s.act_bytes), gsigma(gpu, stack_sigma),
        grho(gpu, stack_rho, 4);
    std::vector<std::unique_ptr<Buffer>> target_sigma, target_rho;
    for (int t = 0; t < count; t++) {
      target_sigma.push_back(std::make_unique<Buffer>(gpu, sigma[size_t(t)]));
      target_rho.push_back(std::make_unique<Buffer>(gpu, rho[size_t(t)], 4));
    }
    const auto at = [](const Buffer& b, int64_t elements, int bytes) {
      return static_cast<char*>(b.ptr()) + elements * bytes;
    };
    auto compress = [&] {
      if (rows) {
        gpu.grass_compressed_grad(ggc.ptr(), gscratch.ptr(), gdy.ptr(), gx.ptr(), gsigma.i32(),
                                  grho.f32(), N, C, width, count * r, true);
        return;
      }
      for (int t = 0, offset = 0; t < count; offset += stack.out[size_t(t)], t++) {
        gpu.grass_gather_columns(gscratch.ptr(), gx.ptr(), target_sigma[size_t(t)]->i32(),
                                 target_rho[size_t(t)]->f32(), N, C, r);
        gpu.grass_selected_cols_grad(at(ggc, gc_offset[size_t(t)], s.grad_bytes),
                                     at(gdy, offset, s.act_bytes), width, gscratch.ptr(), N,
                                     stack.out[size_t(t)], r);
      }
    };
    compress();
    const std::vector<float> got = ggc.get();
    const std::vector<int64_t> J = lab.sample_rows(r);
    double err = 0;
    for (int t = 0, offset = 0; t < count; offset += stack.out[size_t(t)], t++) {
      const int out = stack.out[size_t(t)];
      std::vector<float> dy_t(size_t(N) * out);  // the target's own dy, as the per-target path
      for (int64_t n = 0; n < N; n++)
        std::copy_n(&dy[size_t(n * width + offset)], out, &dy_t[size_t(n * out)]);
      std::vector<int32_t> sigma_J;
      std::vector<float> rho_J, scratch_J(size_t(N) * J.size());
      for (const int64_t j : J) {
        sigma_J.push_back(sigma[size_t(t)][size_t(j)]);
        rho_J.push_back(rho[size_t(t)][size_t(j)]);
      }
      const int64_t numel = int64_t(r) * (rows ? C : out);
      const std::vector<float> gc0_t(gc0.begin() + gc_offset[size_t(t)],
                                     gc0.begin() + gc_offset[size_t(t)] + numel);
      const std::vector<float> got_t(got.begin() + gc_offset[size_t(t)],
                                     got.begin() + gc_offset[size_t(t)] + numel);
      std::vector<float> gc_J = rows ? rows_of(gc0_t, C, J) : cols_of(gc0_t, r, J);
      cpu.grass_compressed_grad(gc_J.data(), scratch_J.data(), dy_t.data(), x.data(),
                                sigma_J.data(), rho_J.data(), N, C, out, int(J.size()), rows);
      err = worst({err, slice_error(got_t, gc_J, J, rows, C, r)});
    }
    lab.report(m, {.op = "grass_compressed_grad", .shape = shape, .ms = lab.time_ms(compress),
                   .flops = 2.0 * double(N) * r * (rows ? double(count) * C : double(width)),
                   .err = err, .tol = kTolBf16});
  }
}
}  // namespace

// ---- GaLore and FLORA ---------------------------------------------------------------------------
// A low-rank layer w[out, in] trains through a projection P[side, r] (fp32) of its gradient onto r
// dimensions of one side: rows when out < in (side = out), else columns, as src/optim/lowrank.cpp
// chooses.
//   lowrank_compressed_grad: R += Pᵀ·(dyᵀ·x) [r, in] (rows) or (dyᵀ·x)·P [out, r] (columns),
//     straight from the activations. FLOPs: 2·N·r·(out + in). The CPU reference computes sampled
//     columns j of P (R's rows j, or its columns j).
//   lowrank_adam_update: Adam on R and the dense update of w through the back-projection (a GEMM of
//     2·out·in·r FLOPs, yet memory-bound: 2·r FLOPs per weight element of >= 4 bytes, under an
//     H100's ~295 FLOPs per byte at every rank here). Bytes: reads R (E·G), reads and writes m and
//     v (4·E·S) for E = r·in or out·r, and every weight (out·in·weight_update_bytes).
//   --state-dtype q8: lowrank_adam_update_q8 instead, the states blocked per feature; m and v
//     move 4·E bytes and 16 per block (codes and absmax, as AdamW's).
void bench_lowrank(Lab& lab, const Model& m) {
  Backend &gpu = lab.gpu, &cpu = lab.cpu;
  const Storage& s = gpu.storage();
  const int64_t N = m.N();
  const int r = m.rank;
  for (const LinearShape& l : linear_shapes(m, /*model_gemms=*/false)) {
    const bool rows = l.out < l.in;
    const int side = rows ? l.out : l.in, other = rows ? l.in : l.out;
    const int64_t E = int64_t(r) * other;  // R [r, in] or [out, r]
    const std::string shape = dims({{"N", N}, {"in", l.in}, {"out", l.out}, {"r", r}}) +
                              (rows ? " rows " : " cols ") + l.layers;
    const double p = std::sqrt(3.0 / r);  // P's entries of variance 1/r, as FLORA's
    const std::vector<float> P = lab.uniform(int64_t(side) * r, -p, p, 4);     // [side, r]
    const std::vector<float> x = lab.uniform(N * l.in, -1, 1, s.act_bytes);    // [N, in]
    const std::vector<float> dy = lab.uniform(N * l.out, -1, 1, s.act_bytes);  // [N, out]
    const std::vector<float> R0 = lab.uniform(E, -1, 1, s.grad_bytes);         // R's start
    Buffer gP(gpu, P, 4), gx(gpu, x, s.act_bytes), gdy(gpu, dy, s.act_bytes),
        gR(gpu, R0, s.grad_bytes), gscratch(gpu, N * r, s.act_bytes),
        gworkspace(gpu, lowrank_workspace_bytes(s, l.out, l.in, r), 1);
    const LowRankProjection gpu_p{gP.f32(), l.out, l.in, r, rows};

    auto compress = [&] {
      gpu.lowrank_compressed_grad(gR.ptr(), gscratch.ptr(), gworkspace.ptr(), gdy.ptr(), gx.ptr(),
                                  N, gpu_p);
    };
    compress();
    const std::vector<int64_t> J = lab.sample_rows(r);
    const int rJ = int(J.size());
    const std::vector<float> P_J = cols_of(P, r, J);  // [side, rJ]
    std::vector<float> R_J = rows ? rows_of(R0, l.in, J) : cols_of(R0, r, J);
    std::vector<float> scratch_J(size_t(N) * rJ);
    cpu.lowrank_compressed_grad(R_J.data(), scratch_J.data(), nullptr, dy.data(), x.data(), N,
                                {P_J.data(), l.out, l.in, rJ, rows});
    const double compress_err = slice_error(gR.get(), R_J, J, rows, l.in, r);
    lab.report(m, {.op = "lowrank_compressed_grad", .shape = shape, .ms = lab.time_ms(compress),
                   .flops = 2.0 * double(N) * r * (l.out + l.in), .err = compress_err,
                   .tol = kTolBf16});

    const std::vector<float> R = lab.uniform(E, -1, 1, s.grad_bytes);
    Buffer gupdate_R(gpu, R, s.grad_bytes);
    const AdamArgs a = adam_args();
    std::vector<float> cpu_R = R;  // overwritten with the Adam direction
    if (lab.options.q8) {
      UpdateTensors u(lab, l.out, l.in, 0, 0);
      Q8State q(lab, projected_quant8_layout(l.out, l.in, r, rows, lab.options.state_block, true));
      auto step = [&] {
        gpu.lowrank_adam_update_q8(u.gpu_weight(), gupdate_R.ptr(), q.gpu(), true,
                                   gworkspace.ptr(), gpu_p, 1.0, 0.0, a, kSeed);
      };
      step();
      cpu.lowrank_adam_update_q8(u.cpu_weight(), cpu_R.data(), q.cpu(), true, nullptr,
                                 {P.data(), l.out, l.in, r, rows}, 1.0, 0.0, a, kSeed);
      const double err = worst({u.weight_error(/*by_columns=*/!rows), q.error()});
      lab.report(m, {.op = "lowrank_adam_update_q8", .shape = shape, .ms = lab.time_ms(step),
                     .bytes = double(E) * s.grad_bytes + q.bytes() +
                              double(l.out) * l.in * weight_update_bytes(s),
                     .err = err, .tol = kTolLowRankUpdate});
      continue;
    }
    UpdateTensors u(lab, l.out, l.in, rows ? r : l.out, rows ? l.in : r);
    auto step = [&] {
      gpu.lowrank_adam_update(u.gpu_weight(), gupdate_R.ptr(), u.gpu_m(), u.gpu_v(),
                              gworkspace.ptr(), gpu_p, 1.0, 0.0, a, kSeed);
    };
    step();
    cpu.lowrank_adam_update(u.cpu_weight(), cpu_R.data(), u.cpu_m(), u.cpu_v(), nullptr,
                            {P.data(), l.out, l.in, r, rows}, 1.0, 0.0, a, kSeed);
    const double update_err = u.error(/*by_columns=*/!rows);
    const double bytes = double(E) * (s.grad_bytes + 4 * s.state_bytes) +
                         double(l.out) * l.in * weight_update_bytes(s);
    lab.report(m, {.op = "lowrank_adam_update", .shape = shape, .ms = lab.time_ms(step),
                   .bytes = bytes, .err = update_err, .tol = kTolLowRankUpdate});
  }
}

}  // namespace grass::lab
