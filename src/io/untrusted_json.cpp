#include "src/io/untrusted_json.h"

#include "src/core/error.h"
#include "src/io/mapped_file.h"

namespace grass {

nlohmann::json parse_untrusted_json(std::string_view text, const std::string& where) {
  const auto limit_depth = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxUntrustedJsonDepth)
      throw UserError(where + ": JSON nested deeper than " +
                      std::to_string(kMaxUntrustedJsonDepth) + " levels");
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), limit_depth);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(where + ": invalid JSON: " + e.what());
  }
}

nlohmann::json read_untrusted_json_file(const std::string& path, size_t max_bytes) {
  const MappedFile file(path);
  if (file.size() > max_bytes)
    throw UserError(path + ": " + std::to_string(file.size()) + " bytes, more than the " +
                    std::to_string(max_bytes) + " a file of this kind may have");
  const auto* text = reinterpret_cast<const char*>(file.bytes().data());
  return parse_untrusted_json(std::string_view(text, file.size()), path);
}

}  // namespace grass
