#include "optim/clip.h"

#include <cmath>

#include "ops.h"

namespace grass {

double grad_norm(const float* grads, int64_t n) { return std::sqrt(ops::sum_squares(grads, n)); }

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

}  // namespace grass
