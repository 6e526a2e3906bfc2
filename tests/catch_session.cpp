// Catch2's implementation. Its single header compiles all of it in the file that defines
// CATCH_CONFIG_RUNNER (10-13 s a time); here once, linked into the CPU tests, the GPU tests and the
// emulator's, whose mains (test_main.cpp, gpu/gpu_main.cpp) only call run_catch_session.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "tests/catch_session.h"

int grass::testing::run_catch_session(int argc, char** argv) {
  return Catch::Session().run(argc, argv);
}
