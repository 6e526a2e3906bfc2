// Softmax cross-entropy over the vocabulary, with ignored (negative) targets.
// The backward overwrites the logits with their gradient, so the [N,V] buffer is held once.
#include <cmath>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/ops.h"

namespace grass::ops {

template <typename T>
double cross_entropy_forward(T* lse, int64_t* valid, const T* logits, const int32_t* targets,
                             int64_t N, int V) {
  // Each row's loss is kept, then summed in row order: the total's bits depend on neither the
  // thread count nor the threads' timing (an omp reduction adds the threads' partial sums in the
  // order they finish, which differs from run to run once there are three threads or more).
  std::vector<double> row_loss(size_t(N), 0.0);
#pragma omp parallel for if (N * V >= kParallelWork)
  for (int64_t n = 0; n < N; n++) {
    const T* row = logits + n * V;
    T mx = row[0];
    for (int i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += std::exp(row[i] - mx);  // exp in T, summed in double
    const double row_lse = double(mx) + std::log(sum);
    lse[n] = T(row_lse);
    if (targets[n] >= 0) row_loss[size_t(n)] = row_lse - double(row[targets[n]]);
  }
  double loss_sum = 0;
  int64_t count = 0;
  for (int64_t n = 0; n < N; n++)
    if (targets[n] >= 0) {
      loss_sum += row_loss[size_t(n)];
      count++;
    }
  *valid = count;
  return loss_sum;
}

template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* targets,
                            int64_t N, int V, double dloss_scale) {
  const T scale = T(dloss_scale);
#pragma omp parallel for if (N * V >= kParallelWork)
  for (int64_t n = 0; n < N; n++) {
    const T* row = logits + n * V;
    T* drow = dlogits + n * V;
    const int32_t target = targets[n];
    if (target < 0) {
      for (int i = 0; i < V; i++) drow[i] = 0;
      continue;
    }
    const T l = lse[n];
    for (int i = 0; i < V; i++) drow[i] = std::exp(row[i] - l) * scale;
    drow[target] -= scale;
  }
}

#define INSTANTIATE(T)                                                                           \
  template double cross_entropy_forward<T>(T*, int64_t*, const T*, const int32_t*, int64_t, int); \
  template void cross_entropy_backward<T>(T*, const T*, const T*, const int32_t*, int64_t, int,   \
                                          double);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace grass::ops
