// 8-bit blockwise quantization on the CPU (kernels/quant8.h has the format and the rounding):
// the reference kernels/cuda/quant8.cu is tested against, code for code.
#include "kernels/quant8.h"

#include <algorithm>
#include <cmath>

namespace grass::ops {

void quantize_blockwise(const Quant8Map& map, const float* x, int64_t n, int block, uint8_t* codes,
                        float* absmax) {
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < (n + block - 1) / block; k++) {
    const int64_t b0 = k * block, b1 = std::min(n, b0 + block);
    float a = 0.0f;
    for (int64_t i = b0; i < b1; i++) a = std::fmax(a, std::fabs(x[i]));
    absmax[k] = a;
    for (int64_t i = b0; i < b1; i++) codes[i] = quant8_encode(map, x[i], a);
  }
}

void dequantize_blockwise(const Quant8Map& map, const uint8_t* codes, const float* absmax,
                          int64_t n, int block, float* x) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) x[i] = quant8_decode(map, codes[i], absmax[i / block]);
}

}  // namespace grass::ops
