#include "src/train/checkpointing.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "src/core/error.h"
#include "src/core/format.h"
#include "src/io/safetensors.h"
#include "src/model/hf_weights.h"
#include "src/train/run_resolution.h"

namespace grass {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kStateFile = "state.safetensors";
constexpr const char* kStateJson = "state.json";
constexpr const char* kConfigFile = "config.json";
constexpr const char* kTokenizerFile = "tokenizer.model";

// The buffers saved byte for byte: weights and optimizer categories, less the weights themselves
// (saved as named tensors in model.safetensors).
std::vector<Arena::Block> state_blocks(const Arena& arena, const WeightStore& weights) {
  std::vector<Arena::Block> out;  // copies: the arena's list may grow while these are in use
  for (const Arena::Block& b : arena.blocks())
    if ((b.cat == MemCategory::Weights || b.cat == MemCategory::Optimizer) && !weights.holds(b.ptr))
      out.push_back(b);
  return out;
}

// One warning line per key whose value differs between the checkpoint's config and this run's.
void warn_config_changes(const Checkpoint& checkpoint, const RunConfig& cfg) {
  if (!checkpoint.has(kConfigFile)) return;
  constexpr int kShown = 8;
  const std::vector<ConfigDifference> differences =
      result_differences(checkpoint.read_json(kConfigFile), to_json(cfg));
  for (size_t i = 0; i < differences.size() && i < size_t(kShown); i++) {
    const ConfigDifference& d = differences[i];
    std::string shown = d.key;  // from a file: no control characters on the terminal
    std::replace_if(shown.begin(), shown.end(), [](char c) { return (unsigned char)c < 0x20; }, '?');
    std::fprintf(stderr,
                 "warning: resuming with %s = %s, but checkpoint %s was made with %s: the run "
                 "will not match an uninterrupted one\n",
                 shown.c_str(), d.now.dump().c_str(), checkpoint.dir().c_str(),
                 d.saved.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  }
  if (differences.size() > size_t(kShown))
    std::fprintf(stderr, "warning: ... and %d more run config keys differ from %s/config.json\n",
                 int(differences.size()) - kShown, checkpoint.dir().c_str());
}

// state.json and state.safetensors of a checkpoint being restored, as the optimizers read them.
class CheckpointStateReader final : public StateReader {
 public:
  CheckpointStateReader(std::string json_path, const SafetensorsFile& buffers,
                        const std::vector<Arena::Block>& blocks)
      : json_path_(std::move(json_path)), buffers_(buffers), blocks_(blocks) {}
  [[noreturn]] void fail(const std::string& problem) const override {
    throw UserError(json_path_ + ": " + problem);
  }
  [[noreturn]] void fail_buffer(const void* buffer, const std::string& problem) const override {
    throw UserError(buffers_.path() + ": buffer " + block(buffer).name + ": " + problem);
  }
  std::span<const std::byte> saved_bytes(const void* buffer) const override {
    return buffers_.get(block(buffer).name).bytes;
  }

 private:
  const Arena::Block& block(const void* buffer) const {
    const auto it = std::find_if(blocks_.begin(), blocks_.end(),
                                 [&](const Arena::Block& b) { return b.ptr == buffer; });
    GRASS_CHECK(it != blocks_.end(), "an optimizer's buffer is not a saved arena block");
    return *it;
  }
  std::string json_path_;
  const SafetensorsFile& buffers_;
  const std::vector<Arena::Block>& blocks_;
};

// state.json's keys that are not an optimizer's
const std::set<std::string> kRunStateKeys = {"step", "loader", "tokens_seen", "metrics_rows", "rng",
                                             "optimizer_states", "attention", "head_rows",
                                             "ranks", "loader_ranks"};

// The attention kernels the model computes with, and cuDNN's version with cuDNN's.
AttentionInUse attention_of(const LlamaModel& model) {
  AttentionInUse in_use;
  in_use.kernel = model.memory_options().attention;
  if (in_use.kernel == AttentionKernel::Cudnn)
    in_use.cudnn_version = model.backend().attention_in_use().cudnn_version;
  return in_use;
}

json attention_json(const AttentionInUse& a) {
  json j = {{"kernel", name_of(a.kernel)}};
  if (a.cudnn_version > 0) j["cudnn_version"] = a.cudnn_version;
  return j;
}

json position_json(const LoaderPosition& p) { return {{"epoch", p.epoch}, {"index", p.index}}; }

}  // namespace

std::string checkpoint_root(const RunConfig& cfg) { return cfg.out_dir + "/checkpoints"; }

std::string save_checkpoint(const RunConfig& cfg, const Arena& arena, const TrainingState& state,
                            const TokenLoader& loader, int64_t step, int64_t metrics_rows,
                            const std::vector<LoaderPosition>& rank_positions) {
  const std::string root = checkpoint_root(cfg);
  LlamaModel& model = *state.model;
  // On the CPU the writers take views of the live buffers (nothing is copied); GPU buffers are
  // brought to the host first, each into one of these.
  const bool on_host = !model.storage().cuda;
  std::vector<std::vector<std::byte>> host_copies;
  auto host_view = [&](const void* p, int64_t bytes) -> const void* {
    if (on_host) return p;
    host_copies.emplace_back(size_t(bytes));
    model.backend().download(host_copies.back().data(), p, size_t(bytes));
    return host_copies.back().data();
  };
  std::string dir;
  {
    CheckpointWriter writer(root, step);
    SafetensorsWriter weights;
    add_hf_tensors(weights, model, host_copies);
    weights.write(writer.file_path(kModelFile), {{"format", "pt"}});
    writer.add_written(kModelFile);

    SafetensorsWriter buffers;
    for (const Arena::Block& b : state_blocks(arena, model.weight_store()))
      buffers.add(b.name, "U8", {b.bytes}, host_view(b.ptr, b.bytes), size_t(b.bytes));
    buffers.write(writer.file_path(kStateFile), {{"format", "grass"}});
    writer.add_written(kStateFile);

    json s = {{"step", step},
              {"loader", position_json(loader.position())},
              {"tokens_seen", step * cfg.tokens_per_step()},
              {"metrics_rows", metrics_rows},
              {"optimizer_states", state_format(cfg.optimizer, model.storage())},
              {"attention", attention_json(attention_of(model))},
              {"head_rows", head_rows_of(model)},
              {"rng", "none: every random draw is a pure function of (seed, step or epoch, index); "
                      "the seeds are in config.json"}};
    if (rank_positions.size() > 1) {
      s["ranks"] = rank_positions.size();
      json& positions = s["loader_ranks"] = json::array();
      for (const LoaderPosition& p : rank_positions) positions.push_back(position_json(p));
    }
    for (const auto& o : state.optimizers->all())
      if (o->state_key()) s[o->state_key()] = o->save_state();
    writer.write_json(kStateJson, s);
    writer.write_json(kConfigFile, to_json(cfg));
    if (!cfg.tokenizer.empty()) writer.copy_file(kTokenizerFile, cfg.tokenizer);
    dir = writer.commit();
  }

  std::vector<int64_t> steps;
  for (const CheckpointEntry& e : list_checkpoints(root)) steps.push_back(e.step);
  for (int64_t old : checkpoints_to_prune(steps, cfg.checkpoint_keep, cfg.checkpoint_keep_every))
    if (old != step) delete_checkpoint(root + "/" + checkpoint_dir_name(old));
  return dir;
}

std::optional<Checkpoint> newest_valid_checkpoint(const std::string& path, bool required) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / kCheckpointManifest, ec) || parse_checkpoint_dir_name(
          fs::path(path).filename().string()))
    return Checkpoint(path);  // one checkpoint named explicitly: any problem is an error
  std::string root = path;
  if (fs::is_directory(fs::path(path) / "checkpoints", ec)) root = path + "/checkpoints";
  if (required && !fs::is_directory(root, ec))
    throw UserError(path + ": not found, or not a checkpoint or a directory of checkpoints");
  std::string skipped;
  for (const CheckpointEntry& entry : list_checkpoints(root)) {
    try {
      Checkpoint checkpoint(entry.dir);
      if (!skipped.empty())
        std::fprintf(stderr, "warning: using the previous complete checkpoint, %s\n",
                     entry.dir.c_str());
      return checkpoint;
    } catch (const UserError& e) {
      std::fprintf(stderr, "warning: skipping checkpoint %s: %s\n", entry.dir.c_str(), e.what());
      skipped = entry.dir;
    }
  }
  if (required && skipped.empty())
    throw UserError(path + ": no checkpoint there (a run writes them to <out_dir>/checkpoints "
                    "when checkpoint_every > 0)");
  if (required) throw UserError(root + ": no complete checkpoint (the ones there fail verification)");
  if (!skipped.empty())
    throw UserError(root + ": every checkpoint fails verification; move the directory away to "
                    "start the run afresh");
  return std::nullopt;
}

