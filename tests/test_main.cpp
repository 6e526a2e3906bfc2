// The CPU tests' main: Catch2's, after OpenBLAS is given the kernels this CPU supports (as grass
// does: kernels/cpu/blas_kernels.h), so the suite tests the kernels users run.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "kernels/cpu/blas_kernels.h"

int main(int argc, char** argv) {
  grass::reload_with_supported_openblas_kernels(argv);
  return Catch::Session().run(argc, argv);
}
