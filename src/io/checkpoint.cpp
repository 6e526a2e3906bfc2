#include "src/io/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <thread>

#include "src/core/error.h"
#include "src/core/format.h"
#include "src/io/durable_file.h"
#include "src/io/hash.h"
#include "src/io/untrusted_json.h"

namespace grass {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormatName = "grass-checkpoint";
constexpr const char* kTmpPrefix = ".tmp_step_";
constexpr const char* kTrashPrefix = ".trash_step_";
constexpr size_t kMaxManifestBytes = size_t(16) << 20;
constexpr size_t kMaxJsonBytes = size_t(64) << 20;
constexpr size_t kMaxFiles = 10000;

// A file name that stays inside the checkpoint directory and cannot be mistaken for the manifest
// or a temporary file.
bool plain_file_name(const std::string& name) {
  if (name.empty() || name.size() > 255 || name == "." || name == ".." ||
      name == kCheckpointManifest || name.ends_with(".tmp"))
    return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
  });
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

CheckpointManifest parse_manifest(const json& j, const std::string& path) {
  const auto fail = [&](const std::string& problem) -> void {
    throw UserError(path + ": " + problem);
  };
  if (!j.is_object()) fail("not a JSON object");
  if (!j.contains("format") || j["format"] != kFormatName)
    fail("not a grass checkpoint manifest (\"format\" is not \"grass-checkpoint\")");
  if (!j.contains("version") || !j["version"].is_number_unsigned())
    fail("\"version\" is missing or not a non-negative integer");
  if (j["version"].get<uint64_t>() != uint64_t(kCheckpointFormatVersion))
    fail("checkpoint format version " + std::to_string(j["version"].get<uint64_t>()) +
         " (this grass reads version " + std::to_string(kCheckpointFormatVersion) + ")");
  if (!j.contains("step") || !j["step"].is_number_unsigned() ||
      j["step"].get<uint64_t>() > uint64_t(INT64_MAX))
    fail("\"step\" is missing or not a non-negative integer");
  if (!j.contains("files") || !j["files"].is_array()) fail("\"files\" is missing or not an array");
  if (j["files"].size() > kMaxFiles)
    fail("lists " + std::to_string(j["files"].size()) + " files, more than " +
         std::to_string(kMaxFiles));
  CheckpointManifest m;
  m.step = int64_t(j["step"].get<uint64_t>());
  std::set<std::string> seen;
  for (size_t i = 0; i < j["files"].size(); i++) {
    const json& f = j["files"][i];
    const std::string where = "files[" + std::to_string(i) + "]";
    if (!f.is_object()) fail(where + " is not an object");
    if (!f.contains("name") || !f["name"].is_string()) fail(where + ".name is not a string");
    CheckpointFile file;
    file.name = f["name"].get<std::string>();
    if (!plain_file_name(file.name))
      fail(where + ".name is not a plain file name inside the checkpoint: " + f["name"].dump());
    if (!seen.insert(file.name).second) fail("file " + file.name + " is listed twice");
    if (!f.contains("bytes") || !f["bytes"].is_number_unsigned())
      fail(where + ".bytes is not a non-negative integer");
    file.bytes = f["bytes"].get<uint64_t>();
    if (!f.contains("crc32") || !f["crc32"].is_string()) fail(where + ".crc32 is not a string");
    const std::string crc = f["crc32"].get<std::string>();
    if (crc.size() != 8 || !std::all_of(crc.begin(), crc.end(), [](char c) {
          return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
        }))
      fail(where + ".crc32 is not 8 lowercase hex digits");
    file.crc32 = uint32_t(std::strtoul(crc.c_str(), nullptr, 16));
    m.files.push_back(file);
  }
  return m;
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step_%08lld", (long long)step);
  return buf;
}

std::optional<int64_t> parse_checkpoint_dir_name(const std::string& name) {
  if (!name.starts_with("step_") || name.size() < 13 || name.size() > 5 + 18) return std::nullopt;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); i++) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  if (checkpoint_dir_name(step) != name) return std::nullopt;  // one spelling per step
  return step;
}

