// Global gradient-norm clipping (the rule: kernels/clip_rule.h). The optimizer applies the
// coefficient as it reads the gradients, so clipping costs one pass (the norm), not two; the
// step computes norm and coefficient in backend memory (Backend::clip), without the host.
#pragma once
#include <cstdint>

#include "kernels/clip_rule.h"

namespace grass {

// L2 norm of the whole gradient buffer (deterministic for any thread count)
double grad_norm(const float* grads, int64_t n);

}  // namespace grass
