#include "src/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "src/core/bf16.h"
#include "src/core/error.h"
#include "src/io/durable_file.h"
#include "src/io/untrusted_json.h"

namespace grass {

// Element data is copied out with memcpy as host values: safetensors is little-endian.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace {

using nlohmann::json;

// Hugging Face's own reader refuses headers above 100 MB; a larger length means the file is
// not safetensors (or is damaged), and parsing it would only waste memory.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Product of the dims, or false if a dim is negative or the product overflows 64 bits.
bool checked_numel(const std::vector<int64_t>& shape, uint64_t& numel) {
  numel = 1;
  for (int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(dim), &numel)) return false;
  }
  return true;
}

float f16_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  // Rebias the exponent from 15 to 127.
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

template <typename T>
T load_element(const std::byte* data, size_t index) {
  T value;
  std::memcpy(&value, data + index * sizeof(T), sizeof(T));
  return value;
}

// Reads every element of `entry` as Source and converts it to Out.
template <typename Out, typename Source, typename Convert>
std::vector<Out> convert_all(const TensorEntry& entry, Convert convert) {
  std::vector<Out> out(static_cast<size_t>(entry.numel()));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = convert(load_element<Source>(entry.bytes.data(), i));
  return out;
}

template <typename Float>
std::vector<Float> read_floats(const std::string& path, const TensorEntry& entry) {
  if (entry.dtype == "F32")
    return convert_all<Float, float>(entry, [](float v) { return Float(v); });
  if (entry.dtype == "F64")
    return convert_all<Float, double>(entry, [](double v) { return Float(v); });
  if (entry.dtype == "BF16")
    return convert_all<Float, uint16_t>(entry, [](uint16_t v) { return Float(bf16_to_float(v)); });
  if (entry.dtype == "F16")
    return convert_all<Float, uint16_t>(entry, [](uint16_t v) { return Float(f16_to_float(v)); });
  throw UserError(path + ": tensor \"" + entry.name + "\" has dtype " + entry.dtype +
                  ", expected a floating-point dtype (F32, F64, BF16 or F16)");
}

// A JSON value that must be a non-negative integer (nlohmann parses those as unsigned).
uint64_t json_u64(const json& value, const std::string& where) {
  if (!value.is_number_unsigned()) throw UserError(where + " is not a non-negative integer");
  return value.get<uint64_t>();
}

}  // namespace

size_t safetensors_dtype_bytes(std::string_view dtype) {
  static const std::map<std::string_view, size_t> kBytes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"U16", 2},  {"I16", 2}, {"F16", 2}, {"BF16", 2},    {"U32", 4},
      {"I32", 4},  {"F32", 4}, {"U64", 8}, {"I64", 8},     {"F64", 8}};
  const auto it = kBytes.find(dtype);
  return it == kBytes.end() ? 0 : it->second;
}

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const uint64_t file_bytes = file_.size();
  if (file_bytes < 8)
    throw UserError(path + ": not a safetensors file (" + std::to_string(file_bytes) +
                    " bytes, too short for the 8-byte header length)");
  const std::byte* file = file_.bytes().data();

  uint64_t header_bytes;
  std::memcpy(&header_bytes, file, 8);
  if (header_bytes > file_bytes - 8)
    throw UserError(path + ": header length " + std::to_string(header_bytes) +
                    " exceeds the file size (" + std::to_string(file_bytes) +
                    " bytes); the file is truncated or not safetensors");
  if (header_bytes > kMaxHeaderBytes)
    throw UserError(path + ": header length " + std::to_string(header_bytes) +
                    " exceeds the 100 MB limit; not a safetensors file?");

  const auto* header_text = reinterpret_cast<const char*>(file + 8);
  const json header = parse_untrusted_json(std::string_view(header_text, header_bytes),
                                           path + ": header");
  if (!header.is_object()) throw UserError(path + ": header is not a JSON object");

  const std::byte* data = file + 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - 8 - header_bytes;
  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;  // non-empty byte ranges, checked for overlaps below

  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) throw UserError(path + ": __metadata__ is not a JSON object");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string())
          throw UserError(path + ": __metadata__ value for \"" + key + "\" is not a string");
        metadata_[key] = text.get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor \"" + name + "\"";
    if (!value.is_object()) throw UserError(where + ": entry is not a JSON object");
    if (!value.contains("dtype") || !value["dtype"].is_string())
      throw UserError(where + ": missing string \"dtype\"");
    if (!value.contains("shape") || !value["shape"].is_array())
      throw UserError(where + ": missing array \"shape\"");
    if (!value.contains("data_offsets") || !value["data_offsets"].is_array() ||
        value["data_offsets"].size() != 2)
      throw UserError(where + ": \"data_offsets\" must be an array [begin, end]");

    TensorEntry entry;
    entry.name = name;
    entry.dtype = value["dtype"].get<std::string>();
    const size_t element_bytes = safetensors_dtype_bytes(entry.dtype);
    if (element_bytes == 0) throw UserError(where + ": unknown dtype " + entry.dtype);
    for (const json& dim : value["shape"]) {
      const uint64_t d = json_u64(dim, where + ": a shape entry");
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw UserError(where + ": shape entry " + std::to_string(d) + " is too large");
      entry.shape.push_back(static_cast<int64_t>(d));
    }
    const uint64_t begin = json_u64(value["data_offsets"][0], where + ": data_offsets[0]");
    const uint64_t end = json_u64(value["data_offsets"][1], where + ": data_offsets[1]");
    if (begin > end || end > data_bytes)
      throw UserError(where + ": data_offsets [" + std::to_string(begin) + ", " +
                      std::to_string(end) + "] lie outside the data section of " +
                      std::to_string(data_bytes) + " bytes; the file is truncated or corrupt");
    uint64_t numel;
    if (!checked_numel(entry.shape, numel))
      throw UserError(where + ": shape " + value["shape"].dump() + " has too many elements");
    uint64_t expected_bytes;
    if (__builtin_mul_overflow(numel, element_bytes, &expected_bytes) ||
        expected_bytes != end - begin)
      throw UserError(where + ": data_offsets span " + std::to_string(end - begin) +
                      " bytes but " + entry.dtype + " with shape " + value["shape"].dump() +
                      " needs " + std::to_string(numel) + " x " + std::to_string(element_bytes) +
                      " bytes");
    entry.bytes = std::span<const std::byte>(data + begin, static_cast<size_t>(end - begin));
    const auto [it, inserted] = tensors_.emplace(name, std::move(entry));
    if (begin < end) ranges.push_back({begin, end, &it->first});
  }

  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end)
      throw UserError(path + ": tensors \"" + *ranges[i - 1].name + "\" and \"" +
                      *ranges[i].name + "\" overlap in the data section; the file is corrupt");
  }
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) names.push_back(name);
  return names;
}

