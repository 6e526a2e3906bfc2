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

// The driver gives kernels local memory (stack frames) from one device pool sized for every
// thread the GPU can hold times the largest frame launched so far, and grows it at the first
// launch of a kernel with a larger frame: after the run's reservation, that growth is memory the
// plan did not count. The engine's kernels have no frame (tools/ptxas_budget.json), but the
// libraries' do (sm_90 cubins, cuobjdump --dump-resource-usage, CUDA 13.0: cuDNN's runtime-compiled
// engines 208 bytes, cuSOLVER's 224-592, cuBLASLt's non-nvjet GEMMs up to 1,160; its nvjet kernels
// are built at run time and cannot be read), and the first GPU runs grew by 54 MiB (58 with cuDNN,
// 82 with cuSOLVER) after the reservation: 144 SMs x 2,048 threads x 192 (208, 290) bytes.
// Launching one kernel with a frame of kLocalFrameBytes before the reservation takes the pool up
// front, where the memory outside the plan is counted. Returns the device memory it took.
constexpr int kLocalFrameBytes = 320;
long long take_local_memory_pool();

// GRASS_CUDA_SYNC=1 in the environment (read once): every launch check (GRASS_LAUNCH_CHECK,
// kernels/cuda/common.cuh) and every cuBLAS(Lt) call waits for the device, so that a kernel that
// faults is named by its launching function, file and line instead of surfacing at the next
// upload. Slow: for debugging only.
bool launch_sync();
// Overrides GRASS_CUDA_SYNC for the rest of the process (tests).
void set_launch_sync(bool on);

// GRASS_POISON=1 in the environment (read once): activation and workspace memory start as NaN
// (0xFF bytes) instead of zero, and the backend fills its scratch with NaN again once an op has
// consumed it (RMSNorm's partials, attention's, the reductions', the token groups, cuDNN's), so a
// kernel that reads what nothing wrote shows as NaN instead of a leftover or a zero. For debugging
// (compute-sanitizer's initcheck cannot see memory of one reservation) and the emulator's poison
// test; a correct run's numbers do not change.
bool poison_mode();

}  // namespace grass::cuda
