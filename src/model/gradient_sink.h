// All the model knows of optimizers: where the backward hands what it forms. The step strategies
// (optim/step.h) implement it.
#pragma once
#include <cstdint>

#include "src/core/error.h"

namespace grass {

// The columns σ of its input that a projected tensor's gradient reads, each scaled by ρ (backend
// memory, `count` of each): GRASS `cols` between refreshes.
struct SelectedColumns {
  const int32_t* sigma = nullptr;
  const float* rho = nullptr;
  int count = 0;
};

class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // A projected tensor's layer y = x·wᵀ: its upstream gradient dy[N, out] and input x[N, in]
  // (act-typed backend memory, valid until this returns). The tensor's optimizer forms its
  // low-rank gradient from them; the out x in gradient is never formed here. With x_selected,
  // x is only the columns selected_columns() gave, xs[N, count] = x[:, σ]·ρ
  // (Backend::grass_gather_columns), kept by the forward.
  virtual void projected(int tensor, const void* dy, const void* x, int64_t N,
                         bool x_selected) = 0;
  // Whether the tensors first .. first + count - 1, one of LlamaModel::projected_stacks() (a
  // layer's q, k and v, or its gate and up), have their gradients formed together this step:
  // then the backward hands them to projected_stack(), not one by one to projected(). The answer
  // may change between micro-batches (a refresh forms each tensor's gradient alone first).
  virtual bool stacks(int first, int count) const {
    (void)first, (void)count;
    return false;
  }
  // The stacked tensors' upstream gradients side by side, dy [N, Σ out] (tensor first's columns
  // first, as the forward's one GEMM wrote y), and each one's input: x[t] [N, in], one x that all
  // read, or with x_selected the columns of it selected_columns() gave tensor first + t.
  virtual void projected_stack(int first, int count, const void* dy, const void* const* x,
                               int64_t N, bool x_selected) {
    (void)first, (void)count, (void)dy, (void)x, (void)N, (void)x_selected;
    throw InternalError("projected_stack on a sink that stacks nothing");
  }
  // Whether the gradient of `tensor` reads only some columns of its input this step, fixed until
  // its next refresh (then `columns` says which): the forward may keep those alone.
  virtual bool selected_columns(int tensor, SelectedColumns* columns) const {
    (void)tensor, (void)columns;
    return false;
  }
  // The backward's part of the dense gradient of `tensor` is in `grad` (grad-typed). With fused
  // updates (one backward per step) it is the whole gradient, rounded to its storage, in a buffer
  // reused for the next tensor as soon as this returns. Otherwise it has been added to the
  // tensor's slice of the model's gradient buffer, which holds the step's sum so far (the CPU
  // backend rounds the buffer to its storage when the backward ends: Backend::store_gradients).
  virtual void dense_ready(int tensor, void* grad) = 0;
};

}  // namespace grass
