// The backend: where the ops run and how their tensors are stored. The model and the optimizers
// call only this interface, so they never branch on the device. Two implementations:
//   CpuBackend  (kernels/cpu/cpu_backend.cpp): the reference, fp32 memory, kernels/ops.h; in the
//               bf16 precisions it rounds what the GPU would store in bf16 (kernels/storage.h).
//   CudaBackend (kernels/cuda/cuda_backend.cu): bf16 activations and weights on the GPU,
//               kernels/cuda/cuda_ops.h.
//
// Pointers are the backend's memory (host on the CPU, device on CUDA), typed by role:
//   act:    activations and backward workspace   (CPU float, CUDA bf16)
//   weight: the weights the forward reads        (CPU float, CUDA bf16)
//   grad:   dense gradients and GRASS's G_C      (CPU float; CUDA fp32 in bf16-mixed, bf16 in bf16)
//   state:  optimizer moments                    (CPU float; CUDA fp32 in bf16-mixed, bf16 in bf16)
//   float*: always fp32 (RMSNorm rstd, master weights, the GRASS refresh gradient, ρ)
// Shapes and semantics are those of kernels/ops.h. Parameter gradients accumulate (+=).
//
// The ops, where each lives and what tests the CUDA one against the CPU's (tests/gpu, which run
// on the CUDA emulator in every build). An op's two files share a name, kernels/cpu/<op>.cpp and
// kernels/cuda/<op>.cu (tools/kernel_twins.py checks it and lists the backends' own machinery);
// docs/architecture.md, "Adding an op", says what a new op needs:
//   op                                     file (kernels/cpu/*.cpp, kernels/cuda/*.cu)      test (tests/gpu)
//   linear_*, full_weight_grad             linear (OpenBLAS; cuBLASLt through gemm.cu)      test_gpu_gemm
//   embedding_*                            embedding                                        test_gpu_elementwise
//   rmsnorm_*                              rmsnorm                                          test_gpu_elementwise
//   gather_rows, row_norms, draw_rows      sampling                                         test_gpu_elementwise
//   swiglu_*                               swiglu                                           test_gpu_elementwise
//   attention_* (RoPE inside)              attention, rope                                  test_gpu_attention
//   head_* (lm_head + cross-entropy)       cross_entropy, linear                            test_gpu_cross_entropy, test_gpu_model
//   sum_squares, clip                      reduce                                           test_gpu_adamw, test_gpu_model
//   adamw_update, adamw_update_q8          adamw                                            test_gpu_adamw
//   store_gradients (bf16 precisions)      bf16_storage (the CPU rounds; the GPU's are      test_gpu_adamw, test_gpu_model
//                                          formed in bf16 by the ops that write them)
//   grass_* (grass_adam_update_q8 too),    grass                                            test_gpu_grass
//   pack_slices, unpack_slices
//   lowrank_*, flora_* (and their _q8)     lowrank                                          test_gpu_lowrank
//   galore_basis (randomized)              galore_basis (cuSOLVER)                          test_gpu_lowrank
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/adam_args.h"
#include "kernels/clip_rule.h"
#include "kernels/lowrank_ops.h"
#include "kernels/qkv_rows.h"
#include "kernels/quant8.h"
#include "kernels/storage.h"
#include "src/core/arena.h"

