// OpenBLAS's kernel choice (kernels/cpu/blas_kernels.h).
#include "kernels/cpu/blas_kernels.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>

namespace grass {

namespace {
// Set with OPENBLAS_CORETYPE by the reload, naming what OpenBLAS had chosen.
constexpr const char* kReloadedFrom = "GRASS_OPENBLAS_FALLBACK";
}  // namespace

std::string openblas_kernels() {
  const char* name = openblas_get_corename();
  return name ? name : "unknown";
}

bool sse_only_openblas_kernels(const std::string& kernels) {
  return kernels == "Prescott" || kernels == "Core2" || kernels == "Penryn" ||
         kernels == "Dunnington" || kernels == "Nehalem" || kernels == "Atom";
}

std::string better_openblas_kernels() {
  if (!sse_only_openblas_kernels(openblas_kernels())) return "";
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return "";
}

void reload_with_supported_openblas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE")) return;  // the user's choice, or this reload's
  const std::string better = better_openblas_kernels();
  if (better.empty()) return;
  setenv(kReloadedFrom, openblas_kernels().c_str(), 1);
  setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  execv("/proc/self/exe", argv);  // returns only on failure: run on with the kernels chosen
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(kReloadedFrom);
}

std::string describe_openblas_kernels() {
  const char* from = std::getenv(kReloadedFrom);
  const std::string kernels = openblas_kernels();
  if (!from) return kernels;
  return kernels + " (set by grass: OpenBLAS chose " + from + " on this CPU)";
}

}  // namespace grass
