#include "src/io/hash.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include <zlib.h>

#include "src/core/error.h"
#include "src/io/mapped_file.h"

namespace grass {

uint64_t fnv1a64_file(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) throw UserError(path + ": cannot open: " + std::strerror(errno));
  std::vector<unsigned char> chunk(1 << 20);
  uint64_t h = kFnv1a64OffsetBasis;
  size_t got;
  while ((got = std::fread(chunk.data(), 1, chunk.size(), file.get())) > 0)
    h = fnv1a64(chunk.data(), got, h);
  if (std::ferror(file.get())) throw UserError(path + ": read failed: " + std::strerror(errno));
  return h;
}

uint32_t crc32_bytes(const void* data, size_t bytes) {
  constexpr size_t kPiece = size_t(16) << 20;
  const auto* p = static_cast<const Bytef*>(data);
  const int64_t pieces = int64_t((bytes + kPiece - 1) / kPiece);
  if (pieces <= 1) return uint32_t(crc32_z(crc32_z(0, nullptr, 0), p, bytes));
  std::vector<uLong> crcs(size_t(pieces), 0);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < pieces; i++) {
    const size_t begin = size_t(i) * kPiece, n = std::min(kPiece, bytes - begin);
    crcs[size_t(i)] = crc32_z(crc32_z(0, nullptr, 0), p + begin, n);
  }
  uLong crc = crcs[0];
  for (int64_t i = 1; i < pieces; i++) {
    const size_t begin = size_t(i) * kPiece, n = std::min(kPiece, bytes - begin);
    crc = crc32_combine(crc, crcs[size_t(i)], z_off_t(n));
  }
  return uint32_t(crc);
}

uint32_t crc32_file(const std::string& path) {
  const MappedFile file(path);
  return crc32_bytes(file.bytes().data(), file.size());
}

}  // namespace grass