namespace grass {

class Communicator;  // dist/communicator.h (which depends on storage.h, not on the backend)

// The weight an optimizer update writes: the weights the forward reads (weight-typed) and the fp32
// master copy of the same elements (null without one).
struct WeightRef {
  void* weights = nullptr;
  float* master = nullptr;
};

// One GRASS target's update: w[out, in] trains the r slices σ (rows when `rows`, else columns),
// slice j's step multiplied by scale[j] (backend memory: sigma int32 [r], scale fp32 [r]).
struct GrassSlices {
  const int32_t* sigma = nullptr;
  const float* scale = nullptr;
  int out = 0, in = 0, r = 0;
  bool rows = true;
};

// One GaLore or FLORA target (kernels/lowrank_ops.h): w[out, in] trains through P [side, r]
// (fp32 backend memory), side = out when `rows`, else in.
struct LowRankProjection {
  const float* P = nullptr;
  int out = 0, in = 0, r = 0;
  bool rows = true;
};
// How a GaLore refresh finds P (optimizer.projection.svd, resolved): LAPACK's exact SVD on the
// host, or the randomized range finder of ops::galore_basis_randomized, on the device where the
// run is (cuSOLVER's QR and eigensolver on a GPU), its Gaussian test matrix drawn from `seed`.
struct GaloreBasisMethod {
  bool randomized = false;
  uint64_t seed = 0;
  int power_iters = 2, oversample = 8;
};
// Bytes of device workspace galore_basis needs for a target of this shape: the randomized range
// finder's matrices and cuSOLVER's work space on the GPU (kernels/backend_sizes.cpp has the
// terms); 0 on the CPU, whose LAPACK calls allocate their own, and for the exact SVD.
int64_t galore_basis_workspace_bytes(const Storage& storage, int out, int in, int r,
                                     const GaloreBasisMethod& how);
// The floats of cuSOLVER work space planned for an orthonormalisation of m x k and a k x k
// eigenproblem; the GPU backend checks it against cuSOLVER's own figure before the reservation.
int64_t galore_solver_work_floats(int64_t m, int64_t k);
// Where Backend::galore_sketch keeps `slots` targets' Q [side, k] and S [k, k] for one
// galore_finish (GaLore's optimizer.svd_batch "layer"), byte offsets in one buffer, regions
// 256-byte aligned: S of slot i at s + 4·i·k'² for the batch's k' ≤ k (the slots' eigenproblems lie
// next to each other, as a batched eigensolver reads them), its eigenvalues at lambda + 4·i·k', Q
// at q + 4·i·k·max_side, cuSOLVER's info at info + 4·i, and on the GPU the batched eigensolver's
// work space (work, work_bytes: slots times galore_solver_work_floats(k, k) floats; the backend
// checks it against cuSOLVER's figure before the reservation).
struct GaloreBatchLayout {
  int64_t s = 0, lambda = 0, q = 0, info = 0, work = 0, work_bytes = 0, bytes = 0;
  int64_t q_stride = 0;  // floats from one slot's Q to the next's: k·max_side
};
GaloreBatchLayout galore_batch_layout(const Storage& storage, int64_t max_side, int64_t k,
                                      int slots);
// Slot i's Q and S in a batch whose eigenproblems are k x k.
struct GaloreSlot {
  float* Q;
  float* S;
};
inline GaloreSlot galore_slot(void* batch, const GaloreBatchLayout& layout, int slot, int64_t k) {
  char* b = static_cast<char*>(batch);
  return {reinterpret_cast<float*>(b + layout.q) + int64_t(slot) * layout.q_stride,
          reinterpret_cast<float*>(b + layout.s) + int64_t(slot) * k * k};
}
// Bytes of the workspace the low-rank ops of a target of this shape need (0 on the CPU; the GPU
// keeps a bf16 copy of P and the bf16 direction there, and in pure bf16 the fp32
// back-projection of a chunk of rows; kernels/cuda/cuda_ops.h has the layout).
int64_t lowrank_workspace_bytes(const Storage& storage, int out, int in, int r);
// Bytes of workspace Backend::draw_rows needs for N rows (0 on the CPU, which draws in its own
// vectors).
int64_t draw_rows_workspace_bytes(const Storage& storage, int64_t N);

// Which kernels compute attention on the GPU (run config `attention`): the engine's own, the
// readable ones the CPU checks, cuDNN's fused flash attention (kernels/cudnn/), or the engine's
// FA2-style kernels (kernels/cuda/attention_mma.cu). The CPU has its reference only.
enum class AttentionKernel { Grass, Cudnn, Mma };
// The kernels a backend computes attention with, once prepare_attention has settled them.
struct AttentionInUse {
  AttentionKernel kernel = AttentionKernel::Grass;
  int64_t cudnn_version = 0;  // cuDNN's cudnnGetVersion() (91002: 9.10.2) with its kernels; else 0
  std::string why_not_cudnn;  // a backend that was to fall back from cuDNN's and did: why
};

// The shapes a model's backward workspace must serve (the largest micro-batch).
struct WorkspaceShape {
  int B = 0, T = 0, C = 0, F = 0, V = 0, NH = 0, NKV = 0, HD = 0;
  double rope_theta = 10000.0;
  AttentionKernel attention = AttentionKernel::Grass;
  bool qkv_grads_packed = true;  // dq, dk, dv packed as q, k, v (else three buffers)
  bool forward_only = false;     // an evaluation model's: none of the backward's scratch
  // The head's chunk asked for (ModelMemoryOptions::head_chunk_rows; head_rows() resolves it):
  // the rows of logits the model's buffer holds and the GPU's head computes at a time.
  int64_t head_chunk_rows = 0;
};

// The backend's own scratch, sized from the storage alone (kernels/backend_sizes.cpp), so that a
// plan for the GPU needs no GPU: Backend::plan_scratch allocates it from the arena's workspace
// category. Zero bytes: not needed by that backend.
struct BackendScratch {
  int64_t attention_bytes = 0;  // attention backward (CPU: [B,NH,T,T] floats; cuDNN: its
                                // workspace)
  int64_t norm_bytes = 0;       // RMSNorm weight-gradient partial sums
  int64_t reduce_bytes = 0;     // deterministic Σx² partials
  int64_t gemm_bytes = 0;       // cuBLASLt workspace
  int64_t tokens_bytes = 0;     // embedding backward's token groups
  int64_t slice_norms_bytes = 0;  // a GRASS refresh's slice norms (doubles)
  int64_t rope_bytes = 0;         // RoPE: the GPU kernels' cos/sin table [2,T,HD/2] fp32 (written
                                  // by init_scratch); none on the CPU and with cuDNN, which rotate
                                  // q and k in place
};
struct BackendScratchPointers {
  void *attention = nullptr, *norm = nullptr, *reduce = nullptr, *gemm = nullptr,
       *tokens = nullptr, *slice_norms = nullptr, *rope = nullptr;
};
BackendScratch backend_scratch(const Storage& storage, const WorkspaceShape& shape);

class Backend;
// Whether scratch planned for shape `a` serves every op of shape `b`: at least its bytes in every
// buffer, the same RoPE table (as many positions or more, the same head dim and theta), and on
// the GPU a head chunk no larger than b's (its logits buffer holds that many rows).
bool scratch_covers(const Storage& storage, const WorkspaceShape& a, const WorkspaceShape& b);

// The backend's scratch for one model's shapes, from Backend::plan_scratch. While the lease lives
// the backend can compute with that scratch. A backend serving several models at once (tests
// build two side by side) computes with the lease alive that covers the others (at least their
// bytes, the same RoPE table), else the newest, and an op asked for more than the scratch in use
// holds stops with an error. A lease on a planning arena holds null pointers and binds nothing.
class ScratchLease {
 public:
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  ~ScratchLease();
  const BackendScratchPointers& scratch() const { return scratch_; }
  const WorkspaceShape& shape() const { return shape_; }

