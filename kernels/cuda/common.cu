#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "src/core/error.h"

namespace grass::cuda {

void fail_cuda(const char* what, const char* file, int line, const std::string& msg) {
  throw InternalError(std::string(file) + ":" + std::to_string(line) + ": " + what + " failed: " +
                      msg);
}

namespace {
std::atomic<int> sync_override{-1};  // -1: as GRASS_CUDA_SYNC says
}  // namespace

bool launch_sync() {
  static const bool from_env = [] {
    const char* value = std::getenv("GRASS_CUDA_SYNC");
    return value && std::strcmp(value, "1") == 0;
  }();
  const int forced = sync_override.load(std::memory_order_relaxed);
  return forced < 0 ? from_env : forced == 1;
}

void set_launch_sync(bool on) { sync_override.store(on ? 1 : 0, std::memory_order_relaxed); }

bool poison_mode() {
  static const bool on = [] {
    const char* value = std::getenv("GRASS_POISON");
    return value && std::strcmp(value, "1") == 0;
  }();
  return on;
}

void debug_sync(const char* what, const char* file, int line) {
  if (!launch_sync()) return;
  // The device, not the stream: a fault is sticky for the whole context, and this way a kernel
  // on any stream is caught at its own check.
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) fail_cuda(what, file, line, cudaGetErrorString(err));
}

void check_launch(const char* launcher, const char* file, int line) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess && launch_sync()) err = cudaDeviceSynchronize();
  if (err != cudaSuccess)
    fail_cuda((std::string("a kernel launched by ") + launcher).c_str(), file, line,
              cudaGetErrorString(err));
}

}  // namespace grass::cuda
