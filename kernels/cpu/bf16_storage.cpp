// bf16 storage emulated in fp32 memory: the CPU backend's bf16 precisions keep every tensor as
// float but round the values a GPU would store in bf16, through these two functions.
#include <bit>

#include "kernels/cpu/parallel.h"
#include "kernels/ops.h"
#include "kernels/stochastic_round.h"
#include "src/core/bf16.h"

namespace grass::ops {

void round_to_bf16(float* x, int64_t n) {
#pragma omp parallel for if (n >= kParallelWork)
  for (int64_t i = 0; i < n; i++) x[i] = bf16_to_float(float_to_bf16(x[i]));
}

void stochastic_round_to_bf16(float* x, int64_t n, uint64_t seed, uint64_t first) {
#pragma omp parallel for if (n >= kParallelWork)
  for (int64_t i = 0; i < n; i++)
    x[i] = bf16_to_float(
        stochastic_round_bits(std::bit_cast<uint32_t>(x[i]), seed, first + uint64_t(i)));
}

}  // namespace grass::ops
