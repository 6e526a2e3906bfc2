// The CPU backend: the reference ops of kernels/ops.h on fp32 host memory. In the bf16 precisions
// it rounds what the GPU stores in bf16 (kernels/storage.h): the weights after every write, pure
// bf16's gradients, G_C and optimizer moments (stochastically for what the optimizer stores).
// Activations stay fp32.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/clip_rule.h"
#include "kernels/cpu/blas_kernels.h"
#include "kernels/cpu/copy_queue.h"
#include "kernels/lowrank_ops.h"
#include "kernels/ops.h"
#include "kernels/stochastic_round.h"
#include "src/core/error.h"
#include "src/dist/communicator.h"

namespace grass {

namespace {

float* f(void* p) { return static_cast<float*>(p); }
const float* f(const void* p) { return static_cast<const float*>(p); }
QkvRows<const float*> floats(QkvRows<const void*> r) {
  return {f(r.q), f(r.k), f(r.v), r.ldq, r.ldk, r.ldv};
}

class CpuBackend final : public Backend {
 public:
  // planning: only for a planning arena, which sizes buffers and runs no op; then the storage
  // may be another backend's (the GPU's, for `grass mem` on a machine without one).
  CpuBackend(const Storage& storage, bool planning) : Backend(storage) {
    GRASS_CHECK(planning || !storage.cuda, "the CPU backend got a CUDA storage plan");
  }

  std::string describe() const override {
    return "cpu, " + std::to_string(omp_get_max_threads()) + " threads (" + storage_.describe() +
           ", OpenMP + OpenBLAS, " + describe_openblas_kernels() + " kernels)";
  }

  double peak_flops() const override { return 0; }  // no agreed CPU peak: MFU is a GPU figure
  DeviceMemory device_memory() const override { return {}; }
  void synchronize() override { copies_.drain(); }
  // The CPU's memory is the host's: the ranks' own communicator sums it.
  std::unique_ptr<Communicator> communicator_for(Communicator&) override { return nullptr; }

  // ---- memory ---------------------------------------------------------------------------------
  void* allocate_zeroed(size_t bytes) override { return host_memory().allocate_zeroed(bytes); }
  void deallocate(void* ptr) override { host_memory().deallocate(ptr); }
  const char* memory_name() const override { return "host memory"; }
  void reserve(int64_t, int64_t) override {}
  void upload(void* dst, const void* host, size_t bytes) override {
    copies_.drain();
    std::memcpy(dst, host, bytes);
  }
  void download(void* host, const void* src, size_t bytes) override {
    copies_.drain();
    std::memcpy(host, src, bytes);
  }
  void upload_async(void* dst, const void* host, size_t bytes) override {
    std::memcpy(dst, host, bytes);
  }
  int64_t host_waits() const override { return 0; }
  void zero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  MemoryResource& host_tier() override { return host_tier_; }
  void copy_async(void* dst, const void* src, size_t bytes, Copy direction) override {
    copies_.copy(int(direction), dst, src, bytes);
  }
  void copy_queue_task(Copy queue, std::function<void()> task, const void* reads,
                       size_t read_bytes) override {
    copies_.task(int(queue), std::move(task), reads, read_bytes);
  }
  CopyMark mark_copies(Copy queue) override { return {queue, copies_.mark(int(queue))}; }
  void wait_copies(CopyMark mark) override { copies_.wait(int(mark.queue), mark.n); }
  void order_copy_after(CopyMark mark) override {
    const int other = mark.queue == Copy::ToDevice ? int(Copy::ToHost) : int(Copy::ToDevice);
    copies_.after(other, int(mark.queue), mark.n);
  }
  CopyTotals copy_totals() override { return {copies_.bytes_done(), copies_.seconds_busy()}; }
  int copy_engines() const override { return 2; }  // the copy threads, one per queue
  // Lazy copies poison what is unwritten too, as the GPU's GRASS_POISON does.
  void mark_unwritten(void* ptr, size_t bytes) override {
    if (copies_.lazy()) std::memset(ptr, 0xFF, bytes);
  }
  void write_weights(void* weights, float* master, int64_t first, const float* host,
                     int64_t n) override {
    float* w = f(weights) + first;
    if (w != host) std::memcpy(w, host, size_t(n) * sizeof(float));  // host may be the weights
    if (master) std::memcpy(master + first, host, size_t(n) * sizeof(float));
    if (storage_.bf16_weights()) ops::round_to_bf16(w, n);
  }
  void read_weights(float* host, const void* weights, int64_t first, int64_t n) override {
    std::memcpy(host, f(weights) + first, size_t(n) * sizeof(float));
  }
  void read_grads(float* host, const void* grads, int64_t first, int64_t n) override {
    std::memcpy(host, f(grads) + first, size_t(n) * sizeof(float));
  }
  void use_scratch(const ScratchLease* lease) override {
    const BackendScratch sizes =
        lease ? backend_scratch(storage_, lease->shape()) : BackendScratch{};
    attention_scratch_ = lease ? f(lease->scratch().attention) : nullptr;
    attention_scratch_floats_ = sizes.attention_bytes / 4;
  }

