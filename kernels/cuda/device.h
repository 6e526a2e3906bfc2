// What the CUDA side can offer on this machine, and how it runs: the probe, and the debugging mode
// of the launch checks. Plain C++: the trainer and the GPU tests include it.
#pragma once
#include <string>

namespace grass::cuda {

struct DeviceProbe {
  bool usable = false;
  std::string description;  // "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" or why none is usable
};

// Finds GPU `device`, and proves it runs code: a kernel writes a known pattern that is read back.
// Never throws: "no usable GPU" is an answer, not an error. It asks for eager module loading
// first (src/core/gpu_environment.h), in case nothing before it did.
DeviceProbe probe_device(int device = 0);

// GRASS_CUDA_SYNC=1 in the environment (read once): every launch check (GRASS_LAUNCH_CHECK,
// kernels/cuda/common.cuh) and every cuBLAS(Lt) call waits for the device, so that a kernel that
// faults is named by its launching function, file and line instead of surfacing at the next
// upload. Slow: for debugging only.
bool launch_sync();
// Overrides GRASS_CUDA_SYNC for the rest of the process (tests).
void set_launch_sync(bool on);

}  // namespace grass::cuda
