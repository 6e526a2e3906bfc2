// safetensors: round trips of each supported dtype, the exact bytes of a small file, bf16/f16
// conversions, and the one-line errors for malformed files.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "src/core/bf16.h"
#include "src/core/error.h"
#include "src/io/safetensors.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using namespace grass::test;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A file with the given 8-byte length field, header text and data_bytes of random data.
void write_raw(const std::string& path, uint64_t header_length, const std::string& header,
               size_t data_bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&header_length), 8);
  out << header;
  std::mt19937 rng(99);
  for (size_t i = 0; i < data_bytes; ++i) out.put(static_cast<char>(rng()));
}

void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  write_raw(path, header.size(), header, data_bytes);
}

std::string open_error(const std::string& path) {
  return user_error_of([&] { grass::SafetensorsFile file(path); });
}

}  // namespace

TEST_CASE("bf16 conversion rounds to nearest even and keeps NaN", "[safetensors][bf16]") {
  CHECK(grass::float_to_bf16(1.0f) == 0x3f80);
  CHECK(grass::float_to_bf16(-2.5f) == 0xc020);
  CHECK(grass::float_to_bf16(3.140625f) == 0x4049);  // exactly representable
  // bf16 keeps 7 mantissa bits, so near 1.0 one bf16 ulp is 2^-7.
  CHECK(grass::float_to_bf16(1.0f + 0x1p-8f) == 0x3f80);             // tie, 0x3f80 is even
  CHECK(grass::float_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);         // tie, rounds up to even
  CHECK(grass::float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);  // just above the tie
  CHECK(grass::float_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds to +inf
  CHECK(std::isnan(
      grass::bf16_to_float(grass::float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(grass::bf16_to_float(grass::float_to_bf16(std::bit_cast<float>(0x7f800001u)))));
  CHECK(grass::bf16_to_float(0xc020) == -2.5f);

  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int i = 0; i < 10000; ++i) {
    const float x = normal(rng);
    const float rounded = grass::bf16_to_float(grass::float_to_bf16(x));
    REQUIRE(std::abs(rounded - x) <= std::abs(x) * 0x1p-8f);  // within half a bf16 ulp
  }
}

TEST_CASE("safetensors round trip of F32, F64, I64, I32, BF16 and F16", "[safetensors]") {
  TempDir dir("grass_test_safetensors");
  const std::string path = dir.file("model.safetensors");
  std::mt19937_64 rng(2);
  std::normal_distribution<double> normal(0.0, 1.0);

  std::vector<float> weight(3 * 5);  // [3, 5]
  for (float& v : weight) v = static_cast<float>(normal(rng));
  std::vector<double> bias(7);  // [7]
  for (double& v : bias) v = normal(rng) * 1e5;
  std::vector<int64_t> steps = {-3, 0, int64_t{1} << 40, std::numeric_limits<int64_t>::min(),
                                17, 42};                                                // [2, 3]
  std::vector<int32_t> ids = {5, -7, 2147483647, 0, 1};                                 // [5]
  const std::vector<uint16_t> bf16 = {0x3f80, 0xc020, 0x4049, 0x0000, 0x8000, 0x7f80};  // [6]
  const std::vector<float> bf16_values = {1.0f, -2.5f, 3.140625f, 0.0f, -0.0f, INFINITY};
  // F16: 1, -2, the smallest subnormal 2^-24, +inf, 0x3555 = 0.333251953125, 65504 (max).
  const std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x0001, 0x7c00, 0x3555, 0x7bff};  // [2, 3]
  const std::vector<float> f16_values = {1.0f,     -2.0f,           0x1p-24f,
                                         INFINITY, 0.333251953125f, 65504.0f};
  const double scalar = normal(rng);  // []

  grass::SafetensorsWriter writer;
  writer.add("model.layers.0.weight", "F32", {3, 5}, weight.data(), weight.size() * 4);
  writer.add("bias", "F64", {7}, bias.data(), bias.size() * 8);
  writer.add("steps", "I64", {2, 3}, steps.data(), steps.size() * 8);
  writer.add("ids", "I32", {5}, ids.data(), ids.size() * 4);
  writer.add("bf16", "BF16", {6}, bf16.data(), bf16.size() * 2);
  writer.add("f16", "F16", {2, 3}, f16.data(), f16.size() * 2);
  writer.add("scalar", "F64", {}, &scalar, 8);
  writer.add("empty", "F32", {0, 4}, nullptr, 0);
  writer.write(path);
  CHECK_FALSE(fs::exists(path + ".tmp"));

  const grass::SafetensorsFile file(path);
  CHECK(file.path() == path);
  CHECK(file.names() == std::vector<std::string>{"bf16", "bias", "empty", "f16", "ids",
                                                 "model.layers.0.weight", "scalar", "steps"});
  CHECK(file.metadata() == std::map<std::string, std::string>{{"format", "pt"}});

  const grass::TensorEntry& w = file.get("model.layers.0.weight");
  CHECK(w.dtype == "F32");
  CHECK(w.shape == std::vector<int64_t>{3, 5});
  CHECK(w.numel() == 15);
  CHECK(w.bytes.size() == 60);
  CHECK(file.read_f32("model.layers.0.weight") == weight);
  CHECK(file.read_f64("bias") == bias);
  CHECK(file.read_i64("steps") == steps);
  CHECK(file.read_i64("ids") == std::vector<int64_t>(ids.begin(), ids.end()));
  CHECK(file.read_f32("bf16") == bf16_values);
  CHECK(file.read_f32("f16") == f16_values);
  CHECK(file.read_f64("scalar") == std::vector<double>{scalar});
  CHECK(file.get("scalar").shape.empty());
  CHECK(file.read_f32("empty").empty());

  // F64 read as F32 narrows; F32 read as F64 widens exactly.
  const std::vector<float> bias_f32 = file.read_f32("bias");
  for (size_t i = 0; i < bias.size(); ++i) CHECK(bias_f32[i] == static_cast<float>(bias[i]));
  const std::vector<double> weight_f64 = file.read_f64("model.layers.0.weight");
  for (size_t i = 0; i < weight.size(); ++i) CHECK(weight_f64[i] == static_cast<double>(weight[i]));

  // Data laid out in name order, starting 8-byte aligned after the header.
  uint64_t header_length;
  std::memcpy(&header_length, read_text(path).data(), 8);
  CHECK(header_length % 8 == 0);
  CHECK(reinterpret_cast<uintptr_t>(file.get("bf16").bytes.data()) % 8 == 0);
  CHECK(file.get("bf16").bytes.data() < file.get("bias").bytes.data());
  CHECK(file.get("bias").bytes.data() < file.get("steps").bytes.data());

  CHECK_THAT(user_error_of([&] { file.read_f32("steps"); }),
             Contains(path + ": tensor \"steps\" has dtype I64, expected a floating-point dtype"));
  CHECK_THAT(user_error_of([&] { file.read_i64("bias"); }),
             Contains(path + ": tensor \"bias\" has dtype F64, expected an integer dtype"));
  CHECK_THAT(user_error_of([&] { file.get("lm_head.weight"); }),
             Contains(path + ": no tensor named \"lm_head.weight\""));
}

TEST_CASE("safetensors writer output matches the format byte for byte", "[safetensors]") {
  TempDir dir("grass_test_safetensors");
  const std::string path = dir.file("tiny.safetensors");
  const std::vector<float> values = {1.5f, -0.25f};
  grass::SafetensorsWriter writer;
  writer.add("x", "F32", {2}, values.data(), 8);
  writer.write(path, {{"format", "pt"}, {"step", "12"}});

  std::string header =
      R"({"__metadata__":{"format":"pt","step":"12"},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string expected(8, '\0');
  const uint64_t length = header.size();
  std::memcpy(expected.data(), &length, 8);
  expected += header;
  expected.append(reinterpret_cast<const char*>(values.data()), 8);
  CHECK(read_text(path) == expected);

  // Rewriting replaces the file; an empty metadata map leaves __metadata__ out.
  writer.write(path, {});
  const grass::SafetensorsFile file(path);
  CHECK(file.metadata().empty());
  CHECK(file.read_f32("x") == values);
}

TEST_CASE("safetensors writer rejects inconsistent tensors as bugs", "[safetensors]") {
  const std::vector<float> values(6);
  grass::SafetensorsWriter writer;
  CHECK_THROWS_AS(writer.add("a", "F32", {2, 3}, values.data(), 20), grass::InternalError);
  CHECK_THROWS_AS(writer.add("a", "F31", {2, 3}, values.data(), 24), grass::InternalError);
  CHECK_THROWS_AS(writer.add("__metadata__", "F32", {6}, values.data(), 24), grass::InternalError);
  writer.add("a", "F32", {2, 3}, values.data(), 24);
  CHECK_THROWS_AS(writer.add("a", "F32", {6}, values.data(), 24), grass::InternalError);
}

TEST_CASE("safetensors reader rejects a header length beyond the file", "[safetensors]") {
  TempDir dir("grass_test_safetensors");
  const std::string path = dir.file("cut.safetensors");
  const std::string header = R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  write_raw(path, 1000, header, 16);
  CHECK_THAT(open_error(path), Contains(path + ": header length 1000 exceeds the file size"));

  write_raw(path, uint64_t{1} << 62, header, 16);  // an absurd length must not overflow
  CHECK_THAT(open_error(path), Contains(path + ": header length 4611686018427387904 exceeds"));

  const std::string short_file = dir.file("short.safetensors");
  std::ofstream(short_file) << "abc";
  CHECK_THAT(open_error(short_file), Contains(short_file + ": not a safetensors file (3 bytes"));

  CHECK_THAT(open_error(dir.file("absent.safetensors")),
             Contains(dir.file("absent.safetensors") + ": cannot open: No such file or directory"));
}

TEST_CASE("safetensors reader rejects malformed headers", "[safetensors]") {
  TempDir dir("grass_test_safetensors");
  const std::string path = dir.file("bad.safetensors");

  write_raw(path, R"({"x": {"dtype": "F32", "shape": [4], )", 16);
  CHECK_THAT(open_error(path), Contains(path + ": header: invalid JSON"));

  write_raw(path, R"([1, 2])", 0);
  CHECK_THAT(open_error(path), Contains(path + ": header is not a JSON object"));

  write_raw(path, R"({"x":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}})", 16);
  CHECK_THAT(open_error(path), Contains(path + ": tensor \"x\": unknown dtype Q4"));

  write_raw(path, R"({"x":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", 16);
  CHECK_THAT(open_error(path),
             Contains(path + ": tensor \"x\": a shape entry is not a non-negative integer"));

  write_raw(path, R"({"x":{"dtype":"F32","shape":[4]}})", 16);
  CHECK_THAT(open_error(path),
             Contains(path + ": tensor \"x\": \"data_offsets\" must be an array"));

  write_raw(path, R"({"__metadata__":{"format":1}})", 0);
  CHECK_THAT(open_error(path),
             Contains(path + ": __metadata__ value for \"format\" is not a string"));
}

TEST_CASE("safetensors reader rejects out-of-range and overlapping offsets", "[safetensors]") {
  TempDir dir("grass_test_safetensors");
  const std::string path = dir.file("offsets.safetensors");

  write_raw(path, R"({"x":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", 16);
  CHECK_THAT(
      open_error(path),
      Contains(path +
               ": tensor \"x\": data_offsets [0, 32] lie outside the data section of 16 bytes"));

  write_raw(path, R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 16);
  CHECK_THAT(open_error(path), Contains(path + ": tensor \"x\": data_offsets [8, 4] lie outside"));

  write_raw(path,
            R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
            R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
            24);
  CHECK_THAT(open_error(path), Contains(path + ": tensors \"a\" and \"b\" overlap"));

  // Touching ranges and a zero-size tensor inside another's range are fine.
  write_raw(path,
            R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},)"
            R"("c":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
            24);
  const grass::SafetensorsFile file(path);
  CHECK(file.names().size() == 3);
}

TEST_CASE("safetensors reader rejects a tensor whose bytes do not match its shape",
          "[safetensors]") {
  TempDir dir("grass_test_safetensors");
  const std::string path = dir.file("mismatch.safetensors");
  write_raw(path, R"({"w":{"dtype":"F32","shape":[3,3],"data_offsets":[0,32]}})", 32);
  CHECK_THAT(
      open_error(path),
      Contains(
          path +
          ": tensor \"w\": data_offsets span 32 bytes but F32 with shape [3,3] needs 9 x 4 bytes"));

  write_raw(path, R"({"w":{"dtype":"BF16","shape":[4294967296,4294967296],"data_offsets":[0,32]}})",
            32);
  CHECK_THAT(
      open_error(path),
      Contains(path + ": tensor \"w\": shape [4294967296,4294967296] has too many elements"));
}
