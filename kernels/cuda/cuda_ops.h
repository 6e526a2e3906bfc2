// The CUDA kernels: the same ops as kernels/ops.h (the CPU reference), on device pointers.
// Include only from .cu files and GPU tests (it needs cuda_bf16.h).
//
// Storage and math
//   Activations and the compute copy of the weights are bf16; every kernel computes in fp32
//   and rounds once when it stores. Per-row statistics (rstd, logsumexp) are fp32.
//   A parameter gradient is fp32 (precision "bf16-mixed") or bf16 (precision "bf16"): the
//   functions that write one take a GradType. Parameter gradients ACCUMULATE (+=), as on the CPU.
//   Shapes, layouts and names follow kernels/ops.h: row-major, a weight W is [out, in],
//   N = tokens, C hidden, F ffn, V vocab, NH/NKV heads, HD head dim.
// Every function launches on ctx.stream and checks its launch; none synchronises.
// Every reduction has a fixed order (no atomics on floats): two identical runs give identical
// bits.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/adam_args.h"
#include "kernels/backend.h"
#include "kernels/clip_rule.h"
#include "kernels/lowrank_ops.h"
#include "kernels/qkv_rows.h"
#include "kernels/quant8.h"

struct cusolverDnContext;  // cuSOLVER's handle, as cusolverDn.h declares it
using cusolverDnHandle_t = cusolverDnContext*;
struct cusolverDnParams;  // the 64-bit API's parameters, likewise
using cusolverDnParams_t = cusolverDnParams*;

