// cuDNN attention's loading, where the build has it (GRASS_HAVE_CUDNN): libcudnn.so.9 is opened at
// run time and every failure on the way to a cuDNN handle is one UserError naming the option; on a
// machine without a GPU (CI) that is cudnnCreate's refusal, reached through the frontend's dynamic
// loading, which this checks works. Its numbers are tests/gpu/test_gpu_attention_cudnn.cpp's.
#include <catch2/catch.hpp>

#ifdef GRASS_HAVE_CUDNN
#include <string>
#include <vector>

#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "kernels/cuda/cuda_ops.h"
#include "src/config/config.h"
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
TEST_CASE("cuDNN attention: every shipped config's graphs pass the frontend's validation for sm_90",
          "[cudnn]") {
  // graph.validate() checks the graphs as cuDNN's frontend will before building them (shapes,
  // strides, the causal mask, the deterministic backward on Hopper) and needs libcudnn but no
  // GPU: each run config's model at its micro-batch, and every model at GaLore's 64 x 256.
  // (tests/gpu/test_gpu_attention_cudnn.cpp runs the graphs on a GPU.)
  namespace fs = std::filesystem;
  const fs::path root = GRASS_SOURCE_DIR;
  std::set<std::tuple<std::string, int, int>> shapes;  // model file, B, T
  for (const auto& run : fs::directory_iterator(root / "configs/runs")) {
    const nlohmann::json j = nlohmann::json::parse(std::ifstream(run.path()));
    shapes.insert({j.at("model").get<std::string>(), j.at("micro_batch_size").get<int>(),
                   j.at("seq_len").get<int>()});
  }
  for (const auto& model : fs::directory_iterator(root / "configs/models"))
    shapes.insert({"configs/models/" + model.path().filename().string(), 64, 256});
  REQUIRE(shapes.size() >= 10);
  for (const auto& [file, B, T] : shapes) {
    const grass::ModelConfig m = grass::load_model_config((root / file).string());
    INFO(file << " at " << B << " x " << T);
    // A build with cuDNN's headers (GRASS_HAVE_CUDNN) has its library: no silent pass without it.
    CHECK(grass::cuda::validate_cudnn_attention(B, T, m.num_attention_heads, m.num_key_value_heads,
                                                m.head_dim(), 90) == "");
  }
  // and the validation can fail: a head dim that is not a multiple of 8
  const std::string odd = grass::cuda::validate_cudnn_attention(2, 128, 4, 4, 36, 90);
  CHECK_THAT(odd, Catch::Contains("forward: hidden_dim should be multiple of 8") &&
                      Catch::Contains("backward:"));
}
#endif
