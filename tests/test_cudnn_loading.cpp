// cuDNN attention's loading, where the build has it (GRASS_HAVE_CUDNN): libcudnn.so.9 is opened at
// run time and every failure on the way to a cuDNN handle is one UserError naming the option; on a
// machine without a GPU (CI) that is cudnnCreate's refusal, reached through the frontend's dynamic
// loading, which this checks works. Its numbers are tests/gpu/test_gpu_attention_cudnn.cpp's.
#include <catch2/catch.hpp>

#ifdef GRASS_HAVE_CUDNN
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "src/core/error.h"

TEST_CASE("cuDNN attention loads cuDNN at run time or says in one line why not", "[cudnn]") {
  try {
    const auto attention = grass::cuda::make_cudnn_attention(nullptr);
    SUCCEED("a cuDNN handle on a usable GPU");
  } catch (const grass::UserError& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.rfind("attention: \"cudnn\"", 0) == 0);
    CHECK(what.find('\n') == std::string::npos);
    CHECK((what.find("cudnnCreate failed (CUDNN_STATUS_") != std::string::npos ||
           what.find("libcudnn.so.9") != std::string::npos));
  }
}

TEST_CASE("cuDNN attention: a library that does not load is named by dlopen's own line", "[cudnn]") {
  // What a failed graph build appends (issue 25, B5): cuDNN's engines and NVRTC load at run time.
  CHECK(grass::cuda::libraries_that_do_not_load({"libc.so.6"}).empty());
  const std::string missing =
      grass::cuda::libraries_that_do_not_load({"libc.so.6", "libgrass_no_such_library.so.1", "libm.so.6"});
  INFO(missing);
  CHECK(missing.find("libgrass_no_such_library.so.1") != std::string::npos);
  CHECK(missing.find(';') == std::string::npos);  // one library, one message
  CHECK(missing.find('\n') == std::string::npos);
}
#endif