 private:
  friend class Backend;
  ScratchLease(Backend* backend, const BackendScratchPointers& scratch, const WorkspaceShape& shape)
      : backend_(backend), scratch_(scratch), shape_(shape) {}
  Backend* backend_;  // null: planned only, never bound
  BackendScratchPointers scratch_;
  WorkspaceShape shape_;
};
// What attention_forward keeps for the backward (CPU: probabilities [B,NH,T,T]; GPU:
// logsumexp [B,NH,T]), in bytes.
int64_t attention_saved_bytes(const Storage& storage, int B, int T, int NH);
// The head dims the CUDA backend's attention takes: a multiple of 8 from 8 to 256, the engine's
// kernels' (kernels/cuda/attention.cu), which cuDNN's and the mma kernels fall back to. The CPU
// backend takes any even head dim; a GPU run of another is refused at start-up.
constexpr int kCudaMaxHeadDim = 256;
constexpr bool cuda_attention_takes_head_dim(int HD) {
  return HD >= 8 && HD <= kCudaMaxHeadDim && HD % 8 == 0;
}
// The widest hidden size the CUDA backend takes: its RMSNorm backward keeps a row's C fp32
// partials and 32 floats of its own in the 48 KiB of shared memory a launch may take unasked
// (kernels/cuda/rmsnorm.cu, kMaxC).
constexpr int kCudaMaxHiddenSize = (48 * 1024 - 32 * 4) / 4;  // 12,256
// cuDNN's SDPA workspace planned for a micro-batch of B x T tokens, NH heads of HD: its
// deterministic backward on sm90 (kernels/backend_sizes.cpp has the terms). Grows as T².
int64_t cudnn_attention_workspace_bytes(int B, int T, int NH, int HD);
// What the GPU backend leaves free on the card after its one reservation, for device memory taken
// after it that cannot be taken before: cuDNN's plans for a shape met later (another batch size),
// the driver's pools (local memory grows when a kernel with a larger stack first launches), cuBLAS's
// and NCCL's own growth. An estimate until a GPU run measures it: the trainer warns when the
// memory in use grows after the reservation, naming by how much.
constexpr int64_t kGpuHeadroomBytes = int64_t(256) << 20;
// Rows of logits the head holds at once: all N on the CPU; on the GPU a chunk of `chunk_rows`,
// or for 0 as many rows as kHeadChunkElements logits (64 MiB of bf16: 1,048 rows at LLaMA's
// vocabulary of 32,000), never more than N. Each chunk reads and writes the whole fp32 lm_head
// gradient once, so fewer, larger chunks are faster; they also change the order in which that
// gradient is summed (fp32, chunk by chunk).
constexpr int64_t kHeadChunkElements = int64_t(32) << 20;
int64_t head_rows(const Storage& storage, int64_t N, int V, int64_t chunk_rows = 0);
// The GPU's chunk for `chunk_rows` asked, before N caps it: chunk_rows, or for 0 the default
// (0 for a shape without a vocabulary).
int64_t head_chunk(int V, int64_t chunk_rows);
// The larger chunk a run takes where its plan has room (train/run_resolution.h): 4,096 rows, or
// the default chunk where that holds more (a vocabulary under 8,192).
constexpr int64_t kLargeHeadChunkRows = 4096;
int64_t large_head_chunk_rows(int V);

class Backend : public MemoryResource {
 public:
  ~Backend() override = default;
  const Storage& storage() const { return storage_; }
  virtual std::string describe() const = 0;
  // Dense bf16 peak of the device in FLOP/s, for MFU; 0 when unknown (MFU is then n/a).
  virtual double peak_flops() const = 0;
  // The device's memory as its driver reports it, every process's allocations and the CUDA
  // context included (zeros on the CPU, where the arena's figure is the one shown).
  struct DeviceMemory {
    int64_t used = 0, total = 0;
    // The per-thread stack limit (cudaLimitStackSize). The driver raises it, and reserves local
    // memory for every thread the GPU can hold, when a kernel launched needs more.
    int64_t stack_per_thread = 0;
    // What the backend's warm-up took for the kernels' local memory pool before the reservation
    // (kernels/cuda/device.h, take_local_memory_pool); 0 on the CPU.
    int64_t local_pool_taken = 0;
  };
  virtual DeviceMemory device_memory() const = 0;
  // Waits for the queued work: step times measure work done, not work launched.
  virtual void synchronize() = 0;
  // The communicator whose sums work on this backend's memory, for the data-parallel ranks
  // `ranks` (MPI, host memory); null when `ranks` itself serves (the CPU backend's memory is the
  // host's). The CUDA backend's sums its device buffers through NCCL on its own stream.
  virtual std::unique_ptr<Communicator> communicator_for(Communicator& ranks) = 0;

