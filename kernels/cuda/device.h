// What the CUDA side can offer on this machine. The CUDA backend's kernels arrive with their own
// issue; until then this probe is the one CUDA translation unit, so CI compiles CUDA from day one.
#pragma once
#include <string>

namespace grass::cuda {

struct DeviceProbe {
  bool usable = false;
  std::string description;  // "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" or why none is usable
};

// Finds device 0, and proves it runs code: a kernel writes a known pattern that is read back.
// Never throws: "no usable GPU" is an answer, not an error.
DeviceProbe probe_device();

}  // namespace grass::cuda
