// Token shards: the pre-tokenized training data, one flat stream of token ids per file.
//
// Layout (little-endian, docs/formats.md has the table): a fixed 256-byte header, then
// token_count tokens of token_bytes each (uint16 when vocab_size <= 65536, else uint32).
// All offsets and counts are 64-bit, so a shard may exceed 4 GiB and 2^32 tokens.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "src/io/mapped_file.h"

namespace grass {

inline constexpr char kShardMagic[8] = {'G', 'R', 'A', 'S', 'S', 'T', 'O', 'K'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 256;

struct ShardInfo {
  std::string path;
  uint32_t token_bytes = 0;  // 2 (uint16 tokens) or 4 (uint32 tokens)
  uint64_t token_count = 0;
  uint32_t vocab_size = 0;      // every token id is < vocab_size
  int32_t bos_id = -1;          // -1: none
  int32_t eos_id = -1;          // -1: none
  uint64_t tokenizer_hash = 0;  // fnv1a64 of the tokenizer model file; 0: no tokenizer
};

// What a writer needs to know up front (the token width follows from vocab_size).
struct ShardSpec {
  uint32_t vocab_size = 0;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  uint64_t tokenizer_hash = 0;
};

// Token width the writer picks for a vocabulary: 2 bytes when every id fits in uint16.
constexpr uint32_t shard_token_bytes(uint32_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

// Streams tokens to "<path>.tmp" and renames it to `path` in finish(), so a crash or an
// exception never leaves a partial shard under the final name. Destroying an unfinished writer
// deletes the temporary file.
class ShardWriter {
 public:
  ShardWriter(std::string path, const ShardSpec& spec);
  ~ShardWriter();
  ShardWriter(ShardWriter&& other) noexcept;
  ShardWriter& operator=(ShardWriter&& other) noexcept;
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends tokens; each must be < vocab_size (UserError naming the token otherwise). After an
  // error the temporary file is deleted and the writer accepts no more calls.
  void append(std::span<const uint32_t> tokens);
  // Writes the header with the final count, flushes, and renames the file into place.
  void finish();

  uint64_t token_count() const { return token_count_; }
  const std::string& path() const { return path_; }

 private:
  void abandon() noexcept;  // close and delete the temporary file

  std::string path_;
  std::string tmp_path_;
  ShardSpec spec_;
  uint32_t token_bytes_ = 0;
  uint64_t token_count_ = 0;
  std::FILE* file_ = nullptr;                 // null once finished or abandoned
  std::vector<unsigned char> encode_buffer_;  // tokens narrowed to token_bytes_, reused
};

// A read-only memory map of one shard, validated on open: magic, version, header checksum,
// token width, and a file size of exactly 256 + token_count * token_bytes.
class ShardReader {
 public:
  explicit ShardReader(const std::string& path);
  ShardReader(ShardReader&&) noexcept = default;
  ShardReader& operator=(ShardReader&&) noexcept = default;

  const ShardInfo& info() const { return info_; }
  uint64_t token_count() const { return info_.token_count; }

  uint32_t token(uint64_t index) const;
  // Copies tokens [offset, offset + n) into out[0 .. n), widened to uint32.
  void read(uint64_t offset, uint64_t n, uint32_t* out) const;
  // Index of the first token >= limit, if any (a parallel scan of the whole shard).
  std::optional<uint64_t> find_first_token_at_least(uint32_t limit) const;

 private:
  // [token_count * token_bytes], just past the header.
  const std::byte* tokens() const { return file_.bytes().data() + kShardHeaderBytes; }

  MappedFile file_;  // the whole shard, header included
  ShardInfo info_;
};

}  // namespace grass
