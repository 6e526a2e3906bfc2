// Tests name the config's choices as run configs do, by their names (config/choices.h).
#pragma once
#include <catch2/catch.hpp>

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "src/config/choices.h"

namespace grass::test {

template <typename E>
E named(const std::string& name) {
  const std::optional<E> choice = choice_from_name<E>(name);
  REQUIRE(choice.has_value());
  return *choice;
}

inline std::vector<ProjectionTarget> named_targets(std::initializer_list<const char*> names) {
  std::vector<ProjectionTarget> targets;
  for (const char* name : names) targets.push_back(named<ProjectionTarget>(name));
  return targets;
}

}  // namespace grass::test
