// Gradient-norm clipping's rule, torch.nn.utils.clip_grad_norm_'s: the gradients are multiplied by
// min(1, max_norm / (norm + 1e-6)), and by 1 when max_norm <= 0 (clipping off). One definition for
// the host and the GPU (Backend::clip computes it on the device), so both give the same bits.
#pragma once
#include <cmath>

#ifdef __CUDACC__
#define GRASS_CLIP_FN __host__ __device__ inline
#else
#define GRASS_CLIP_FN inline
#endif

namespace grass {

// The clipping scalars of a step, fp64 in backend memory (Backend::clip computes them).
struct ClipScalars {
  double pending = 0;      // Σ x² gathered since the last clip()
  double total = 0;        // Σ x² of everything clipped this step: the squared global norm
  double coefficient = 1;  // the last clip()'s coefficient, which the updates read
  double clipped = 0;      // how many clip() calls had a coefficient below 1
  double largest_cut = 0;  // the largest 1 - coefficient of the step's clip() calls
};

GRASS_CLIP_FN double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

// Backend::clip's arithmetic, the CPU's and the GPU's: the coefficient of what was gathered since
// the last call, which joins the step's totals.
GRASS_CLIP_FN void clip_gathered(ClipScalars* s, double max_norm) {
  s->coefficient = clip_coefficient(sqrt(s->pending), max_norm);
  s->total += s->pending;
  s->clipped += s->coefficient < 1.0;
  const double cut = 1.0 - s->coefficient;
  s->largest_cut = cut > s->largest_cut ? cut : s->largest_cut;
  s->pending = 0;
}

}  // namespace grass
