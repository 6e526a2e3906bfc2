#include "src/train/out_dir.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/config/json_check.h"
#include "src/core/error.h"
#include "src/io/checkpoint.h"
#include "src/io/out_dir_lock.h"
#include "src/train/checkpointing.h"
#include "src/train/hf_interop.h"

namespace grass {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kLockFile = ".lock";

std::vector<std::string> contents(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
    if (e.path().filename() != kLockFile) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A run config as to_json writes it (as opposed to a Hugging Face LlamaConfig, or anything else).
bool is_run_config(const json& j) {
  return j.is_object() && j.contains("model") && j["model"].is_object() && j.contains("optimizer") &&
         j.contains("out_dir");
}

std::optional<json> read_json(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  return json_check::read_json_file(path);
}

// The run config of the run in `dir`: its config.json, else its newest checkpoint's.
std::optional<json> saved_run_config(const std::string& dir, const std::string& checkpoints) {
  if (const std::optional<json> j = read_json(dir + "/config.json"); j && is_run_config(*j)) return j;
  for (const CheckpointEntry& e : list_checkpoints(checkpoints))
    if (const std::optional<json> j = read_json(e.dir + "/config.json"); j && is_run_config(*j))
      return j;
  return std::nullopt;
}

// What a folder that holds no run holds, for the refusal.
std::string describe_other_contents(const std::string& dir, const std::vector<std::string>& names) {
  const std::optional<json> config = [&]() -> std::optional<json> {
    try {
      return read_json(dir + "/config.json");
    } catch (const UserError&) {
      return std::nullopt;  // not JSON: just a file among others
    }
  }();
  std::error_code ec;
  if ((config && config->is_object() &&
       (config->contains("model_type") || config->contains("architectures"))) ||
      fs::exists(dir + "/model.safetensors", ec) ||
      fs::exists(dir + "/model.safetensors.index.json", ec))
    return "a Hugging Face model";
  std::string shown;
  for (size_t i = 0; i < names.size() && i < 3; i++) shown += (i ? ", " : "") + names[i];
  if (names.size() > 3) shown += ", ...";
  return std::to_string(names.size()) + (names.size() == 1 ? " entry: " : " entries: ") + shown;
}

// The last step metrics.jsonl records (0 when none): what a rerun without a checkpoint would
// start again from nothing.
int64_t last_metrics_step(const std::string& path) {
  std::ifstream in(path);
  int64_t last = 0;
  std::string line;
  while (std::getline(in, line)) {
    const json row = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_object() && row.contains("step") && row["step"].is_number_integer())
      last = std::max(last, row["step"].get<int64_t>());
  }
  return last;
}

std::string old_name(const std::string& out_dir, int n) {
  std::string base = out_dir;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return base + ".old-" + std::to_string(n);
}

std::string next_old_name(const std::string& out_dir) {
  std::error_code ec;
  for (int n = 1;; n++)
    if (!fs::exists(old_name(out_dir, n), ec)) return old_name(out_dir, n);
}

std::string shown_value(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

std::string finished_run_error(const RunConfig& cfg, int64_t step) {
  return cfg.out_dir + ": out_dir holds this run, finished: its newest complete checkpoint is at "
         "step " + std::to_string(step) + " of steps " + std::to_string(cfg.steps) +
         "; raise steps to train further, or train into a new out_dir, or pass --overwrite to "
         "move its contents to " + next_old_name(cfg.out_dir);
}

bool out_dir_has_contents(const std::string& out_dir) {
  std::error_code ec;
  return fs::is_directory(out_dir, ec) && !contents(out_dir).empty();
}

std::string check_out_dir(const RunConfig& cfg, bool explicit_resume) {
  const std::string& dir = cfg.out_dir;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return "";
  if (!fs::is_directory(dir, ec))
    throw UserError(dir + ": out_dir is a file, not a directory; choose another out_dir");
  refuse_if_locked(dir);  // a run in progress is named as such, whatever it holds
  const std::vector<std::string> names = contents(dir);
  if (names.empty()) return "";
  const std::string way_out = "train into a new out_dir, or pass --overwrite to move its contents "
                              "to " + next_old_name(dir);
  const std::string checkpoints = checkpoint_root(cfg);
  const std::optional<json> saved = saved_run_config(dir, checkpoints);
  if (!saved)
    throw UserError(dir + ": out_dir is not empty and holds no grass run (" +
                    describe_other_contents(dir, names) + "): " + way_out);
  const std::vector<CheckpointEntry> complete = list_checkpoints(checkpoints);
  if (!explicit_resume) {
    std::vector<ConfigDifference> differences;
    for (const ConfigDifference& d : result_differences(*saved, to_json(cfg)))
      if (d.key != "steps" && !d.saved.is_null()) differences.push_back(d);
    if (!differences.empty()) {
      const ConfigDifference& d = differences.front();
      std::string what = d.key + " is " + shown_value(d.saved) + " there, " + shown_value(d.now) +
                         " here";
      if (differences.size() > 1)
        what += "; " + std::to_string(differences.size() - 1) + " more key" +
                (differences.size() > 2 ? "s differ" : " differs");
      throw UserError(dir + ": out_dir holds another run (" + what + "): " + way_out +
                      (complete.empty() ? "" : ", or --resume " + dir +
                                                   " to continue it with this config"));
    }
  }
  // A resume (or, from a checkpoint at `steps`, a finished run: finished_run_error, once the
  // checkpoint it would resume from has been verified)
  if (!complete.empty()) return "";
  if (explicit_resume) return "";  // from a checkpoint elsewhere
  const int64_t last = last_metrics_step(dir + "/metrics.jsonl");
  const bool model = fs::exists(final_model_dir(dir), ec);
  if (last == 0 && !model) return "";  // it never finished a step: nothing to lose
  // Killed before its first checkpoint: it resumes from its start, as from a checkpoint at step
  // 0 (metrics.jsonl cut back to it), as a run with checkpoints is meant to.
  const json* every = saved->contains("checkpoint_every") ? &(*saved)["checkpoint_every"] : nullptr;
  if (!model && every && every->is_number_integer() && every->get<int64_t>() > 0)
    return "none: " + dir + " holds this run to step " + std::to_string(last) +
           " but no checkpoint yet, so it starts again from step 0";
  std::string results;
  if (last > 0) results = "metrics.jsonl to step " + std::to_string(last);
  if (model) results += (results.empty() ? "" : ", ") + std::string("its model in ") + final_model_dir(dir);
  throw UserError(dir + ": out_dir holds this run's results (" + results +
                  ") and no checkpoint to resume from, so a rerun would replace them: " + way_out +
                  " (with checkpoint_every a run can be resumed or extended)");
}

std::string move_out_dir_aside(const std::string& out_dir) {
  std::string moved;
  {
    const OutDirLock lock(out_dir);  // no other process is training into it
    moved = next_old_name(out_dir);
    std::error_code ec;
    fs::rename(out_dir, moved, ec);
    if (ec)
      throw UserError(out_dir + ": cannot move it aside to " + moved + " (--overwrite): " +
                      ec.message());
  }
  return moved;
}

}  // namespace grass
