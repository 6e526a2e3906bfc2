// Checkpoint directories on disk: the layout, the manifest, crash-safe commit, verification,
// listing and pruning. No training logic: what goes into the files is src/train/checkpointing's
// business; docs/formats.md describes the layout.
//
//   <root>/step_00000100/            root is <out_dir>/checkpoints
//     <data files>                   each written to "<name>.tmp", fsynced, renamed
//     manifest.json                  written last: step, and every file's size and CRC-32
//
// A checkpoint is written inside "<root>/.tmp_step_00000100", which is renamed to its final name
// only after the manifest and the directory are fsynced. So a directory with a final name is
// complete unless damaged afterwards, which verification (sizes and checksums) catches.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace grass {

inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr const char* kCheckpointManifest = "manifest.json";

std::string checkpoint_dir_name(int64_t step);  // "step_00000100"
// The step of a final checkpoint directory name ("step_" and at least 8 digits), else nullopt.
std::optional<int64_t> parse_checkpoint_dir_name(const std::string& name);

struct CheckpointFile {
  std::string name;  // a plain file name inside the checkpoint directory
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

struct CheckpointManifest {
  int64_t step = 0;
  std::vector<CheckpointFile> files;
};

// Writes one checkpoint. Files are written into the temporary directory through the write_*
// methods (or by the caller at file_path(name), who must then call add_written(name)); commit()
// checksums them, writes the manifest and moves the directory into place. Destroying a writer
// that was not committed removes its temporary directory. Every failure is a UserError naming
// the file, and leaves the checkpoints already in `root` untouched.
class CheckpointWriter {
 public:
  CheckpointWriter(const std::string& root, int64_t step);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  std::string file_path(const std::string& name) const;  // inside the temporary directory
  void add_written(const std::string& name);             // a file the caller wrote itself
  void write_json(const std::string& name, const nlohmann::json& value);
  void copy_file(const std::string& name, const std::string& source);
  // Returns the final directory, "<root>/step_XXXXXXXX". A final directory of the same step that
  // already exists (from a run that was resumed from an older checkpoint) is replaced.
  std::string commit();

 private:
  void pause_for_tests() const;
  std::string root_, tmp_dir_, final_dir_;
  int64_t step_ = 0;
  std::vector<std::string> names_;
  int pause_ms_ = 0;
  bool committed_ = false;
};

// A checkpoint opened for reading: the manifest is parsed and checked (format, version, step
// against the directory name, file names), and every file it lists has exactly the recorded size
// and CRC-32. Anything else is a UserError naming the file and the problem.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);

  const std::string& dir() const { return dir_; }
  int64_t step() const { return manifest_.step; }
  const CheckpointManifest& manifest() const { return manifest_; }
  bool has(const std::string& name) const;
  std::string path(const std::string& name) const;  // UserError if the manifest lacks it
  // A JSON file of the checkpoint (at most 64 MiB), parsed with untrusted-input limits.
  nlohmann::json read_json(const std::string& name) const;

 private:
  std::string dir_;
  CheckpointManifest manifest_;
};

// Final-named checkpoint directories under root, newest (highest step) first; not verified.
// An absent root gives an empty list.
struct CheckpointEntry {
  int64_t step;
  std::string dir;
};
std::vector<CheckpointEntry> list_checkpoints(const std::string& root);

// Removes what interrupted writes and deletions leave in root (".tmp_step_*", ".trash_step_*").
void remove_checkpoint_leftovers(const std::string& root);

// Deletes a checkpoint: renamed out of the way first (atomic), then removed, so a crash never
// leaves a partial directory under a final name.
void delete_checkpoint(const std::string& dir);

// Which of `steps` to delete: all but the newest keep_last, except multiples of keep_every
// (when keep_every > 0), which are kept forever.
std::vector<int64_t> checkpoints_to_prune(std::vector<int64_t> steps, int64_t keep_last,
                                          int64_t keep_every);

}  // namespace grass
