// The arguments of one Adam update, shared by every optimizer's update op (ops.h, backend.h and
// the CUDA kernels) instead of a long positional list, and the scalars every op derives from them.
#pragma once
#include <cmath>
#include <cstdint>

namespace grass {

struct AdamArgs {
  // The gradient is read as g·grad_scale·(*clip): clip, when set, is the clipping coefficient in
  // backend memory (ClipScalars::coefficient), which the update reads there so the host never
  // waits for the norm.
  double grad_scale = 1;
  const double* clip = nullptr;
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0;   // decoupled
  int64_t step = 1;          // Adam's t for the bias corrections, from 1
  // The proximal term (optimizer.proximal, docs/proximal.md): the gradient, once read, gains
  // proximal_coef·(θ − anchor) before the moments see it, θ the value the update changes (the
  // master copy when there is one) before this step. anchor: state-typed, shaped like the
  // gradient the op reads (AdamW: n elements; GRASS: its compressed gradient's slices); with
  // anchor_reset it is first set to θ, so the term is 0 (an inner loop's first step). Null: none.
  void* anchor = nullptr;
  double proximal_coef = 0;
  bool anchor_reset = false;
  // AdamW: the tensor's element that the op's element 0 is. Pure bf16's rounding streams count
  // from it, so a tensor updated in pieces (offloaded states, optim/state_slots.h) draws what it
  // would whole.
  int64_t first = 0;
};

#ifdef __CUDACC__
#define GRASS_ADAM_FN __host__ __device__ inline
#else
#define GRASS_ADAM_FN inline
#endif

// The factor the gradient is read with, in fp64: where clip is device memory, the CUDA kernels
// call this themselves.
GRASS_ADAM_FN double grad_scale_of(double grad_scale, const double* clip) {
  return clip ? grad_scale * *clip : grad_scale;
}
// The same on the host, where clip is host memory (the CPU backend).
inline double host_grad_scale(const AdamArgs& a) { return grad_scale_of(a.grad_scale, a.clip); }

// The Adam arguments as the AdamW and GRASS kernels take them, and their 8-bit CPU twins: every
// scalar narrowed to fp32 first (adam_scalars() then derives the step-dependent ones from these
// in double).
inline AdamArgs narrowed_to_f32(const AdamArgs& a) {
  AdamArgs narrowed = a;
  narrowed.lr = float(a.lr);
  narrowed.beta1 = float(a.beta1);
  narrowed.beta2 = float(a.beta2);
  narrowed.eps = float(a.eps);
  narrowed.weight_decay = float(a.weight_decay);
  return narrowed;
}

// The scalars of one Adam step, derived from AdamArgs in double by adam_scalars(), the one place
// that says how. Every update op (AdamW, GRASS, GaLore and FLORA; the CPU's loops and the host code
// that fills the CUDA kernels' parameters) narrows to its arithmetic's precision only what it reads,
// and combines them in double where it needs more (a step size).
struct AdamScalars {
  double beta1 = 0, beta2 = 0;
  double one_minus_beta1 = 0, one_minus_beta2 = 0;  // 1 - β
  double eps = 0;
  double lr = 0;
  double bias_correction1 = 0;       // 1 - β1^t
  double bias_correction2_sqrt = 0;  // sqrt(1 - β2^t)
  double decay = 0;                  // 1 - lr·weight_decay (decoupled weight decay's factor)
};

// BetaT is the precision 1 - β is taken in: AdamW's and GRASS's CPU ops take it in their own T
// (fp32's 1 - float(β)), the CUDA kernels from their fp32 β, GaLore and FLORA in double. The
// double subtraction of the narrowed β gives fp32's bits once narrowed (exact by Sterbenz's lemma
// for β in [0.5, 1], and double rounding is innocuous at 53 ≥ 2·24 + 2 bits for any β).
template <typename BetaT = double>
inline AdamScalars adam_scalars(const AdamArgs& a) {
  const double t = double(a.step);
  AdamScalars s;
  s.beta1 = a.beta1;
  s.beta2 = a.beta2;
  s.one_minus_beta1 = 1.0 - double(BetaT(a.beta1));
  s.one_minus_beta2 = 1.0 - double(BetaT(a.beta2));
  s.eps = a.eps;
  s.lr = a.lr;
  s.bias_correction1 = 1.0 - std::pow(a.beta1, t);
  s.bias_correction2_sqrt = std::sqrt(1.0 - std::pow(a.beta2, t));
  s.decay = 1.0 - a.lr * a.weight_decay;
  return s;
}

}  // namespace grass
