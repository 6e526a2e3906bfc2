// Catch2's session, compiled once (tests/catch_session.cpp) for every test executable's main.
#pragma once

namespace grass::testing {

// Catch::Session().run(argc, argv): the tests named on the command line, Catch's exit status.
int run_catch_session(int argc, char** argv);

}  // namespace grass::testing