namespace grass::cuda {

using bf16 = __nv_bfloat16;

struct Context {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;  // cublasGemmEx, for what cuBLASLt has no kernel for
  void* lt_workspace = nullptr;  // cuBLASLt's workspace
  size_t lt_workspace_bytes = 0;
};

enum class GradType { F32, BF16 };

// ---- GEMM through cuBLASLt (kernels/cuda/gemm.cu; gemm.cuh has the GEMM itself) -------------
// Context::blas: a cuBLAS handle whose math mode keeps split-K reductions in fp32. cublasCreate
// takes device memory: the backend makes it before reserving the run's memory.
cublasHandle_t create_gemm_fallback_handle();

// ---- linear (kernels/cuda/linear.cu): bf16 inputs, fp32 accumulation -------------------------
// y[N,out] = x[N,in] · w[out,in]ᵀ
void linear_forward(const Context& ctx, bf16* y, const bf16* x, const bf16* w, int64_t N, int in,
                    int out);
// y[N,out] = r[N,out] + x[N,in] · w[out,in]ᵀ, the add in the GEMM's epilogue: the product's fp32
// sum plus r, rounded to bf16 once. r is read only and must not overlap y (o_proj's and down's
// output on the residual stream: r the stream before the block, y the stream after it).
void linear_residual_forward(const Context& ctx, bf16* y, const bf16* x, const bf16* w,
                             const bf16* r, int64_t N, int in, int out);
// dx[N,in] = dy[N,out] · w[out,in]   (dx += ... when accumulate_dx)
void linear_backward_dx(const Context& ctx, bf16* dx, const bf16* dy, const bf16* w, int64_t N,
                        int in, int out, bool accumulate_dx);
// dw[out,in] += dy[N,out]ᵀ · x[N,in]   (β = 1 in the GEMM: accumulation costs no extra pass);
// dw is float* or bf16* as gtype says.
void linear_backward_dw(const Context& ctx, void* dw, GradType gtype, const bf16* dy, const bf16* x,
                        int64_t N, int in, int out);
// Rows row0 .. row0 + rows of a refresh's transient fp32 full gradient (GaLore: all of them;
// GRASS: a chunk at a time): g[rows, in] = (dyᵀ · x)[row0 :, :]. row0 a multiple of 8 keeps the
// columns of dy 16-byte aligned.
void linear_full_grad_f32(const Context& ctx, float* g, const bf16* dy, const bf16* x, int64_t N,
                          int in, int out, int row0, int rows);

// ---- embedding (kernels/cuda/embedding.cu) ---------------------------------------------------
// out[N,C] = table[tokens[n], :]; tokens < V is the caller's promise (the loader checks the
// shards against the vocabulary before training).
void embedding_forward(const Context& ctx, bf16* out, const int32_t* tokens, const bf16* table,
                       int64_t N, int C);
// dtable[token, :] += Σ dout[n, :] over the n holding that token, without atomics: the host
// groups positions by token (CudaBackend::embedding_backward, a counting sort) and one block sums
// each group in order.
//   positions[N]:        the token positions, grouped by token id (ascending within a group)
//   group_start[G + 1]:  group g is positions[group_start[g] .. group_start[g+1])
//   group_token[G]:      the token id of group g
void embedding_backward(const Context& ctx, void* dtable, GradType gtype, const bf16* dout,
                        const int32_t* positions, const int32_t* group_start,
                        const int32_t* group_token, int num_groups, int C);

// ---- RMSNorm (kernels/cuda/rmsnorm.cu; C ≤ 12256, the backward's shared-memory partials) ------
// out[N,C] = w[C] * x * rstd,  rstd[N] = 1/sqrt(mean(x²) + eps)
void rmsnorm_forward(const Context& ctx, bf16* out, float* rstd, const bf16* x, const bf16* w,
                     int64_t N, int C, float eps);
// dx[N,C] += ∂/∂x (the residual stream accumulates);  dw[C] += ∂/∂w.
// dw's column sums go through scratch[rmsnorm_scratch_floats(N, C)] in a fixed order.
int64_t rmsnorm_scratch_floats(int64_t N, int C);
void rmsnorm_backward(const Context& ctx, bf16* dx, void* dw, GradType gtype, const bf16* dout,
                      const bf16* x, const bf16* w, const float* rstd, float* scratch, int64_t N,
                      int C);
// For the kernel lab alone, which times the block-per-row kernels beside the warp-per-row ones
// (issue 45): true sends every row of the two calls above to the block-per-row kernels.
void rmsnorm_force_block_kernels(bool on);

// ---- RoPE (kernels/cuda/rope.cu), HF rotate-half on x[B,T,H,HD], in place ----------------------
// Rows at a pitch of ld elements (0: H·HD). The engine's attention kernels apply RoPE as they load
// q and k (RopeTable below), and these two are the unfused reference their tests compare with;
// cuDNN's attention takes q and k rotated by these, in place in the packed q, k, v.
void rope_forward(const Context& ctx, bf16* x, int B, int T, int H, int HD, float theta,
                  int64_t ld = 0);
void rope_backward(const Context& ctx, bf16* dx, int B, int T, int H, int HD, float theta,
                   int64_t ld = 0);
// table[2·T·HD/2] = cos then sin of the angle t / theta^(2i/HD), t < T, i < HD/2 ([T, HD/2] each),
// computed as rope_forward computes them (double, narrowed to fp32), so a rotation by the table
// gives rope_forward's bits.
void rope_table(const Context& ctx, float* table, int T, int HD, float theta);

// ---- SwiGLU (kernels/cuda/swiglu.cu) ---------------------------------------------------------
// gate and up are the halves of gu[N, 2F] (ops.h); out, dout are [N, F], dgate and dup N rows
// of F at a pitch of ld (F, or 2F packed as gu with dup = dgate + F)
void swiglu_forward(const Context& ctx, bf16* out, const bf16* gu, int64_t N, int F);
void swiglu_backward(const Context& ctx, bf16* dgate, bf16* dup, const bf16* dout, const bf16* gu,
                     int64_t N, int F, int64_t ld);

// ---- row sampling (kernels/cuda/sampling.cu) -------------------------------------------------
// out[j, :] = scale[j] · x[rows[j], :] for j < k (scale null: 1), rounded once; out [k, D]
void gather_rows(const Context& ctx, bf16* out, const bf16* x, const int32_t* rows,
                 const float* scale, int64_t k, int D);
// norms[n] = ‖x[n, :]‖₂ in fp32, x [N, D]
void row_norms(const Context& ctx, float* norms, const bf16* x, int64_t N, int D);
// crs's k rows (winners: wta-crs's) drawn from the weights norms [N] with stream `stream`, as
// ops::draw_rows draws them (kernels/row_draw.h), into rows [k] and scale [k], on the stream;
// workspace: draw_rows_workspace_bytes(N) (kernels/backend.h).
void draw_rows(const Context& ctx, int32_t* rows, float* scale, const float* norms, int64_t N,
               int k, bool winners, uint64_t stream, void* workspace);

// ---- causal attention with GQA (kernels/cuda/attention.cu) -----------------------------------
// q[B,T,NH,HD], k,v[B,T,NKV,HD] at their row pitches (kernels/qkv_rows.h: three buffers or one
// packed q, k, v; pitches of a multiple of 8); query head h reads kv head h / (NH/NKV).
// Flash-style: the T x T scores never exist in memory; the forward keeps lse[B,NH,T] (natural-log
// logsumexp of the scaled scores) for the backward, which recomputes them. HD ∈ {64, 128} (and
// any multiple of 8 ≤ 256).
// With a RoPE table, q and k are the projections' outputs and the kernels rotate them as they load
// them (the rotated tiles are rope_forward's bits), and dq, dk are the gradients of the unrotated
// q and k (rotated back in fp32 before their one rounding); without one (table null), q and k are
// used as they are.
struct RopeTable {
  const float* table = nullptr;  // rope_table() of at least T positions and this HD
  int T = 0;                     // the positions it holds
};
void attention_forward(const Context& ctx, bf16* out, float* lse, QkvRows<const bf16*> qkv, int B,
                       int T, int NH, int NKV, int HD, RopeTable rope = {});
// dq, dk, dv overwritten at dqkv's pitches (the rest of a packed row left alone).
// scratch[attention_scratch_floats(...)] holds D = rowsum(dout ⊙ out), [B,NH,T] fp32; dK/dV
// accumulate in registers over the query heads sharing a kv head.
int64_t attention_scratch_floats(int B, int T, int NH, int NKV, int HD);
void attention_backward(const Context& ctx, QkvRows<bf16*> dqkv, float* scratch, const bf16* dout,
                        const bf16* out, const float* lse, QkvRows<const bf16*> qkv, int B, int T,
                        int NH, int NKV, int HD, RopeTable rope = {});

// ---- the `attention: "mma"` kernels (kernels/cuda/attention_mma.cu) ---------------------------
// attention_forward's and attention_backward's contracts without RoPE (q and k already rotated, as
// for cuDNN), on sm_80's mma.sync, ldmatrix and cp.async, FA2-style, for the head dims
// attention_mma_takes(HD) (16, 32, 64, 128); any other HD runs the old kernels, whose out and lse
// are the same contract, so either backward takes either forward's. The backward has two paths:
// A, one CTA per kv head and batch with dQ summed in shared memory (HD ≤ 64, T ≤ 256, the group's
// dQ within shared memory: attention_backward_mma_path_a_takes), and B, a dK/dV kernel per key
// block and a dQ kernel per query block (any T, HD 128). Auto takes A where it can.
bool attention_mma_takes(int HD);
void attention_forward_mma(const Context& ctx, bf16* out, float* lse, QkvRows<const bf16*> qkv,
                           int B, int T, int NH, int NKV, int HD);
enum class MmaBackwardPath { Auto, A, B };
bool attention_backward_mma_path_a_takes(int T, int NH, int NKV, int HD);
// scratch: attention_scratch_floats(...), D = rowsum(dout ⊙ out) for path B and the old backward
void attention_backward_mma(const Context& ctx, QkvRows<bf16*> dqkv, float* scratch,
                            const bf16* dout, const bf16* out, const float* lse,
                            QkvRows<const bf16*> qkv, int B, int T, int NH, int NKV, int HD,
                            MmaBackwardPath path = MmaBackwardPath::Auto);

// ---- cuDNN's fused flash attention (kernels/cudnn/attention_cudnn.cpp) -----------------------
// The `attention: "cudnn"` option: the same contract as attention_forward/backward without RoPE
// (q and k already rotated), stats [B,NH,T] fp32 in place of lse, and a cuDNN workspace of at
// least workspace_bytes(shape) (its graphs are built at the first call of a shape and of its row
// pitches, and kept). libcudnn.so.9 is loaded at run time: make_cudnn_attention throws a UserError
// where it is missing.
class CudnnAttention {
 public:
  virtual ~CudnnAttention() = default;
  // cudnnGetVersion() of the libcudnn loaded (major·10000 + minor·100 + patch: 91002 is 9.10.2):
  // its kernels' bits may change with it.
  virtual int64_t version() const = 0;
  // Builds the graphs of the shape for a packed q, k, v, and dq, dk, dv packed or three buffers.
  virtual int64_t workspace_bytes(int B, int T, int NH, int NKV, int HD, bool grads_packed) = 0;
  virtual void forward(bf16* out, float* stats, QkvRows<const bf16*> qkv, int B, int T, int NH,
                       int NKV, int HD, void* workspace, int64_t workspace_bytes) = 0;
  virtual void backward(QkvRows<bf16*> d, const bf16* dout, const bf16* out, const float* stats,
                        QkvRows<const bf16*> qkv, int B, int T, int NH, int NKV, int HD,
                        void* workspace, int64_t workspace_bytes) = 0;
};
std::unique_ptr<CudnnAttention> make_cudnn_attention(cudaStream_t stream);
// The frontend's own checks (graph.validate(): shapes, strides, the mask, the deterministic
// backward) of the forward and backward graphs of one shape for GPUs of `sm_version` (90: Hopper),
// without a GPU, for the model's layouts (a packed q, k, v; dq, dk, dv packed and as three
// buffers): "" or what fails. A UserError where libcudnn.so.9 does not load.
std::string validate_cudnn_attention(int B, int T, int NH, int NKV, int HD, int sm_version);
// Which of `libraries` do not load here (dlopen), as dlerror's lines joined by "; "; empty when
// all do. cuDNN's shim opens its engine libraries at run time, and its runtime-compiled engines
// (most of Hopper's attention) open NVRTC: a graph whose engine cannot load fails to build with a
// message that names neither, so a failed build names them from this.
std::string libraries_that_do_not_load(const std::vector<std::string>& libraries);

// ---- cross-entropy, fused with its backward (kernels/cuda/cross_entropy.cu) ------------------
// On one chunk of rows of logits[n, V] (bf16, the lm_head GEMM's output): loss[i] =
// logsumexp(row) - row[target] (0 on an ignored row, target < 0), and the row is overwritten
// IN PLACE with its gradient (softmax - onehot(target)) · dloss_scale (0 on ignored rows).
// No fp32 copy of the probabilities exists; the caller loops over chunks of tokens.
void cross_entropy_fused(const Context& ctx, bf16* logits, float* loss, const int32_t* targets,
                         int64_t n, int V, float dloss_scale);

// ---- AdamW (kernels/cuda/adamw.cu) -----------------------------------------------------------
// One decoupled-AdamW step, the formula of ops::adamw_update, on g·grad_scale (grad_scale is the
// clipping coefficient). Two storage schemes:
//   master != nullptr ("bf16-mixed"): master[n] fp32 is the weight; m, v fp32; param[n] (bf16,
//     the compute copy) = round-to-nearest(master) afterwards. g is fp32.
//   master == nullptr ("bf16"): param is the weight; m, v bf16; every store of param, m and v
//     rounds stochastically, with the streams rounding_stream_seed(seed, step, buffer) and the
//     element index as the counter (kernels/stochastic_round.h, as the CPU backend rounds);
//     callers pass a different seed per tensor. g is bf16.
// The kernels take every scalar of `a` narrowed to fp32 first, and the step-dependent ones
// adam_scalars() (kernels/adam_args.h) derives from those in double on the host.
void adamw_update(const Context& ctx, bf16* param, float* master, const void* g, void* m, void* v,
                  int64_t n, const AdamArgs& a, uint64_t seed);
// The same step with 8-bit moments (ops::adamw_update_q8 is the reference; the kernels:
// kernels/cuda/quant8.cuh), in blocks of a power of two from 8 to 4096: codes, absmax and weights
// the CPU's bit for bit (every rounding of the step written out). The weight and g as in
// adamw_update; the anchor is fp32 (mixed) or bf16 (pure).
void adamw_update_q8(const Context& ctx, bf16* param, float* master, const void* g,
                     const Quant8Moments& s, int64_t n, const AdamArgs& a, uint64_t seed);

// ---- the reductions behind clipping (kernels/cuda/reduce.cu) ---------------------------------
// Σ x² over n elements of fp32 or bf16 (gtype), deterministically: fixed blocks, then one block
// sums the partials in order. Adds the double result to *acc (device memory).
// scratch[sum_squares_scratch_doubles(n)].
int64_t sum_squares_scratch_doubles(int64_t n);
void sum_squares(const Context& ctx, double* acc, const void* x, GradType gtype, int64_t n,
                 double* scratch);
// *acc += Σ x[i] over n fp32 elements, in the same fixed order (the head's loss).
void sum(const Context& ctx, double* acc, const float* x, int64_t n, double* scratch);
// Backend::clip (kernels/backend.h): the clipping coefficient from s->pending, on the device.
void clip(const Context& ctx, ClipScalars* s, double max_norm);

// ---- bf16 storage (kernels/cuda/bf16_storage.cu) ---------------------------------------------
// Conversions: bf16[n] = round-to-nearest(f32[n]); f32[n] = bf16[n].
void f32_to_bf16(const Context& ctx, bf16* out, const float* in, int64_t n);
void bf16_to_f32(const Context& ctx, float* out, const bf16* in, int64_t n);

// ---- GRASS (kernels/cuda/grass.cu; the CPU reference: kernels/cpu/grass.cpp) -----------------
// The compressed gradient straight from the activations, gathered then one GEMM:
//   rows: gc[r, in]  += ρ ⊙ (dy[:, σ])ᵀ · x
//   cols: gc[out, r] += dyᵀ · (x[:, σ] ⊙ ρ)
// gc is fp32 or bf16 (gtype); scratch[N, r] (bf16) holds the gathered, ρ-scaled columns.
void grass_compressed_grad(const Context& ctx, void* gc, GradType gtype, bf16* scratch,
                           const bf16* dy, const bf16* x, const int32_t* sigma, const float* rho,
                           int64_t N, int in, int out, int r, bool rows);
// Its halves, of which it is made: xs[N, r] = source[:, σ] ⊙ ρ of source[N, width], and
// gc[out, r] += dyᵀ · xs (the cols GEMM from columns the forward kept), dy's rows ldy apart.
void grass_gather_columns(const Context& ctx, bf16* xs, const bf16* source, const int32_t* sigma,
                          const float* rho, int64_t N, int width, int r);
void grass_selected_cols_grad(const Context& ctx, void* gc, GradType gtype, const bf16* dy,
                              int64_t ldy, const bf16* xs, int64_t N, int out, int r);
// norms_sq[out] (rows) or norms_sq[in] (cols) = squared L2 norms of the slices of g[out, in]
// (fp32), each in a fixed order; cols with `accumulate`: norms_sq[c] += the column's.
void grass_slice_norms(const Context& ctx, double* norms_sq, const float* g, int out, int in,
                       bool rows, bool accumulate);
// Adam on gc·grad_scale (m, v shaped like gc; step counts from 1 since the last refresh), then
// the sparse update w[σ_j] -= lr·alpha·scale_j·Δ_j (rows: w[σ_j, :]; cols: w[:, σ_j]), scale_j the
// slice's step factor (ops::grass_adam_update). σ is sorted ascending and may repeat: the Δ of
// repeated slices add up, in j order, with no atomics.
// Decoupled weight decay multiplies each distinct selected slice by (1 - lr·wd) once.
// Storage as in adamw_update: master != nullptr: the weight is master (fp32, [out,in]), m, v, gc
// fp32, and the touched slices of param are re-rounded from master; master == nullptr: the
// weight is param (bf16), m, v, gc bf16, with stochastic rounding on every store.
// Scalars narrowed as in adamw_update (alpha too).
void grass_adam_update(const Context& ctx, bf16* param, float* master, const void* gc, void* m,
                       void* v, const int32_t* sigma, const float* scale, int out, int in, int r,
                       bool rows, double alpha, const AdamArgs& a, uint64_t seed);
// A target's selected slices packed and back (ops::pack_slices, unpack_slices).
void pack_slices(const Context& ctx, bf16* delta, const bf16* w, const int32_t* sigma, int count,
                 int out, int in, bool rows);
void unpack_slices(const Context& ctx, bf16* w, const bf16* delta, const int32_t* sigma, int count,
                   int out, int in, bool rows);
// The same with 8-bit moments (ops::grass_adam_update_q8 is the reference; σ distinct), blocked
// flat or down gc's columns; the weight and gc as in grass_adam_update, the anchor state-typed.
void grass_adam_update_q8(const Context& ctx, bf16* param, float* master, const void* gc,
                          const Quant8Moments& q, bool by_columns, const int32_t* sigma,
                          const float* scale, int out, int in, int r, bool rows, double alpha,
                          const AdamArgs& a, uint64_t seed);

// ---- GaLore and FLORA (kernels/cuda/lowrank.cu) -------------------------------------------
// The CPU reference: kernels/cpu/lowrank.cpp (kernels/lowrank_ops.h; the formulas:
// docs/lowrank.md). w[out, in] trains through P, fp32 [side, r] in device memory (side = out when
// `rows`, else in). The GEMMs read a bf16 copy of P, transposed, that each call writes into
// `workspace` (workspace_bytes = lowrank_workspace_bytes() of kernels/backend_sizes.cpp, the one
// place that sizes it; every function checks that its layout fits):
//   [0, H)       Pt bf16 [r, side]                                   H = align16(2·r·max(out, in))
//   [H, 2H)      the Adam direction, scaled by the step: bf16 [r, in] (rows) or [out, r] (cols)
//   [2H, 2H+16)  one double: Σ direction² for the update's RMS bound (max_rms)
//   [2H+16, end) pure bf16 only: the fp32 back-projection of a chunk of whole rows of w
//                [rows_c, in], rows_c = what fits (a multiple of 8 where it can be)
// Bytes of the first three regions (what bf16-mixed needs):
int64_t lowrank_workspace_prefix_bytes(int out, int in, int r);
// R += the projected gradient straight from the activations (the out x in gradient never exists):
//   rows: scratch[N, r] = dy[N, out]·P;  R[r, in]  += scratchᵀ·x[N, in]
//   cols: scratch[N, r] = x[N, in]·P;    R[out, r] += dyᵀ·scratch
// R fp32 or bf16 (gtype), accumulated by the GEMM's β = 1; scratch bf16 [N, r].
void lowrank_compressed_grad(const Context& ctx, void* R, GradType gtype, bf16* scratch,
                             void* workspace, int64_t workspace_bytes, const bf16* dy,
                             const bf16* x, const float* P, int64_t N, int in, int out, int r,
                             bool rows);
// FLORA's projection P [side, r]: ops::flora_projection's stream drawn on the device (no host
// round trip); equal to the CPU's up to the device's double log and cos, then fp32 rounding.
void flora_projection(const Context& ctx, float* P, uint64_t seed, int64_t tensor, int64_t refresh,
                      int side, int r);
// FLORA's moment transfer m = down_new(up_old(m)) through C = P_oldᵀ·P_new [r, r]:
//   rows: m[r, in] = Cᵀ·m;   cols: m[out, r] = m·C
// m fp32 or bf16 (stype: the moments' storage; bf16 stores round stochastically from
// rounding_stream_seed(seed, 0, kRoundFirstMoment), as the CPU backend rounds: the caller's seed
// differs per step and tensor);
// scratch fp32 [r·r + numel(m)] holds C and an fp32 copy of m. Every sum runs in a fixed order.
void flora_transfer(const Context& ctx, void* m, GradType stype, float* scratch,
                    const float* P_old, const float* P_new, int out, int in, int r, bool rows,
                    uint64_t seed);
// GaLore's Adam step on R and the dense update of w through the back-projection (the formula of
// ops::lowrank_adam_update, galore_torch's order):
//   m = b1·m + (1-b1)·g;  v = b2·v + (1-b2)·g²;  N = m / (sqrt(v) + eps)   (g = R·grad_scale)
//   w = w·decay + s·back(N),  s = -lr·sqrt(1-b2^t)/(1-b1^t)·alpha·decay,  decay = 1 - lr·wd
// with back(N) = P·N (rows) or N·Pᵀ (cols). Storage as in grass_adam_update:
//   master != nullptr: R, m, v fp32; the GEMM writes master with β = decay, then
//     param = round-to-nearest(master);
//   master == nullptr: R, m, v, param bf16; m, v and param round stochastically (streams
//     rounding_stream_seed(seed, step, buffer), the element index as the counter), the
//     back-projection going through the workspace's fp32 chunk.
// R is read only. 1 - beta is computed in double then narrowed, as the CPU op does.
// max_rms > 0: the RMS bound of ops::lowrank_adam_update (FLORA), measured on the bf16 direction
// (Σ d² by sum_squares, through reduce_scratch: sum_squares_scratch_doubles(numel(R)) doubles) and
// applied to it before the back-projection, on the device (no host wait); 0: no bound, and
// reduce_scratch may be null.
void lowrank_adam_update(const Context& ctx, bf16* param, float* master, const void* R, void* m,
                         void* v, void* workspace, int64_t workspace_bytes, double* reduce_scratch,
                         const float* P, int out, int in, int r, bool rows, double alpha,
                         double max_rms, const AdamArgs& a, uint64_t seed);
// The same with 8-bit moments (ops::lowrank_adam_update_q8), blocked flat or down R's columns.
void lowrank_adam_update_q8(const Context& ctx, bf16* param, float* master, const void* R,
                            const Quant8Moments& q, bool by_columns, void* workspace,
                            int64_t workspace_bytes, double* reduce_scratch, const float* P,
                            int out, int in, int r, bool rows, double alpha, double max_rms,
                            const AdamArgs& a, uint64_t seed);
// FLORA's transfer of an 8-bit m (ops::flora_transfer_q8): decoded, carried through C in fp32,
// requantized; scratch fp32 [r·r + 2·numel(m)].
void flora_transfer_q8(const Context& ctx, const Quant8Moments& q, bool by_columns, float* scratch,
                       const float* P_old, const float* P_new, int out, int in, int r, bool rows);

// ---- 8-bit blockwise quantization (kernels/cuda/quant8.cu; the format: kernels/quant8.h) --------
// ops::quantize_blockwise and ops::dequantize_blockwise on device memory, code for code the CPU's.
void quantize_blockwise(const Context& ctx, const Quant8Map& map, const float* x, int64_t n,
                        int block, uint8_t* codes, float* absmax);
void dequantize_blockwise(const Context& ctx, const Quant8Map& map, const uint8_t* codes,
                          const float* absmax, int64_t n, int block, float* x);
// ops::quantize_layout and ops::dequantize_layout: the blocks of any Quant8Layout.
void quantize_layout(const Context& ctx, const Quant8Map& map, const float* x,
                     const Quant8Layout& layout, uint8_t* codes, float* absmax);
void dequantize_layout(const Context& ctx, const Quant8Map& map, const uint8_t* codes,
                       const float* absmax, const Quant8Layout& layout, float* x);

// ---- GaLore's randomized refresh (kernels/cuda/galore_basis.cu) ------------------------------
// ops::galore_basis_randomized on the device: fp32 GEMMs (gemm_f32), cuSOLVER's QR (geqrf, orgqr),
// Cholesky (potrf) with cuBLAS's trsm, and eigensolver (syevd), kernels for the test matrix, the
// shift and the signs. The same test matrix as the
// CPU's for a seed, so P spans the CPU's subspace to within rounding (not its bits: other
// summation orders, another QR). cusolverDnCreate takes device memory: the backend makes the
// handle before the reservation.
cusolverDnHandle_t create_solver_handle(cudaStream_t stream);
void destroy_solver_handle(cusolverDnHandle_t solver);
cusolverDnParams_t create_solver_params();
void destroy_solver_params(cusolverDnParams_t params);
// The floats of work space cuSOLVER asks for to orthonormalise m x k and solve a k x k
// eigenproblem (the largest of geqrf's, orgqr's, syevd's and the k x k potrf's).
int64_t solver_work_floats(cusolverDnHandle_t solver, int m, int k);
// P[side, r] from G[out, in] (fp32 device memory); workspace: galore_basis_workspace_bytes of
// kernels/backend_sizes.cpp (galore_basis.cu carves it and checks that it fits). status (device
// memory, 4 ints) keeps each of cuSOLVER's statuses (the last geqrf's, orgqr's, syevd's, and
// every potrf's of the CholeskyQR2 passes) where it is still 0, so over a refresh's targets it holds the first failure of each kind: the caller
// zeroes it before the refresh and reads it once after (GaLore::check_refresh_status).
void galore_basis_randomized(const Context& ctx, cusolverDnHandle_t solver, float* P,
                             const float* G, int out, int in, int r, bool rows, uint64_t seed,
                             int power_iters, int oversample, void* workspace,
                             int64_t workspace_bytes, int* status);
// Backend::galore_sketch and galore_finish on the device: the range finder of one target into a
// batch slot (the same steps as galore_basis_randomized, its Q and S kept in the slot), then one
// cusolverDnXsyevBatched call over `count` slots and each P as galore_basis_randomized forms it.
// params: a cusolverDnParams_t (the 64-bit API's); host_work grows to cuSOLVER's host work space.
void galore_sketch(const Context& ctx, cusolverDnHandle_t solver, const float* G, int out, int in,
                   int r, bool rows, uint64_t seed, int power_iters, int oversample, void* batch,
                   const GaloreBatchLayout& layout, int slot, void* workspace,
                   int64_t workspace_bytes, int* status);
void galore_finish(const Context& ctx, cusolverDnHandle_t solver, cusolverDnParams_t params,
                   float* const* P, const int* sides, int count, int k, int r, void* batch,
                   const GaloreBatchLayout& layout, std::vector<char>& host_work, void* workspace,
                   int64_t workspace_bytes, int* status);
// The bytes of device work space cuSOLVER asks for to solve `count` k x k eigenproblems in one
// cusolverDnXsyevBatched call (host_bytes, if not null: its host work space).
int64_t batched_eig_work_bytes(cusolverDnHandle_t solver, cusolverDnParams_t params, int k,
                               int count, size_t* host_bytes = nullptr);
// Throws a UserError where cuSOLVER asks for more work space for batches of 1 .. slots k x k
// eigenproblems than the layout plans.
void check_batched_eig_work(cusolverDnHandle_t solver, cusolverDnParams_t params, int k,
                            int slots, const GaloreBatchLayout& layout);
// With GRASS_GALORE_TIMERS=1: the phases' event times of the galore_basis_randomized calls since
// the last take (one wait for the last of them), then reset.
ops::GaloreRefreshTimes refresh_phase_times();

}  // namespace grass::cuda