  // ---- model ops ------------------------------------------------------------------------------
  void linear_forward(void* y, const void* x, const void* w, int64_t N, int in, int out) override {
    ops::linear_forward(f(y), f(x), f(w), N, in, out);
  }
  void linear_residual_forward(void* y, const void* x, const void* w, const void* r, int64_t N,
                               int in, int out) override {
    ops::linear_residual_forward(f(y), f(x), f(w), f(r), N, in, out);
  }
  void linear_backward(void* dx, void* dw, const void* dy, const void* x, const void* w, int64_t N,
                       int in, int out, bool accumulate_dx) override {
    ops::linear_backward(f(dx), f(dw), f(dy), f(x), f(w), N, in, out, accumulate_dx);
  }
  void embedding_forward(void* out, const int32_t* tokens, const void* table, int64_t N,
                         int C) override {
    ops::embedding_forward(f(out), tokens, f(table), N, C);
  }
  void embedding_backward(void* dtable, const void* dout, const int32_t* tokens, const int32_t*,
                          int64_t N, int C) override {
    ops::embedding_backward(f(dtable), f(dout), tokens, N, C);
  }
  void rmsnorm_forward(void* out, float* rstd, const void* x, const void* w, int64_t N, int C,
                       double eps) override {
    ops::rmsnorm_forward(f(out), rstd, f(x), f(w), N, C, eps);
  }
  void rmsnorm_backward(void* dx, void* dw, const void* dout, const void* x, const void* w,
                        const float* rstd, int64_t N, int C) override {
    ops::rmsnorm_backward(f(dx), f(dw), f(dout), f(x), f(w), rstd, N, C);
  }
  // RoPE on q and k in place, then attention; the backward rotates dq and dk back in place.
  void attention_forward(void* out, void* saved, QkvRows<void*> qkv, int B, int T, int NH,
                         int NKV, int HD, double theta) override {
    ops::rope_forward(f(qkv.q), f(qkv.q), B, T, NH, HD, theta, qkv.ldq, qkv.ldq);
    ops::rope_forward(f(qkv.k), f(qkv.k), B, T, NKV, HD, theta, qkv.ldk, qkv.ldk);
    ops::attention_forward(f(out), f(saved), floats(read_only(qkv)), B, T, NH, NKV, HD);
  }
  void attention_backward(QkvRows<void*> d, const void* dout, const void*, const void* saved,
                          QkvRows<const void*> qkv, int B, int T, int NH, int NKV, int HD,
                          double theta) override {
    GRASS_CHECK(attention_scratch_ &&
                    int64_t(B) * NH * T * T <= attention_scratch_floats_,
                "attention_backward: the attention scratch is unbound or smaller than this batch "
                "(Backend::plan_scratch)");
    const QkvRows<float*> df{f(d.q), f(d.k), f(d.v), d.ldq, d.ldk, d.ldv};
    ops::attention_backward(df, attention_scratch_, f(dout), floats(qkv), f(saved), B, T, NH, NKV,
                            HD);
    ops::rope_backward(df.q, df.q, B, T, NH, HD, theta, df.ldq, df.ldq);
    ops::rope_backward(df.k, df.k, B, T, NKV, HD, theta, df.ldk, df.ldk);
  }
  void swiglu_forward(void* out, const void* gu, int64_t N, int F) override {
    ops::swiglu_forward(f(out), f(gu), N, F);
  }
  void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gu, int64_t N, int F,
                       int64_t ld) override {
    ops::swiglu_backward(f(dgate), f(dup), f(dout), f(gu), N, F, ld);
  }

