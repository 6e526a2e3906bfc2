// The ops: the one boundary between the math and the hardware.
//
// Plain functions with explicit shapes, in forward/backward pairs as in llm.c. The model and the
// optimizers call only these. Today every op has one implementation, the CPU reference in
// kernels/cpu (OpenMP + BLAS); each is instantiated for float (the engine) and double (the
// finite-difference tests). The CUDA backend implements the same signatures with the same meaning.
//
// Conventions
//   N = rows (tokens, B*T), C = hidden, F = ffn width, V = vocab,
//   NH = query heads, NKV = key/value heads, HD = head dim.
//   Row-major everywhere; a weight W of a linear layer is [out, in] (the HF *_proj.weight layout).
//   Parameter gradients (dw, dtable, ...) always ACCUMULATE (+=): that is how micro-batches sum.
//   Activation gradients are overwritten unless the argument says otherwise.
#pragma once
#include <cstdint>

#include "kernels/adam_args.h"
#include "kernels/clip_rule.h"
#include "kernels/qkv_rows.h"
#include "kernels/quant8.h"

namespace grass::ops {

// ---- linear (kernels/cpu/linear.cpp) ---------------------------------------------------------
// y[N,out] = x[N,in] · w[out,in]ᵀ
template <typename T>
void linear_forward(T* y, const T* x, const T* w, int64_t N, int in, int out);
// y[N,out] = r[N,out] + x[N,in] · w[out,in]ᵀ: o_proj's and down's output added to the residual
// stream r (not overlapping y). The product is rounded to T, then the add: in fp32 (the CPU
// backend) the GPU's epilogue, which adds r to the fp32 product and rounds once, gives these bits.
// The backward of the add is the identity on both sides: linear_backward's.
template <typename T>
void linear_residual_forward(T* y, const T* x, const T* w, const T* r, int64_t N, int in, int out);
// dx[N,in] = dy·w (or += when accumulate_dx);  dw[out,in] += dyᵀ·x (skipped when dw is null)
template <typename T>
void linear_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t N, int in, int out,
                     bool accumulate_dx);
// g[rows,in] = (dyᵀ·x)[row0 : row0+rows, :]: rows of the full weight gradient of w[out,in], which
// a projected target never keeps (a refresh reads it a chunk of rows at a time). Overwritten.
template <typename T>
void linear_full_grad(T* g, const T* dy, const T* x, int64_t N, int in, int out, int row0,
                      int rows);

// ---- embedding (kernels/cpu/embedding.cpp) ---------------------------------------------------
// out[N,C] = table[tokens[n], :]
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* table, int64_t N, int C);
// dtable[tokens[n], :] += dout[n, :]
template <typename T>
void embedding_backward(T* dtable, const T* dout, const int32_t* tokens, int64_t N, int C);

// ---- RMSNorm (kernels/cpu/rmsnorm.cpp) -------------------------------------------------------
// out[N,C] = w[C] * x * rstd,  rstd[N] = 1/sqrt(mean(x²) + eps)   (HF LlamaRMSNorm)
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int64_t N, int C, double eps);
// dx[N,C] += ∂/∂x;  dw[C] += ∂/∂w.  dx accumulates because RMSNorm sits on the residual stream.
template <typename T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd, int64_t N,
                      int C);

// ---- RoPE (kernels/cpu/rope.cpp) -------------------------------------------------------------
// HF rotate-half layout on x[B,T,H,HD], position = t:  out = x·cos + rotate_half(x)·sin,
// rotate_half(x) = [-x[HD/2:], x[:HD/2]],  angle(t, i) = t / theta^(2i/HD).  out may alias x.
// Rows (b, t) of H·HD elements at pitches of ld_out and ld_x elements (0: H·HD), so q and k are
// read from, and dq and dk rotated within, a packed q, k, v (kernels/qkv_rows.h).
template <typename T>
void rope_forward(T* out, const T* x, int B, int T_, int H, int HD, double theta,
                  int64_t ld_out = 0, int64_t ld_x = 0);
// dx = the transpose rotation of dout (dx may alias dout)
template <typename T>
void rope_backward(T* dx, const T* dout, int B, int T_, int H, int HD, double theta,
                   int64_t ld_dx = 0, int64_t ld_dout = 0);

// ---- causal attention with GQA (kernels/cpu/attention.cpp) -----------------------------------
// q[B,T,NH,HD], k,v[B,T,NKV,HD] at their row pitches (QkvRows: three buffers or one packed);
// query head h reads kv head h / (NH/NKV) by indexing (no copies).
// probs[B,NH,T,T] = softmax(q·kᵀ/sqrt(HD) + causal mask) (upper triangle stored as 0)
// out[B,T,NH,HD] = probs·v
template <typename T>
void attention_forward(T* out, T* probs, QkvRows<const T*> qkv, int B, int T_, int NH, int NKV,
                       int HD);
