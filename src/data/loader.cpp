#include "src/data/loader.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <utility>

#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/data/data_sets.h"

namespace grass {

// ---- TokenStream ------------------------------------------------------------------------------

TokenStream::TokenStream(std::string key, const std::vector<std::string>& specs)
    : key_(std::move(key)) {
  const std::vector<ShardSource> sources = expand_data_spec(key_, specs);
  shards_.reserve(sources.size());
  for (const ShardSource& source : sources) {
    try {
      shards_.emplace_back(source.path);
    } catch (const UserError& e) {  // a damaged or unreadable shard: say which set it is in
      throw UserError(key_ + ": " + e.what());
    }
    const ShardInfo& info = shards_.back().info();
    if (source.manifest_tokens && info.token_count != *source.manifest_tokens)
      throw UserError(key_ + ": " + source.manifest + " records " +
                      std::to_string(*source.manifest_tokens) + " tokens for " + info.path +
                      " but its header says " + std::to_string(info.token_count) +
                      "; the shards changed since grass prepare wrote the manifest: re-run it");
    shard_starts_.push_back(total_tokens_);
    total_tokens_ += info.token_count;
  }
}

std::string TokenStream::describe() const {
  constexpr size_t kShown = 3;
  std::string text;
  for (size_t i = 0; i < std::min(shards_.size(), kShown); ++i)
    text += (i ? ", " : "") + shards_[i].info().path;
  if (shards_.size() > kShown) text += " and " + std::to_string(shards_.size() - kShown) + " more";
  return text;
}

void TokenStream::read(uint64_t offset, uint64_t n, uint32_t* out) const {
  GRASS_CHECK(offset + n <= total_tokens_, "TokenStream read past the end of the stream");
  // The shard holding `offset`: the last one starting at or before it (skipping empty shards,
  // which share their start with the next one).
  size_t s =
      static_cast<size_t>(std::upper_bound(shard_starts_.begin(), shard_starts_.end(), offset) -
                          shard_starts_.begin() - 1);
  while (n > 0) {
    const uint64_t in_shard = offset - shard_starts_[s];
    const uint64_t take = std::min(n, shards_[s].token_count() - in_shard);
    shards_[s].read(in_shard, take, out);
    out += take;
    offset += take;
    n -= take;
    ++s;
  }
}

// ---- WindowPermutation ------------------------------------------------------------------------

WindowPermutation::WindowPermutation(uint64_t n, uint64_t key) : n_(n) {
  GRASS_CHECK(n > 0, "WindowPermutation over an empty range");
  const int bits = n <= 1 ? 1 : std::bit_width(n - 1);  // 2^bits >= n
  half_bits_ = std::max(1, (bits + 1) / 2);
  half_mask_ = (uint64_t(1) << half_bits_) - 1;
  for (int r = 0; r < 6; ++r) round_keys_[r] = derive_seed(key, uint64_t(r));
}

uint64_t WindowPermutation::feistel(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (const uint64_t round_key : round_keys_) {
    const uint64_t mixed = left ^ (splitmix64(right ^ round_key) & half_mask_);
    left = right;
    right = mixed;
  }
  return (left << half_bits_) | right;
}

uint64_t WindowPermutation::operator()(uint64_t i) const {
  GRASS_CHECK(i < n_, "WindowPermutation index out of range");
  // The Feistel network permutes [0, 4^half_bits); following its cycle from i until it returns
  // below n restricts it to a permutation of [0, n). The domain is under 4n, so the walk takes
  // fewer than 4 steps on average.
  uint64_t x = feistel(i);
  while (x >= n_) x = feistel(x);
  return x;
}

// ---- TokenLoader ------------------------------------------------------------------------------

TokenLoader::TokenLoader(const std::vector<std::string>& specs, int batch, int seq_len,
                         const LoaderOptions& options)
    : stream_(options.key, specs), batch_(batch), seq_len_(seq_len), options_(options) {
  GRASS_CHECK(batch > 0 && seq_len > 0, "TokenLoader needs positive batch and seq_len");
  GRASS_CHECK(options.world > 0 && options.rank >= 0 && options.rank < options.world,
              "TokenLoader rank must lie in [0, world)");
  const uint64_t window_tokens = static_cast<uint64_t>(seq_len) + 1;
  if (stream_.total_tokens() < window_tokens)
    throw UserError(stream_.describe() + ": " + std::to_string(stream_.total_tokens()) +
                    " tokens in all, fewer than one window of seq_len + 1 = " +
                    std::to_string(window_tokens) + " tokens; add data or lower seq_len");
  num_windows_ = (stream_.total_tokens() - 1) / static_cast<uint64_t>(seq_len);
  const auto world = static_cast<uint64_t>(options.world);
  const auto rank = static_cast<uint64_t>(options.rank);
  slice_windows_ = num_windows_ > rank ? (num_windows_ - rank + world - 1) / world : 0;
  if (slice_windows_ == 0)
    throw UserError(stream_.describe() + ": " + std::to_string(num_windows_) +
                    " windows of seq_len + 1 tokens, fewer than the " + std::to_string(world) +
                    " ranks; every rank needs at least one: add data or lower seq_len");
  const size_t n = static_cast<size_t>(batch) * seq_len;
  ready_ = Batch{std::vector<int32_t>(n), std::vector<int32_t>(n)};
  if (options_.prefetch) prefetch_thread_ = std::thread([this] { prefetch_loop(); });
}

TokenLoader::~TokenLoader() {
  if (!prefetch_thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    state_ = SlotState::kStopping;
  }
  changed_.notify_all();
  prefetch_thread_.join();
}

uint64_t TokenLoader::window_start(const LoaderPosition& position) const {
  GRASS_CHECK(position.index < slice_windows_, "window_start past the end of the slice");
  const uint64_t in_order =
      position.index * static_cast<uint64_t>(options_.world) + static_cast<uint64_t>(options_.rank);
  const uint64_t window =
      options_.shuffle
          ? WindowPermutation(num_windows_, derive_seed(options_.seed, position.epoch))(in_order)
          : in_order;
  return window * static_cast<uint64_t>(seq_len_);
}

LoaderPosition TokenLoader::fill(LoaderPosition position, Batch& out) const {
  std::vector<uint32_t> window(static_cast<size_t>(seq_len_) + 1);
  for (int b = 0; b < batch_; ++b) {
    stream_.read(window_start(position), window.size(), window.data());
    int32_t* row_inputs = out.inputs.data() + static_cast<size_t>(b) * seq_len_;
    int32_t* row_targets = out.targets.data() + static_cast<size_t>(b) * seq_len_;
    for (int t = 0; t < seq_len_; ++t) {
      row_inputs[t] = static_cast<int32_t>(window[t]);
      row_targets[t] = static_cast<int32_t>(window[t + 1]);
    }
    // A finished epoch moves on at once, so a saved position always names a window to read.
    if (++position.index == slice_windows_) position = {position.epoch + 1, 0};
  }
  return position;
}

void TokenLoader::prefetch_loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return state_ == SlotState::kEmpty || state_ == SlotState::kStopping; });
    if (state_ == SlotState::kStopping) return;
    state_ = SlotState::kFilling;
    const LoaderPosition from = position_;
    lock.unlock();
    LoaderPosition after;
    std::exception_ptr error;
    try {
      after = fill(from, ready_);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (state_ == SlotState::kStopping) return;
    next_position_ = after;
    prefetch_error_ = error;
    state_ = SlotState::kFull;
    changed_.notify_all();
  }
}

