#include "data/loader.h"

#include <algorithm>

#include "core/error.h"

namespace grass {

namespace {

// "a.bin, b.bin, c.bin and 3 more": enough to identify the data without flooding one line.
std::string describe_shards(const std::vector<ShardReader>& shards) {
  constexpr size_t kShown = 3;
  std::string text;
  for (size_t i = 0; i < std::min(shards.size(), kShown); ++i)
    text += (i ? ", " : "") + shards[i].info().path;
  if (shards.size() > kShown) text += " and " + std::to_string(shards.size() - kShown) + " more";
  return text;
}

}  // namespace

TokenLoader::TokenLoader(const std::vector<std::string>& paths, int batch, int seq_len)
    : batch_(batch), seq_len_(seq_len), window_(static_cast<size_t>(seq_len) + 1) {
  GRASS_CHECK(batch > 0 && seq_len > 0, "TokenLoader needs positive batch and seq_len");
  if (paths.empty()) throw UserError("no training data: the list of token shards is empty");
  shards_.reserve(paths.size());
  for (const std::string& path : paths) {
    shards_.emplace_back(path);
    const ShardInfo& first = shards_.front().info();
    const ShardInfo& info = shards_.back().info();
    if (info.vocab_size != first.vocab_size)
      throw UserError(info.path + ": vocab_size " + std::to_string(info.vocab_size) +
                      " differs from " + first.path + "'s " + std::to_string(first.vocab_size) +
                      "; all shards of one run must come from the same tokenizer");
    if (info.tokenizer_hash != first.tokenizer_hash)
      throw UserError(info.path + ": tokenizer_hash differs from " + first.path +
                      "'s; the shards were made with different tokenizers");
    shard_starts_.push_back(total_tokens_);
    total_tokens_ += info.token_count;
  }
  const uint64_t window_tokens = static_cast<uint64_t>(seq_len) + 1;
  if (total_tokens_ < window_tokens)
    throw UserError(describe_shards(shards_) + ": " + std::to_string(total_tokens_) +
                    " tokens in all, fewer than one window of seq_len + 1 = " +
                    std::to_string(window_tokens) + " tokens; add data or lower seq_len");
}

void TokenLoader::read_stream(uint64_t offset, uint64_t n, uint32_t* out) const {
  // The shard holding `offset`: the last one starting at or before it (skipping empty shards,
  // which share their start with the next one).
  size_t s =
      static_cast<size_t>(std::upper_bound(shard_starts_.begin(), shard_starts_.end(), offset) -
                          shard_starts_.begin() - 1);
  while (n > 0) {
    GRASS_CHECK(s < shards_.size(), "TokenLoader read past the end of the stream");
    const uint64_t in_shard = offset - shard_starts_[s];
    const uint64_t take = std::min(n, shards_[s].token_count() - in_shard);
    shards_[s].read(in_shard, take, out);
    out += take;
    offset += take;
    n -= take;
    ++s;
  }
}

void TokenLoader::next_batch(int32_t* inputs, int32_t* targets) {
  const uint64_t window_tokens = static_cast<uint64_t>(seq_len_) + 1;
  for (int b = 0; b < batch_; ++b) {
    if (position_.next_offset + window_tokens > total_tokens_) {
      position_.next_offset = 0;
      ++position_.epoch;
    }
    read_stream(position_.next_offset, window_tokens, window_.data());
    int32_t* row_inputs = inputs + static_cast<size_t>(b) * seq_len_;
    int32_t* row_targets = targets + static_cast<size_t>(b) * seq_len_;
    for (int t = 0; t < seq_len_; ++t) {
      row_inputs[t] = static_cast<int32_t>(window_[t]);
      row_targets[t] = static_cast<int32_t>(window_[t + 1]);
    }
    position_.next_offset += static_cast<uint64_t>(seq_len_);
  }
}

void TokenLoader::check_vocab(int model_vocab) const {
  GRASS_CHECK(model_vocab > 0, "check_vocab needs a positive model vocab_size");
  const auto model_vocab_u = static_cast<uint32_t>(model_vocab);
  for (const ShardReader& shard : shards_) {
    const ShardInfo& info = shard.info();
    if (info.vocab_size > model_vocab_u)
      throw UserError(info.path + ": the shard's vocab_size " + std::to_string(info.vocab_size) +
                      " exceeds the model's vocab_size " + std::to_string(model_vocab) +
                      "; use a model whose vocab_size covers the tokenizer");
    // The writer keeps every token below the shard's vocab_size (<= model_vocab here), so a
    // token at or above it means the token data itself is damaged.
    if (const auto position = shard.find_first_token_at_least(info.vocab_size))
      throw UserError(info.path + ": token id " + std::to_string(shard.token(*position)) +
                      " at position " + std::to_string(*position) +
                      " is out of range (shard vocab_size " + std::to_string(info.vocab_size) +
                      ", model vocab_size " + std::to_string(model_vocab) +
                      "); the shard is corrupt: re-create it");
  }
}

void TokenLoader::set_position(const LoaderPosition& position) {
  if (position.next_offset > total_tokens_ || position.epoch < 0)
    throw UserError("data position (offset " + std::to_string(position.next_offset) + ", epoch " +
                    std::to_string(position.epoch) + ") lies outside the " +
                    std::to_string(total_tokens_) + " tokens of " + describe_shards(shards_) +
                    "; was the checkpoint made with different data?");
  position_ = position;
}

}  // namespace grass
