// The device probe on real hardware: it found a GPU, ran a kernel on it and read the result back.
#include <catch2/catch.hpp>

#include "kernels/cuda/device.h"

TEST_CASE("device probe runs a kernel and describes the GPU", "[gpu]") {
  const grass::cuda::DeviceProbe probe = grass::cuda::probe_device();
  REQUIRE(probe.usable);
  CHECK(probe.description.find("sm_") != std::string::npos);
  CHECK(probe.description.find("GiB") != std::string::npos);
}
