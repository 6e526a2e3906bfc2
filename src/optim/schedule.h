// Learning-rate schedules. "cosine" is GaLore's: linear warmup, then cosine decay from lr to
// lr·min_lr_ratio at the last step. One deliberate difference: warmup ramps (step+1)/warmup, so
// the first update is not wasted at lr 0 (GaLore's LambdaLR gives step 0 a zero lr).
#pragma once
#include <cstdint>

#include "src/config/config.h"

namespace grass {

// lr for step (0-based) of total_steps.
double schedule_lr(const ScheduleConfig& s, double base_lr, int64_t step, int64_t total_steps);

}  // namespace grass
