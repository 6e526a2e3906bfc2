// Helpers the GPU test files share: device buffers filled from host vectors, bf16 round trips,
// poisoning (every element NaN, so an element a kernel forgot to write fails the comparison) and
// the relative error used by every CPU-vs-GPU check; attention's q, k, v laid out in one buffer.
#pragma once
#include <catch2/catch.hpp>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"

namespace grass::gputest {

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// One device allocation of n elements of T, freed on scope exit.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    check(cudaMalloc(&ptr, std::max<size_t>(1, n) * sizeof(T)), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n);
    check(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download() const {
    std::vector<T> host(n);
    check(cudaDeviceSynchronize(), "kernel");
    check(cudaMemcpy(host.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return host;
  }
  // Every byte 0xFF: NaN in fp32 and bf16 alike, -1 as an int32.
  void poison() { check(cudaMemset(ptr, 0xFF, std::max<size_t>(1, n) * sizeof(T)), "poison"); }
};

inline std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& x) {
  std::vector<__nv_bfloat16> out(x.size());
  for (size_t i = 0; i < x.size(); i++) out[i] = __float2bfloat16_rn(x[i]);
  return out;
}
inline std::vector<float> to_f32(const std::vector<__nv_bfloat16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); i++) out[i] = __bfloat162float(x[i]);
  return out;
}
// x rounded to bf16 and back: the CPU reference runs on exactly the values the GPU sees.
inline std::vector<float> bf16_rounded(const std::vector<float>& x) { return to_f32(to_bf16(x)); }

// Fresh random normals (scale·N(0,1)) for every call: tests never run on zeros or constants.
inline std::vector<float> randn(size_t n, double scale = 1.0) {
  static std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<float> out(n);
  for (float& v : out) v = float(dist(rng));
  return out;
}

// ‖got - want‖₂ / ‖want‖₂ (NaN anywhere in got gives NaN, which fails every bound).
inline double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// A Context with its own stream and cuBLAS(Lt) handles; for tests.
struct TestContext {
  cuda::Context ctx;
  TestContext() {
    check(cudaStreamCreate(&ctx.stream), "cudaStreamCreate");
    if (cublasLtCreate(&ctx.lt) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasLtCreate");
    ctx.blas = cuda::create_gemm_fallback_handle();
    ctx.lt_workspace_bytes = 32u << 20;
    check(cudaMalloc(&ctx.lt_workspace, ctx.lt_workspace_bytes), "cudaMalloc workspace");
  }
  ~TestContext() {
    cudaFree(ctx.lt_workspace);
    cublasDestroy(ctx.blas);
    cublasLtDestroy(ctx.lt);
    cudaStreamDestroy(ctx.stream);
  }
};

// q, k, v (or their gradients) of N rows in one buffer from base: packed rows (the model's q, k,
// v), or three buffers one after another.
template <typename T>
QkvRows<T*> qkv_layout(T* base, int64_t N, int NH, int NKV, int HD, bool packed) {
  const int64_t nq = N * NH * HD, nkv = N * NKV * HD;
  return packed ? packed_qkv(base, NH, NKV, HD, int(sizeof(T)))
                : separate_qkv(base, base + nq, base + nq + nkv, NH, NKV, HD);
}

// Row r of each of q, k, v ([N, width] each) copied to its place in `rows`.
template <typename T>
void scatter_qkv(QkvRows<T*> rows, const std::vector<T>& q, const std::vector<T>& k,
                 const std::vector<T>& v, int64_t N) {
  const size_t wq = q.size() / size_t(N), wkv = k.size() / size_t(N);
  for (size_t r = 0; r < size_t(N); r++) {
    std::copy_n(q.begin() + r * wq, wq, rows.q + r * rows.ldq);
    std::copy_n(k.begin() + r * wkv, wkv, rows.k + r * rows.ldk);
    std::copy_n(v.begin() + r * wkv, wkv, rows.v + r * rows.ldv);
  }
}

// N rows of `width` elements at a pitch of ld, as one [N, width].
template <typename T>
std::vector<T> gather_pitched(const T* at, int64_t ld, size_t width, int64_t N) {
  std::vector<T> out(size_t(N) * width);
  for (size_t r = 0; r < size_t(N); r++) std::copy_n(at + r * ld, width, out.begin() + r * width);
  return out;
}

}  // namespace grass::gputest