  void gather_rows(void* out, const void* x, const int32_t* rows, const float* scale, int64_t k,
                   int D) override {
    ops::gather_rows(f(out), f(x), rows, scale, k, D);
  }
  void row_norms(float* norms, const void* x, int64_t N, int D) override {
    ops::row_norms(norms, f(x), N, D);
  }
  void draw_rows(int32_t* rows, float* scale, const float* norms, int64_t N, int k, bool winners,
                 uint64_t stream, void*) override {
    const std::vector<double> weight(norms, norms + N);
    ops::draw_rows(rows, scale, weight.data(), N, k, winners, stream);
  }
  void head_forward(void* logits, float* lse, double* loss, const void* nf, const void* w,
                    const int32_t* targets, int64_t N, int C, int V) override {
    ops::linear_forward(f(logits), f(nf), f(w), N, C, V);
    int64_t valid = 0;
    *loss = ops::cross_entropy_forward(lse, &valid, f(logits), targets, N, V);
  }
  void head_backward(void* dnf, void* dw, void* logits, float* lse, const void* nf,
                     const void* w, const int32_t* targets, int64_t N, int C, int V,
                     double dloss_scale) override {
    // the logits of head_forward become their gradient in place, then flow through lm_head
    ops::cross_entropy_backward(f(logits), f(logits), lse, targets, N, V, dloss_scale);
    ops::linear_backward(f(dnf), f(dw), f(logits), f(nf), f(w), N, C, V, false);
  }
  void head_forward_backward(void* dnf, void* dw, void* logits, float* lse, double* loss,
                             const void* nf, const void* w, const int32_t* targets, int64_t N,
                             int C, int V, double dloss_scale) override {
    head_forward(logits, lse, loss, nf, w, targets, N, C, V);  // the logits are computed once
    head_backward(dnf, dw, logits, lse, nf, w, targets, N, C, V, dloss_scale);
  }
  void store_gradients(void* grads, int64_t n) override {
    if (storage_.pure_bf16()) ops::round_to_bf16(f(grads), n);
  }

  // ---- optimizer ops --------------------------------------------------------------------------
  void sum_squares(double* acc, const void* grads, int64_t n) override {
    *acc += ops::sum_squares(f(grads), n);
  }
  void clip(ClipScalars* s, double max_norm) override { ops::clip(s, max_norm); }

  void adamw_update(WeightRef weight, const void* g, void* m, void* v, int64_t n,
                    const AdamArgs& a, uint64_t seed) override {
    float* w = weight.master ? weight.master : f(weight.weights);
    ops::adamw_update(w, f(g), f(m), f(v), n, a);
    if (weight.master) round_from_master(f(weight.weights), weight.master, n);
    if (storage_.pure_bf16()) stochastic_round(w, f(m), f(v), n, n, seed, a.step, a.first);
  }
  void adamw_update_q8(WeightRef weight, const void* g, const Quant8Moments& s, int64_t n,
                       const AdamArgs& a, uint64_t seed) override {
    float* w = weight.master ? weight.master : f(weight.weights);
    ops::adamw_update_q8(w, f(g), s, n, a);
    if (weight.master) round_from_master(f(weight.weights), weight.master, n);
    if (storage_.pure_bf16())
      ops::stochastic_round_to_bf16(w, n, rounding_stream_seed(seed, a.step, kRoundWeight),
                                    uint64_t(a.first));
  }

