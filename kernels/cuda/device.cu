#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cuda/device.h"
#include "src/core/gpu_environment.h"

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

DeviceProbe probe_device(int device) {
  request_eager_module_loading();  // before the first CUDA call, which reads it
  DeviceProbe probe;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return {false, failure("cudaGetDeviceCount", err)};
  if (count == 0) return {false, "no usable GPU (no CUDA device found)"};
  if (device >= count)
    return {false, "no GPU " + std::to_string(device) + " for this rank (the node has " +
                       std::to_string(count) + "): start at most one rank per GPU on each node"};
  if ((err = cudaSetDevice(device)) != cudaSuccess) return {false, failure("cudaSetDevice", err)};
  cudaDeviceProp prop{};
  if ((err = cudaGetDeviceProperties(&prop, device)) != cudaSuccess)
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
