#include "src/io/hf_model_dir.h"

#include <algorithm>
#include <filesystem>

#include "src/core/error.h"
#include "src/io/untrusted_json.h"

namespace grass {

namespace fs = std::filesystem;

namespace {
constexpr size_t kMaxIndexBytes = size_t(64) << 20;

bool plain_shard_name(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name.front() != '.' &&
         name.find('/') == std::string::npos && name.find('\\') == std::string::npos &&
         name.find('\0') == std::string::npos;
}
}  // namespace

HfModelWeights::HfModelWeights(const std::string& path) : path_(path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UserError(path + ": not found");
  if (!fs::is_directory(path, ec)) {  // one .safetensors file
    files_.emplace_back(path);
    for (const std::string& name : files_.back().names()) where_[name] = 0;
    return;
  }
  const std::string index_path = path + "/model.safetensors.index.json";
  const std::string single_path = path + "/model.safetensors";
  if (!fs::exists(index_path, ec)) {
    if (!fs::exists(single_path, ec))
      throw UserError(path + ": no model.safetensors or model.safetensors.index.json; a Hugging "
                      "Face model directory holds one of them");
    files_.emplace_back(single_path);
    for (const std::string& name : files_.back().names()) where_[name] = 0;
    return;
  }
  const nlohmann::json index = read_untrusted_json_file(index_path, kMaxIndexBytes);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw UserError(index_path + ": expected a JSON object with a \"weight_map\" object");
  std::map<std::string, size_t> shard_of_file;
  for (const auto& [tensor, file] : index["weight_map"].items()) {
    if (!file.is_string() || !plain_shard_name(file.get<std::string>()))
      throw UserError(index_path + ": weight_map[\"" + tensor + "\"] is not a shard file name in "
                      "the model directory: " + file.dump());
    if (tensor.empty()) throw UserError(index_path + ": weight_map has an empty tensor name");
    const std::string shard = file.get<std::string>();
    auto it = shard_of_file.find(shard);
    if (it == shard_of_file.end()) {
      files_.emplace_back(path + "/" + shard);
      it = shard_of_file.emplace(shard, files_.size() - 1).first;
    }
    if (!files_[it->second].contains(tensor))
      throw UserError(index_path + ": places tensor " + tensor + " in " + shard +
                      ", which has no such tensor");
    where_[tensor] = it->second;
  }
  if (files_.empty()) throw UserError(index_path + ": weight_map is empty");
}

std::vector<std::string> HfModelWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

const SafetensorsFile& HfModelWeights::file_of(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) throw UserError(path_ + ": no tensor named " + name);
  return files_[it->second];
}

}  // namespace grass