// d.q[B,T,NH,HD], d.k, d.v[B,T,NKV,HD] overwritten (their rows at d's pitches; the rest of a
// packed row is left alone).  scratch: [B, NH, T, T]
template <typename T>
void attention_backward(QkvRows<T*> d, T* scratch, const T* dout, QkvRows<const T*> qkv,
                        const T* probs, int B, int T_, int NH, int NKV, int HD);

// ---- SwiGLU (kernels/cpu/swiglu.cpp) ---------------------------------------------------------
// out[N,F] = silu(gate) * up, where gate and up are the halves of gu[N, 2F]: row n holds gate's F
// values, then up's (gate_proj and up_proj computed as one GEMM of the stacked weights).
template <typename T>
void swiglu_forward(T* out, const T* gu, int64_t N, int F);
// dgate, dup: N rows of F overwritten, each at a row pitch of ld ≥ F elements (F: two [N,F]
// buffers; 2F with dup = dgate + F: one [N,2F] buffer laid out as gu, for gate_proj and up_proj's
// backward as one GEMM), from dout[N,F] and gu[N,2F]
template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gu, int64_t N, int F, int64_t ld);

// ---- row sampling (kernels/cpu/sampling.cpp; src/model/row_sampling.h draws the rows) ---------
// A sampled weight gradient's stored rows: out[j, :] = scale[j] · x[rows[j], :] for j < k
// (scale null: 1); out [k, D], rows and scale [k].
template <typename T>
void gather_rows(T* out, const T* x, const int32_t* rows, const float* scale, int64_t k, int D);
// norms[n] = ‖x[n, :]‖₂ in fp32 (the CPU sums in double), x [N, D]: the sampling weights.
template <typename T>
void row_norms(float* norms, const T* x, int64_t N, int D);
// crs's k rows (winners: wta-crs's) drawn from weight [N] ≥ 0 with stream `stream`, 1 ≤ k ≤ N, in
// exact integers (kernels/row_draw.h): rows [k] with their factors scale [k], wta-crs's winners
// first (scale 1). Returns the number of winners (0 for crs).
int draw_rows(int32_t* rows, float* scale, const double* weight, int64_t N, int k, bool winners,
              uint64_t stream);

// ---- cross-entropy (kernels/cpu/cross_entropy.cpp) -------------------------------------------
// logits[N,V], targets[N] (a negative target is ignored).
// Returns the SUM of -log softmax(logits)[target] over valid rows; lse[N] keeps logsumexp per row;
// *valid gets the number of valid rows. The caller divides by what it averages over.
template <typename T>
double cross_entropy_forward(T* lse, int64_t* valid, const T* logits, const int32_t* targets,
                             int64_t N, int V);
// dlogits[N,V] = (softmax(logits) - onehot(target)) * dloss_scale; zero on ignored rows.
// dlogits may alias logits (the logits are dead after this).
template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* targets,
                            int64_t N, int V, double dloss_scale);

// ---- AdamW (kernels/cpu/adamw.cpp) ----------------------------------------------------------
// One decoupled-AdamW step, torch.optim.AdamW's formula, on the gradient g·grad_scale (the
// clipping coefficient, applied here so clipping costs no extra pass over the gradients):
//   p -= lr·wd·p;  m = b1·m + (1-b1)·g;  v = b2·v + (1-b2)·g²;
//   p -= (lr / (1-b1^t)) · m / (sqrt(v) / sqrt(1-b2^t) + eps)        (t = a.step, from 1)
// With a.anchor (the proximal term, kernels/adam_args.h), g += coef·(p − anchor) first, p the value
// before this step (or, with anchor_reset, anchor = p and g as it is).
template <typename T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const AdamArgs& a);
// The same step with 8-bit moments (kernels/quant8.h), in fp32, one block of s.block elements at
// a time: dequantize m and v, step as above, take each block's new absmax from the new values and
// requantize. An element whose read gradient (or its square) is not finite keeps its weight and
// gets zero moments, as bitsandbytes' 8-bit kernels do. The anchor, with a.anchor, is fp32 [n].
void adamw_update_q8(float* p, const float* g, const Quant8Moments& s, int64_t n,
                     const AdamArgs& a);

// ---- the reductions behind clipping (kernels/cpu/reduce.cpp) --------------------------------
// Σ x² in double (deterministic: fixed chunking, independent of the thread count)
template <typename T>
double sum_squares(const T* x, int64_t n);
// Backend::clip (kernels/backend.h): the coefficient of kernels/clip_rule.h from s->pending.
void clip(ClipScalars* s, double max_norm);