  void grass_compressed_grad(void* gc, void* scratch, const void* dy, const void* x,
                             const int32_t* sigma, const float* rho, int64_t N, int in, int out,
                             int r, bool rows) override {
    ops::grass_compressed_grad(f(gc), f(scratch), f(dy), f(x), sigma, rho, N, in, out, r, rows);
    if (storage_.pure_bf16()) ops::round_to_bf16(f(gc), int64_t(r) * (rows ? in : out));
  }
  void grass_gather_columns(void* xs, const void* x, const int32_t* sigma, const float* rho,
                            int64_t N, int width, int r) override {
    ops::grass_gather_columns(f(xs), f(x), sigma, rho, N, width, r);
  }
  void grass_selected_cols_grad(void* gc, const void* dy, int64_t ldy, const void* xs, int64_t N,
                                int out, int r) override {
    ops::grass_selected_cols_grad(f(gc), f(dy), ldy, f(xs), N, out, r);
    if (storage_.pure_bf16()) ops::round_to_bf16(f(gc), int64_t(r) * out);
  }
  void full_weight_grad(float* g, const void* dy, const void* x, int64_t N, int in, int out,
                        int row0, int rows) override {
    ops::linear_full_grad(g, f(dy), f(x), N, in, out, row0, rows);
  }
  void grass_slice_norms(const float* g, int row0, int rows, int in, bool by_rows) override {
    if (by_rows) {
      if (slice_norms_.size() < size_t(row0 + rows)) slice_norms_.resize(size_t(row0 + rows));
      ops::grass_slice_norms(slice_norms_.data() + row0, g, rows, in, true);
      return;
    }
    chunk_norms_.resize(size_t(in));
    ops::grass_slice_norms(chunk_norms_.data(), g, rows, in, false);
    if (row0 == 0) slice_norms_.assign(size_t(in), 0.0);
    for (int c = 0; c < in; c++) slice_norms_[size_t(c)] += chunk_norms_[size_t(c)];
  }
  void read_slice_norms(double* host, int n) override {
    std::copy(slice_norms_.begin(), slice_norms_.begin() + n, host);
  }
  void pack_slices(void* delta, const void* w, const int32_t* sigma, int count, int out, int in,
                   bool rows) override {
    ops::pack_slices(f(delta), f(w), sigma, count, out, in, rows);
  }
  void unpack_slices(void* w, const void* delta, const int32_t* sigma, int count, int out, int in,
                     bool rows) override {
    ops::unpack_slices(f(w), f(delta), sigma, count, out, in, rows);
  }
  void grass_adam_update(WeightRef weight, void* gc, void* m, void* v, const GrassSlices& s,
                         double alpha, const AdamArgs& a, uint64_t seed) override {
    float* const master = weight.master;
    float* w = master ? master : f(weight.weights);
    ops::grass_adam_update(w, f(gc), f(m), f(v), s.sigma, s.scale, s.out, s.in, s.r, s.rows, alpha,
                           a);
    const int64_t numel = int64_t(s.out) * s.in, gc_numel = int64_t(s.r) * (s.rows ? s.in : s.out);
    if (master) {  // re-round what changed: the selected rows, or (columns) every row
      if (s.rows)
        for (int j = 0; j < s.r; j++) {
          const int64_t first = int64_t(s.sigma[j]) * s.in;
          round_from_master(f(weight.weights) + first, master + first, s.in);
        }
      else
        round_from_master(f(weight.weights), master, numel);
    }
    // Stochastic rounding leaves a bf16 value as it is, so rounding the whole weight changes
    // only the selected slices.
    if (storage_.pure_bf16()) stochastic_round(w, f(m), f(v), numel, gc_numel, seed, a.step);
  }

