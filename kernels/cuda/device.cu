#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "cuda/device.h"

namespace grass::cuda {

namespace {

__global__ void write_index_pattern(int* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i * 3 + 1;
}

std::string failure(const char* what, cudaError_t err) {
  return std::string("no usable GPU (") + what + ": " + cudaGetErrorString(err) + ")";
}

}  // namespace

DeviceProbe probe_device() {
  DeviceProbe probe;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return {false, failure("cudaGetDeviceCount", err)};
  if (count == 0) return {false, "no usable GPU (no CUDA device found)"};
  cudaDeviceProp prop{};
  if ((err = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess)
    return {false, failure("cudaGetDeviceProperties", err)};

  constexpr int n = 1000;
  int* dev = nullptr;
  if ((err = cudaMalloc(&dev, n * sizeof(int))) != cudaSuccess) return {false, failure("cudaMalloc", err)};
  write_index_pattern<<<(n + 255) / 256, 256>>>(dev, n);
  err = cudaGetLastError();
  std::vector<int> host(n, -1);
  if (err == cudaSuccess) err = cudaMemcpy(host.data(), dev, n * sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(dev);
  if (err != cudaSuccess) return {false, failure("test kernel", err)};
  for (int i = 0; i < n; i++)
    if (host[i] != i * 3 + 1) return {false, "no usable GPU (test kernel wrote wrong values)"};

  char desc[256];
  std::snprintf(desc, sizeof desc, "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
                double(prop.totalGlobalMem) / (1024.0 * 1024 * 1024));
  probe.usable = true;
  probe.description = desc;
  return probe;
}

}  // namespace grass::cuda
