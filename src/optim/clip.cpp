#include "src/optim/clip.h"

#include <cmath>

#include "kernels/ops.h"

namespace grass {

double grad_norm(const float* grads, int64_t n) { return std::sqrt(ops::sum_squares(grads, n)); }

}  // namespace grass
