// JSON from files that may be damaged or hostile (safetensors headers, checkpoint manifests,
// Hugging Face index files): size and nesting are bounded, and every failure is one UserError.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace grass {

// Nesting deeper than this is refused before it is built: none of these formats nests past 4, and
// a deeply nested document would only make later recursive code (printing a value) overflow
// the stack.
inline constexpr int kMaxUntrustedJsonDepth = 64;

// Parses `text`; UserError "<where>: invalid JSON: <parser message>" or "<where>: JSON nested
// deeper than 64 levels".
nlohmann::json parse_untrusted_json(std::string_view text, const std::string& where);

// Reads and parses a whole file of at most max_bytes. UserError naming the file when it cannot be
// read, is larger, or is not valid JSON.
nlohmann::json read_untrusted_json_file(const std::string& path, size_t max_bytes);

}  // namespace grass
