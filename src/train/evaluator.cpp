#include "src/train/evaluator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "src/core/error.h"

namespace grass {

Evaluator::Evaluator(const std::vector<std::string>& val_files, int64_t tokens)
    : stream_("data.val", val_files), tokens_(tokens) {
  GRASS_CHECK(tokens > 0, "Evaluator needs a positive token count");
  if (stream_.total_tokens() < static_cast<uint64_t>(tokens) + 1)
    throw UserError(stream_.describe() + ": " + std::to_string(stream_.total_tokens()) +
                    " tokens hold " + std::to_string(stream_.total_tokens() - 1) +
                    " targets, fewer than the " + std::to_string(tokens) +
                    " to evaluate; lower eval_tokens or add validation data");
}

EvalResult Evaluator::evaluate(LlamaModel& model, int batch) const {
  const int T = model.seq_len();
  const auto N = static_cast<uint64_t>(tokens_);
  const uint64_t windows = (N + T - 1) / T;
  std::vector<int32_t> inputs(static_cast<size_t>(batch) * T), targets(inputs.size());
  std::vector<uint32_t> window(static_cast<size_t>(T) + 1);
  double loss_sum = 0;
  int64_t counted = 0;
  const auto start = std::chrono::steady_clock::now();
  auto last_report = start;
  for (uint64_t first = 0; first < windows; first += batch) {
    const int B = static_cast<int>(std::min<uint64_t>(batch, windows - first));
    for (int b = 0; b < B; ++b) {
      const uint64_t offset = (first + b) * T;
      const int needed = static_cast<int>(std::min<uint64_t>(T, N - offset));  // targets
      stream_.read(offset, static_cast<uint64_t>(needed) + 1, window.data());
      int32_t* row_inputs = inputs.data() + static_cast<size_t>(b) * T;
      int32_t* row_targets = targets.data() + static_cast<size_t>(b) * T;
      for (int t = 0; t < T; ++t) {
        // Past `needed` the inputs are padding (token 0): attention is causal, so they cannot
        // change the counted positions, and their targets are ignored.
        row_inputs[t] = t < needed ? static_cast<int32_t>(window[t]) : 0;
        row_targets[t] = t < needed ? static_cast<int32_t>(window[t + 1]) : -1;
      }
    }
    const double mean = model.forward(inputs.data(), targets.data(), B);
    loss_sum += mean * double(model.valid_targets());
    counted += model.valid_targets();

    const auto now = std::chrono::steady_clock::now();
    if (now - last_report > std::chrono::seconds(5)) {
      const double seconds = std::chrono::duration<double>(now - start).count();
      std::fprintf(stderr, "eval: %lld/%lld tokens, %.0f tok/s\n", (long long)counted,
                   (long long)N, double(counted) / seconds);
      last_report = now;
    }
  }
  GRASS_CHECK(counted == tokens_, "evaluation counted " + std::to_string(counted) +
                                      " targets instead of " + std::to_string(tokens_));
  EvalResult result;
  result.tokens = counted;
  result.loss = loss_sum / double(counted);
  result.perplexity = std::exp(result.loss);
  return result;
}

}  // namespace grass
