// The CUDA backend: the Backend interface (kernels/backend.h) on the kernels of cuda_ops.h.
// bf16 activations and weights; gradients and moments fp32 ("bf16-mixed") or bf16 ("bf16").
// Memory: one cudaMalloc of the planned size (reserve()), cut into the arena's named buffers.
// Every op runs on one stream. The host waits only where it needs a result: a training step
// reads its loss and gradient norm once at its end; the tokens it sends go through pinned staging
// (staging.cuh). host_waits() counts every wait.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/copy_stream.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/nccl_communicator.h"
#include "kernels/cuda/staging.cuh"
#include "kernels/lowrank_ops.h"
#include "src/core/error.h"
#include "src/core/format.h"

namespace grass {

namespace {

using cuda::bf16;
using cuda::GradType;

bf16* b(void* p) { return static_cast<bf16*>(p); }
const bf16* b(const void* p) { return static_cast<const bf16*>(p); }
QkvRows<const bf16*> bf16_rows(QkvRows<const void*> r) {
  return {b(r.q), b(r.k), b(r.v), r.ldq, r.ldk, r.ldv};
}
// act- or weight-typed pointer + elements
void* at(void* p, int64_t elements) { return static_cast<bf16*>(p) + elements; }
const void* at(const void* p, int64_t elements) { return static_cast<const bf16*>(p) + elements; }

constexpr size_t kAlign = 256;  // what cudaMalloc guarantees; vector loads and cuBLASLt like it
// Pinned memory for upload_async: a micro-batch's tokens, targets and embedding groups take
// 20 bytes a token (2.6 MB at 131,072 tokens), so the ring holds several micro-batches ahead.
constexpr size_t kStagingBytes = size_t(32) << 20;

// GRASS_SIDE_STREAM=0 runs side work (Backend::begin_side_work) on the compute stream, as
// before it had a stream of its own: for A/B timing, and for the tests that hold the side stream
// to it bit for bit.
bool side_stream_wanted() {
  const char* text = std::getenv("GRASS_SIDE_STREAM");
  if (!text || std::string(text) == "1") return true;
  if (std::string(text) == "0") return false;
  throw UserError(std::string("GRASS_SIDE_STREAM: \"") + text + "\" is neither 0 nor 1");
}

// GRASS_MMA_BACKWARD=a|b forces a path of `attention: "mma"`'s backward (attention_mma.cu) for
// A/B timing; unset, each shape takes path A where it can. Path A on a shape it does not take
// stops the run with one line before it writes anything.
cuda::MmaBackwardPath mma_backward_path() {
  const char* text = std::getenv("GRASS_MMA_BACKWARD");
  if (!text) return cuda::MmaBackwardPath::Auto;
  if (std::string(text) == "a") return cuda::MmaBackwardPath::A;
  if (std::string(text) == "b") return cuda::MmaBackwardPath::B;
  throw UserError(std::string("GRASS_MMA_BACKWARD: \"") + text + "\" is neither a nor b");
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Storage& storage, std::string gpu, int device, AttentionKernel attention,
              bool fall_back_to_grass)
      : Backend(storage),
        gpu_(std::move(gpu)),
        staging_(kStagingBytes),
        attention_(fall_back_to_grass ? AttentionKernel::Grass : attention),
        try_cudnn_(fall_back_to_grass && attention == AttentionKernel::Cudnn),
        mma_backward_(mma_backward_path()) {
    GRASS_CHECK(storage.cuda && storage.bf16_weights(),
                "the CUDA backend needs a bf16 CUDA storage plan");
    GRASS_CUDA_CHECK(cudaSetDevice(device));
    GRASS_CUDA_CHECK(cudaDeviceGetAttribute(&copy_engines_, cudaDevAttrAsyncEngineCount, device));
    // Everything that takes device memory outside the arena happens here, before reserve(), so
    // that the reservation is the run's last allocation: the stream, both cuBLAS handles, the
    // kernels' local memory pool (and the kernels, loaded eagerly: probe_device, cuda/device.h).
    GRASS_CUDA_CHECK(cudaStreamCreate(&ctx_.stream));
    copies_ = std::make_unique<cuda::CopyStreams>(ctx_.stream);
    GRASS_CUBLAS_CHECK(cublasLtCreate(&ctx_.lt));
    ctx_.blas = cuda::create_gemm_fallback_handle();
    if (attention_ == AttentionKernel::Cudnn) {
#ifdef GRASS_HAVE_CUDNN
      cudnn_ = cuda::make_cudnn_attention(ctx_.stream);  // its handle, before the reservation too
#else
      throw UserError("attention: \"cudnn\" but this grass was built without cuDNN's headers "
                      "(cudnn.h was not found at configure time; pass -DCUDNN_INCLUDE_DIR=...), "
                      "or use \"grass\"");
#endif
    }
    if (side_stream_wanted()) {
      GRASS_CUDA_CHECK(cudaStreamCreate(&side_));
      GRASS_CUDA_CHECK(cudaEventCreateWithFlags(&side_fork_, cudaEventDisableTiming));
      for (cudaEvent_t& e : side_marks_)
        GRASS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    local_pool_taken_ = cuda::take_local_memory_pool();
  }
  ~CudaBackend() override {
    if (side_) {
      cudaStreamSynchronize(side_);
      for (cudaEvent_t e : side_marks_) cudaEventDestroy(e);
      cudaEventDestroy(side_fork_);
      cudaStreamDestroy(side_);
    }
    cuda::destroy_solver_params(solver_params_);
    cuda::destroy_solver_handle(solver_);
    if (pool_) cudaFree(pool_);
    cublasDestroy(ctx_.blas);
    cublasLtDestroy(ctx_.lt);
    copies_.reset();
    cudaStreamDestroy(ctx_.stream);
  }

  std::string describe() const override {
    return "cuda, " + gpu_ + " (" + storage_.describe() + ")";
  }
  // Dense bf16 peaks (NVIDIA's datasheets): A100 312, H100 SXM and H200 989, H100 PCIe 756
  // TFLOP/s. Another GPU gets 0: MFU n/a rather than a guess.
  double peak_flops() const override {
    if (gpu_.find("H200") != std::string::npos) return 989e12;
    if (gpu_.find("H100") != std::string::npos)
      return gpu_.find("PCIe") != std::string::npos ? 756e12 : 989e12;
    if (gpu_.find("A100") != std::string::npos) return 312e12;
    return 0;
  }
  DeviceMemory device_memory() const override {
    size_t free_bytes = 0, total_bytes = 0;
    GRASS_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    size_t stack = 0;
    GRASS_CUDA_CHECK(cudaDeviceGetLimit(&stack, cudaLimitStackSize));
    return {int64_t(total_bytes - free_bytes), int64_t(total_bytes), int64_t(stack),
            local_pool_taken_};
  }
  void synchronize() override { sync(); }
  // Side work on side_, forked from the compute stream by an event; ctx_.stream names it while
  // the side ops are queued. Marks share a ring of events: joining a mark whose event was
  // recorded again since waits for a later mark, which is only stricter.
  void begin_side_work() override {
    if (!side_) return;
    GRASS_CHECK(!main_, "side work begun twice");
    GRASS_CUDA_CHECK(cudaEventRecord(side_fork_, ctx_.stream));
    GRASS_CUDA_CHECK(cudaStreamWaitEvent(side_, side_fork_, 0));
    main_ = ctx_.stream;
    ctx_.stream = side_;
  }
  SideMark end_side_work() override {
    if (!side_) return {};
    GRASS_CHECK(main_, "side work ended that was not begun");
    ctx_.stream = std::exchange(main_, nullptr);
    side_mark_count_++;
    GRASS_CUDA_CHECK(cudaEventRecord(side_marks_[size_t(side_mark_count_ % kSideMarks)], side_));
    return {side_mark_count_};
  }
  void join_side_work(SideMark mark) override {
    if (!side_ || mark.n <= side_joined_) return;
    GRASS_CHECK(!main_ && mark.n <= side_mark_count_, "a join of side work not ended");
    GRASS_CUDA_CHECK(
        cudaStreamWaitEvent(ctx_.stream, side_marks_[size_t(mark.n % kSideMarks)], 0));
    side_joined_ = mark.n;
  }
  std::unique_ptr<Communicator> communicator_for(Communicator& ranks) override {
    return cuda::make_nccl_communicator(ranks, ctx_.stream);
  }

  // ---- memory ---------------------------------------------------------------------------------
  void reserve(int64_t total, int64_t buffers) override {
    GRASS_CHECK(!pool_, "the GPU memory was reserved twice");
    const size_t bytes = size_t(total) + size_t(buffers + 1) * kAlign;
    size_t free_bytes = 0, total_bytes = 0;
    GRASS_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const bool room = bytes + size_t(kGpuHeadroomBytes) <= free_bytes;
    if (!room || cudaMalloc(&pool_, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the error: it was answered
      throw UserError("the run needs " + format_bytes(int64_t(bytes)) + " of GPU memory and " +
                      format_bytes(kGpuHeadroomBytes) + " left free beside it (kGpuHeadroomBytes, " +
                      "kernels/backend.h), " + format_bytes(int64_t(free_bytes)) + " are free on " +
                      gpu_ + ": reduce micro_batch_size or seq_len, or use precision \"bf16\" or "
                      "GRASS (grass mem <run.json> shows where the memory goes)");
    }
    pool_bytes_ = bytes;
    pool_used_ = 0;
  }
  void prepare_attention(int B, int T, int NH, int NKV, int HD, bool grads_packed) override {
    if (try_cudnn_) {
      try_cudnn_ = false;
      take_cudnn_if_it_builds(B, T, NH, NKV, HD, grads_packed);
      return;
    }
    // builds both graphs and keeps them
    if (cudnn_) cudnn_->workspace_bytes(B, T, NH, NKV, HD, grads_packed);
  }
  AttentionInUse attention_in_use() const override {
    return {attention_, cudnn_ ? cudnn_->version() : 0, why_not_cudnn_};
  }
  void prepare_galore_basis(int max_side, int k) override {
    if (!solver_) solver_ = cuda::create_solver_handle(ctx_.stream);
    const int64_t asked = cuda::solver_work_floats(solver_, max_side, k);
    const int64_t planned = galore_solver_work_floats(max_side, k);
    if (asked > planned)
      throw UserError("GaLore's randomized refresh: cuSOLVER asks for " + format_bytes(4 * asked) +
                      " of work space for " + std::to_string(max_side) + " x " + std::to_string(k) +
                      ", the plan has " + format_bytes(4 * planned) +
                      " (galore_solver_work_floats, kernels/backend_sizes.cpp, is short: a bug); "
                      "optimizer.svd \"exact\" avoids it");
  }
  void prepare_galore_batch(int k, int slots, const GaloreBatchLayout& layout) override {
    if (!solver_) solver_ = cuda::create_solver_handle(ctx_.stream);
    if (!solver_params_) solver_params_ = cuda::create_solver_params();
    cuda::check_batched_eig_work(solver_, solver_params_, k, slots, layout);
  }
  void* allocate_zeroed(size_t bytes) override {
    void* p = nullptr;
    if (pool_) {  // cut from the reservation
      const size_t start = (pool_used_ + kAlign - 1) / kAlign * kAlign;
      if (start + bytes > pool_bytes_) return nullptr;
      p = static_cast<char*>(pool_) + start;
      pool_used_ = start + bytes;
    } else if (cudaMalloc(&p, bytes) != cudaSuccess) {  // no plan (tests): one buffer each
      cudaGetLastError();
      return nullptr;
    }
    GRASS_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx_.stream));
    return p;
  }
  void mark_unwritten(void* ptr, size_t bytes) override { poison(ptr, int64_t(bytes)); }
  void deallocate(void* ptr) override {
    const bool in_pool = pool_ && ptr >= pool_ && ptr < static_cast<char*>(pool_) + pool_bytes_;
    if (!in_pool) GRASS_CUDA_CHECK(cudaFree(ptr));  // the pool goes back whole at the end
  }
  const char* memory_name() const override { return "GPU memory"; }

