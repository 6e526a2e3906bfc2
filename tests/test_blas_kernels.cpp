// OpenBLAS's kernels (kernels/cpu/blas_kernels.h): the suite's main, like grass's, has OpenBLAS
// run the kernels this CPU supports even where OpenBLAS does not recognise the CPU.
#include <catch2/catch.hpp>

#include <strings.h>

#include <cstdlib>
#include <string>

#include "kernels/cpu/blas_kernels.h"

using namespace grass;

TEST_CASE("OpenBLAS runs the vector kernels this CPU supports", "[blas]") {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const char* asked = std::getenv("OPENBLAS_CORETYPE");
  INFO("OpenBLAS kernels: " << describe_openblas_kernels() << "; OPENBLAS_CORETYPE "
                            << (asked ? asked : "unset"));
  if (asked) {  // a user's choice (or the reload's) is what runs; OpenBLAS ignores the case
    CHECK(strcasecmp(openblas_kernels().c_str(), asked) == 0);
    return;
  }
  // a CPU with AVX2 never runs OpenBLAS's SSE-only kernels: detected, or reloaded by main()
  if (avx2) CHECK(!sse_only_openblas_kernels(openblas_kernels()));
  CHECK(better_openblas_kernels().empty());
}

TEST_CASE("the kernels to reload with follow the CPU's vector units", "[blas]") {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const std::string better = better_openblas_kernels();
  if (!sse_only_openblas_kernels(openblas_kernels())) {
    CHECK(better.empty());  // nothing to improve on
    return;
  }
  // OpenBLAS runs SSE-only kernels (OPENBLAS_CORETYPE=Prescott in cpu_tests_prescott_kernels)
  CHECK(better == (avx512 ? "SkylakeX" : avx2 ? "Haswell" : ""));
}
