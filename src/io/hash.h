// Checksums. 64-bit FNV-1a: a small, dependency-free checksum for file headers and tokenizer
// identity. CRC-32 (zlib's, the one of gzip, zip and PNG): checkpoint files, computed on all cores.
// Neither is cryptographic; they catch corruption and mismatched files, not tampering.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace grass {

inline constexpr uint64_t kFnv1a64OffsetBasis = 14695981039346656037ull;
inline constexpr uint64_t kFnv1a64Prime = 1099511628211ull;

// Hash `bytes` bytes at `data`. Pass a previous result as `seed` to hash data in pieces:
// fnv1a64(b, nb, fnv1a64(a, na)) == fnv1a64 of a followed by b.
inline uint64_t fnv1a64(const void* data, size_t bytes, uint64_t seed = kFnv1a64OffsetBasis) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= kFnv1a64Prime;
  }
  return h;
}

// FNV-1a of a whole file's bytes (streamed, so any size works). UserError if it cannot be read.
uint64_t fnv1a64_file(const std::string& path);

// CRC-32 (polynomial 0xEDB88320, as zlib.crc32 in Python) of `bytes` bytes, in 16 MiB pieces on
// all cores, joined with crc32_combine: the same value as a serial pass, at memory speed.
uint32_t crc32_bytes(const void* data, size_t bytes);
// CRC-32 of a whole file (mapped). UserError naming the file if it cannot be read.
uint32_t crc32_file(const std::string& path);

}  // namespace grass
