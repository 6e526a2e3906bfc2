// The CPU's fp32 GEMM ceiling, for judging the engine's GFLOP/s: times OpenBLAS sgemm on the
// shapes of the 60M model's linears (rows = 4 x 256 tokens) and one large square product.
//   build/bench_gemm
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "kernels/cpu/blas_kernels.h"

namespace {

// GFLOP/s of y[M,N] = x[M,K] · w[N,K]ᵀ, the linear layer's layout, median of 5 after a warm-up
double sgemm_gflops(int M, int N, int K) {
  std::vector<float> x(size_t(M) * K), w(size_t(N) * K), y(size_t(M) * N);
  for (size_t i = 0; i < x.size(); i++) x[i] = float(i % 97) * 0.01f;
  for (size_t i = 0; i < w.size(); i++) w[i] = float(i % 89) * 0.01f;
  std::vector<double> seconds;
  for (int rep = 0; rep < 6; rep++) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x.data(), K, w.data(), K,
                0.0f, y.data(), N);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) seconds.push_back(s);
  }
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * M * N * K / seconds[seconds.size() / 2] / 1e9;
}

}  // namespace

int main(int, char** argv) {
  grass::reload_with_supported_openblas_kernels(argv);  // the kernels grass itself runs
  struct Shape { int M, N, K; const char* what; };
  const Shape shapes[] = {{1024, 512, 512, "q/k/v/o_proj"},
                          {1024, 1376, 512, "gate/up_proj"},
                          {1024, 512, 1376, "down_proj"},
                          {1024, 32000, 512, "lm_head"},
                          {2048, 2048, 2048, "square"}};
  sgemm_gflops(1024, 1024, 1024);  // start OpenBLAS's threads before anything is timed
  std::printf("%-14s %-20s %s\n", "linear", "M x N x K", "GFLOP/s");
  for (const Shape& s : shapes) {
    char dims[32];
    std::snprintf(dims, sizeof dims, "%d x %d x %d", s.M, s.N, s.K);
    std::printf("%-14s %-20s %.1f\n", s.what, dims, sgemm_gflops(s.M, s.N, s.K));
  }
}
