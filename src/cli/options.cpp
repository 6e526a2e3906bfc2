#include "src/cli/options.h"

#include <charconv>
#include <cmath>

#include "src/core/error.h"

namespace grass::cli {

bool take_option(const Args& args, size_t& i, const std::string& name, std::string& value) {
  const std::string& a = args[i];
  if (a.size() > name.size() && a.starts_with(name) && a[name.size()] == '=') {
    value = a.substr(name.size() + 1);
    return true;
  }
  if (a != name) return false;
  if (i + 1 >= args.size()) throw UserError(name + " needs a value");
  value = args[++i];
  return true;
}

uint64_t parse_count(const std::string& name, const std::string& text, uint64_t min) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < min)
    throw UserError(name + " " + text + ": expected an integer >= " + std::to_string(min));
  return v;
}

double parse_positive(const std::string& name, const std::string& text) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) || v <= 0)
    throw UserError(name + " " + text + ": expected a number > 0");
  return v;
}

}  // namespace grass::cli
