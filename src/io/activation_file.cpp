#include "src/io/activation_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "src/core/error.h"
#include "src/core/format.h"

namespace grass {

namespace {
std::string where(const std::string& dir) { return "offload.disk_dir " + dir + ": "; }
}  // namespace

ActivationFile::ActivationFile(const std::string& dir, int records, int64_t record_bytes)
    : dir_(dir), records_(records), stride_(stride_for(record_bytes)) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // out_dir, the default, is made later
  if (ec) throw UserError(where(dir) + "cannot create the directory: " + ec.message());
  std::string path = dir + "/grass-activations-XXXXXX";
  std::vector<char> name(path.begin(), path.end());
  name.push_back('\0');
  fd_ = mkostemp(name.data(), O_DIRECT);
  direct_ = fd_ >= 0;
  if (fd_ < 0 && errno == EINVAL) fd_ = mkostemp(name.data(), 0);  // no O_DIRECT here (tmpfs)
  if (fd_ < 0)
    throw UserError(where(dir) + "cannot create the activation ring's file: " +
                    std::strerror(errno));
  unlink(name.data());  // gone when the run ends, however it ends
  if (const int e = posix_fallocate(fd_, 0, file_bytes())) {
    close(fd_);
    fd_ = -1;
    throw UserError(where(dir) + "cannot reserve " + format_bytes(file_bytes()) +
                    " for the activation ring: " + std::strerror(e));
  }
}

ActivationFile::~ActivationFile() {
  if (fd_ >= 0) close(fd_);
}

void ActivationFile::fail(const char* what, int r, int error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_.empty()) return;
  error_ = where(dir_) + what + " layer " + std::to_string(r) + "'s input: " +
           (error ? std::strerror(error) : "the file ended early");
}

void ActivationFile::write(int r, const void* buffer, int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_.empty()) return;
  }
  const char* p = static_cast<const char*>(buffer);
  for (int64_t done = 0, n = stride_for(bytes); done < n;) {
    const ssize_t w = pwrite(fd_, p + done, size_t(n - done), off_t(r * stride_ + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return fail("writing", r, w < 0 ? errno : ENOSPC);
    done += w;
  }
}

void ActivationFile::read(int r, void* buffer, int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_.empty()) return;
  }
  char* p = static_cast<char*>(buffer);
  for (int64_t done = 0, n = stride_for(bytes); done < n;) {
    const ssize_t got = pread(fd_, p + done, size_t(n - done), off_t(r * stride_ + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return fail("reading", r, got < 0 ? errno : 0);
    done += got;
  }
}

void ActivationFile::throw_if_failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_.empty()) throw UserError(error_);
}

}  // namespace grass
