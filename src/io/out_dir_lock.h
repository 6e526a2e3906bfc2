// One training run per out_dir: an exclusive advisory lock on <out_dir>/.lock.
#pragma once
#include <string>

namespace grass {

// Holds an exclusive lock on <out_dir>/.lock (created with out_dir) for its lifetime, so two
// runs never write one out_dir. UserError when another process holds it.
// UserError (OutDirLock's) when another process holds out_dir's lock; creates nothing.
void refuse_if_locked(const std::string& out_dir);

class OutDirLock {
 public:
  explicit OutDirLock(const std::string& out_dir);
  ~OutDirLock();
  OutDirLock(const OutDirLock&) = delete;
  OutDirLock& operator=(const OutDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace grass
