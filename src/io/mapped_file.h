// A whole regular file mapped read-only into memory: the shared open/stat/mmap behind the
// shard and safetensors readers.
#pragma once
#include <cstddef>
#include <memory>
#include <span>
#include <string>

namespace grass {

// Maps the whole file on construction and unmaps it on destruction; move-only. Errors are
// UserError naming the file: it cannot be opened or stat'ed, is not a regular file, or cannot
// be mapped. An empty file has no mapping (mmap refuses a length of 0): bytes() is then empty.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);

  std::span<const std::byte> bytes() const { return {mapping_.get(), size()}; }
  size_t size() const { return mapping_ ? mapping_.get_deleter().bytes : 0; }
  const std::string& path() const { return path_; }

 private:
  // munmap needs the length as well as the address.
  struct Unmap {
    // No "= 0": GCC then rejects the defaulted Mapping() inside MappedFile. unique_ptr
    // value-initializes its deleter, so an empty Mapping still holds 0.
    size_t bytes;
    void operator()(const std::byte* address) const noexcept;
  };

  using Mapping = std::unique_ptr<const std::byte, Unmap>;

  std::string path_;
  Mapping mapping_;  // the whole file; null for an empty file
};

}  // namespace grass
