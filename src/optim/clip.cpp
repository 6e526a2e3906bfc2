#include "optim/clip.h"

#include <cmath>

#include "ops.h"

namespace grass {

double clip_grad_norm(float* grads, int64_t n, double max_norm) {
  const double norm = std::sqrt(ops::sum_squares(grads, n));
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) ops::scale_inplace(grads, n, coef);
  }
  return norm;
}

}  // namespace grass
