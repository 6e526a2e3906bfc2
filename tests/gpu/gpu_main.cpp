// Runner for the GPU tests: exits 77 (ctest's SKIP_RETURN_CODE) when no GPU is usable, so a
// machine without one reports these tests as skipped, never as passed. Both lines go to stderr:
// stdout is Catch's (ctest lists the test names from it).
#include <cstdio>

#include "kernels/cpu/blas_kernels.h"
#include "kernels/cuda/device.h"
#include "tests/catch_session.h"

int main(int argc, char** argv) {
  grass::reload_with_supported_openblas_kernels(argv);  // the CPU references' GEMMs
  const grass::cuda::DeviceProbe probe = grass::cuda::probe_device();
  if (!probe.usable) {
    std::fprintf(stderr, "skipped: %s\n", probe.description.c_str());
    return 77;
  }
  std::fprintf(stderr, "GPU: %s\n", probe.description.c_str());
  return grass::testing::run_catch_session(argc, argv);
}
