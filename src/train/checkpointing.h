// The run's state in and out of checkpoints (the directory format is io/checkpoint.h).
//
// What exists is read from the arena: every buffer of the weights and optimizer categories is
// saved, the parameters as Hugging Face tensors in model.safetensors, every other buffer (Adam
// moments, GRASS σ, ρ and moments, whatever a later optimizer adds) byte for byte under its arena
// name in state.safetensors. Counters that are not buffers (the data loader's position, GRASS's
// per-target step counters) go to state.json, and so do the attention kernels the run computed
// with ("attention": {"kernel": "grass"} or "cudnn" with its "cudnn_version"), which
// verify_checkpoint compares with the resuming run's. Nothing else needs saving: every random
// draw is a pure function of (seed, step or epoch, index), and the seeds are in config.json.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/data/loader.h"
#include "src/io/checkpoint.h"
#include "src/io/safetensors.h"
#include "src/train/training_state.h"

namespace grass {

std::string checkpoint_root(const RunConfig& cfg);  // <out_dir>/checkpoints

// Writes the state after `step` optimizer steps to <out_dir>/checkpoints/step_XXXXXXXX, then
// deletes the checkpoints that checkpoint_keep / checkpoint_keep_every no longer keep. Returns
// the directory. UserError (a full disk, no permission) leaves the earlier checkpoints intact.
// With several ranks only rank 0 writes; rank_positions holds every rank's loader position (the
// ranks' slices of an epoch may differ by a window, so their positions may differ).
std::string save_checkpoint(const RunConfig& cfg, const Arena& arena, const TrainingState& state,
                            const TokenLoader& loader, int64_t step, int64_t metrics_rows,
                            const std::vector<LoaderPosition>& rank_positions = {});

// The newest checkpoint under `path` that verifies: `path` itself when it holds a manifest, else
// the step directories in path/checkpoints or in path. Those that fail verification are skipped
// with a warning line on stderr naming the file and the problem. nullopt when there is none; with
// `required`, that is a UserError.
std::optional<Checkpoint> newest_valid_checkpoint(const std::string& path, bool required);

// Restoring a run from a checkpoint, in two halves. verify_checkpoint checks that a verified
// checkpoint holds exactly this run's state (same tensors and buffers, same sizes, a well-formed
// state.json that every optimizer accepts) and warns about run config keys that differ from the
// checkpoint's config.json; it touches nothing, and any mismatch is a UserError naming the file
// (a checkpoint written by another number of ranks is one). apply_checkpoint then copies it in.
struct VerifiedCheckpoint {
  SafetensorsFile weights;           // model.safetensors
  SafetensorsFile buffers;           // state.safetensors
  std::vector<Arena::Block> blocks;  // the run's buffers that state.safetensors holds
  nlohmann::json state;              // state.json
  LoaderPosition position;           // this rank's
  int64_t step = 0;                  // optimizer steps done when the checkpoint was taken
  int64_t metrics_rows = 0;          // rows metrics.jsonl had then
};
// A resume on other attention kernels than the checkpoint's (state.json's "attention": its kernel
// and cuDNN's version; for checkpoints before that record, the kernel their config.json named),
// or on another cuDNN version, computes other bits: the warning verify_checkpoint prints, or ""
// when they are the same or unknown. A warning, not a refusal: the weights and states fit either.
std::string attention_resume_warning(const Checkpoint& checkpoint, const nlohmann::json& state,
                                     const AttentionInUse& now);
// The same for the head's chunk (state.json's "head_rows": the rows of logits a GPU head computes
// at a time, which its memory_limit may choose, ModelMemoryOptions::head_chunk_rows): another
// chunk sums lm_head's gradient in another order. "" when the same or unrecorded.
std::string head_rows_resume_warning(const Checkpoint& checkpoint, const nlohmann::json& state,
                                     int64_t now);
// The rows of logits the model's head computes at a time, as head_rows() gives them.
int64_t head_rows_of(const LlamaModel& model);
VerifiedCheckpoint verify_checkpoint(const Checkpoint& checkpoint, const RunConfig& cfg,
                                     const Arena& arena, const TrainingState& state,
                                     const TokenLoader& loader);
struct RestoredRun {
  int64_t step = 0;          // optimizer steps done when the checkpoint was taken
  int64_t metrics_rows = 0;  // rows metrics.jsonl had then
};
RestoredRun apply_checkpoint(const VerifiedCheckpoint& verified, TrainingState& state,
                             TokenLoader& loader);
// Both halves.
RestoredRun restore_checkpoint(const Checkpoint& checkpoint, const RunConfig& cfg, Arena& arena,
                               TrainingState& state, TokenLoader& loader);

}  // namespace grass