namespace {

const std::string kMismatch =
    ": does not fit this run (was the checkpoint made with another model or optimizer? its "
    "config.json has the settings it was made with)";

// model.safetensors holds exactly the model's tensors, in its dtype and Hugging Face's shapes.
void verify_weights(const SafetensorsFile& weights, const LlamaModel& model) {
  for (const ParamTensor& t : model.tensors()) {
    if (!weights.contains(t.name))
      throw UserError(weights.path() + ": tensor " + t.name + " is missing" + kMismatch);
    const TensorEntry& e = weights.get(t.name);
    if (e.dtype != hf_weight_dtype(model) || e.shape != t.hf_shape)
      throw UserError(weights.path() + ": tensor " + t.name + " is " + e.dtype + " " +
                      shape_str(e.shape) + ", this run needs " + hf_weight_dtype(model) + " " +
                      shape_str(t.hf_shape) + kMismatch);
  }
  if (weights.names().size() != model.tensors().size())
    throw UserError(weights.path() + ": holds " + std::to_string(weights.names().size()) +
                    " tensors, this run's model has " + std::to_string(model.tensors().size()) +
                    kMismatch);
}

// state.safetensors holds exactly the run's other buffers, byte for byte of the same size.
void verify_buffers(const SafetensorsFile& buffers, const std::vector<Arena::Block>& blocks) {
  for (const Arena::Block& b : blocks) {
    if (!buffers.contains(b.name))
      throw UserError(buffers.path() + ": buffer " + b.name + " is missing" + kMismatch);
    const TensorEntry& e = buffers.get(b.name);
    if (e.dtype != "U8" || e.shape != std::vector<int64_t>{b.bytes})
      throw UserError(buffers.path() + ": buffer " + b.name + " is " + e.dtype + " " +
                      shape_str(e.shape) + ", this run holds U8 [" + std::to_string(b.bytes) +
                      "]" + kMismatch);
  }
  if (buffers.names().size() != blocks.size())
    throw UserError(buffers.path() + ": holds " + std::to_string(buffers.names().size()) +
                    " buffers, this run has " + std::to_string(blocks.size()) + kMismatch);
}

// state.json's own keys: the step, the ranks that wrote it, this rank's data position (within
// the data's epoch) and the rows metrics.jsonl had.
void read_run_state(const CheckpointStateReader& r, const Checkpoint& checkpoint,
                    const TrainingState& state, const TokenLoader& loader, VerifiedCheckpoint& v) {
  const json& s = v.state;
  if (!s.is_object()) r.fail("not a JSON object");
  if (int64_t(r.u64(s, "step", "")) != checkpoint.step())
    r.fail("step " + std::to_string(r.u64(s, "step", "")) + " differs from the manifest's " +
           std::to_string(checkpoint.step()));
  const int world = state.comm ? state.comm->world() : 1, rank = state.comm ? state.comm->rank() : 0;
  const uint64_t saved_ranks = s.contains("ranks") ? r.u64(s, "ranks", "") : 1;
  if (saved_ranks != uint64_t(world))
    r.fail("written by a run of " + std::to_string(saved_ranks) + " rank(s); this run has " +
           std::to_string(world) + ": resume it with mpirun -np " + std::to_string(saved_ranks) +
           " (another rank count would change which windows each rank reads)");
  const json* saved_position = &r.field(s, "loader", "");
  if (world > 1) {
    const json& all = r.field(s, "loader_ranks", "");
    if (!all.is_array() || all.size() != size_t(world))
      r.fail("loader_ranks must list one position per rank (" + std::to_string(world) + ")");
    saved_position = &all[size_t(rank)];
  }
  const std::string where = world > 1 ? "loader_ranks[" + std::to_string(rank) + "]." : "loader.";
  v.position = {r.u64(*saved_position, "epoch", where), r.u64(*saved_position, "index", where)};
  if (v.position.index >= loader.windows_per_epoch())
    r.fail("data position (epoch " + std::to_string(v.position.epoch) + ", window " +
           std::to_string(v.position.index) + ") lies outside the " +
           std::to_string(loader.windows_per_epoch()) + " windows per epoch of " +
           loader.stream().describe() + "; was the checkpoint made with different data?");
  v.step = checkpoint.step();
  v.metrics_rows = int64_t(r.u64(s, "metrics_rows", ""));
}

// The moments' format before the buffers: a checkpoint of another format holds other buffers,
// and naming both formats says more than naming a buffer. (Checkpoints written before the key
// existed have none; their buffers are checked as before.)
void check_state_format(const std::string& path, const json& s, const RunConfig& cfg,
                        const Storage& storage) {
  if (!s.is_object() || !s.contains("optimizer_states")) return;
  const json& saved = s["optimizer_states"];
  const std::string ours = state_format(cfg.optimizer, storage);
  if (saved.is_string() && saved.get<std::string>() == ours) return;
  throw UserError(path + ": holds " + (saved.is_string() ? saved.get<std::string>() : saved.dump()) +
                  " optimizer states, this run's are " + ours +
                  ": resume with the checkpoint's optimizer.state_dtype (its config.json has it)");
}

// Each optimizer checks its own part of state.json (and its buffers' contents); no other
// optimizer's state may be there.
void verify_optimizer_states(const CheckpointStateReader& r, const json& s, const RunConfig& cfg,
                             const TrainingState& state) {
  std::set<std::string> claimed = kRunStateKeys;
  for (const auto& o : state.optimizers->all()) {
    const char* key = o->state_key();
    o->check_state(key && s.contains(key) ? &s[key] : nullptr, r);
    if (key) claimed.insert(key);
  }
  for (const auto& [key, value] : s.items())
    if (!claimed.count(key))
      r.fail("holds " + key + " state, but this run's optimizer is " + name_of(cfg.optimizer.kind) +
             kMismatch);
}

}  // namespace

