#include "src/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "src/core/error.h"

namespace grass {

namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UserError(path + ": cannot open: " + errno_text());
  // The mapping stays valid after the descriptor is closed.
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};

  struct stat st;
  if (::fstat(fd, &st) != 0) throw UserError(path + ": cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) throw UserError(path + ": not a regular file");
  const size_t file_bytes = static_cast<size_t>(st.st_size);
  if (file_bytes == 0) return;

  void* address = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  if (address == MAP_FAILED) throw UserError(path + ": cannot map into memory: " + errno_text());
  mapping_ = Mapping(static_cast<const std::byte*>(address), Unmap{file_bytes});
}

void MappedFile::Unmap::operator()(const std::byte* address) const noexcept {
  ::munmap(const_cast<std::byte*>(address), bytes);
}

}  // namespace grass
