#include "src/io/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "src/core/error.h"
#include "src/io/mapped_file.h"

namespace grass {

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

void write_durably(const std::string& path, const std::function<bool(std::FILE*)>& write) {
  const std::string tmp_path = path + ".tmp";
  std::FILE* file = std::fopen(tmp_path.c_str(), "wb");
  if (!file) throw UserError(tmp_path + ": cannot create: " + errno_text());
  bool written = write(file);
  // fsync before the rename: after a crash the final name holds the old file or the new one.
  written = written && std::fflush(file) == 0 && ::fsync(::fileno(file)) == 0;
  const std::string write_error = written ? "" : errno_text();
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed) {
    const std::string reason = written ? errno_text() : write_error;
    std::remove(tmp_path.c_str());
    throw UserError(tmp_path + ": write failed: " + reason);
  }
  if (std::rename(tmp_path.c_str(), path.c_str()) != 0) {
    const std::string reason = errno_text();
    std::remove(tmp_path.c_str());
    throw UserError(path + ": cannot rename " + tmp_path + " into place: " + reason);
  }
}

void write_file_durably(const std::string& path, std::string_view bytes) {
  write_durably(path, [&](std::FILE* file) {
    return bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size();
  });
}

void copy_file_durably(const std::string& source, const std::string& destination) {
  const MappedFile in(source);
  write_file_durably(destination, std::string_view(reinterpret_cast<const char*>(in.bytes().data()),
                                                   in.size()));
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw UserError(dir + ": cannot open directory: " + errno_text());
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (rc != 0 && saved != EINVAL)
    throw UserError(dir + ": cannot sync directory: " + std::strerror(saved));
}

}  // namespace grass