void TokenLoader::next_batch(int32_t* inputs, int32_t* targets) {
  if (!options_.prefetch) {
    position_ = fill(position_, ready_);
  } else {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return state_ == SlotState::kFull; });
    if (prefetch_error_) std::rethrow_exception(prefetch_error_);
    position_ = next_position_;
  }
  std::copy(ready_.inputs.begin(), ready_.inputs.end(), inputs);
  std::copy(ready_.targets.begin(), ready_.targets.end(), targets);
  if (options_.prefetch) {
    std::lock_guard lock(mutex_);
    state_ = SlotState::kEmpty;
    changed_.notify_all();
  }
}

LoaderPosition TokenLoader::position() const {
  std::lock_guard lock(mutex_);
  return position_;
}

void TokenLoader::set_position(const LoaderPosition& position) {
  if (position.index >= slice_windows_)
    throw UserError("data position (epoch " + std::to_string(position.epoch) + ", window " +
                    std::to_string(position.index) + ") lies outside the " +
                    std::to_string(slice_windows_) + " windows per epoch of " +
                    stream_.describe() + "; was the checkpoint made with different data?");
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return state_ != SlotState::kFilling; });
  position_ = position;
  if (options_.prefetch) {
    state_ = SlotState::kEmpty;  // drop the batch prepared for the old position
    changed_.notify_all();
  }
}

}  // namespace grass
