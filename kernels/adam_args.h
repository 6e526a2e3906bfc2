// The scalars of one Adam update, shared by every optimizer's update op (ops.h, backend.h and
// the CUDA kernels) instead of a long positional list.
#pragma once
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

}  // namespace grass
