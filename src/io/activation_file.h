// The disk tier of offload.activations (model/x_in_ring.h): a ring of fixed-size records in one
// file, each read and written whole at its own offset from a buffer in the host tier.
// The file is unlinked as soon as it is open: it is gone when the run ends, however it ends, and a
// later run (a resume) never finds it. O_DIRECT where the file system takes it, so the page cache
// holds no second copy of what the ring keeps out of memory; buffered I/O otherwise (tmpfs). Its
// blocks are reserved when it opens, so a disk too small ends the run before its first step.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>

namespace grass {

class ActivationFile {
 public:
  // O_DIRECT's alignment of buffer addresses, file offsets and sizes.
  static constexpr int64_t kAlign = 4096;
  static int64_t stride_for(int64_t record_bytes) {
    return (record_bytes + kAlign - 1) / kAlign * kAlign;
  }
  // `records` records of up to record_bytes each in a new file in `dir` (made if missing).
  // UserError naming the key offload.disk_dir and `dir` when the file cannot be created or its
  // blocks reserved.
  ActivationFile(const std::string& dir, int records, int64_t record_bytes);
  ~ActivationFile();
  ActivationFile(const ActivationFile&) = delete;
  ActivationFile& operator=(const ActivationFile&) = delete;

  int64_t stride() const { return stride_; }
  int64_t file_bytes() const { return stride_ * records_; }
  bool direct() const { return direct_; }

  // The first `bytes` of record r from or into `buffer` (kAlign-aligned, stride() bytes; the
  // transfer is rounded up to kAlign). They run on the copy queue: a failure is recorded, not
  // thrown, and the I/O after it is skipped.
  void write(int r, const void* buffer, int64_t bytes);
  void read(int r, void* buffer, int64_t bytes);
  // On the caller's thread, after the transfers it cares about: UserError for the first failure.
  void throw_if_failed() const;

 private:
  void fail(const char* what, int r, int error);

  std::string dir_;
  int records_;
  int64_t stride_;
  int fd_ = -1;
  bool direct_ = false;
  mutable std::mutex mutex_;
  std::string error_;  // the first failure; "": none
};

}  // namespace grass
