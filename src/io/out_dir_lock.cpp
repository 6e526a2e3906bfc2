#include "src/io/out_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "src/core/error.h"

namespace grass {

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
    throw UserError(out_dir + ": another grass process is training into this out_dir (it holds " +
                    path + "); wait for it or choose another out_dir");
  }
}

OutDirLock::~OutDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

}  // namespace grass
