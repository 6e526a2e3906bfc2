// Token data for training and evaluation.
//
// TokenStream: the shards of one data set (data.train or data.val, expanded from their spec by
// expand_data_spec: files, globs, directories, manifests) read as one concatenated stream of
// token ids. check_run_data (data_sets.h) checks that a run's sets belong together.
//
// TokenLoader: training batches from a TokenStream. Each batch row is a window of seq_len + 1
// consecutive tokens; inputs are its first seq_len tokens and targets its last seq_len (the next
// token at every position). Window i starts at token i * seq_len, so each window's last token is
// the next window's first (llm.c's layout); there are (total_tokens - 1) / seq_len windows, and
// windows may span the boundary between two shards. One epoch visits every window once, in an
// order that is either sequential (0, 1, 2, ...) or a permutation drawn from (seed, epoch).
// With several ranks, rank r of `world` takes positions r, r + world, r + 2·world, ... of each
// epoch's order: the ranks' windows are disjoint and together cover the epoch (slices differ by
// at most one window when world does not divide the window count).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/data/shard.h"

namespace grass {

class TokenStream {
 public:
  // Expands `specs`, the value of config key `key` ("data.train", "data.val"), and opens every
  // shard. UserError naming the key for a spec without shards (expand_data_spec), a shard that
  // cannot be read or is damaged (ShardReader's message after the key), and a shard whose header
  // holds another token count than its manifest records.
  TokenStream(std::string key, const std::vector<std::string>& specs);

  const std::string& key() const { return key_; }
  uint64_t total_tokens() const { return total_tokens_; }
  const std::vector<ShardReader>& shards() const { return shards_; }
  // "a.bin, b.bin, c.bin and 3 more": names the data in one line.
  std::string describe() const;

  // Copies stream tokens [offset, offset + n) into out, crossing shard boundaries as needed.
  void read(uint64_t offset, uint64_t n, uint32_t* out) const;

 private:
  std::string key_;
  std::vector<ShardReader> shards_;
  std::vector<uint64_t> shard_starts_;  // [shards]: stream offset of each shard's first token
  uint64_t total_tokens_ = 0;
};

// Where a loader is: saved in checkpoints so a resumed run sees exactly the same batches.
struct LoaderPosition {
  uint64_t epoch = 0;  // completed passes over this rank's slice
  uint64_t index = 0;  // next window within this rank's slice of the epoch's order
  bool operator==(const LoaderPosition&) const = default;
};

struct LoaderOptions {
  bool shuffle = false;   // false: windows in stream order (evaluation, debugging)
  uint64_t seed = 0;      // with `epoch`, picks each epoch's order when shuffling
  int rank = 0;           // this process's slice of every epoch ...
  int world = 1;          // ... out of `world` disjoint ones
  bool prefetch = false;  // prepare the next batch on a background thread
  std::string key = "data.train";  // the config key the shard specs came from, for messages
};

// Maps [0, n) onto itself one to one, differently for every key: a 6-round Feistel network on
// the smallest even power of two >= n, walking the cycle until the value lands below n. O(1)
// memory, so it serves billions of windows; a value costs a few hashes.
class WindowPermutation {
 public:
  WindowPermutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t i) const;

 private:
  uint64_t feistel(uint64_t x) const;
  uint64_t n_;
  int half_bits_;
  uint64_t half_mask_;
  uint64_t round_keys_[6];
};

class TokenLoader {
 public:
  // UserError if the shards hold no complete window (seq_len + 1 tokens), or if this rank's
  // slice of an epoch would be empty (fewer windows than ranks).
  TokenLoader(const std::vector<std::string>& specs, int batch, int seq_len,
              const LoaderOptions& options = {});
  ~TokenLoader();  // stops and joins the prefetch thread
  TokenLoader(const TokenLoader&) = delete;
  TokenLoader& operator=(const TokenLoader&) = delete;

  // Fills inputs and targets, each [batch, seq_len] row-major. With prefetching it copies the
  // batch the background thread already prepared and lets it start on the next one.
  void next_batch(int32_t* inputs, int32_t* targets);

  const TokenStream& stream() const { return stream_; }
  uint64_t total_tokens() const { return stream_.total_tokens(); }
  const std::vector<ShardReader>& shards() const { return stream_.shards(); }
  uint64_t num_windows() const { return num_windows_; }
  uint64_t windows_per_epoch() const { return slice_windows_; }  // this rank's
  int batch() const { return batch_; }
  int seq_len() const { return seq_len_; }

  // The position of the batch next_batch() returns next.
  LoaderPosition position() const;
  uint64_t epoch() const { return position().epoch; }
  // UserError if the position lies beyond this rank's slice (a checkpoint made with other data).
  void set_position(const LoaderPosition& position);
  // Stream offset of the first token of the window at `position`.
  uint64_t window_start(const LoaderPosition& position) const;

 private:
  struct Batch {
    std::vector<int32_t> inputs, targets;  // [batch, seq_len] each
  };
  // Fills `out` with the batch at `position` and returns the position after it.
  LoaderPosition fill(LoaderPosition position, Batch& out) const;
  void prefetch_loop();

  TokenStream stream_;
  int batch_ = 0;
  int seq_len_ = 0;
  LoaderOptions options_;
  uint64_t num_windows_ = 0;    // in the whole stream
  uint64_t slice_windows_ = 0;  // this rank's per epoch

  // Without prefetching only position_ and ready_ are used. With it, the thread fills ready_
  // from position_ when state_ is kEmpty, then stores the following position in next_position_.
  enum class SlotState { kEmpty, kFilling, kFull, kStopping };
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  SlotState state_ = SlotState::kEmpty;
  LoaderPosition position_;       // of the batch next_batch() returns next
  LoaderPosition next_position_;  // after the batch in ready_
  Batch ready_;
  std::exception_ptr prefetch_error_;
  std::thread prefetch_thread_;
};

}  // namespace grass