// ---- writing -------------------------------------------------------------------------------

CheckpointWriter::CheckpointWriter(const std::string& root, int64_t step)
    : root_(root),
      tmp_dir_(root + "/" + kTmpPrefix + checkpoint_dir_name(step).substr(5)),
      final_dir_(root + "/" + checkpoint_dir_name(step)),
      step_(step) {
  GRASS_CHECK(step >= 0, "negative checkpoint step");
  if (const char* pause = std::getenv("GRASS_TEST_CHECKPOINT_PAUSE_MS")) pause_ms_ = std::atoi(pause);
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) throw UserError(root_ + ": cannot create the checkpoint directory: " + ec.message());
  fs::remove_all(tmp_dir_, ec);  // left by a write that was interrupted
  if (ec) throw UserError(tmp_dir_ + ": cannot remove: " + ec.message());
  if (!fs::create_directory(tmp_dir_, ec) || ec)
    throw UserError(tmp_dir_ + ": cannot create: " + (ec ? ec.message() : "it exists"));
}

CheckpointWriter::~CheckpointWriter() {
  if (!committed_) remove_tree(tmp_dir_);
}

void CheckpointWriter::pause_for_tests() const {
  if (pause_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms_));
}

std::string CheckpointWriter::file_path(const std::string& name) const {
  GRASS_CHECK(plain_file_name(name), "bad checkpoint file name " + name);
  return tmp_dir_ + "/" + name;
}

void CheckpointWriter::add_written(const std::string& name) {
  GRASS_CHECK(!committed_, "checkpoint file added after commit");
  GRASS_CHECK(std::find(names_.begin(), names_.end(), name) == names_.end(),
              "checkpoint file written twice: " + name);
  names_.push_back(name);
  pause_for_tests();
}

void CheckpointWriter::write_json(const std::string& name, const json& value) {
  write_file_durably(file_path(name), value.dump(2) + "\n");
  add_written(name);
}

void CheckpointWriter::copy_file(const std::string& name, const std::string& source) {
  copy_file_durably(source, file_path(name));
  add_written(name);
}

std::string CheckpointWriter::commit() {
  GRASS_CHECK(!committed_, "checkpoint committed twice");
  json files = json::array();
  for (const std::string& name : names_) {
    const std::string path = file_path(name);
    std::error_code ec;
    const uint64_t bytes = fs::file_size(path, ec);
    if (ec) throw UserError(path + ": cannot stat: " + ec.message());
    files.push_back({{"name", name}, {"bytes", bytes}, {"crc32", hex32(crc32_file(path))}});
  }
  const json manifest = {{"format", kFormatName},
                         {"version", kCheckpointFormatVersion},
                         {"step", step_},
                         {"files", files}};
  write_file_durably(tmp_dir_ + "/" + kCheckpointManifest, manifest.dump(2) + "\n");
  fsync_directory(tmp_dir_);
  pause_for_tests();

  std::error_code ec;
  const std::string trash = root_ + "/" + kTrashPrefix + checkpoint_dir_name(step_).substr(5);
  if (fs::exists(final_dir_, ec)) {  // same step from an earlier life of this run: replace it
    fs::remove_all(trash, ec);
    fs::rename(final_dir_, trash, ec);
    if (ec) throw UserError(final_dir_ + ": cannot move the old checkpoint aside: " + ec.message());
  }
  fs::rename(tmp_dir_, final_dir_, ec);
  if (ec) throw UserError(final_dir_ + ": cannot rename " + tmp_dir_ + " into place: " + ec.message());
  committed_ = true;
  fsync_directory(root_);
  remove_tree(trash);
  return final_dir_;
}

