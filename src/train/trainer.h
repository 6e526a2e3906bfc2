// The training loop: micro-batches with gradient accumulation, global-norm clipping, AdamW, the
// learning-rate schedule, and the step log (stdout) plus <out_dir>/metrics.jsonl.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "config/config.h"
#include "train/evaluator.h"

namespace grass {

struct TrainResult {
  std::vector<double> losses;  // mean loss of every step, before its update
  double tokens_per_second = 0;  // median over the steps after the first
  std::optional<EvalResult> final_eval;  // after the last step, when the run has data.val
};

// Everything a run needs is validated (config, data, vocabulary) before out_dir is touched.
TrainResult train(const RunConfig& cfg);

}  // namespace grass
