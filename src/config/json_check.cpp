#include "src/config/json_check.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "src/core/error.h"

namespace grass::json_check {

using nlohmann::json;

Location Location::child(const std::string& key) const {
  return {file, path.empty() ? key : path + "." + key};
}

Location Location::element(size_t index) const {
  return {file, path + "[" + std::to_string(index) + "]"};
}

std::string Location::message(const std::string& problem) const {
  std::string text;
  for (const std::string* part : {&file, &path, &problem}) {
    if (part->empty()) continue;
    if (!text.empty()) text += ": ";
    text += *part;
  }
  return text;
}

void Location::fail(const std::string& problem) const { throw UserError(message(problem)); }

std::string brief(const json& value) {
  // ensure_ascii keeps the text one line of plain ASCII, so cutting it never splits a character.
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true);
  constexpr size_t kMaxShown = 60;
  if (text.size() > kMaxShown) text = text.substr(0, kMaxShown - 3) + "...";
  return text;
}

std::string describe(const json& value) {
  if (value.is_null()) return "null";
  return std::string(value.type_name()) + " " + brief(value);
}

std::string format_number(double value) {
  // Whole numbers print as the user most likely wrote them: "0", not "0.0".
  if (value == std::floor(value) && std::abs(value) < 1e15) return std::to_string(int64_t(value));
  return json(value).dump();
}

size_t edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment: Levenshtein plus adjacent transpositions ("weigth" -> "weight" is 1).
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitution = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + substitution});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

static std::string lowercase(std::string s) {
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

std::string closest_match(const std::string& key, const std::vector<std::string>& candidates) {
  const std::string typed = lowercase(key);
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& candidate : candidates) {
    const std::string known = lowercase(candidate);
    const size_t distance = edit_distance(typed, known);
    // A few slips per word, or a truncated key ("warmup" for "warmup_steps").
    const std::string& shorter = typed.size() < known.size() ? typed : known;
    const std::string& longer = typed.size() < known.size() ? known : typed;
    const bool truncated = shorter.size() >= 4 && longer.starts_with(shorter);
    const bool close = distance <= std::max<size_t>(1, typed.size() / 3) || truncated;
    if (close && distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

json read_json_file(const std::string& path) {
  const Location file{path, ""};
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) file.fail("file not found");
  if (std::filesystem::is_directory(path, ec)) file.fail("is a directory, expected a JSON file");
  std::ifstream in(path);
  if (!in) file.fail(std::string("cannot open: ") + std::strerror(errno));
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    // Drop nlohmann's "[json.exception.parse_error.101] " tag; keep its line/column text.
    std::string what = e.what();
    if (const size_t tag_end = what.find("] "); tag_end != std::string::npos)
      what = what.substr(tag_end + 2);
    std::replace(what.begin(), what.end(), '\n', ' ');
    file.fail("invalid JSON: " + what);
  }
}

// Names the bound that was crossed: "must be positive, got 0", "must be at most 2147483647, ...".
static std::string bound_problem(bool below_min, int64_t min, int64_t max, const json& value) {
  const std::string rule = !below_min ? "at most " + std::to_string(max)
                           : min == 1 ? "positive"
                           : min == 0 ? "non-negative"
                                      : "at least " + std::to_string(min);
  return "must be " + rule + ", got " + value.dump();
}

int64_t to_integer(const json& value, const Location& where, int64_t min, int64_t max) {
  int64_t result = 0;
  if (value.is_number_integer() && !value.is_number_unsigned()) {
    result = value.get<int64_t>();
  } else if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() > uint64_t(INT64_MAX))
      where.fail(bound_problem(false, min, max, value));
    result = int64_t(value.get<uint64_t>());
  } else if (value.is_number_float()) {
    // 1e4 is a fine way to write 10000; 2.5 is not an integer.
    const double d = value.get<double>();
    if (!std::isfinite(d) || d != std::floor(d))
      where.fail("expected an integer, got " + describe(value));
    if (!(d >= -0x1p63 && d < 0x1p63)) where.fail(bound_problem(d < 0, min, max, value));
    result = int64_t(d);
  } else {
    where.fail("expected an integer, got " + describe(value));
  }
  if (result < min || result > max) where.fail(bound_problem(result < min, min, max, value));
  return result;
}

double to_number(const json& value, const Location& where) {
  if (!value.is_number()) where.fail("expected a number, got " + describe(value));
  const double d = value.get<double>();
  if (!std::isfinite(d)) where.fail("expected a finite number");
  return d;
}

bool to_boolean(const json& value, const Location& where) {
  if (!value.is_boolean()) where.fail("expected a boolean (true or false), got " + describe(value));
  return value.get<bool>();
}

std::string to_string(const json& value, const Location& where) {
  if (!value.is_string()) where.fail("expected a string, got " + describe(value));
  return value.get<std::string>();
}

ObjectReader::ObjectReader(const json& value, Location where)
    : object_(value), where_(std::move(where)) {
  if (!value.is_object()) where_.fail("expected an object, got " + describe(value));
}

void ObjectReader::reject_unknown_keys(const std::vector<std::string>& known) const {
  for (const auto& [key, value] : object_.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    const std::string suggestion = closest_match(key, known);
    at(key).fail(suggestion.empty() ? "unknown key (docs/configs.md lists the accepted keys)"
                                    : "unknown key (did you mean \"" + suggestion + "\"?)");
  }
}

const json* ObjectReader::find(const std::string& key) const {
  const auto it = object_.find(key);
  return it == object_.end() ? nullptr : &*it;
}

const json& ObjectReader::required(const std::string& key) const {
  const json* value = find(key);
  if (!value) at(key).fail("required key is missing");
  return *value;
}

std::optional<int64_t> ObjectReader::integer(const std::string& key, int64_t min,
                                             int64_t max) const {
  const json* value = find(key);
  if (!value) return std::nullopt;
  return to_integer(*value, at(key), min, max);
}

std::optional<double> ObjectReader::number(const std::string& key) const {
  const json* value = find(key);
  if (!value) return std::nullopt;
  return to_number(*value, at(key));
}

std::optional<bool> ObjectReader::boolean(const std::string& key) const {
  const json* value = find(key);
  if (!value) return std::nullopt;
  return to_boolean(*value, at(key));
}

std::optional<std::string> ObjectReader::string(const std::string& key) const {
  const json* value = find(key);
  if (!value) return std::nullopt;
  return to_string(*value, at(key));
}

}  // namespace grass::json_check
