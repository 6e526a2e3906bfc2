// safetensors (Hugging Face's tensor file format): reader and writer.
//
// File layout: uint64 little-endian N, then N bytes of JSON header
//   {"<name>": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<value>", ...}}
// then the data section; offsets are bytes relative to the data section's start.
// Tensors are C-contiguous and little-endian. docs/formats.md lists the supported subset.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/io/mapped_file.h"

namespace grass {

// Bytes per element of a safetensors dtype ("F32", "BF16", "I64", ...); 0 when unknown.
size_t safetensors_dtype_bytes(std::string_view dtype);

struct TensorEntry {
  std::string name;
  std::string dtype;                 // safetensors spelling: F64 F32 F16 BF16 I64 I32 ...
  std::vector<int64_t> shape;        // [] for a scalar
  std::span<const std::byte> bytes;  // the tensor's data inside the file's mapping

  int64_t numel() const;
};

// A validated, read-only memory map of one .safetensors file. Validation on open: the header
// length lies within the file, the header is JSON of the expected shape, every dtype is
// known, every tensor's byte range lies within the data section, matches dtype * shape, and
// overlaps no other. Errors are UserError naming the file (and tensor).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;

  const std::string& path() const { return file_.path(); }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // UserError naming the file and tensor if absent.
  const TensorEntry& get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Element-wise conversions; UserError for a dtype they do not accept.
  std::vector<float> read_f32(const std::string& name) const;    // from F32 F64 BF16 F16
  std::vector<double> read_f64(const std::string& name) const;   // from F64 F32 BF16 F16
  std::vector<int64_t> read_i64(const std::string& name) const;  // from I64 I32

 private:
  MappedFile file_;
  std::map<std::string, TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Collects tensors, then writes one file: tensors in name order, the header padded with
// spaces to a multiple of 8 bytes (so the data section is 8-byte aligned), written to
// "<path>.tmp" and renamed into place. add() keeps only the pointer: the data must stay valid
// and unchanged until write() returns (a checkpoint never holds two copies of the weights).
class SafetensorsWriter {
 public:
  // InternalError if the name is empty, reserved or repeated, the dtype unknown, or `bytes`
  // differs from numel(shape) * dtype size.
  void add(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
           const void* data, size_t bytes);
  // An empty metadata map omits "__metadata__".
  void write(const std::string& path,
             const std::map<std::string, std::string>& metadata = {{"format", "pt"}}) const;

 private:
  struct Pending {
    std::string dtype;
    std::vector<int64_t> shape;
    const void* data;
    size_t bytes;
  };
  std::map<std::string, Pending> tensors_;  // std::map: iteration is name order
};

}  // namespace grass
