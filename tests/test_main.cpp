// The CPU tests' main: Catch2's, after OpenBLAS is given the kernels this CPU supports (as grass
// does: kernels/cpu/blas_kernels.h), so the suite tests the kernels users run.
#include "kernels/cpu/blas_kernels.h"
#include "tests/catch_session.h"

int main(int argc, char** argv) {
  grass::reload_with_supported_openblas_kernels(argv);
  return grass::testing::run_catch_session(argc, argv);
}
