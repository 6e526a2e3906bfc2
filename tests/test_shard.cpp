// Token shards: round trips at both token widths, the on-disk header layout, and the one-line
// errors for damaged files. Also the FNV-1a hash the header checksum uses.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "src/core/error.h"
#include "src/data/shard.h"
#include "src/io/hash.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using namespace grass::test;

namespace {

std::vector<unsigned char> shard_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
T field(const std::vector<unsigned char>& bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

// Overwrites a header field and re-seals the checksum, as a writer of that header would.
template <typename T>
void set_field_resealed(std::vector<unsigned char>& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
  const uint64_t checksum = grass::fnv1a64(bytes.data(), 48);
  std::memcpy(bytes.data() + 48, &checksum, 8);
}

}  // namespace

TEST_CASE("fnv1a64 matches the published test vectors and hashes in pieces", "[hash]") {
  CHECK(grass::fnv1a64("", 0) == 0xcbf29ce484222325ull);
  CHECK(grass::fnv1a64("a", 1) == 0xaf63dc4c8601ec8cull);
  CHECK(grass::fnv1a64("foobar", 6) == 0x85944171f73967e8ull);
  CHECK(grass::fnv1a64("bar", 3, grass::fnv1a64("foo", 3)) == grass::fnv1a64("foobar", 6));

  TempDir dir("grass_test_shard");
  const std::string path = dir.file("tokenizer.model");
  const std::vector<uint32_t> words = random_tokens(300000, 1u << 31, 5);  // > the 1 MiB read chunk
  std::vector<unsigned char> bytes(words.size() * 4);
  std::memcpy(bytes.data(), words.data(), bytes.size());
  write_bytes(path, bytes);
  CHECK(grass::fnv1a64_file(path) == grass::fnv1a64(bytes.data(), bytes.size()));
  CHECK_THAT(user_error_of([&] { grass::fnv1a64_file(dir.file("absent.model")); }),
             Contains("absent.model: cannot open: No such file or directory"));
}

TEST_CASE("shard round trip with uint16 tokens", "[shard]") {
  TempDir dir("grass_test_shard");
  const std::string path = dir.file("small.bin");
  const grass::ShardSpec spec{
      .vocab_size = 32000, .bos_id = 1, .eos_id = 2, .tokenizer_hash = 0x1234abcd5678ef90ull};
  const std::vector<uint32_t> tokens = random_tokens(10007, spec.vocab_size, 1);
  {
    grass::ShardWriter writer(path, spec);
    // Several appends of uneven size: the stream must come out as one sequence.
    writer.append(std::span(tokens).subspan(0, 3));
    writer.append(std::span(tokens).subspan(3, 7000));
    writer.append(std::span(tokens).subspan(7003));
    CHECK(writer.token_count() == tokens.size());
    writer.finish();
  }
  CHECK(fs::file_size(path) == 256 + tokens.size() * 2);

  const grass::ShardReader reader(path);
  const grass::ShardInfo& info = reader.info();
  CHECK(info.path == path);
  CHECK(info.token_bytes == 2);
  CHECK(info.token_count == tokens.size());
  CHECK(info.vocab_size == 32000);
  CHECK(info.bos_id == 1);
  CHECK(info.eos_id == 2);
  CHECK(info.tokenizer_hash == 0x1234abcd5678ef90ull);
  for (size_t i = 0; i < tokens.size(); ++i) REQUIRE(reader.token(i) == tokens[i]);
  std::vector<uint32_t> range(500);
  reader.read(4321, range.size(), range.data());
  CHECK(std::equal(range.begin(), range.end(), tokens.begin() + 4321));
}

TEST_CASE("shard round trip with uint32 tokens for a vocabulary above 65536", "[shard]") {
  TempDir dir("grass_test_shard");
  const std::string path = dir.file("wide.bin");
  const grass::ShardSpec spec{.vocab_size = 100000};
  std::vector<uint32_t> tokens = random_tokens(5000, spec.vocab_size, 2);
  tokens[17] = 99999;  // the largest id, which needs more than 16 bits
  write_shard(path, tokens, spec);
  CHECK(fs::file_size(path) == 256 + tokens.size() * 4);

  const grass::ShardReader reader(path);
  CHECK(reader.info().token_bytes == 4);
  CHECK(reader.info().bos_id == -1);
  CHECK(reader.info().eos_id == -1);
  CHECK(reader.info().tokenizer_hash == 0);
  std::vector<uint32_t> all(tokens.size());
  reader.read(0, all.size(), all.data());
  CHECK(all == tokens);
}

TEST_CASE("shard token width is uint16 up to vocab 65536 and uint32 above", "[shard]") {
  STATIC_REQUIRE(grass::shard_token_bytes(65536) == 2);
  STATIC_REQUIRE(grass::shard_token_bytes(65537) == 4);
  TempDir dir("grass_test_shard");
  const std::string path = dir.file("edge.bin");
  const std::vector<uint32_t> tokens = {65535, 0, 40000, 65535};
  write_shard(path, tokens, {.vocab_size = 65536});
  const grass::ShardReader reader(path);
  CHECK(reader.info().token_bytes == 2);
  for (size_t i = 0; i < tokens.size(); ++i) CHECK(reader.token(i) == tokens[i]);
}

TEST_CASE("shard offsets and counts are 64-bit", "[shard]") {
  // Shards above 4 GiB are impractical in a unit test; the types and the arithmetic are not.
  STATIC_REQUIRE(std::is_same_v<decltype(grass::ShardInfo::token_count), uint64_t>);
  STATIC_REQUIRE(std::is_same_v<decltype(&grass::ShardReader::read),
                                void (grass::ShardReader::*)(uint64_t, uint64_t, uint32_t*) const>);
  STATIC_REQUIRE(std::is_same_v<decltype(&grass::ShardReader::token),
                                uint32_t (grass::ShardReader::*)(uint64_t) const>);

  TempDir dir("grass_test_shard");
  const std::string path = dir.file("edge.bin");
  const std::vector<uint32_t> tokens = random_tokens(777, 50000, 3);
  write_shard(path, tokens, {.vocab_size = 50000});
  {
    const grass::ShardReader reader(path);
    std::vector<uint32_t> tail(5);
    reader.read(tokens.size() - 5, 5, tail.data());
    CHECK(std::equal(tail.begin(), tail.end(), tokens.end() - 5));
    reader.read(tokens.size(), 0, nullptr);  // an empty read at the very end is valid
    CHECK_THROWS_AS(reader.read(tokens.size() - 2, 3, tail.data()), grass::InternalError);
    // offset + n would wrap around to a small number in 64-bit arithmetic: still rejected.
    CHECK_THROWS_AS(reader.read(5, UINT64_MAX - 2, tail.data()), grass::InternalError);
  }

  // A header claiming 2^32 + 3 tokens: the expected size (2^33 + 262 bytes) must not wrap.
  std::vector<unsigned char> bytes = shard_bytes(path);
  set_field_resealed<uint64_t>(bytes, 16, (uint64_t{1} << 32) + 3);
  write_bytes(path, bytes);
  CHECK_THAT(user_error_of([&] { grass::ShardReader reader(path); }),
             Contains(path) && Contains("header says 4294967299 tokens (8589934854 bytes)"));
}

TEST_CASE("shard header layout matches docs/formats.md", "[shard]") {
  TempDir dir("grass_test_shard");
  const std::string path = dir.file("layout.bin");
  write_shard(path, random_tokens(10, 1000, 4),
              {.vocab_size = 1000, .bos_id = 7, .eos_id = 9, .tokenizer_hash = 42});
  const std::vector<unsigned char> bytes = shard_bytes(path);
  REQUIRE(bytes.size() == 256 + 20);
  CHECK(std::memcmp(bytes.data(), "GRASSTOK", 8) == 0);
  CHECK(field<uint32_t>(bytes, 8) == 1);                                  // version
  CHECK(field<uint32_t>(bytes, 12) == 2);                                 // token_bytes
  CHECK(field<uint64_t>(bytes, 16) == 10);                                // token_count
  CHECK(field<uint32_t>(bytes, 24) == 1000);                              // vocab_size
  CHECK(field<int32_t>(bytes, 28) == 7);                                  // bos_id
  CHECK(field<int32_t>(bytes, 32) == 9);                                  // eos_id
  CHECK(field<uint32_t>(bytes, 36) == 0);                                 // reserved0
  CHECK(field<uint64_t>(bytes, 40) == 42);                                // tokenizer_hash
  CHECK(field<uint64_t>(bytes, 48) == grass::fnv1a64(bytes.data(), 48));  // header_checksum
  for (size_t i = 56; i < 256; ++i) REQUIRE(bytes[i] == 0);
}

TEST_CASE("shard reader rejects truncated and padded files with the sizes", "[shard]") {
  TempDir dir("grass_test_shard");
  const std::string path = dir.file("x.bin");
  write_shard(path, random_tokens(1000, 32000, 5), {.vocab_size = 32000});

  fs::resize_file(path, 1800);
  CHECK_THAT(
      user_error_of([&] { grass::ShardReader reader(path); }),
      Contains(path +
               ": truncated: header says 1000 tokens (2256 bytes) but the file has 1800 bytes"));

  fs::resize_file(path, 2300);
  CHECK_THAT(
      user_error_of([&] { grass::ShardReader reader(path); }),
      Contains(
          path +
          ": trailing bytes: header says 1000 tokens (2256 bytes) but the file has 2300 bytes"));

  fs::resize_file(path, 100);  // magic intact, header cut short
  CHECK_THAT(
      user_error_of([&] { grass::ShardReader reader(path); }),
      Contains(path + ": truncated: the file has 100 bytes, fewer than the 256-byte header"));
}

TEST_CASE("shard reader rejects files that are not shards", "[shard]") {
  TempDir dir("grass_test_shard");
  const std::string noise = dir.file("noise.bin");
  std::vector<unsigned char> bytes(600);
  std::mt19937 rng(6);
  for (unsigned char& b : bytes) b = static_cast<unsigned char>(rng());
  write_bytes(noise, bytes);
  CHECK_THAT(user_error_of([&] { grass::ShardReader reader(noise); }),
             Contains(noise + ": not a grass token shard (bad magic)"));

  const std::string empty = dir.file("empty.bin");
  write_bytes(empty, {});
  CHECK_THAT(user_error_of([&] { grass::ShardReader reader(empty); }),
             Contains(empty + ": not a grass token shard (bad magic)"));

  const std::string missing = dir.file("missing.bin");
  CHECK_THAT(user_error_of([&] { grass::ShardReader reader(missing); }),
             Contains(missing + ": cannot open: No such file or directory"));

  CHECK_THAT(user_error_of([&] { grass::ShardReader reader(dir.path.string()); }),
             Contains(dir.path.string() + ": not a regular file"));
}

TEST_CASE("shard reader detects a corrupted header byte and a foreign version", "[shard]") {
  TempDir dir("grass_test_shard");
  const std::string path = dir.file("x.bin");
  write_shard(path, random_tokens(64, 32000, 7), {.vocab_size = 32000});
  const std::vector<unsigned char> good = shard_bytes(path);

  // Every byte the checksum covers, other than the magic and the version (checked first).
  for (size_t offset = 12; offset < 56; ++offset) {
    std::vector<unsigned char> bad = good;
    bad[offset] ^= 0x10;
    write_bytes(path, bad);
    INFO("flipped byte " << offset);
    CHECK_THAT(user_error_of([&] { grass::ShardReader reader(path); }),
               Contains(path + ": corrupt header (checksum mismatch)"));
  }

  std::vector<unsigned char> future = good;
  set_field_resealed<uint32_t>(future, 8, 2);
  write_bytes(path, future);
  CHECK_THAT(user_error_of([&] { grass::ShardReader reader(path); }),
             Contains(path + ": unsupported shard version 2"));

  std::vector<unsigned char> odd_width = good;
  set_field_resealed<uint32_t>(odd_width, 12, 3);
  write_bytes(path, odd_width);
  CHECK_THAT(user_error_of([&] { grass::ShardReader reader(path); }),
             Contains(path + ": invalid header: token_bytes is 3"));
}

TEST_CASE("shard writer writes to a temporary file and renames it on finish", "[shard]") {
  TempDir dir("grass_test_shard");
  const std::string path = dir.file("atomic.bin");
  const std::vector<uint32_t> tokens = random_tokens(2000, 500, 8);
  {
    grass::ShardWriter writer(path, {.vocab_size = 500});
    writer.append(tokens);
    CHECK_FALSE(fs::exists(path));
    CHECK(fs::exists(path + ".tmp"));
    // A half-written file is not a shard, even under its temporary name.
    CHECK_THAT(user_error_of([&] { grass::ShardReader reader(path + ".tmp"); }),
               Contains("bad magic"));
    writer.finish();
    CHECK(fs::exists(path));
    CHECK_FALSE(fs::exists(path + ".tmp"));
  }
  CHECK(grass::ShardReader(path).token_count() == tokens.size());

  const std::string abandoned = dir.file("abandoned.bin");
  {
    grass::ShardWriter writer(abandoned, {.vocab_size = 500});
    writer.append(tokens);
  }  // destroyed without finish(), as when an exception unwinds
  CHECK_FALSE(fs::exists(abandoned));
  CHECK_FALSE(fs::exists(abandoned + ".tmp"));

  CHECK_THAT(
      user_error_of(
          [&] { grass::ShardWriter writer(dir.file("no/such/dir/x.bin"), {.vocab_size = 500}); }),
      Contains(dir.file("no/such/dir/x.bin.tmp") + ": cannot create: No such file or directory"));
}

TEST_CASE("shard writer rejects a token outside the vocabulary", "[shard]") {
  TempDir dir("grass_test_shard");
  const std::string path = dir.file("bad.bin");
  grass::ShardWriter writer(path, {.vocab_size = 1000});
  writer.append(random_tokens(100, 1000, 9));
  std::vector<uint32_t> more = random_tokens(50, 1000, 10);
  more[20] = 1000;
  CHECK_THAT(user_error_of([&] { writer.append(more); }),
             Contains(path + ": token id 1000 at position 120 is >= vocab_size 1000"));
  CHECK_FALSE(fs::exists(path + ".tmp"));
  CHECK_THROWS_AS(writer.finish(), grass::InternalError);
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE("shard reader is movable and finds the first token above a limit", "[shard]") {
  TempDir dir("grass_test_shard");
  // More than two 2^20-token scan chunks, so the parallel search has several to reduce over.
  for (uint32_t vocab : {32000u, 70000u}) {
    const std::string path = dir.file("scan" + std::to_string(vocab) + ".bin");
    std::vector<uint32_t> tokens = random_tokens(2'600'000, 1000, 11);
    tokens[2'500'000] = 5000;
    tokens[2'500'001] = vocab - 1;
    tokens[1'900'000] = 1000;  // the first token >= 1000
    write_shard(path, tokens, {.vocab_size = vocab});

    grass::ShardReader first(path);
    grass::ShardReader reader(std::move(first));
    CHECK(reader.token_count() == tokens.size());
    CHECK(reader.find_first_token_at_least(1000) == std::optional<uint64_t>(1'900'000));
    CHECK(reader.find_first_token_at_least(5000) == std::optional<uint64_t>(2'500'000));
    CHECK(reader.find_first_token_at_least(vocab) == std::nullopt);
    CHECK(reader.token(2'500'001) == vocab - 1);
  }
}
