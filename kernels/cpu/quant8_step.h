// An Adam step over 8-bit moments on the CPU, block by block (kernels/quant8.h): the loop every
// optimizer's 8-bit update shares (AdamW's, GRASS's). For each block of the layout,
// step(i, m, v) gets state element i's decoded moments, updates them in place and writes what
// else element i owns (its weight); then the block's absmax is taken from the new moments and
// they are requantized. Blocks are independent, so the result does not depend on the threads.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/quant8.h"

namespace grass::ops {

template <typename Step>
void quant8_adam_blocks(const Quant8Layout& layout, const Quant8Moments& s, Step&& step) {
  const Quant8Map& qm = quant8_map(true);
  const Quant8Map& qv = quant8_map(false);
  const int64_t blocks = layout.blocks();
#pragma omp parallel
  {
    std::vector<float> m(size_t(layout.block)), v(size_t(layout.block));  // one block's new moments
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
      const float old_m = s.absmax_m[b], old_v = s.absmax_v[b];
      float absmax_m = 0.0f, absmax_v = 0.0f;
      for (int k = 0; k < layout.block; k++) {
        const int64_t i = layout.index(b, k);
        if (i < 0) break;
        float mi = quant8_decode(qm, s.m[i], old_m), vi = quant8_decode(qv, s.v[i], old_v);
        step(i, mi, vi);
        m[size_t(k)] = mi;
        v[size_t(k)] = vi;
        absmax_m = std::fmax(absmax_m, std::fabs(mi));
        absmax_v = std::fmax(absmax_v, vi);
      }
      s.absmax_m[b] = absmax_m;
      s.absmax_v[b] = absmax_v;
      for (int k = 0; k < layout.block; k++) {
        const int64_t i = layout.index(b, k);
        if (i < 0) break;
        s.m[i] = quant8_encode(qm, m[size_t(k)], absmax_m);
        s.v[i] = quant8_encode(qv, v[size_t(k)], absmax_v);
      }
    }
  }
}

}  // namespace grass::ops