std::string attention_resume_warning(const Checkpoint& checkpoint, const nlohmann::json& state,
                                     const AttentionInUse& now) {
  // Checkpoints before the record: the kernels their config.json asked for by name, if it did
  // (its CPU runs computed with the reference either way; no version to compare).
  json saved;
  if (state.is_object() && state.contains("attention") && state["attention"].is_object()) {
    saved = state["attention"];
  } else if (checkpoint.has(kConfigFile)) {
    const json config = checkpoint.read_json(kConfigFile);
    if (config.is_object() && config.contains("attention") && config["attention"].is_string() &&
        config["attention"] != "auto")
      saved = {{"kernel", config["attention"]}};
  }
  // anything but a kernel's name is no record (state.json is a file anyone may edit)
  if (!saved.contains("kernel") ||
      (saved["kernel"] != "grass" && saved["kernel"] != "cudnn" && saved["kernel"] != "mma"))
    return "";
  const std::string kernel = saved["kernel"].get<std::string>();
  const bool versioned =
      saved.contains("cudnn_version") && saved["cudnn_version"].is_number_integer();
  const int64_t version = versioned ? saved["cudnn_version"].get<int64_t>() : 0;
  const auto words = [](const std::string& name, int64_t cudnn_version) {
    if (name == "mma") return std::string("the engine's FA2-style (mma) attention");
    if (name != "cudnn") return std::string("the engine's attention kernels");
    std::string text = "cuDNN ";
    if (cudnn_version > 0) text += cudnn_version_name(cudnn_version);
    else text.pop_back();
    return text + "'s attention";
  };
  const std::string ours = name_of(now.kernel);
  const bool same = kernel == ours && (kernel != "cudnn" || version == 0 ||
                                       now.cudnn_version == 0 || version == now.cudnn_version);
  if (same) return "";
  return "resuming on " + words(ours, now.cudnn_version) + ", but checkpoint " + checkpoint.dir() +
         " was made on " + words(kernel, version) +
         ": the two compute other bits, so the run will not match an uninterrupted one";
}

