// Global gradient-norm clipping, torch.nn.utils.clip_grad_norm_'s rule:
// coef = max_norm / (norm + 1e-6), applied only when coef < 1. The optimizer applies the
// coefficient as it reads the gradients, so clipping costs one pass (the norm), not two.
#pragma once
#include <cstdint>

namespace grass {

// L2 norm of the whole gradient buffer (deterministic for any thread count)
double grad_norm(const float* grads, int64_t n);
// The factor the gradients are multiplied by: min(1, max_norm / (norm + 1e-6)); 1 when
// max_norm <= 0 (clipping off).
double clip_coefficient(double norm, double max_norm);

}  // namespace grass
