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

// A stack frame of kLocalFrameBytes (tools/ptxas_budget.json records it): an array written and
// read at indices known only at run time must live in local memory (a volatile one indexed in
// order, or one whose values the compiler can recompute, is kept in registers or dropped). It
// writes nothing to global memory (out is null).
__global__ void local_frame_kernel(int* out, int index) {
  constexpr int kWords = kLocalFrameBytes / int(sizeof(int));
  int frame[kWords];
  for (int i = 0; i < kWords; i++) frame[(i * 7 + index) % kWords] = i + int(threadIdx.x);
  if (out != nullptr) *out = frame[index % kWords];
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

long long take_local_memory_pool() {
  size_t free_before = 0, free_after = 0, total = 0;
  if (cudaMemGetInfo(&free_before, &total) != cudaSuccess) return 0;
  local_frame_kernel<<<1, 32>>>(nullptr, 0);
  if (cudaGetLastError() != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemGetInfo(&free_after, &total) != cudaSuccess)
    return 0;  // an answer, not an error: the run then shows any growth after the reservation
  return (long long)free_before - (long long)free_after;
}

}  // namespace grass::cuda