  // ---- memory ---------------------------------------------------------------------------------
  // The GPU takes its memory as one reservation of `total` bytes in `buffers` allocations (the
  // memory plan's figures) and cuts the arena's buffers from it; the CPU allocates each buffer.
  virtual void reserve(int64_t total, int64_t buffers) = 0;
  // Before reserve(): builds what the attention kernels keep per shape of a micro-batch of B
  // sequences of T tokens (cuDNN's graphs, whose plans put kernels on the device), so that it
  // takes its memory before the reservation; for a packed q, k, v and dq, dk, dv packed too
  // (grads_packed) or three buffers. Nothing on the CPU or with the engine's own kernels. A
  // backend made to fall back from cuDNN's (make_cuda_backend) tries them here, the first time:
  // it takes them when libcudnn loads and both graphs build within the planned workspace
  // (cudnn_attention_workspace_bytes), else keeps the engine's. One asked for cuDNN's alone
  // throws the UserError that says why they do not build.
  virtual void prepare_attention(int B, int T, int NH, int NKV, int HD, bool grads_packed) {
    (void)B, (void)T, (void)NH, (void)NKV, (void)HD, (void)grads_packed;
  }
  // The kernels attention runs on (for a backend that may fall back, as prepare_attention left
  // them: the engine's until then).
  virtual AttentionInUse attention_in_use() const { return {}; }
  // Before reserve(): what GaLore's randomized refresh needs that takes device memory of its own
  // (cuSOLVER's handle), for targets of up to max_side rows or columns and k = r + oversample
  // columns; the GPU also checks cuSOLVER's work space against galore_solver_work_floats.
  virtual void prepare_galore_basis(int max_side, int k) { (void)max_side, (void)k; }
  // The same for galore_finish's batches of up to `slots` k x k eigenproblems: the GPU checks
  // cuSOLVER's work space for cusolverDnXsyevBatched against the layout's.
  virtual void prepare_galore_batch(int k, int slots, const GaloreBatchLayout& layout) {
    (void)k, (void)slots, (void)layout;
  }
  // upload and download wait for the transfer (the host buffer is free, or filled, on return).
  virtual void upload(void* dst, const void* host, size_t bytes) = 0;
  virtual void download(void* host, const void* src, size_t bytes) = 0;
  // The host buffer is copied before this returns and the transfer is queued behind the work
  // already queued: the host neither waits nor keeps the buffer (the GPU stages it in pinned
  // memory). What the model and the optimizers send every step goes this way.
  virtual void upload_async(void* dst, const void* host, size_t bytes) = 0;
  // The times the host has waited for the device (a synchronize, a download, an upload, a full
  // staging buffer): a step needs O(1) of them (docs/architecture.md). Always 0 on the CPU.
  virtual int64_t host_waits() const = 0;
  virtual void zero(void* dst, size_t bytes) = 0;

