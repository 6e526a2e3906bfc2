// 8-bit blockwise quantization on the CPU (kernels/quant8.h has the format and the rounding):
// the reference kernels/cuda/quant8.cu is tested against, code for code.
#include "kernels/quant8.h"

#include <cmath>

namespace grass::ops {

void quantize_layout(const Quant8Map& map, const float* x, const Quant8Layout& layout,
                     uint8_t* codes, float* absmax) {
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < layout.blocks(); b++) {
    float a = 0.0f;
    for (int k = 0; k < layout.block && layout.index(b, k) >= 0; k++)
      a = std::fmax(a, std::fabs(x[layout.index(b, k)]));
    absmax[b] = a;
    for (int k = 0; k < layout.block && layout.index(b, k) >= 0; k++)
      codes[layout.index(b, k)] = quant8_encode(map, x[layout.index(b, k)], a);
  }
}

void dequantize_layout(const Quant8Map& map, const uint8_t* codes, const float* absmax,
                       const Quant8Layout& layout, float* x) {
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < layout.blocks(); b++)
    for (int k = 0; k < layout.block && layout.index(b, k) >= 0; k++)
      x[layout.index(b, k)] = quant8_decode(map, codes[layout.index(b, k)], absmax[b]);
}

void quantize_blockwise(const Quant8Map& map, const float* x, int64_t n, int block, uint8_t* codes,
                        float* absmax) {
  quantize_layout(map, x, {.rows = 1, .cols = n, .block = block}, codes, absmax);
}

void dequantize_blockwise(const Quant8Map& map, const uint8_t* codes, const float* absmax,
                          int64_t n, int block, float* x) {
  dequantize_layout(map, codes, absmax, {.rows = 1, .cols = n, .block = block}, x);
}

}  // namespace grass::ops
