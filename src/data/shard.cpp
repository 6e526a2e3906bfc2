#include "src/data/shard.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include "src/core/error.h"
#include "src/io/hash.h"

namespace grass {

// Header fields are copied in and out with memcpy at fixed offsets, and tokens are read in
// place from the map: both rely on a little-endian host, which every supported target is.
static_assert(std::endian::native == std::endian::little,
              "grass shards assume a little-endian host");

namespace {

// Byte offsets of the header fields (docs/formats.md). The checksum covers bytes [0, 48).
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 8;
constexpr size_t kOffTokenBytes = 12;
constexpr size_t kOffTokenCount = 16;
constexpr size_t kOffVocabSize = 24;
constexpr size_t kOffBosId = 28;
constexpr size_t kOffEosId = 32;
constexpr size_t kOffReserved0 = 36;
constexpr size_t kOffTokenizerHash = 40;
constexpr size_t kOffHeaderChecksum = 48;

using HeaderBytes = unsigned char[kShardHeaderBytes];

template <typename T>
void store(HeaderBytes& header, size_t offset, T value) {
  std::memcpy(header + offset, &value, sizeof(T));
}

template <typename T>
T load(const std::byte* header, size_t offset) {
  T value;
  std::memcpy(&value, header + offset, sizeof(T));
  return value;
}

void encode_header(const ShardInfo& info, HeaderBytes& header) {
  std::memset(header, 0, kShardHeaderBytes);
  std::memcpy(header + kOffMagic, kShardMagic, sizeof(kShardMagic));
  store<uint32_t>(header, kOffVersion, kShardVersion);
  store<uint32_t>(header, kOffTokenBytes, info.token_bytes);
  store<uint64_t>(header, kOffTokenCount, info.token_count);
  store<uint32_t>(header, kOffVocabSize, info.vocab_size);
  store<int32_t>(header, kOffBosId, info.bos_id);
  store<int32_t>(header, kOffEosId, info.eos_id);
  store<uint32_t>(header, kOffReserved0, 0);
  store<uint64_t>(header, kOffTokenizerHash, info.tokenizer_hash);
  store<uint64_t>(header, kOffHeaderChecksum, fnv1a64(header, kOffHeaderChecksum));
}

std::string errno_text() { return std::strerror(errno); }

// Index of the first token >= limit in tokens[0, count). Each chunk first takes a max, which
// vectorizes, and is searched element by element only when it holds an offending token.
template <typename Token>
std::optional<uint64_t> find_first_at_least(const Token* tokens, uint64_t count, uint32_t limit) {
  constexpr uint64_t kChunk = uint64_t{1} << 20;
  const int64_t chunks = static_cast<int64_t>((count + kChunk - 1) / kChunk);
  uint64_t first = count;
#pragma omp parallel for schedule(dynamic, 1) reduction(min : first)
  for (int64_t c = 0; c < chunks; ++c) {
    const uint64_t begin = static_cast<uint64_t>(c) * kChunk;
    const uint64_t end = std::min(begin + kChunk, count);
    Token chunk_max = 0;
    for (uint64_t i = begin; i < end; ++i) chunk_max = std::max(chunk_max, tokens[i]);
    if (chunk_max < limit) continue;
    for (uint64_t i = begin; i < end; ++i) {
      if (tokens[i] >= limit) {
        first = std::min(first, i);
        break;
      }
    }
  }
  if (first == count) return std::nullopt;
  return first;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ShardWriter

ShardWriter::ShardWriter(std::string path, const ShardSpec& spec)
    : path_(std::move(path)),
      tmp_path_(path_ + ".tmp"),
      spec_(spec),
      token_bytes_(shard_token_bytes(spec.vocab_size)) {
  GRASS_CHECK(spec.vocab_size > 0, "ShardWriter needs a positive vocab_size");
  GRASS_CHECK(spec.bos_id < static_cast<int64_t>(spec.vocab_size) &&
                  spec.eos_id < static_cast<int64_t>(spec.vocab_size),
              "ShardWriter: bos_id and eos_id must be below vocab_size");
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  if (!file_) throw UserError(tmp_path_ + ": cannot create: " + errno_text());
  // A zero placeholder (no magic) until finish() knows the count: an unfinished file is
  // never mistaken for a shard.
  const HeaderBytes placeholder = {};
  if (std::fwrite(placeholder, 1, kShardHeaderBytes, file_) != kShardHeaderBytes) {
    const std::string reason = errno_text();
    abandon();
    throw UserError(tmp_path_ + ": write failed: " + reason);
  }
}

ShardWriter::~ShardWriter() { abandon(); }

ShardWriter::ShardWriter(ShardWriter&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_path_(std::move(other.tmp_path_)),
      spec_(other.spec_),
      token_bytes_(other.token_bytes_),
      token_count_(other.token_count_),
      file_(std::exchange(other.file_, nullptr)),
      encode_buffer_(std::move(other.encode_buffer_)) {}

ShardWriter& ShardWriter::operator=(ShardWriter&& other) noexcept {
  if (this != &other) {
    abandon();
    path_ = std::move(other.path_);
    tmp_path_ = std::move(other.tmp_path_);
    spec_ = other.spec_;
    token_bytes_ = other.token_bytes_;
    token_count_ = other.token_count_;
    file_ = std::exchange(other.file_, nullptr);
    encode_buffer_ = std::move(other.encode_buffer_);
  }
  return *this;
}

void ShardWriter::abandon() noexcept {
  if (!file_) return;
  std::fclose(file_);
  file_ = nullptr;
  std::remove(tmp_path_.c_str());
}

void ShardWriter::append(std::span<const uint32_t> tokens) {
  GRASS_CHECK(file_ != nullptr, "ShardWriter::append after finish() or a failed append");
  // Encode in bounded chunks so appending a huge span does not double its memory.
  constexpr size_t kChunkTokens = size_t{1} << 16;
  encode_buffer_.resize(kChunkTokens * token_bytes_);
  for (size_t begin = 0; begin < tokens.size(); begin += kChunkTokens) {
    const size_t n = std::min(kChunkTokens, tokens.size() - begin);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t token = tokens[begin + i];
      if (token >= spec_.vocab_size) {
        abandon();
        throw UserError(path_ + ": token id " + std::to_string(token) + " at position " +
                        std::to_string(token_count_ + begin + i) + " is >= vocab_size " +
                        std::to_string(spec_.vocab_size) +
                        "; the tokenizer and the vocab_size given to the writer disagree");
      }
      if (token_bytes_ == 2) {
        const auto narrow = static_cast<uint16_t>(token);
        std::memcpy(&encode_buffer_[i * 2], &narrow, 2);
      } else {
        std::memcpy(&encode_buffer_[i * 4], &token, 4);
      }
    }
    if (std::fwrite(encode_buffer_.data(), token_bytes_, n, file_) != n) {
      const std::string reason = errno_text();
      abandon();
      throw UserError(tmp_path_ + ": write failed: " + reason);
    }
  }
  token_count_ += tokens.size();
}

void ShardWriter::finish() {
  GRASS_CHECK(file_ != nullptr, "ShardWriter::finish after finish() or a failed append");
  ShardInfo info;
  info.token_bytes = token_bytes_;
  info.token_count = token_count_;
  info.vocab_size = spec_.vocab_size;
  info.bos_id = spec_.bos_id;
  info.eos_id = spec_.eos_id;
  info.tokenizer_hash = spec_.tokenizer_hash;
  HeaderBytes header;
  encode_header(info, header);

  // fsync before the rename: after a crash the final name holds either nothing or all tokens.
  const bool written = std::fseek(file_, 0, SEEK_SET) == 0 &&
                       std::fwrite(header, 1, kShardHeaderBytes, file_) == kShardHeaderBytes &&
                       std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  if (!written) {
    const std::string reason = errno_text();
    abandon();
    throw UserError(tmp_path_ + ": write failed: " + reason);
  }
  const int close_status = std::fclose(file_);
  file_ = nullptr;
  if (close_status != 0) {
    const std::string reason = errno_text();
    std::remove(tmp_path_.c_str());
    throw UserError(tmp_path_ + ": write failed: " + reason);
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const std::string reason = errno_text();
    std::remove(tmp_path_.c_str());
    throw UserError(path_ + ": cannot rename " + tmp_path_ + " into place: " + reason);
  }
}

// ---------------------------------------------------------------------------------------------
// ShardReader

ShardReader::ShardReader(const std::string& path) : file_(path) {
  info_.path = path;
  const std::span<const std::byte> bytes = file_.bytes();
  const uint64_t file_bytes = bytes.size();
  const std::byte* header = bytes.data();

  if (file_bytes < sizeof(kShardMagic) ||
      std::memcmp(header + kOffMagic, kShardMagic, sizeof(kShardMagic)) != 0)
    throw UserError(path + ": not a grass token shard (bad magic)");
  if (file_bytes < kShardHeaderBytes)
    throw UserError(path + ": truncated: the file has " + std::to_string(file_bytes) +
                    " bytes, fewer than the " + std::to_string(kShardHeaderBytes) + "-byte header");
  const uint32_t version = load<uint32_t>(header, kOffVersion);
  if (version != kShardVersion)
    throw UserError(path + ": unsupported shard version " + std::to_string(version) +
                    " (this grass reads version " + std::to_string(kShardVersion) +
                    "); re-create the shard with this grass's tools");
  if (load<uint64_t>(header, kOffHeaderChecksum) != fnv1a64(header, kOffHeaderChecksum))
    throw UserError(path + ": corrupt header (checksum mismatch); re-create the shard");

  info_.token_bytes = load<uint32_t>(header, kOffTokenBytes);
  info_.token_count = load<uint64_t>(header, kOffTokenCount);
  info_.vocab_size = load<uint32_t>(header, kOffVocabSize);
  info_.bos_id = load<int32_t>(header, kOffBosId);
  info_.eos_id = load<int32_t>(header, kOffEosId);
  info_.tokenizer_hash = load<uint64_t>(header, kOffTokenizerHash);

  if (info_.token_bytes != 2 && info_.token_bytes != 4)
    throw UserError(path + ": invalid header: token_bytes is " + std::to_string(info_.token_bytes) +
                    " (must be 2 or 4)");
  if (info_.vocab_size == 0) throw UserError(path + ": invalid header: vocab_size is 0");
  if (info_.token_bytes < shard_token_bytes(info_.vocab_size))
    throw UserError(path + ": invalid header: vocab_size " + std::to_string(info_.vocab_size) +
                    " does not fit in " + std::to_string(info_.token_bytes) + "-byte tokens");

  const uint64_t max_count = (UINT64_MAX - kShardHeaderBytes) / info_.token_bytes;
  if (info_.token_count > max_count)
    throw UserError(path + ": invalid header: token_count " + std::to_string(info_.token_count) +
                    " is impossibly large");
  const uint64_t expected_bytes = kShardHeaderBytes + info_.token_count * info_.token_bytes;
  if (file_bytes != expected_bytes) {
    const std::string what = file_bytes < expected_bytes ? "truncated" : "trailing bytes";
    throw UserError(path + ": " + what + ": header says " + std::to_string(info_.token_count) +
                    " tokens (" + std::to_string(expected_bytes) + " bytes) but the file has " +
                    std::to_string(file_bytes) + " bytes");
  }
}

uint32_t ShardReader::token(uint64_t index) const {
  GRASS_CHECK(index < info_.token_count, "ShardReader::token index out of range");
  if (info_.token_bytes == 2) return reinterpret_cast<const uint16_t*>(tokens())[index];
  return reinterpret_cast<const uint32_t*>(tokens())[index];
}

void ShardReader::read(uint64_t offset, uint64_t n, uint32_t* out) const {
  // Written as n <= count - offset so that offset + n cannot overflow.
  GRASS_CHECK(offset <= info_.token_count && n <= info_.token_count - offset,
              "ShardReader::read range out of bounds");
  if (n == 0) return;  // out may be null for an empty read
  if (info_.token_bytes == 4) {
    std::memcpy(out, tokens() + offset * 4, n * 4);
    return;
  }
  const uint16_t* narrow = reinterpret_cast<const uint16_t*>(tokens()) + offset;
  for (uint64_t i = 0; i < n; ++i) out[i] = narrow[i];
}

std::optional<uint64_t> ShardReader::find_first_token_at_least(uint32_t limit) const {
  if (info_.token_bytes == 2)
    return find_first_at_least(reinterpret_cast<const uint16_t*>(tokens()), info_.token_count,
                               limit);
  return find_first_at_least(reinterpret_cast<const uint32_t*>(tokens()), info_.token_count, limit);
}

}  // namespace grass
