// The scalars of one Adam update, shared by every optimizer's update op (ops.h, backend.h and
// the CUDA kernels) instead of a long positional list.
#pragma once
#include <cstdint>

namespace grass {

struct AdamArgs {
  double grad_scale = 1;     // the clipping coefficient: the gradient is read as g·grad_scale
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0;   // decoupled
  int64_t step = 1;          // Adam's t for the bias corrections, from 1
};

}  // namespace grass