  // The host tier is host memory: read and written by the host once no copy touches it.
  void upload(void* dst, const void* host, size_t bytes) override {
    if (copies_->in_host_tier(dst)) {
      sync();
      std::memcpy(dst, host, bytes);
      return;
    }
    GRASS_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, ctx_.stream));
    sync();  // the host buffer may change as soon as this returns
  }
  void download(void* host, const void* src, size_t bytes) override {
    if (copies_->in_host_tier(src)) {
      sync();
      std::memcpy(host, src, bytes);
      return;
    }
    GRASS_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, ctx_.stream));
    sync();
  }
  void upload_async(void* dst, const void* host, size_t bytes) override {
    if (!staging_.upload(dst, host, bytes, ctx_.stream, &host_waits_)) upload(dst, host, bytes);
  }
  int64_t host_waits() const override { return host_waits_; }
  void zero(void* dst, size_t bytes) override {
    GRASS_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, ctx_.stream));
  }
  MemoryResource& host_tier() override { return copies_->host_tier(); }
  void copy_async(void* dst, const void* src, size_t bytes, Copy direction) override {
    copies_->copy(int(direction), dst, src, bytes,
                  direction == Copy::ToDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
  }
  void copy_queue_task(Copy queue, std::function<void()> task, const void*, size_t) override {
    copies_->task(int(queue), std::move(task));
  }
  CopyMark mark_copies(Copy queue) override { return {queue, copies_->mark(int(queue))}; }
  void wait_copies(CopyMark mark) override { copies_->wait(int(mark.queue), mark.n); }
  void order_copy_after(CopyMark mark) override {
    const Copy other = mark.queue == Copy::ToDevice ? Copy::ToHost : Copy::ToDevice;
    copies_->order_after(int(other), int(mark.queue), mark.n);
  }
  CopyTotals copy_totals() override { return copies_->totals(); }
  int copy_engines() const override { return copy_engines_; }
  void write_weights(void* weights, float* master, int64_t first, const float* host,
                     int64_t n) override {
    if (master) upload(master + first, host, size_t(n) * sizeof(float));
    std::vector<bf16> rounded(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) rounded[size_t(i)] = __float2bfloat16_rn(host[i]);
    upload(at(weights, first), rounded.data(), size_t(n) * sizeof(bf16));
  }
  void read_weights(float* host, const void* weights, int64_t first, int64_t n) override {
    read_bf16(host, at(weights, first), n);
  }
  void read_grads(float* host, const void* grads, int64_t first, int64_t n) override {
    if (storage_.grad_bytes == 2)
      read_bf16(host, at(grads, first), n);
    else
      download(host, static_cast<const float*>(grads) + first, size_t(n) * sizeof(float));
  }
  void use_scratch(const ScratchLease* lease) override {
    if (!lease) {  // none: every op that needs scratch stops at its capacity check
      scratch_ = {};
      scratch_bytes_ = {};
      attention_bytes_ = 0;
      rope_ = {nullptr, 0};
      slice_norms_capacity_ = 0;
      head_chunk_ = 0;
      ctx_.lt_workspace = nullptr;
      ctx_.lt_workspace_bytes = 0;
      return;
    }
    const BackendScratchPointers& scratch = lease->scratch();
    const WorkspaceShape& s = lease->shape();
    // backend_sizes.cpp sized these without the kernels: check that the kernels agree
    const int64_t N = int64_t(s.B) * s.T;
    const BackendScratch sizes = backend_scratch(storage_, s);
    if (!s.forward_only) {  // a forward-only model's: the backward's scratch is not there
      GRASS_CHECK(cuda::attention_scratch_floats(s.B, s.T, s.NH, s.NKV, s.HD) * 4 <=
                      sizes.attention_bytes,
                  "attention scratch smaller than the kernel needs");
      GRASS_CHECK(cuda::rmsnorm_scratch_floats(N, s.C) * 4 <= sizes.norm_bytes,
                  "RMSNorm scratch smaller than the kernel needs");
    }
    GRASS_CHECK(cuda::sum_squares_scratch_doubles(int64_t(1) << 40) * 8 <= sizes.reduce_bytes,
                "reduction scratch smaller than the kernel needs");
    GRASS_CHECK(s.attention == attention_, "a workspace planned for other attention kernels");
    if (attention_ == AttentionKernel::Mma && !s.forward_only)
      check_mma_backward_path(s.T, s.NH, s.NKV, s.HD);
    // The head's chunk: the model sized its logits with head_rows() from this shape's, and
    // scratch_covers serves no model whose logits hold fewer rows. One chunk is one GEMM's rows
    // and one launch of the cross-entropy's blocks: within their int dimensions.
    head_chunk_ = head_chunk(s.V, s.head_chunk_rows);
    GRASS_CHECK(s.V <= 0 || (head_chunk_ >= 1 && head_chunk_ <= INT32_MAX),
                "the head's chunk is outside the kernels' dimensions");
    scratch_ = scratch;
    scratch_bytes_ = sizes;
    attention_bytes_ = sizes.attention_bytes;
    rope_ = {static_cast<const float*>(scratch.rope), s.T};  // init_scratch() filled it
    rope_HD_ = s.HD;
    rope_theta_ = s.rope_theta;
    slice_norms_capacity_ = sizes.slice_norms_bytes / int64_t(sizeof(double));
    ctx_.lt_workspace = scratch.gemm;
    ctx_.lt_workspace_bytes = size_t(sizes.gemm_bytes);
  }
  void init_scratch(const ScratchLease& lease) override {
    const BackendScratchPointers& scratch = lease.scratch();
    const WorkspaceShape& s = lease.shape();
    if (cudnn_) {  // its graphs for the largest micro-batch, and whether their workspace fits
      const int64_t need =
          cudnn_->workspace_bytes(s.B, s.T, s.NH, s.NKV, s.HD, s.qkv_grads_packed);
      const int64_t have = backend_scratch(storage_, s).attention_bytes;
      if (need > have)
        throw InternalError("cuDNN attention needs " + std::to_string(need) +
                            " bytes of workspace at this shape, the plan has " +
                            std::to_string(have) + " (kernels/backend_sizes.cpp)");
      return;
    }
    // the RoPE table: a kernel on the stream, no wait
    if (scratch.rope && s.T > 0 && s.HD > 0)
      cuda::rope_table(ctx_, static_cast<float*>(scratch.rope), s.T, s.HD, float(s.rope_theta));
  }


  // ---- model ops ------------------------------------------------------------------------------
  void linear_forward(void* y, const void* x, const void* w, int64_t N, int in, int out) override {
    cuda::linear_forward(ctx_, b(y), b(x), b(w), N, in, out);
  }
  void linear_residual_forward(void* y, const void* x, const void* w, const void* r, int64_t N,
                               int in, int out) override {
    cuda::linear_residual_forward(ctx_, b(y), b(x), b(w), b(r), N, in, out);
  }
  void linear_backward(void* dx, void* dw, const void* dy, const void* x, const void* w, int64_t N,
                       int in, int out, bool accumulate_dx) override {
    if (dx) cuda::linear_backward_dx(ctx_, b(dx), b(dy), b(w), N, in, out, accumulate_dx);
    if (dw) cuda::linear_backward_dw(ctx_, dw, grad_type(), b(dy), b(x), N, in, out);
  }
  void embedding_forward(void* out, const int32_t* tokens, const void* table, int64_t N,
                         int C) override {
    cuda::embedding_forward(ctx_, b(out), tokens, b(table), N, C);
  }
  void embedding_backward(void* dtable, const void* dout, const int32_t*,
                          const int32_t* host_tokens, int64_t N, int C) override {
    // Group the positions by token on the host (a counting sort), so that one block sums each
    // token's rows in order: deterministic, no atomics.
    std::vector<int32_t> order(static_cast<size_t>(N)), starts, tokens;
    std::vector<int32_t> by_token(host_tokens, host_tokens + N);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t c) { return by_token[a] < by_token[c]; });
    for (int64_t i = 0; i < N; i++)
      if (i == 0 || by_token[order[i]] != by_token[order[i - 1]]) {
        starts.push_back(int32_t(i));
        tokens.push_back(by_token[order[i]]);
      }
    starts.push_back(int32_t(N));
    const int groups = int(tokens.size());
    int32_t* positions = static_cast<int32_t*>(scratch_.tokens);
    int32_t* group_start = positions + N;
    int32_t* group_token = group_start + N + 1;
    upload_async(positions, order.data(), order.size() * sizeof(int32_t));
    upload_async(group_start, starts.data(), starts.size() * sizeof(int32_t));
    upload_async(group_token, tokens.data(), tokens.size() * sizeof(int32_t));
    cuda::embedding_backward(ctx_, dtable, grad_type(), b(dout), positions, group_start,
                             group_token, groups, C);
    poison(scratch_.tokens, scratch_bytes_.tokens_bytes);
  }
  void rmsnorm_forward(void* out, float* rstd, const void* x, const void* w, int64_t N, int C,
                       double eps) override {
    cuda::rmsnorm_forward(ctx_, b(out), rstd, b(x), b(w), N, C, float(eps));
  }
  void rmsnorm_backward(void* dx, void* dw, const void* dout, const void* x, const void* w,
                        const float* rstd, int64_t N, int C) override {
    cuda::rmsnorm_backward(ctx_, b(dx), dw, grad_type(), b(dout), b(x), b(w), rstd,
                           static_cast<float*>(scratch_.norm), N, C);
    poison(scratch_.norm, scratch_bytes_.norm_bytes);
  }
  // The engine's kernels rotate q and k as they load them; cuDNN's and "mma"'s take them rotated,
  // so for those the backend rotates q and k in place, once, and turns dq, dk back afterwards.
  // "mma": the FA2-style kernels on the rotated q and k (attention_mma.cu), the old ones for the
  // shapes they do not take.
  void attention_forward(void* out, void* saved, QkvRows<void*> qkv, int B, int T, int NH,
                         int NKV, int HD, double theta) override {
    if (attention_ == AttentionKernel::Mma) {
      cuda::rope_forward(ctx_, b(qkv.q), B, T, NH, HD, float(theta), qkv.ldq);
      cuda::rope_forward(ctx_, b(qkv.k), B, T, NKV, HD, float(theta), qkv.ldk);
      cuda::attention_forward_mma(ctx_, b(out), static_cast<float*>(saved),
                                  bf16_rows(read_only(qkv)), B, T, NH, NKV, HD);
      return;
    }
    if (cudnn_) {
      cuda::rope_forward(ctx_, b(qkv.q), B, T, NH, HD, float(theta), qkv.ldq);
      cuda::rope_forward(ctx_, b(qkv.k), B, T, NKV, HD, float(theta), qkv.ldk);
      cudnn_->forward(b(out), static_cast<float*>(saved), bf16_rows(read_only(qkv)), B, T, NH,
                      NKV, HD, scratch_.attention, attention_bytes_);
      poison(scratch_.attention, attention_bytes_);
      return;
    }
    cuda::attention_forward(ctx_, b(out), static_cast<float*>(saved), bf16_rows(read_only(qkv)),
                            B, T, NH, NKV, HD, rope_table(HD, theta));
  }
  void attention_backward(QkvRows<void*> d, const void* dout, const void* out, const void* saved,
                          QkvRows<const void*> qkv, int B, int T, int NH, int NKV, int HD,
                          double theta) override {
    const QkvRows<bf16*> grads{b(d.q), b(d.k), b(d.v), d.ldq, d.ldk, d.ldv};
    if (attention_ == AttentionKernel::Mma) {
      check_mma_backward_path(T, NH, NKV, HD);
      cuda::attention_backward_mma(ctx_, grads, static_cast<float*>(scratch_.attention), b(dout),
                                   b(out), static_cast<const float*>(saved), bf16_rows(qkv), B, T,
                                   NH, NKV, HD, mma_backward_);
      cuda::rope_backward(ctx_, grads.q, B, T, NH, HD, float(theta), grads.ldq);
      cuda::rope_backward(ctx_, grads.k, B, T, NKV, HD, float(theta), grads.ldk);
      poison(scratch_.attention, attention_bytes_);
      return;
    }
    if (cudnn_) {
      cudnn_->backward(grads, b(dout), b(out), static_cast<const float*>(saved), bf16_rows(qkv),
                       B, T, NH, NKV, HD, scratch_.attention, attention_bytes_);
      cuda::rope_backward(ctx_, grads.q, B, T, NH, HD, float(theta), grads.ldq);
      cuda::rope_backward(ctx_, grads.k, B, T, NKV, HD, float(theta), grads.ldk);
      poison(scratch_.attention, attention_bytes_);
      return;
    }
    cuda::attention_backward(ctx_, grads, static_cast<float*>(scratch_.attention), b(dout), b(out),
                             static_cast<const float*>(saved), bf16_rows(qkv), B, T, NH, NKV, HD,
                             rope_table(HD, theta));
    poison(scratch_.attention, attention_bytes_);
  }
  void swiglu_forward(void* out, const void* gu, int64_t N, int F) override {
    cuda::swiglu_forward(ctx_, b(out), b(gu), N, F);
  }
  void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gu, int64_t N, int F,
                       int64_t ld) override {
    cuda::swiglu_backward(ctx_, b(dgate), b(dup), b(dout), b(gu), N, F, ld);
  }
  void gather_rows(void* out, const void* x, const int32_t* rows, const float* scale, int64_t k,
                   int D) override {
    cuda::gather_rows(ctx_, b(out), b(x), rows, scale, k, D);
  }
  void row_norms(float* norms, const void* x, int64_t N, int D) override {
    cuda::row_norms(ctx_, norms, b(x), N, D);
  }
  void draw_rows(int32_t* rows, float* scale, const float* norms, int64_t N, int k, bool winners,
                 uint64_t stream, void* workspace) override {
    cuda::draw_rows(ctx_, rows, scale, norms, N, k, winners, stream, workspace);
  }
  // The head in chunks of the scratch's head_chunk_ tokens (head_rows()): the logits of a chunk
  // exist only while it is worked on. `lse` holds each row's loss here (0 for an ignored
  // target), summed in a fixed order on the device (the backward recomputes the logits, not the
  // lse).
  void head_forward(void* logits, float* lse, double* loss, const void* nf, const void* w,
                    const int32_t* targets, int64_t N, int C, int V) override {
    const int64_t chunk = head_chunk_rows(N);
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
      const int64_t rows = std::min(chunk, N - r0);
      cuda::linear_forward(ctx_, b(logits), b(at(nf, r0 * C)), b(w), rows, C, V);
      cuda::cross_entropy_fused(ctx_, b(logits), lse + r0, targets + r0, rows, V, 0.0f);
    }
    zero(loss, sizeof(double));
    cuda::sum(ctx_, loss, lse, N, static_cast<double*>(scratch_.reduce));
    poison(scratch_.reduce, scratch_bytes_.reduce_bytes);
  }
  void head_backward(void* dnf, void* dw, void* logits, float* lse, const void* nf,
                     const void* w, const int32_t* targets, int64_t N, int C, int V,
                     double dloss_scale) override {
    const int64_t chunk = head_chunk_rows(N);
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
      const int64_t rows = std::min(chunk, N - r0);
      head_chunk_backward(dnf, dw, logits, lse, nf, w, targets, r0, rows, C, V, dloss_scale);
    }
  }
  // Each chunk's logits once: the fused cross-entropy writes the rows' losses and overwrites the
  // logits with their gradient, which flows through lm_head at once.
  void head_forward_backward(void* dnf, void* dw, void* logits, float* lse, double* loss,
                             const void* nf, const void* w, const int32_t* targets, int64_t N,
                             int C, int V, double dloss_scale) override {
    const int64_t chunk = head_chunk_rows(N);
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
      const int64_t rows = std::min(chunk, N - r0);
      head_chunk_backward(dnf, dw, logits, lse, nf, w, targets, r0, rows, C, V, dloss_scale);
    }
    zero(loss, sizeof(double));
    cuda::sum(ctx_, loss, lse, N, static_cast<double*>(scratch_.reduce));
    poison(scratch_.reduce, scratch_bytes_.reduce_bytes);
  }
  void store_gradients(void*, int64_t) override {}  // already in their storage type

  // ---- optimizer ops --------------------------------------------------------------------------
  void sum_squares(double* acc, const void* grads, int64_t n) override {
    cuda::sum_squares(ctx_, acc, grads, grad_type(), n, static_cast<double*>(scratch_.reduce));
    poison(scratch_.reduce, scratch_bytes_.reduce_bytes);
  }
  void clip(ClipScalars* s, double max_norm) override { cuda::clip(ctx_, s, max_norm); }
  void adamw_update(WeightRef w, const void* g, void* m, void* v, int64_t n, const AdamArgs& a,
                    uint64_t seed) override {
    cuda::adamw_update(ctx_, b(w.weights), w.master, g, m, v, n, a, seed);
  }
  void adamw_update_q8(WeightRef w, const void* g, const Quant8Moments& s, int64_t n,
                       const AdamArgs& a, uint64_t seed) override {
    cuda::adamw_update_q8(ctx_, b(w.weights), w.master, g, s, n, a, seed);
  }
  void grass_compressed_grad(void* gc, void* scratch, const void* dy, const void* x,
                             const int32_t* sigma, const float* rho, int64_t N, int in, int out,
                             int r, bool rows) override {
    cuda::grass_compressed_grad(ctx_, gc, grad_type(), b(scratch), b(dy), b(x), sigma, rho, N, in,
                                out, r, rows);
  }
  void grass_gather_columns(void* xs, const void* x, const int32_t* sigma, const float* rho,
                            int64_t N, int width, int r) override {
    cuda::grass_gather_columns(ctx_, b(xs), b(x), sigma, rho, N, width, r);
  }
  void grass_selected_cols_grad(void* gc, const void* dy, int64_t ldy, const void* xs, int64_t N,
                                int out, int r) override {
    cuda::grass_selected_cols_grad(ctx_, gc, grad_type(), b(dy), ldy, b(xs), N, out, r);
  }
  void grass_adam_update_q8(WeightRef w, const void* gc, const Quant8Moments& q, bool by_columns,
                            const GrassSlices& s, double alpha, const AdamArgs& a,
                            uint64_t seed) override {
    cuda::grass_adam_update_q8(ctx_, b(w.weights), w.master, gc, q, by_columns, s.sigma, s.scale,
                               s.out, s.in, s.r, s.rows, alpha, a, seed);
  }
  void full_weight_grad(float* g, const void* dy, const void* x, int64_t N, int in, int out,
                        int row0, int rows) override {
    cuda::linear_full_grad_f32(ctx_, g, b(dy), b(x), N, in, out, row0, rows);
  }
  void grass_slice_norms(const float* g, int row0, int rows, int in, bool by_rows) override {
    GRASS_CHECK((by_rows ? row0 + rows : in) <= slice_norms_capacity_,
                "slice-norm scratch smaller than a target's side");
    double* norms = static_cast<double*>(scratch_.slice_norms);
    if (by_rows)
      cuda::grass_slice_norms(ctx_, norms + row0, g, rows, in, true, false);
    else
      cuda::grass_slice_norms(ctx_, norms, g, rows, in, false, row0 > 0);
  }
  void read_slice_norms(double* host, int n) override {
    download(host, scratch_.slice_norms, size_t(n) * sizeof(double));
  }
  void pack_slices(void* delta, const void* w, const int32_t* sigma, int count, int out, int in,
                   bool rows) override {
    cuda::pack_slices(ctx_, b(delta), b(w), sigma, count, out, in, rows);
  }
  void unpack_slices(void* w, const void* delta, const int32_t* sigma, int count, int out, int in,
                     bool rows) override {
    cuda::unpack_slices(ctx_, b(w), b(delta), sigma, count, out, in, rows);
  }
  void grass_adam_update(WeightRef w, void* gc, void* m, void* v, const GrassSlices& s,
                         double alpha, const AdamArgs& a, uint64_t seed) override {
    cuda::grass_adam_update(ctx_, b(w.weights), w.master, gc, m, v, s.sigma, s.scale, s.out, s.in,
                            s.r, s.rows, alpha, a, seed);
  }

  // GaLore and FLORA (kernels/cuda/lowrank.cu). The workspace is lowrank_workspace_bytes() of this
  // target (kernels/backend_sizes.cpp); the kernels check that their layout fits in it.
  void lowrank_compressed_grad(void* R, void* scratch, void* workspace, const void* dy,
                               const void* x, int64_t N, const LowRankProjection& p) override {
    cuda::lowrank_compressed_grad(ctx_, R, grad_type(), b(scratch), workspace,
                                  lowrank_workspace_bytes(storage_, p.out, p.in, p.r), b(dy), b(x),
                                  p.P, N, p.in, p.out, p.r, p.rows);
  }
  // The randomized range finder runs on the device (kernels/cuda/galore_basis.cu), no wait: its
  // cuSOLVER statuses are kept in `status` for the caller to read once. The exact SVD runs on
  // the host (LAPACK, the CPU backend's op, bit for bit): one out x in download, a wait, per
  // target per refresh.
  void galore_basis(float* P, const float* g, int out, int in, int r, bool rows,
                    const GaloreBasisMethod& how, void* workspace, int* status) override {
    if (how.randomized) {
      GRASS_CHECK(status, "galore_basis: the randomized refresh needs its status ints");
      if (!solver_) solver_ = cuda::create_solver_handle(ctx_.stream);  // tests: no prepare
      cuda::galore_basis_randomized(ctx_, solver_, P, g, out, in, r, rows, how.seed,
                                    how.power_iters, how.oversample, workspace,
                                    galore_basis_workspace_bytes(storage_, out, in, r, how),
                                    status);
      return;
    }
    const int side = rows ? out : in;
    std::vector<float> host_g(size_t(out) * size_t(in)), host_P(size_t(side) * size_t(r));
    download(host_g.data(), g, host_g.size() * sizeof(float));
    ops::galore_basis<float>(host_P.data(), host_g.data(), out, in, r, rows);
    upload_async(P, host_P.data(), host_P.size() * sizeof(float));
  }
  void galore_sketch(const float* g, int out, int in, int r, bool rows, const GaloreBasisMethod& how,
                     void* batch, const GaloreBatchLayout& layout, int slot, void* workspace,
                     int* status) override {
    GRASS_CHECK(how.randomized && status,
                "galore_sketch: the randomized refresh, with its status ints");
    if (!solver_) solver_ = cuda::create_solver_handle(ctx_.stream);  // tests: no prepare
    cuda::galore_sketch(ctx_, solver_, g, out, in, r, rows, how.seed, how.power_iters,
                        how.oversample, batch, layout, slot, workspace,
                        galore_basis_workspace_bytes(storage_, out, in, r, how), status);
  }
  void galore_finish(float* const* P, const int* sides, int count, int k, int r, void* batch,
                     const GaloreBatchLayout& layout, void* workspace, int* status) override {
    GRASS_CHECK(status, "galore_finish: the randomized refresh needs its status ints");
    if (!solver_) solver_ = cuda::create_solver_handle(ctx_.stream);
    if (!solver_params_) solver_params_ = cuda::create_solver_params();
    // the workspace was sized for the batch's largest target (out, in as large as its side)
    int side = 0;
    for (int i = 0; i < count; i++) side = std::max(side, sides[i]);
    GaloreBasisMethod how;
    how.randomized = true;
    how.oversample = k - r;
    cuda::galore_finish(ctx_, solver_, solver_params_, P, sides, count, k, r, batch, layout,
                        solver_host_work_, workspace,
                        galore_basis_workspace_bytes(storage_, side, side, r, how), status);
  }
  ops::GaloreRefreshTimes take_galore_refresh_times() override {
    return cuda::refresh_phase_times();
  }
  // Generated on the host and uploaded: the same P as the CPU backend's, bit for bit.
  void flora_projection(float* P, uint64_t seed, int64_t tensor, int64_t refresh, int side,
                        int r) override {
    cuda::flora_projection(ctx_, P, seed, tensor, refresh, side, r);
  }
  void flora_transfer(void* m, float* scratch, const float* P_old, const LowRankProjection& p,
                      uint64_t seed) override {
    const GradType state_type = storage_.state_bytes == 2 ? GradType::BF16 : GradType::F32;
    cuda::flora_transfer(ctx_, m, state_type, scratch, P_old, p.P, p.out, p.in, p.r, p.rows, seed);
  }
  void flora_transfer_q8(const Quant8Moments& q, bool by_columns, float* scratch,
                         const float* P_old, const LowRankProjection& p) override {
    cuda::flora_transfer_q8(ctx_, q, by_columns, scratch, P_old, p.P, p.out, p.in, p.r, p.rows);
  }
  void lowrank_adam_update_q8(WeightRef w, void* R, const Quant8Moments& q, bool by_columns,
                              void* workspace, const LowRankProjection& p, double alpha,
                              double max_rms, const AdamArgs& a, uint64_t seed) override {
    cuda::lowrank_adam_update_q8(ctx_, b(w.weights), w.master, R, q, by_columns, workspace,
                                 lowrank_workspace_bytes(storage_, p.out, p.in, p.r),
                                 static_cast<double*>(scratch_.reduce), p.P, p.out, p.in, p.r,
                                 p.rows, alpha, max_rms, a, seed);
    poison(scratch_.reduce, scratch_bytes_.reduce_bytes);
  }
  void lowrank_adam_update(WeightRef w, void* R, void* m, void* v, void* workspace,
                           const LowRankProjection& p, double alpha, double max_rms,
                           const AdamArgs& a, uint64_t seed) override {
    cuda::lowrank_adam_update(ctx_, b(w.weights), w.master, R, m, v, workspace,
                              lowrank_workspace_bytes(storage_, p.out, p.in, p.r),
                              static_cast<double*>(scratch_.reduce), p.P, p.out, p.in, p.r,
                              p.rows, alpha, max_rms, a, seed);
    poison(scratch_.reduce, scratch_bytes_.reduce_bytes);
  }

 private:
  // GRASS_POISON=1 (cuda/device.h): NaN in memory whose contents nobody may read before writing.
  void poison(void* p, int64_t bytes) {
    if (cuda::poison_mode() && p && bytes > 0)
      GRASS_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, size_t(bytes), ctx_.stream));
  }
  GradType grad_type() const { return storage_.grad_bytes == 2 ? GradType::BF16 : GradType::F32; }
  // Rows of the head's chunk for a call on N rows: the scratch in use's chunk, at most N.
  int64_t head_chunk_rows(int64_t N) const {
    GRASS_CHECK(head_chunk_ > 0, "the head needs the scratch of a model with a vocabulary");
    return std::min(N, head_chunk_);
  }
  // Rows r0 .. r0 + rows of the head: logits, loss per row (into lse) and its gradient in place,
  // then dnf (overwritten) and dw (+=) through lm_head.
  void head_chunk_backward(void* dnf, void* dw, void* logits, float* lse, const void* nf,
                           const void* w, const int32_t* targets, int64_t r0, int64_t rows, int C,
                           int V, double dloss_scale) {
    cuda::linear_forward(ctx_, b(logits), b(at(nf, r0 * C)), b(w), rows, C, V);
    cuda::cross_entropy_fused(ctx_, b(logits), lse + r0, targets + r0, rows, V,
                              float(dloss_scale));
    cuda::linear_backward_dx(ctx_, b(at(dnf, r0 * C)), b(logits), b(w), rows, C, V, false);
    cuda::linear_backward_dw(ctx_, dw, grad_type(), b(logits), b(at(nf, r0 * C)), rows, C, V);
  }
  void sync() {
    if (!main_) join_side_work({side_mark_count_});  // a host wait waits for side work too
    copies_->order_compute_after_copies();
    GRASS_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
    host_waits_++;
  }
  void read_bf16(float* host, const void* src, int64_t n) {
    std::vector<bf16> values(static_cast<size_t>(n));
    download(values.data(), src, size_t(n) * sizeof(bf16));
    for (int64_t i = 0; i < n; i++) host[i] = __bfloat162float(values[size_t(i)]);
  }
  std::string gpu_;
  cuda::Context ctx_;
  void* pool_ = nullptr;
  int64_t local_pool_taken_ = 0;  // by take_local_memory_pool, before the reservation
  size_t pool_bytes_ = 0, pool_used_ = 0;
  BackendScratchPointers scratch_;
  cuda::StagingRing staging_;
  std::unique_ptr<cuda::CopyStreams> copies_;  // the copy queues and the host tier
  int copy_engines_ = 0;                        // cudaDevAttrAsyncEngineCount
  int64_t host_waits_ = 0;
  // Side work (begin_side_work): its stream (null: none, GRASS_SIDE_STREAM=0), the compute
  // stream while side ops are queued (else null), the fork event and the marks' ring.
  static constexpr int kSideMarks = 16;
  cudaStream_t side_ = nullptr, main_ = nullptr;
  cudaEvent_t side_fork_ = nullptr;
  std::array<cudaEvent_t, kSideMarks> side_marks_{};
  int64_t side_mark_count_ = 0, side_joined_ = 0;
  BackendScratch scratch_bytes_;       // the sizes of scratch_'s buffers
  int64_t slice_norms_capacity_ = 0;  // doubles at scratch_.slice_norms
  int64_t head_chunk_ = 0;            // rows of logits the head computes at a time (head_chunk())
  // The RoPE table in scratch_.rope, for head dim rope_HD_ and rope_theta_.
  cuda::RopeTable rope_;
  int rope_HD_ = 0;
  double rope_theta_ = 0;
  // cuDNN attention, when the run asked for it; its workspace is scratch_.attention
  AttentionKernel attention_;
  std::unique_ptr<cuda::CudnnAttention> cudnn_;
  // Asked to fall back (attention "auto"): cuDNN's kernels are tried in prepare_attention, which
  // only a training run calls (a forward-only model, grass eval's or sample's, keeps the
  // engine's), and why they were not taken.
  bool try_cudnn_;
  cuda::MmaBackwardPath mma_backward_;  // GRASS_MMA_BACKWARD (mma_backward_path())
  // Path A forced on a shape it does not take: one line, from use_scratch before the run writes
  // anything (and again at each backward, for a caller that never leased scratch)
  void check_mma_backward_path(int T, int NH, int NKV, int HD) const {
    if (mma_backward_ == cuda::MmaBackwardPath::A &&
        !cuda::attention_backward_mma_path_a_takes(T, NH, NKV, HD))
      throw UserError("GRASS_MMA_BACKWARD=a: path A of the mma backward does not take HD " +
                      std::to_string(HD) + ", T " + std::to_string(T) + ", " +
                      std::to_string(NH / NKV) + " query heads a kv head (unset it, or b)");
  }
  std::string why_not_cudnn_;
  void take_cudnn_if_it_builds(int B, int T, int NH, int NKV, int HD, bool grads_packed) {
#ifdef GRASS_HAVE_CUDNN
    try {
      auto cudnn = cuda::make_cudnn_attention(ctx_.stream);
      // builds both graphs, kept; the plan gives them its estimate, which init_scratch would
      // otherwise find short only after the reservation
      const int64_t need = cudnn->workspace_bytes(B, T, NH, NKV, HD, grads_packed);
      const int64_t planned = cudnn_attention_workspace_bytes(B, T, NH, HD);
      if (need > planned) {
        why_not_cudnn_ = "its graphs need " + format_bytes(need) + " of workspace, " +
                         format_bytes(planned) + " planned (kernels/backend_sizes.cpp)";
        return;
      }
      cudnn_ = std::move(cudnn);
      attention_ = AttentionKernel::Cudnn;
    } catch (const UserError& e) {
      why_not_cudnn_ = e.what();  // its handle and any graph built are gone before the reservation
    }
#else
    (void)B, (void)T, (void)NH, (void)NKV, (void)HD, (void)grads_packed;
    why_not_cudnn_ = "this grass was built without cuDNN's headers (cudnn.h was not found at "
                     "configure time; pass -DCUDNN_INCLUDE_DIR=...)";
#endif
  }
  cusolverDnHandle_t solver_ = nullptr;  // GaLore's randomized refresh: prepare_galore_basis
  cusolverDnParams_t solver_params_ = nullptr;  // its batched eigensolver: prepare_galore_batch
  std::vector<char> solver_host_work_;          // the batched eigensolver's host work space
  int64_t attention_bytes_ = 0;
  cuda::RopeTable rope_table(int HD, double theta) const {
    GRASS_CHECK(rope_.table && HD == rope_HD_ && theta == rope_theta_,
                "attention: no RoPE table bound for this head dim and theta");
    return rope_;
  }
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Storage& storage, int device,
                                           AttentionKernel attention, bool fall_back_to_grass) {
  const cuda::DeviceProbe gpu = cuda::probe_device(device);
  if (!gpu.usable) throw UserError("device cuda: " + gpu.description);
  if (!storage.bf16_weights())
    throw UserError("precision \"fp32\" runs on the CPU backend only: on the GPU use "
                    "\"bf16-mixed\" or \"bf16\"");
  return std::make_unique<CudaBackend>(storage, gpu.description, device, attention,
                                       fall_back_to_grass);
}

}  // namespace grass
