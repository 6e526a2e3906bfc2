#include "io/hash.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"

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

}  // namespace grass
