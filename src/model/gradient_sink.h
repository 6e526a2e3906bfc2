// All the model knows of optimizers: where the backward hands what it forms. The step strategies
// (optim/step.h) implement it.
#pragma once
#include <cstdint>

namespace grass {

class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // A projected tensor's layer y = x·wᵀ: its upstream gradient dy[N, out] and input x[N, in]
  // (act-typed backend memory, valid until this returns). The tensor's optimizer forms its
  // low-rank gradient from them; the out x in gradient is never formed here.
  virtual void projected(int tensor, const void* dy, const void* x, int64_t N) = 0;
  // Models built with fused updates only (one backward per step): the dense gradient of `tensor`
  // is complete in `grad` (grad-typed, rounded to its storage); the buffer is reused for the next
  // tensor as soon as this returns. Otherwise gradients accumulate in the model's gradient buffer
  // over the step's micro-batches and this is never called.
  virtual void dense_ready(int tensor, void* grad) = 0;
};

}  // namespace grass