  // ---- the host tier (MemPlace::Host, core/arena.h; docs/memory.md's offload) ------------------
  // Where the arena's host-placed buffers come from: pinned host memory, which the GPU's copy
  // engine reads and writes directly; on the CPU, host memory outside the arena memory_limit caps.
  // upload, download and synchronize also order themselves after the queued copies.
  virtual MemoryResource& host_tier() = 0;
  // Two copy queues, one each way (PCIe is full duplex): Copy::ToDevice's (from the host tier) and
  // Copy::ToHost's (back). Queues a copy of `bytes` from src to dst on `direction`'s queue: it runs
  // after the compute queued so far and the copies queued before it on the same queue, beside the
  // compute queued later and beside the other queue. Neither buffer may be touched until a
  // wait_copies() with a mark taken after this call.
  enum class Copy { ToDevice, ToHost };
  virtual void copy_async(void* dst, const void* src, size_t bytes, Copy direction) = 0;
  // The copies the device can run at once beside its compute: the GPU's copy engines
  // (cudaDevAttrAsyncEngineCount; with one, the two queues' copies take turns), the CPU's two copy
  // threads. The offload planner's link model assumes min(this, 2) queues (LinkModel::copy_queues).
  virtual int copy_engines() const = 0;
  // Runs `task` on `queue` in its order: after the copies queued before on it, before those queued
  // after (the disk tier's file reads and writes between a pinned buffer's copies,
  // model/x_in_ring.h). It runs on another thread and must not call the backend. `reads`: the
  // host bytes it reads, which no copy may write before it runs.
  virtual void copy_queue_task(Copy queue, std::function<void()> task, const void* reads,
                               size_t read_bytes) = 0;
  // A point on one queue: after the copies (and tasks) queued on it before the mark was taken.
  // n = 0: before everything (waiting for it waits for nothing).
  struct CopyMark {
    Copy queue = Copy::ToDevice;
    int64_t n = 0;
  };
  // A mark after the copies queued so far on `queue`; then wait_copies(mark): the compute queued
  // from now on runs after them. The host does not wait for the GPU (an event the compute stream
  // waits on); the CPU, whose compute is the calling thread, waits for its copy thread.
  virtual CopyMark mark_copies(Copy queue) = 0;
  virtual void wait_copies(CopyMark mark) = 0;
  // The cross-queue wait: the copies and tasks queued from now on, on the other queue, run after
  // the mark's (its own queue is in order already). Every reuse across the queues needs one: a
  // slot fetched into after its write-back, host bytes fetched after the copy that wrote them, a
  // bounce buffer read by a task on one queue and refilled on the other. The host does not wait.
  virtual void order_copy_after(CopyMark mark) = 0;
  // The bytes the copy queues have moved and the seconds they spent moving them (each copy from its
  // start to its end, both queues summed: the link's rate, not the step's), since the backend
  // began; on the GPU, copies that finished by the last synchronisation.
  struct CopyTotals {
    int64_t bytes = 0;
    double seconds = 0;
  };
  virtual CopyTotals copy_totals() = 0;
  // weights <-> fp32 on the host: n elements at element offset `first` of a weight buffer
  // (and of the master copy, when there is one: both are written)
  virtual void write_weights(void* weights, float* master, int64_t first, const float* host,
                             int64_t n) = 0;
  virtual void read_weights(float* host, const void* weights, int64_t first, int64_t n) = 0;
  // fp32 on the host <- a grad- or state-typed buffer
  virtual void read_grads(float* host, const void* grads, int64_t first, int64_t n) = 0;
  // The backend's scratch for models of `shape` (backend_scratch(storage(), shape)), allocated from
  // `arena`'s workspace category ("backend.attention", ...: the plan counts it) and, on a real
  // arena, written with what it holds for every pass (the GPU's RoPE table) and put in use. A
  // model takes its lease once, at setup (kernels/backend.cpp).
  std::unique_ptr<ScratchLease> plan_scratch(Arena& arena, const WorkspaceShape& shape);

