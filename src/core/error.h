// Errors, split by who can fix them.
//   UserError:     bad config, missing/corrupt file, impossible request. The CLI prints
//                  "error: <message>" as one line and exits with code 2.
//   InternalError: a broken invariant inside grass (a bug). Exit code 1.
// Messages name the file or config field and, where possible, what to do.
#pragma once
#include <stdexcept>
#include <string>

namespace grass {

struct UserError : std::runtime_error {
  explicit UserError(const std::string& msg) : std::runtime_error(msg) {}
};

struct InternalError : std::runtime_error {
  explicit InternalError(const std::string& msg) : std::runtime_error(msg) {}
};

// GRASS_CHECK guards invariants that only a bug can break.
#define GRASS_CHECK(cond, msg)                                                               \
  do {                                                                                       \
    if (!(cond))                                                                             \
      throw ::grass::InternalError(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                                   ": " + (msg));                                            \
  } while (0)

}  // namespace grass