  void grass_adam_update_q8(WeightRef weight, const void* gc, const Quant8Moments& q,
                            bool by_columns, const GrassSlices& s, double alpha, const AdamArgs& a,
                            uint64_t seed) override {
    float* const master = weight.master;
    float* w = master ? master : f(weight.weights);
    ops::grass_adam_update_q8(w, f(gc), q, by_columns, s.sigma, s.scale, s.out, s.in, s.r, s.rows,
                              alpha, a);
    const int64_t numel = int64_t(s.out) * s.in;
    if (master) round_from_master(f(weight.weights), master, numel);
    if (storage_.pure_bf16())  // leaves the bf16 values it did not change as they are
      ops::stochastic_round_to_bf16(w, numel, rounding_stream_seed(seed, a.step, kRoundWeight));
  }

  void lowrank_compressed_grad(void* R, void* scratch, void*, const void* dy, const void* x,
                               int64_t N, const LowRankProjection& p) override {
    ops::lowrank_compressed_grad(f(R), f(scratch), f(dy), f(x), p.P, N, p.in, p.out, p.r, p.rows);
    if (storage_.pure_bf16()) ops::round_to_bf16(f(R), int64_t(p.r) * (p.rows ? p.in : p.out));
  }
  void galore_basis(float* P, const float* g, int out, int in, int r, bool rows,
                    const GaloreBasisMethod& how, void* /*LAPACK allocates its own*/,
                    int* /*status: LAPACK's failures throw*/) override {
    if (how.randomized)
      ops::galore_basis_randomized(P, g, out, in, r, rows, how.seed, how.power_iters, how.oversample);
    else
      ops::galore_basis(P, g, out, in, r, rows);
  }
  void galore_sketch(const float* g, int out, int in, int r, bool rows, const GaloreBasisMethod& how,
                     void* batch, const GaloreBatchLayout& layout, int slot, void*,
                     int*) override {
    GRASS_CHECK(how.randomized, "galore_sketch: the exact SVD has no eigenproblem to batch");
    const int k = ops::galore_sketch_columns(out, in, r, how.oversample);
    const GaloreSlot at = galore_slot(batch, layout, slot, k);
    ops::galore_sketch(at.Q, at.S, g, out, in, r, rows, how.seed, how.power_iters, how.oversample);
  }
  // LAPACK has no batched eigensolver: syevd for each slot, in order
  void galore_finish(float* const* P, const int* sides, int count, int k, int r, void* batch,
                     const GaloreBatchLayout& layout, void*, int*) override {
    for (int i = 0; i < count; i++) {
      const GaloreSlot at = galore_slot(batch, layout, i, k);
      ops::galore_finish(P[i], at.Q, at.S, sides[i], k, r);
    }
  }
  void flora_projection(float* P, uint64_t seed, int64_t tensor, int64_t refresh, int side,
                        int r) override {
    ops::flora_projection(P, seed, tensor, refresh, side, r);
  }
  void flora_transfer(void* m, float* scratch, const float* P_old, const LowRankProjection& p,
                      uint64_t seed) override {
    ops::flora_transfer(f(m), scratch, P_old, p.P, p.out, p.in, p.r, p.rows);
    if (storage_.pure_bf16())
      ops::stochastic_round_to_bf16(f(m), int64_t(p.r) * (p.rows ? p.in : p.out),
                                    rounding_stream_seed(seed, 0, kRoundFirstMoment));
  }
  void flora_transfer_q8(const Quant8Moments& q, bool by_columns, float* scratch,
                         const float* P_old, const LowRankProjection& p) override {
    ops::flora_transfer_q8(q, by_columns, scratch, P_old, p.P, p.out, p.in, p.r, p.rows);
  }
  void lowrank_adam_update_q8(WeightRef weight, void* R, const Quant8Moments& q, bool by_columns,
                              void*, const LowRankProjection& p, double alpha, double max_rms,
                              const AdamArgs& a, uint64_t seed) override {
    float* w = weight.master ? weight.master : f(weight.weights);
    ops::lowrank_adam_update_q8(w, f(R), q, by_columns, p.P, p.out, p.in, p.r, p.rows, alpha,
                                max_rms, a);
    const int64_t numel = int64_t(p.out) * p.in;
    if (weight.master) round_from_master(f(weight.weights), weight.master, numel);
    if (storage_.pure_bf16())
      ops::stochastic_round_to_bf16(w, numel, rounding_stream_seed(seed, a.step, kRoundWeight));
  }
  void lowrank_adam_update(WeightRef weight, void* R, void* m, void* v, void*,
                           const LowRankProjection& p, double alpha, double max_rms,
                           const AdamArgs& a, uint64_t seed) override {
    float* w = weight.master ? weight.master : f(weight.weights);
    ops::lowrank_adam_update(w, f(R), f(m), f(v), p.P, p.out, p.in, p.r, p.rows, alpha, max_rms,
                             a);
    const int64_t numel = int64_t(p.out) * p.in, moments = int64_t(p.r) * (p.rows ? p.in : p.out);
    if (weight.master) round_from_master(f(weight.weights), weight.master, numel);
    if (storage_.pure_bf16()) stochastic_round(w, f(m), f(v), numel, moments, seed, a.step);
  }