  // ---- model ops --------------------------------------------------------------------------------
  virtual void linear_forward(void* y, const void* x, const void* w, int64_t N, int in, int out) = 0;
  // y = r + x·wᵀ, r[N,out] not overlapping y: o_proj's and down's output added to the residual
  // stream, the GPU's add in the GEMM's epilogue (one bf16 rounding of the fp32 product plus r)
  virtual void linear_residual_forward(void* y, const void* x, const void* w, const void* r,
                                       int64_t N, int in, int out) = 0;
  // dx = dy·w (+= when accumulate_dx) unless dx is null; dw += dyᵀ·x unless dw is null
  virtual void linear_backward(void* dx, void* dw, const void* dy, const void* x, const void* w,
                               int64_t N, int in, int out, bool accumulate_dx) = 0;
  // tokens: the backend's copy; host_tokens: the same on the host (the GPU groups them there)
  virtual void embedding_forward(void* out, const int32_t* tokens, const void* table, int64_t N,
                                 int C) = 0;
  virtual void embedding_backward(void* dtable, const void* dout, const int32_t* tokens,
                                  const int32_t* host_tokens, int64_t N, int C) = 0;
  virtual void rmsnorm_forward(void* out, float* rstd, const void* x, const void* w, int64_t N,
                               int C, double eps) = 0;
  virtual void rmsnorm_backward(void* dx, void* dw, const void* dout, const void* x, const void* w,
                                const float* rstd, int64_t N, int C) = 0;
  // Causal attention with RoPE: q[B,T,NH,HD] and k[B,T,NKV,HD] as the projections give them,
  // rotated (HF rotate-half, angle t / theta^(2i/HD)) by the forward; dq, dk (overwritten) are the
  // gradients of the unrotated q and k. q, k, v and dq, dk, dv lie at their row pitches
  // (kernels/qkv_rows.h): the model's q, k, v are one GEMM's packed output, and so are its dq, dk,
  // dv when one GEMM forms the three weight gradients. The GPU's kernels rotate the tiles as they
  // load them and leave qkv as it was; the CPU and cuDNN rotate q and k in place, once, so the
  // backward must be given qkv as the forward left it. theta must be the bound WorkspaceShape's.
  // saved: attention_saved_bytes(storage(), B, T, NH) bytes, written by the forward for the
  // backward.
  virtual void attention_forward(void* out, void* saved, QkvRows<void*> qkv, int B, int T, int NH,
                                 int NKV, int HD, double theta) = 0;
  virtual void attention_backward(QkvRows<void*> d, const void* dout, const void* out,
                                  const void* saved, QkvRows<const void*> qkv, int B, int T,
                                  int NH, int NKV, int HD, double theta) = 0;
  // out[N,F] = silu(gate)·up, gate and up the halves of gu[N,2F] (row n: gate's F values, then
  // up's), as one GEMM of gate_proj and up_proj stacked gives them; dgate, dup: N rows of F
  // overwritten at a row pitch of ld (F: two buffers; 2F with dup = dgate + F: packed as gu, for
  // the stacked weights' backward as one GEMM).
  virtual void swiglu_forward(void* out, const void* gu, int64_t N, int F) = 0;
  virtual void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gu, int64_t N,
                               int F, int64_t ld) = 0;
  // A sampled weight gradient's rows (model/row_sampling.h): out[k, D] = scale[j] · x[rows[j], :]
  // (act-typed; rows int32 and scale fp32 [k] in backend memory, scale null: 1), and the
  // sampling weights norms[N] (fp32) = ‖x[n, :]‖₂ of x [N, D].
  virtual void gather_rows(void* out, const void* x, const int32_t* rows, const float* scale,
                           int64_t k, int D) = 0;
  virtual void row_norms(float* norms, const void* x, int64_t N, int D) = 0;
  // crs's k rows (winners: wta-crs's) drawn from the sampling weights norms [N] with stream
  // `stream`, into rows [k] (int32) and scale [k] (fp32), all backend memory: the draw of
  // ops::draw_rows (exact integers, kernels/row_draw.h), the same bits on both backends, on the
  // device with no wait. workspace: draw_rows_workspace_bytes(storage(), N) bytes.
  virtual void draw_rows(int32_t* rows, float* scale, const float* norms, int64_t N, int k,
                         bool winners, uint64_t stream, void* workspace) = 0;
  // Side work (the sampled activations' draws, issue 46): the ops queued between
  // begin_side_work() and end_side_work() run after everything queued before, beside what is
  // queued after (on the GPU a second stream, so latency-bound draws hide behind the GEMMs), in
  // order with earlier side work; join_side_work(mark): what is queued from then on runs after
  // the side work up to the mark end_side_work returned. Anything side work reads must not be
  // written again, nor anything it writes read, before the join. The CPU runs it in place.
  struct SideMark {
    int64_t n = 0;  // 0: none (joining it waits for nothing)
  };
  virtual void begin_side_work() {}
  virtual SideMark end_side_work() { return {}; }
  virtual void join_side_work(SideMark mark) { (void)mark; }
  // The head: logits = nf·wᵀ and *loss (one fp64 of backend memory, overwritten) = the summed
  // cross-entropy over the valid targets (target < 0 is ignored), in a fixed order: the host
  // reads it when it needs it. logits: head_rows(storage(), N, V, chunk) x V act elements, chunk
  // the bound workspace shape's head_chunk_rows (the GPU computes that many rows at a time);
  // lse: N floats.
  virtual void head_forward(void* logits, float* lse, double* loss, const void* nf, const void* w,
                            const int32_t* targets, int64_t N, int C, int V) = 0;
  // dnf = d(loss·dloss_scale)/dnf (overwritten), dw += its weight gradient. Runs after
  // head_forward on the same inputs (the GPU recomputes each chunk's logits here, and uses lse
  // as scratch).
  virtual void head_backward(void* dnf, void* dw, void* logits, float* lse, const void* nf,
                             const void* w, const int32_t* targets, int64_t N, int C, int V,
                             double dloss_scale) = 0;
  // Training's head in one pass: head_forward's *loss, then head_backward's dnf and dw, with
  // each chunk's logits computed once (the GPU's head_backward alone recomputes them).
  virtual void head_forward_backward(void* dnf, void* dw, void* logits, float* lse, double* loss,
                                     const void* nf, const void* w, const int32_t* targets,
                                     int64_t N, int C, int V, double dloss_scale) = 0;
  // After a backward: gradients computed in fp32 take their storage's rounding (CPU pure bf16).
  virtual void store_gradients(void* grads, int64_t n) = 0;

