#include "src/optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace grass {

double schedule_lr(const ScheduleConfig& s, double base_lr, int64_t step, int64_t total_steps) {
  if (step < s.warmup_steps) return base_lr * double(step + 1) / double(s.warmup_steps);
  if (s.kind == ScheduleKind::Constant) return base_lr;
  // cosine: progress 0 at the end of warmup, 1 at the last step
  const double span = double(std::max<int64_t>(1, total_steps - 1 - s.warmup_steps));
  const double progress = std::min(1.0, double(step - s.warmup_steps) / span);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return base_lr * (s.min_lr_ratio + (1.0 - s.min_lr_ratio) * cosine);
}

}  // namespace grass
