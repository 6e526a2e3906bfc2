// The weights of a Hugging Face model directory: model.safetensors, or the sharded form,
// model.safetensors.index.json ({"weight_map": {"<tensor>": "<shard file>", ...}}) beside the
// shards it names. Format only: matching tensors to a model is the caller's job.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "src/io/safetensors.h"

namespace grass {

class HfModelWeights {
 public:
  // `path` is a model directory, or one .safetensors file. Every file is opened and validated
  // (see SafetensorsFile); the index must be a JSON object whose "weight_map" maps tensor names
  // to plain file names in the same directory, and each shard must hold the tensors the index
  // places in it. UserError naming the file otherwise.
  explicit HfModelWeights(const std::string& path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // The file holding a tensor, for reading it and for messages. UserError if absent.
  const SafetensorsFile& file_of(const std::string& name) const;

 private:
  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor -> files_ index
};

}  // namespace grass