// ---- reading -------------------------------------------------------------------------------

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  std::error_code ec;
  if (!fs::is_directory(dir_, ec))
    throw UserError(dir_ + ": not a checkpoint directory (" +
                    (fs::exists(dir_, ec) ? "not a directory" : "not found") + ")");
  const std::string manifest_path = dir_ + "/" + kCheckpointManifest;
  if (!fs::exists(manifest_path, ec))
    throw UserError(manifest_path + ": missing: the checkpoint is incomplete (its write was "
                    "interrupted) or the directory is not a checkpoint");
  manifest_ = parse_manifest(read_untrusted_json_file(manifest_path, kMaxManifestBytes),
                             manifest_path);
  const std::string base = fs::path(dir_).filename().string();
  if (const auto named = parse_checkpoint_dir_name(base); named && *named != manifest_.step)
    throw UserError(manifest_path + ": step " + std::to_string(manifest_.step) +
                    " differs from the directory name " + base);
  for (const CheckpointFile& f : manifest_.files) {
    const std::string path = dir_ + "/" + f.name;
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0)
      throw UserError(path + ": missing (manifest.json lists it): the checkpoint is damaged");
    if (!S_ISREG(st.st_mode)) throw UserError(path + ": not a regular file");
    if (uint64_t(st.st_size) != f.bytes)
      throw UserError(path + ": " + std::to_string(st.st_size) + " bytes, but manifest.json "
                      "records " + std::to_string(f.bytes) + ": the file is truncated or damaged");
    const uint32_t crc = crc32_file(path);
    if (crc != f.crc32)
      throw UserError(path + ": checksum mismatch (CRC-32 " + hex32(crc) + ", manifest.json "
                      "records " + hex32(f.crc32) + "): the file is corrupt");
  }
}

bool Checkpoint::has(const std::string& name) const {
  return std::any_of(manifest_.files.begin(), manifest_.files.end(),
                     [&](const CheckpointFile& f) { return f.name == name; });
}

std::string Checkpoint::path(const std::string& name) const {
  if (!has(name))
    throw UserError(dir_ + "/" + kCheckpointManifest + ": the checkpoint has no file " + name);
  return dir_ + "/" + name;
}

json Checkpoint::read_json(const std::string& name) const {
  return read_untrusted_json_file(path(name), kMaxJsonBytes);
}

// ---- the checkpoint directory ------------------------------------------------------------------

std::vector<CheckpointEntry> list_checkpoints(const std::string& root) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  fs::directory_iterator it(root, ec);
  if (ec) throw UserError(root + ": cannot list: " + ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) throw UserError(root + ": cannot list: " + ec.message());
    const std::string name = it->path().filename().string();
    const auto step = parse_checkpoint_dir_name(name);
    std::error_code type_ec;
    if (step && it->is_directory(type_ec)) out.push_back({*step, it->path().string()});
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step > b.step; });
  return out;
}

void remove_checkpoint_leftovers(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  std::vector<fs::path> leftovers;
  for (fs::directory_iterator it(root, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with(kTmpPrefix) || name.starts_with(kTrashPrefix))
      leftovers.push_back(it->path());
  }
  for (const fs::path& p : leftovers) remove_tree(p.string());
}

void delete_checkpoint(const std::string& dir) {
  const fs::path p(dir);
  const auto step = parse_checkpoint_dir_name(p.filename().string());
  GRASS_CHECK(step.has_value(), "delete_checkpoint of a directory that is not a checkpoint: " + dir);
  const fs::path trash = p.parent_path() / (kTrashPrefix + p.filename().string().substr(5));
  std::error_code ec;
  fs::remove_all(trash, ec);
  fs::rename(p, trash, ec);
  if (ec) throw UserError(dir + ": cannot remove an old checkpoint: " + ec.message());
  fs::remove_all(trash, ec);
  if (ec) throw UserError(trash.string() + ": cannot remove: " + ec.message());
}

std::vector<int64_t> checkpoints_to_prune(std::vector<int64_t> steps, int64_t keep_last,
                                          int64_t keep_every) {
  std::sort(steps.begin(), steps.end(), std::greater<>());
  std::vector<int64_t> prune;
  for (size_t i = 0; i < steps.size(); i++) {
    if (int64_t(i) < keep_last) continue;
    if (keep_every > 0 && steps[i] % keep_every == 0) continue;
    prune.push_back(steps[i]);
  }
  return prune;
}

}  // namespace grass
