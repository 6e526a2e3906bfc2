// Checked reading of JSON config values: every problem becomes one UserError line
//   "<file>: <dotted.key>: <problem>"   (just "<dotted.key>: <problem>" for JSON without a file)
// naming where the value sits, what was expected and what was found.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace grass::json_check {

// Where a JSON value sits: the file it came from and its dotted key path.
struct Location {
  std::string file;  // "" when the JSON did not come from a file
  std::string path;  // dotted key path; "" for the document itself

  Location child(const std::string& key) const;
  Location element(size_t index) const;  // "data.train[2]"
  std::string message(const std::string& problem) const;
  [[noreturn]] void fail(const std::string& problem) const;
};

// A value as compact one-line JSON, cut short when long: `"fast"`, `[1,2]`, `{"type":"linear"}`.
std::string brief(const nlohmann::json& value);

// The value with its type, for "expected X, got Y": `string "fast"`, `number 1.5`, `null`.
std::string describe(const nlohmann::json& value);

// A number for messages: "0.001", "1e-06", "2048".
std::string format_number(double value);

// Edit distance counting insertions, deletions, substitutions and adjacent transpositions.
size_t edit_distance(const std::string& a, const std::string& b);

// The candidate a mistyped key most likely meant, or "" when none is reasonably close.
std::string closest_match(const std::string& key, const std::vector<std::string>& candidates);

// Reads a JSON file. Fails with "<path>: file not found" or "<path>: invalid JSON: <parser's
// message with line and column>".
nlohmann::json read_json_file(const std::string& path);

// Checked conversions of one value; failures name `where`.
int64_t to_integer(const nlohmann::json& value, const Location& where, int64_t min, int64_t max);
double to_number(const nlohmann::json& value, const Location& where);
bool to_boolean(const nlohmann::json& value, const Location& where);
std::string to_string(const nlohmann::json& value, const Location& where);

// A JSON object read key by key. Getters return nullopt for an absent key and fail on a value of
// the wrong type, so defaults stay with the caller: `c.lr = obj.number("lr").value_or(c.lr)`.
class ObjectReader {
 public:
  ObjectReader(const nlohmann::json& value, Location where);  // fails unless value is an object

  // Fails on the first key not in `known`, suggesting the closest known key. Call before reading
  // required keys, so a misspelt key is reported as such rather than as a missing one.
  void reject_unknown_keys(const std::vector<std::string>& known) const;

  const nlohmann::json* find(const std::string& key) const;  // nullptr when absent
  const nlohmann::json& required(const std::string& key) const;
  Location at(const std::string& key) const { return where_.child(key); }
  const Location& where() const { return where_; }

  std::optional<int64_t> integer(const std::string& key, int64_t min, int64_t max) const;
  std::optional<double> number(const std::string& key) const;
  std::optional<bool> boolean(const std::string& key) const;
  std::optional<std::string> string(const std::string& key) const;

 private:
  const nlohmann::json& object_;
  Location where_;
};

}  // namespace grass::json_check