  // ---- optimizer ops ------------------------------------------------------------------------------
  // Gradient clipping without the host: the sums, the norm and the coefficient stay in backend
  // memory, and the updates read the coefficient there (AdamArgs::clip).
  // *acc += Σ x² of a grad-typed buffer, deterministic (acc: one fp64 of backend memory).
  virtual void sum_squares(double* acc, const void* grads, int64_t n) = 0;
  // s (backend memory): coefficient = clip_coefficient(sqrt(pending), max_norm) (optim/clip.h),
  // total += pending, clipped += (coefficient < 1), pending = 0.
  virtual void clip(ClipScalars* s, double max_norm) = 0;
  // AdamW (ops::adamw_update's formula) on n elements of the weight: the master copy when there
  // is one (then the weights take its rounding), else the weights themselves (stochastically
  // rounded in pure bf16, with m and v, from the stream `seed`).
  virtual void adamw_update(WeightRef w, const void* g, void* m, void* v, int64_t n,
                            const AdamArgs& a, uint64_t seed) = 0;
  // The same with 8-bit moments (ops::adamw_update_q8): the weights as above (stochastically
  // rounded in pure bf16 from `seed`'s weight stream), the codes rounded to the nearest; the
  // proximal anchor, if any, is state-typed.
  virtual void adamw_update_q8(WeightRef w, const void* g, const Quant8Moments& s, int64_t n,
                               const AdamArgs& a, uint64_t seed) = 0;
  // GRASS (ops.h): gc += the compressed gradient straight from the activations
  virtual void grass_compressed_grad(void* gc, void* scratch, const void* dy, const void* x,
                                     const int32_t* sigma, const float* rho, int64_t N, int in,
                                     int out, int r, bool rows) = 0;
  // Its cols path in two halves with its bits: xs[N, r] (act-typed) = x[:, σ]·ρ of x[N, width],
  // which the forward can keep instead of x (GRASS `cols` between refreshes), then later
  // gc[out, r] += dyᵀ·xs, dy [N, out] with rows ldy apart (ldy > out: a view of packed dy's).
  virtual void grass_gather_columns(void* xs, const void* x, const int32_t* sigma,
                                    const float* rho, int64_t N, int width, int r) = 0;
  virtual void grass_selected_cols_grad(void* gc, const void* dy, int64_t ldy, const void* xs,
                                        int64_t N, int out, int r) = 0;
  // g[rows, in] = rows row0 .. row0 + rows of the weight gradient dyᵀ·x [out, in], in fp32: a
  // refresh's transient full gradient (GaLore: all of it; GRASS: in chunks of rows). row0 is a
  // multiple of 8 (aligned rows of dy for the GPU's GEMM).
  virtual void full_weight_grad(float* g, const void* dy, const void* x, int64_t N, int in,
                                int out, int row0, int rows) = 0;
  // A refresh's slice norms, gathered in the backend's own fp64 buffer so that a target's
  // chunks cost one wait, not one each. g holds rows row0 .. row0 + rows of a weight gradient
  // [out, in] (full_weight_grad): by_rows, their squared norms are written at [row0, row0 + rows);
  // otherwise its columns' squared norms are added to [0, in) (set, when row0 == 0).
  virtual void grass_slice_norms(const float* g, int row0, int rows, int in, bool by_rows) = 0;
  // The buffer's first n norms, on the host.
  virtual void read_slice_norms(double* host, int n) = 0;
  // A target's selected slices out of w[out, in] (weight-typed) into delta and back
  // (ops::pack_slices, unpack_slices), σ in backend memory.
  virtual void pack_slices(void* delta, const void* w, const int32_t* sigma, int count, int out,
                           int in, bool rows) = 0;
  virtual void unpack_slices(void* w, const void* delta, const int32_t* sigma, int count, int out,
                             int in, bool rows) = 0;
  // The sparse Adam update of one target (ops::grass_adam_update), the weight w[out, in] as in
  // adamw_update. gc may be overwritten.
  virtual void grass_adam_update(WeightRef w, void* gc, void* m, void* v, const GrassSlices& s,
                                 double alpha, const AdamArgs& a, uint64_t seed) = 0;
  // The same with 8-bit moments (ops::grass_adam_update_q8; σ distinct), blocked flat or down
  // gc's columns (by_columns); the weight as in adamw_update_q8.
  virtual void grass_adam_update_q8(WeightRef w, const void* gc, const Quant8Moments& q,
                                    bool by_columns, const GrassSlices& s, double alpha,
                                    const AdamArgs& a, uint64_t seed) = 0;

