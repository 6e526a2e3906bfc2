// Validation perplexity, the GaLore protocol without its off-by-one: the mean token
// cross-entropy over exactly the first N targets of the validation stream (tokens 1 .. N, each
// predicted from the tokens before it), read in order, no shuffling, and perplexity = exp(mean).
//
// The stream is cut into windows of seq_len + 1 tokens at stride seq_len (the training layout),
// so window w predicts targets w·seq_len + 1 .. (w+1)·seq_len. The last window may be partial:
// its targets past N are set to -1, which the model ignores, so exactly N count.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "src/data/loader.h"
#include "src/model/llama.h"

namespace grass {

struct EvalResult {
  double loss = 0;        // mean cross-entropy per target token, nats
  double perplexity = 0;  // exp(loss)
  int64_t tokens = 0;     // targets counted: exactly the requested N
};

class Evaluator {
 public:
  // UserError, naming the shards, if they hold fewer than tokens + 1 tokens (N targets need N + 1).
  Evaluator(const std::vector<std::string>& val_files, int64_t tokens);

  const TokenStream& stream() const { return stream_; }
  int64_t tokens() const { return tokens_; }

  // Runs the model forward over the first N targets, `batch` windows of model.seq_len() tokens
  // at a time (batch at most the micro-batch the model was built for). Only the activations and
  // logits change; weights and gradients are untouched.
  EvalResult evaluate(LlamaModel& model, int batch) const;

 private:
  TokenStream stream_;
  int64_t tokens_;
};

}  // namespace grass
