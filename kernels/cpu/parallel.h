// When a CPU kernel's loop is worth more than one thread.
#pragma once

#include <cstdint>

namespace grass::ops {

// Below this many elements of work a kernel's loop runs on the calling thread alone (OpenMP's
// `if` clause): starting a team and its closing barrier cost more than the work, and each costs a
// wake-up of an idle (virtual) core or a wait for a thread another process has descheduled, which
// made a tiny model's step, thousands of such regions, many times slower on 2 threads than on 1.
// The loops that take it have independent iterations, so their results do not depend on how many
// threads run them; rmsnorm's backward, which sums dw per thread, gives below it thread 0's sum
// alone, the same for every thread count.
constexpr int64_t kParallelWork = int64_t(1) << 14;

}  // namespace grass::ops