int64_t head_rows_of(const LlamaModel& model) {
  return head_rows(model.storage(), int64_t(model.max_batch()) * model.seq_len(),
                   model.config().vocab_size, model.memory_options().head_chunk_rows);
}

std::string head_rows_resume_warning(const Checkpoint& checkpoint, const nlohmann::json& state,
                                     int64_t now) {
  if (!state.is_object() || !state.contains("head_rows") ||
      !state["head_rows"].is_number_integer() || state["head_rows"].get<int64_t>() == now)
    return "";
  return "resuming with the head's logits " + std::to_string(now) + " rows at a time, but " +
         "checkpoint " + checkpoint.dir() + " was made with " +
         std::to_string(state["head_rows"].get<int64_t>()) +
         " (memory_limit chooses it on a GPU): lm_head's gradient sums in another order, so the "
         "run will not match an uninterrupted one";
}

VerifiedCheckpoint verify_checkpoint(const Checkpoint& checkpoint, const RunConfig& cfg,
                                     const Arena& arena, const TrainingState& state,
                                     const TokenLoader& loader) {
  json run_state = checkpoint.read_json(kStateJson);
  check_state_format(checkpoint.path(kStateJson), run_state, cfg, state.model->storage());
  SafetensorsFile weights(checkpoint.path(kModelFile));
  verify_weights(weights, *state.model);
  SafetensorsFile buffers(checkpoint.path(kStateFile));
  std::vector<Arena::Block> blocks = state_blocks(arena, state.model->weight_store());
  verify_buffers(buffers, blocks);
  VerifiedCheckpoint v{.weights = std::move(weights),
                       .buffers = std::move(buffers),
                       .blocks = std::move(blocks),
                       .state = std::move(run_state),
                       .position = {}};
  const CheckpointStateReader r(checkpoint.path(kStateJson), v.buffers, v.blocks);
  read_run_state(r, checkpoint, state, loader, v);
  verify_optimizer_states(r, v.state, cfg, state);
  warn_config_changes(checkpoint, cfg);
  if (const std::string warning =
          attention_resume_warning(checkpoint, v.state, attention_of(*state.model));
      !warning.empty())
    std::fprintf(stderr, "warning: %s\n", warning.c_str());
  if (const std::string warning =
          head_rows_resume_warning(checkpoint, v.state, head_rows_of(*state.model));
      !warning.empty())
    std::fprintf(stderr, "warning: %s\n", warning.c_str());
  return v;
}

// Copies through the backend: a memcpy on the CPU, an upload to the GPU.
RestoredRun apply_checkpoint(const VerifiedCheckpoint& v, TrainingState& state,
                             TokenLoader& loader) {
  LlamaModel& model = *state.model;
  Backend& backend = model.backend();
  for (const ParamTensor& t : model.tensors())
    model.weight_store().load_hf_bytes(t, v.weights.get(t.name).bytes.data());
  for (const Arena::Block& b : v.blocks) {
    const TensorEntry& e = v.buffers.get(b.name);
    backend.upload(b.ptr, e.bytes.data(), e.bytes.size());
  }
  for (const auto& o : state.optimizers->all())
    if (o->state_key()) o->restore_state(v.state[o->state_key()]);
  loader.set_position(v.position);
  return {v.step, v.metrics_rows};
}

RestoredRun restore_checkpoint(const Checkpoint& checkpoint, const RunConfig& cfg, Arena& arena,
                               TrainingState& state, TokenLoader& loader) {
  return apply_checkpoint(verify_checkpoint(checkpoint, cfg, arena, state, loader), state, loader);
}

}  // namespace grass
