// Global gradient-norm clipping, torch.nn.utils.clip_grad_norm_'s rule:
// coef = max_norm / (norm + 1e-6), applied only when coef < 1.
#pragma once
#include <cstdint>

namespace grass {

// Returns the norm before clipping. max_norm <= 0 measures without clipping.
double clip_grad_norm(float* grads, int64_t n, double max_norm);

}  // namespace grass
