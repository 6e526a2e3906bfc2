// Dense AdamW over the model's tensors that have a dense gradient, tensor by tensor so that
// RMSNorm gains skip weight decay. Moments are fp32, laid out like the gradient buffer, in the
// arena's optimizer category. Compressed (GRASS) tensors are left to the GRASS optimizer.
#pragma once
#include <cstdint>
#include <vector>

#include "config/config.h"
#include "core/arena.h"
#include "model/llama.h"

namespace grass {

class AdamW {
 public:
  AdamW(const OptimizerConfig& cfg, const std::vector<ParamTensor>& tensors, int64_t num_dense_grads,
        Arena& arena);
  // One update of the dense tensors from grads·grad_scale (the clipping coefficient) at learning
  // rate lr; step counts from 1.
  void step(float* params, const float* grads, double grad_scale, double lr, int64_t step);

 private:
  OptimizerConfig cfg_;
  std::vector<ParamTensor> tensors_;
  float* m_ = nullptr;  // first moment  [num_dense_grads]
  float* v_ = nullptr;  // second moment [num_dense_grads]
};

}  // namespace grass
