#include "core/error.h"
#include "cuda/common.cuh"

namespace grass::cuda {

void fail_cuda(const char* what, const char* file, int line, const std::string& msg) {
  throw InternalError(std::string(file) + ":" + std::to_string(line) + ": " + what + " failed: " +
                      msg);
}

}  // namespace grass::cuda