// ---- GRASS (kernels/cpu/grass.cpp; the method: docs/grass.md) --------------------------------
// A GRASS linear y = x·wᵀ, w [out,in], trains r selected slices of w: rows σ ⊂ [out] (rows=true)
// or columns σ ⊂ [in] (rows=false), each scaled by ρ_j. Its compressed gradient is
//   rows: gc[r, in]  = ρ ⊙ (dy[:, σ])ᵀ · x          (2·N·r·in FLOPs, not 2·N·out·in)
//   cols: gc[out, r] = dyᵀ · (x[:, σ] ⊙ ρ)
// built straight from the activations: the out x in gradient never exists.
// gc += that;  scratch [N, r] holds the gathered (and ρ-scaled) columns.
template <typename T>
void grass_compressed_grad(T* gc, T* scratch, const T* dy, const T* x, const int32_t* sigma,
                           const T* rho, int64_t N, int in, int out, int r, bool rows);
// Its two halves, which it is made of (so the halves give its bits): the gather,
// dst[N, r] = source[:, σ] ⊙ ρ for source[N, width], and the cols GEMM from gathered columns,
// gc[out, r] += dyᵀ · xs, dy's rows ldy apart. The model keeps xs from the forward (GRASS `cols`
// between refreshes).
template <typename T>
void grass_gather_columns(T* dst, const T* source, const int32_t* sigma, const T* rho, int64_t N,
                          int width, int r);
template <typename T>
void grass_selected_cols_grad(T* gc, const T* dy, int64_t ldy, const T* xs, int64_t N, int out,
                              int r);
// Squared L2 norms of the rows (norms_sq[out]) or columns (norms_sq[in]) of g[out, in].
template <typename T>
void grass_slice_norms(double* norms_sq, const T* g, int out, int in, bool rows);
// Adam on the compressed gradient (m, v shaped like gc; step counts from 1 since the last
// refresh), then the sparse update of w[out, in]:
//   Δ = m̂ / (sqrt(v̂) + eps);   w[σ_j, :] -= lr·alpha·s_j·Δ_j   (or w[:, σ_j] for columns)
// where s_j = scale[j], the slice's step factor (the engine passes its draw count, times ρ_j
// with rho_in_update). Duplicate σ_j add up. Decoupled weight decay multiplies each distinct
// selected slice by (1 - lr·wd) once. gc is read as gc·grad_scale (the clipping coefficient) and
// overwritten with Δ. With a.anchor (shaped like gc) the proximal term adds coef·(w[slice] − anchor)
// to each read element, w before this step (or, with anchor_reset, sets anchor = w[slice]).
template <typename T>
void grass_adam_update(T* w, T* gc, T* m, T* v, const int32_t* sigma, const T* scale, int out,
                       int in, int r, bool rows, double alpha, const AdamArgs& a);
// A target's selected slices, packed, and back (offload.layers' write-back of a GRASS layer,
// src/model/layer_stream.h): delta [count, in] = w[σ_j, :] (rows) or delta [out, count] =
// w[:, σ_j] (columns), j < count, w [out, in]; unpack_slices writes them back into w.
template <typename T>
void pack_slices(T* delta, const T* w, const int32_t* sigma, int count, int out, int in, bool rows);
template <typename T>
void unpack_slices(T* w, const T* delta, const int32_t* sigma, int count, int out, int in,
                   bool rows);
// The same step with 8-bit moments (kernels/quant8.h), in fp32: m, v are codes shaped like gc,
// blocked flat or down its columns (by_columns: Quant8Layout::columns), and σ is distinct, so
// each element of gc owns one weight element: w = w·(1 − lr·wd) − lr·alpha·s_j·Δ, gc unchanged.
// A non-finite read gradient (or square) leaves its weight and zeroes its moments.
void grass_adam_update_q8(float* w, const float* gc, const Quant8Moments& s, bool by_columns,
                          const int32_t* sigma, const float* scale, int out, int in, int r,
                          bool rows, double alpha, const AdamArgs& a);


// ---- bf16 storage, emulated in fp32 memory (kernels/cpu/bf16_storage.cpp) -------------------
// x[i] = the bf16 value nearest x[i] (ties to even): what a bf16 store keeps.
void round_to_bf16(float* x, int64_t n);
// x[i] = x[i] rounded stochastically to bf16 with the counter-based stream (seed, i) of
// kernels/stochastic_round.h, the one the CUDA kernels draw from.
void stochastic_round_to_bf16(float* x, int64_t n, uint64_t seed, uint64_t first = 0);

}  // namespace grass::ops
