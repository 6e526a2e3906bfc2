// What `grass --version` says of the binary: the commit it was built from (rewritten at every
// build by cmake/version.cmake, into build/generated/build_info.cpp) and the build's options.
#pragma once

namespace grass::cli {

struct BuildInfo {
  const char* commit;      // `git describe --always --dirty`, or "unknown (...)"
  const char* build_type;  // CMAKE_BUILD_TYPE
  const char* compiler;    // "GNU 12.2.0"
  const char* cuda;        // "CUDA 13.0.88", "" without the CUDA backend
  const char* cuda_archs;  // "80,90"
  const char* cudnn;       // where cudnn.h was found, "" without cuDNN attention
  const char* mpi;         // "MPI 3.1", "" without MPI
};
const BuildInfo& build_info();

}  // namespace grass::cli
