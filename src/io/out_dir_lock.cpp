#include "src/io/out_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "src/core/error.h"

namespace grass {

namespace {
UserError locked(const std::string& out_dir, const std::string& path) {
  return UserError(out_dir + ": another grass process is training into this out_dir (it holds " +
                   path + "); wait for it or choose another out_dir");
}
}  // namespace

void refuse_if_locked(const std::string& out_dir) {
  const std::string path = out_dir + "/.lock";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // no lock file: nobody has trained there
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  if (held) throw locked(out_dir, path);
}

OutDirLock::OutDirLock(const std::string& out_dir) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw UserError(out_dir + ": cannot create out_dir: " + ec.message());
  const std::string path = out_dir + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw UserError(path + ": cannot create: " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd_);
    fd_ = -1;
    throw locked(out_dir, path);
  }
}

OutDirLock::~OutDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

}  // namespace grass
