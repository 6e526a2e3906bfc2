// How far a basis P [side, r] (orthonormal columns) is from the subspace of a reference basis:
// tests of GaLore's projection (tests/test_lowrank.cpp on the CPU, tests/gpu/test_gpu_lowrank.cpp
// on the device).
#pragma once
#include <cmath>
#include <cstddef>
#include <vector>

namespace grass::test {

// ‖(I − E·Eᵀ)·P‖_F for the first r columns of E [side, k] (orthonormal) and P [side, r]: at least
// the sine of the largest principal angle between the two r-dimensional subspaces.
template <typename TE, typename TP>
double subspace_sine(const std::vector<TE>& E, int k, const std::vector<TP>& P, int side, int r) {
  double sum = 0;
  for (int c = 0; c < r; c++) {
    std::vector<double> resid(static_cast<size_t>(side));
    for (int i = 0; i < side; i++) resid[size_t(i)] = double(P[size_t(i) * r + c]);
    for (int j = 0; j < r; j++) {
      double dot = 0;
      for (int i = 0; i < side; i++) dot += double(E[size_t(i) * k + j]) * double(P[size_t(i) * r + c]);
      for (int i = 0; i < side; i++) resid[size_t(i)] -= dot * double(E[size_t(i) * k + j]);
    }
    for (double x : resid) sum += x * x;
  }
  return std::sqrt(sum);
}

}  // namespace grass::test