const TensorEntry& SafetensorsFile::get(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw UserError(file_.path() + ": no tensor named \"" + name + "\"");
  return it->second;
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  return read_floats<float>(file_.path(), get(name));
}

std::vector<double> SafetensorsFile::read_f64(const std::string& name) const {
  return read_floats<double>(file_.path(), get(name));
}

std::vector<int64_t> SafetensorsFile::read_i64(const std::string& name) const {
  const TensorEntry& entry = get(name);
  if (entry.dtype == "I64")
    return convert_all<int64_t, int64_t>(entry, [](int64_t v) { return v; });
  if (entry.dtype == "I32")
    return convert_all<int64_t, int32_t>(entry, [](int32_t v) { return int64_t{v}; });
  throw UserError(file_.path() + ": tensor \"" + name + "\" has dtype " + entry.dtype +
                  ", expected an integer dtype (I64 or I32)");
}

// ---------------------------------------------------------------------------------------------
// SafetensorsWriter

void SafetensorsWriter::add(const std::string& name, const std::string& dtype,
                            const std::vector<int64_t>& shape, const void* data, size_t bytes) {
  GRASS_CHECK(!name.empty() && name != "__metadata__", "invalid safetensors tensor name: " + name);
  GRASS_CHECK(!tensors_.count(name), "safetensors tensor added twice: " + name);
  const size_t element_bytes = safetensors_dtype_bytes(dtype);
  GRASS_CHECK(element_bytes != 0, "unknown safetensors dtype " + dtype + " for " + name);
  uint64_t numel, expected_bytes;
  GRASS_CHECK(checked_numel(shape, numel) &&
                  !__builtin_mul_overflow(numel, element_bytes, &expected_bytes) &&
                  expected_bytes == bytes,
              "safetensors tensor " + name + ": byte count does not match dtype and shape");
  GRASS_CHECK(data != nullptr || bytes == 0, "safetensors tensor " + name + " has no data");
  tensors_.emplace(name, Pending{dtype, shape, data, bytes});
}

void SafetensorsWriter::write(const std::string& path,
                              const std::map<std::string, std::string>& metadata) const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors_) {
    header[name] = {{"dtype", tensor.dtype},
                    {"shape", tensor.shape},
                    {"data_offsets", {offset, offset + tensor.bytes}}};
    offset += tensor.bytes;
  }
  std::string header_text = header.dump();
  // Spaces after the JSON are valid whitespace; they make the data section 8-byte aligned.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_bytes = header_text.size();

  write_durably(path, [&](std::FILE* file) {
    bool written = std::fwrite(&header_bytes, 8, 1, file) == 1 &&
                   std::fwrite(header_text.data(), 1, header_text.size(), file) == header_text.size();
    for (auto it = tensors_.begin(); written && it != tensors_.end(); ++it) {
      const Pending& tensor = it->second;  // empty tensors may have a null data pointer
      written = tensor.bytes == 0 || std::fwrite(tensor.data, 1, tensor.bytes, file) == tensor.bytes;
    }
    return written;
  });
}

}  // namespace grass