  // GaLore and FLORA (kernels/lowrank_ops.h). workspace: lowrank_workspace_bytes(storage(), ...)
  // R (grad-typed) += the projected gradient straight from the activations; scratch [N, r] act.
  virtual void lowrank_compressed_grad(void* R, void* scratch, void* workspace, const void* dy,
                                       const void* x, int64_t N, const LowRankProjection& p) = 0;
  // P = the sign-normalised top-r singular vectors of g[out, in] (both fp32 backend memory), exact
  // or by the randomized range finder as `how` says; workspace: galore_basis_workspace_bytes.
  // status (backend memory, 4 ints; null unless the refresh is randomized on a GPU): there the
  // GPU keeps, per kind, the first non-zero status of its QRs, eigensolver and Cholesky
  // factorisations (0: fine), so a refresh of many targets reads them once
  // (GaLore::check_refresh_status) instead of waiting for the device after each; the CPU's
  // LAPACK throws at once.
  virtual void galore_basis(float* P, const float* g, int out, int in, int r, bool rows,
                            const GaloreBasisMethod& how, void* workspace, int* status) = 0;
  // The randomized refresh of several targets with one batched eigensolver call (GaLore's
  // optimizer.svd_batch "layer"), in two halves. galore_sketch runs the range finder of one target
  // (`how` randomized) up to its eigenproblem, k = ops::galore_sketch_columns, and keeps Q and S in
  // slot `slot` of `batch` (backend memory laid out as `layout`; the slots of one finish share k).
  // galore_finish solves slots 0 .. count-1 at once (cuSOLVER's cusolverDnXsyevBatched on a GPU,
  // LAPACK's syevd for each on the CPU) and writes P[i] [sides[i], r], sign-normalised. A sketch
  // then a finish of one slot is galore_basis's randomized refresh, bit for bit on the CPU and the
  // emulator, whose batched eigensolver is syevd for each. workspace and status as galore_basis's
  // (the eigensolver's first non-zero info over the slots in status[2]).
  virtual void galore_sketch(const float* g, int out, int in, int r, bool rows,
                             const GaloreBasisMethod& how, void* batch,
                             const GaloreBatchLayout& layout, int slot, void* workspace,
                             int* status) = 0;
  virtual void galore_finish(float* const* P, const int* sides, int count, int k, int r,
                             void* batch, const GaloreBatchLayout& layout, void* workspace,
                             int* status) = 0;
  // The randomized refresh's phase times since the last call (GRASS_GALORE_TIMERS=1, else none),
  // then reset; a GPU waits for the last timed refresh's events.
  virtual ops::GaloreRefreshTimes take_galore_refresh_times() {
    return ops::take_galore_refresh_times();
  }
  // P [side, r] = FLORA's projection number `refresh` of tensor `tensor`.
  virtual void flora_projection(float* P, uint64_t seed, int64_t tensor, int64_t refresh,
                                int side, int r) = 0;
  // m (state-typed) = down_new(up_old(m)); p.P is the new projection. scratch: fp32
  // [r·r + numel(m)]. Pure bf16 stores m with stochastic rounding from `seed`.
  virtual void flora_transfer(void* m, float* scratch, const float* P_old,
                              const LowRankProjection& p, uint64_t seed) = 0;
  // Adam on R (overwritten) and the dense update of w through the back-projection; weights and
  // master as in adamw_update. max_rms > 0 bounds the update's RMS (FLORA; ops::lowrank_adam_update).
  virtual void lowrank_adam_update(WeightRef w, void* R, void* m, void* v, void* workspace,
                                   const LowRankProjection& p, double alpha, double max_rms,
                                   const AdamArgs& a, uint64_t seed) = 0;
  // The same two with 8-bit moments (ops::lowrank_adam_update_q8, ops::flora_transfer_q8),
  // blocked flat or down R's columns; the transfer's scratch is fp32 [r·r + 2·numel(m)].
  virtual void lowrank_adam_update_q8(WeightRef w, void* R, const Quant8Moments& q,
                                      bool by_columns, void* workspace, const LowRankProjection& p,
                                      double alpha, double max_rms, const AdamArgs& a,
                                      uint64_t seed) = 0;
  virtual void flora_transfer_q8(const Quant8Moments& q, bool by_columns, float* scratch,
                                 const float* P_old, const LowRankProjection& p) = 0;

 protected:
  explicit Backend(const Storage& storage) : storage_(storage) {}
  // The scratch the ops compute with from now on; null: none (the last lease ended).
  virtual void use_scratch(const ScratchLease* lease) = 0;
  // Writes what a new lease's scratch holds for every pass, before its first use.
  virtual void init_scratch(const ScratchLease& lease) { (void)lease; }
  Storage storage_;

 private:
  friend class ScratchLease;
  const ScratchLease* lease_in_use() const;  // null when none is alive
  std::vector<ScratchLease*> leases_;        // alive, oldest first
};

std::unique_ptr<Backend> make_cpu_backend(const Storage& storage);
// A backend that only carries a storage (any device's), for planning arenas, which size every
// buffer and run no op: `grass mem` plans a GPU run without a GPU.
std::unique_ptr<Backend> make_planning_backend(const Storage& storage);
// The fp32 CPU backend, for what builds a model without choosing one (tests, tools).
Backend& default_cpu_backend();
// On GPU `device` (a rank's index on its node), attention by `attention`'s kernels. Throws
// UserError when no usable GPU is present, or cuDNN attention is asked of a build or machine
// without it; only in builds with CUDA. With fall_back_to_grass (the run config's attention
// "auto") cuDNN's kernels are only tried, in prepare_attention (a training run's, before its
// reservation; forward-only models keep the engine's): where libcudnn does not load or the graphs
// do not build, the engine's kernels stay, and attention_in_use() says why.
std::unique_ptr<Backend> make_cuda_backend(const Storage& storage, int device = 0,
                                           AttentionKernel attention = AttentionKernel::Grass,
                                           bool fall_back_to_grass = false);

}  // namespace grass