 private:
  static void round_from_master(float* weights, const float* master, int64_t n) {
    std::memcpy(weights, master, size_t(n) * sizeof(float));
    ops::round_to_bf16(weights, n);
  }
  // pure bf16's stores: the weight and both moments, each with its own stream of this step and
  // the element's index in its buffer as the counter, as the CUDA kernels draw them
  // (counting from element `first`: AdamArgs::first)
  static void stochastic_round(float* w, float* m, float* v, int64_t n_weights, int64_t n_moments,
                               uint64_t seed, int64_t step, int64_t first = 0) {
    const uint64_t from = uint64_t(first);
    ops::stochastic_round_to_bf16(w, n_weights, rounding_stream_seed(seed, step, kRoundWeight), from);
    ops::stochastic_round_to_bf16(m, n_moments,
                                  rounding_stream_seed(seed, step, kRoundFirstMoment), from);
    ops::stochastic_round_to_bf16(v, n_moments,
                                  rounding_stream_seed(seed, step, kRoundSecondMoment), from);
  }

  // The host tier: host memory like the arena's, counted apart. A buffer goes back only after
  // the copies that may still touch it.
  class HostTier final : public MemoryResource {
   public:
    explicit HostTier(CopyQueues& copies) : copies_(copies) {}
    void* allocate_zeroed(size_t bytes) override { return host_memory().allocate_zeroed(bytes); }
    void deallocate(void* ptr) override {
      copies_.drain();
      host_memory().deallocate(ptr);
    }
    const char* memory_name() const override { return "host memory outside the arena"; }

   private:
    CopyQueues& copies_;
  };
  static bool lazy_copies() {
    const char* v = std::getenv("GRASS_LAZY_COPIES");
    return v && std::strcmp(v, "1") == 0;
  }

  CopyQueues copies_{lazy_copies()};
  HostTier host_tier_{copies_};
  float* attention_scratch_ = nullptr;  // [B,NH,T,T] dscores
  int64_t attention_scratch_floats_ = 0;
  std::vector<double> slice_norms_, chunk_norms_;  // grass_slice_norms' buffer and a chunk's
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Storage& storage) {
  return std::make_unique<CpuBackend>(storage, false);
}

std::unique_ptr<Backend> make_planning_backend(const Storage& storage) {
  return std::make_unique<CpuBackend>(storage, true);
}

Backend& default_cpu_backend() {
  static CpuBackend backend{Storage{}, false};
  return backend;
}

}  // namespace grass
