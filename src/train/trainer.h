// The training loop: micro-batches with gradient accumulation, global-norm clipping, AdamW, the
// learning-rate schedule, and the step log (stdout) plus <out_dir>/metrics.jsonl.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/config/config.h"
#include "src/dist/communicator.h"
#include "src/train/evaluator.h"

namespace grass {

struct TrainResult {
  int64_t first_step = 0;      // steps done before this call: 0, or the resumed checkpoint's step
  std::string resumed_from;    // the checkpoint directory, "" for a fresh run
  std::vector<double> losses;  // mean loss of every step run, before its update
  double tokens_per_second = 0;  // median over the steps after the first (0 after one step)
  int64_t clipped_steps = 0;     // steps of this call whose gradients clipping scaled down
  std::optional<EvalResult> final_eval;  // after the last step, when the run has data.val
  int stop_signal = 0;  // SIGINT or SIGTERM when one stopped the run early (its model saved); 0
  std::string saved;    // where the final weights are: the last checkpoint, or <out_dir>/model
};

struct TrainOptions {
  // A checkpoint directory (or a run's out_dir) to resume from. Empty: the newest complete
  // checkpoint in <out_dir>/checkpoints when there is one, else a fresh start.
  std::string resume;
  // --overwrite: a non-empty out_dir is moved aside to <out_dir>.old-N first (train/out_dir.h),
  // and the run starts afresh (or from `resume`, which must not lie inside it).
  bool overwrite = false;
  // The data-parallel ranks (dist/communicator.h); null: one process. Every rank calls train()
  // with the same config; rank 0 alone prints, evaluates and writes out_dir.
  Communicator* comm = nullptr;
};

// Everything a run needs is validated (config, data, vocabulary, what out_dir holds, the
// checkpoint it resumes from, the weights of init_from) before out_dir's files are touched. At its
// end, and when SIGINT or SIGTERM stops it after a step, the model is saved: into a checkpoint when
// checkpoints are on, else into <out_dir>/model (a Hugging Face directory). A second signal ends
// the process at once.
TrainResult train(const RunConfig& cfg, const TrainOptions& options = {});

}  // namespace grass
