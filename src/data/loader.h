// TokenLoader: training batches from a list of token shards read as one concatenated stream.
//
// Each batch row is a window of seq_len + 1 consecutive tokens; inputs are its first seq_len
// tokens and targets its last seq_len (the next token at every position). Successive windows
// start seq_len tokens apart, so each window's last token is the next window's first (llm.c's
// layout). A window that would run past the end of the stream wraps to the start instead and
// begins a new epoch; windows may span the boundary between two shards.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/shard.h"

namespace grass {

// Where the loader is in the stream; saved in checkpoints so a resumed run sees the same data.
struct LoaderPosition {
  uint64_t next_offset = 0;  // stream offset of the next window's first token
  int64_t epoch = 0;         // completed passes over the stream
};

class TokenLoader {
 public:
  // All shards must agree on vocab_size and tokenizer_hash, and together hold at least one
  // window (seq_len + 1 tokens); UserError otherwise.
  TokenLoader(const std::vector<std::string>& paths, int batch, int seq_len);

  // Fills inputs and targets, each [batch, seq_len] row-major.
  void next_batch(int32_t* inputs, int32_t* targets);

  // UserError, naming the shard, if any shard's vocab_size exceeds model_vocab or any token is
  // outside its shard's vocabulary (the first such token id and its position in the shard).
  // Call once before training: it reads every token.
  void check_vocab(int model_vocab) const;

  uint64_t total_tokens() const { return total_tokens_; }
  int64_t epoch() const { return position_.epoch; }
  int batch() const { return batch_; }
  int seq_len() const { return seq_len_; }
  const std::vector<ShardReader>& shards() const { return shards_; }

  LoaderPosition position() const { return position_; }
  // UserError if the offset lies beyond this stream (a checkpoint made with other data).
  void set_position(const LoaderPosition& position);

 private:
  // Copies stream tokens [offset, offset + n) into out, crossing shard boundaries as needed.
  void read_stream(uint64_t offset, uint64_t n, uint32_t* out) const;

  std::vector<ShardReader> shards_;
  std::vector<uint64_t> shard_starts_;  // [shards]: stream offset of each shard's first token
  uint64_t total_tokens_ = 0;
  int batch_ = 0;
  int seq_len_ = 0;
  LoaderPosition position_;
  std::vector<uint32_t> window_;  // [seq_len + 1] scratch for one window
};

}  // namespace grass
