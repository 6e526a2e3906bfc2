// TokenLoader: window layout (inputs/targets shifted by one, stride seq_len), wrap-around and
// epochs, windows spanning shards, shuffled orders (a permutation per epoch, deterministic),
// rank slices (disjoint, complete), exact resume and prefetching. The data specs and the checks
// of a run's shards are test_data_sets.cpp's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "src/core/error.h"
#include "src/data/loader.h"
#include "tests/test_util.h"

using Catch::Matchers::Contains;
using namespace grass::test;

namespace {

struct Batch {
  std::vector<int32_t> inputs, targets;  // [batch, seq_len] each
};

Batch next(grass::TokenLoader& loader) {
  const size_t n = static_cast<size_t>(loader.batch()) * loader.seq_len();
  Batch batch{std::vector<int32_t>(n), std::vector<int32_t>(n)};
  loader.next_batch(batch.inputs.data(), batch.targets.data());
  return batch;
}

// The batches the loader must produce, computed the obvious way over the concatenated stream.
struct ReferenceStream {
  std::vector<uint32_t> stream;
  int batch, seq_len;
  uint64_t offset = 0;
  int64_t epoch = 0;

  Batch next() {
    Batch out;
    for (int b = 0; b < batch; ++b) {
      if (offset + seq_len + 1 > stream.size()) {
        offset = 0;
        ++epoch;
      }
      for (int t = 0; t < seq_len; ++t) {
        out.inputs.push_back(static_cast<int32_t>(stream[offset + t]));
        out.targets.push_back(static_cast<int32_t>(stream[offset + t + 1]));
      }
      offset += seq_len;
    }
    return out;
  }
};

}  // namespace

TEST_CASE("loader rows are windows of seq_len + 1 tokens with stride seq_len", "[loader]") {
  TempDir dir("grass_test_loader");
  const std::vector<uint32_t> tokens = random_tokens(1000, 32000, 1);
  const std::string path = write_shard(dir.file("a.bin"), tokens, {.vocab_size = 32000});
  const int batch = 4, seq_len = 16;
  grass::TokenLoader loader({path}, batch, seq_len);
  CHECK(loader.total_tokens() == 1000);

  for (int step = 0; step < 2; ++step) {
    const Batch out = next(loader);
    for (int b = 0; b < batch; ++b) {
      const size_t start = static_cast<size_t>((step * batch + b) * seq_len);
      for (int t = 0; t < seq_len; ++t) {
        REQUIRE(out.inputs[b * seq_len + t] == static_cast<int32_t>(tokens[start + t]));
        REQUIRE(out.targets[b * seq_len + t] == static_cast<int32_t>(tokens[start + t + 1]));
      }
    }
  }
  CHECK(loader.num_windows() == 999 / 16);
  CHECK(loader.position() == grass::LoaderPosition{.epoch = 0, .index = 2 * batch});
}

TEST_CASE("loader wraps to the start when a window would pass the end, counting epochs",
          "[loader]") {
  TempDir dir("grass_test_loader");
  // 100 tokens, seq_len 10: windows start at 0, 10, ..., 80 (9 per epoch); one at 90 would need
  // token 100, so the loader wraps there.
  const std::vector<uint32_t> tokens = random_tokens(100, 5000, 2);
  const std::string path = write_shard(dir.file("a.bin"), tokens, {.vocab_size = 5000});
  grass::TokenLoader loader({path}, 3, 10);
  ReferenceStream reference{tokens, 3, 10};

  for (int step = 0; step < 2; ++step) {  // windows 0..5
    next(loader);
    reference.next();
  }
  CHECK(loader.position() == grass::LoaderPosition{.epoch = 0, .index = 6});
  next(loader);  // windows 6..8 end the epoch
  reference.next();
  CHECK(loader.position() == grass::LoaderPosition{.epoch = 1, .index = 0});
  const Batch wrapped = next(loader);  // windows 0, 10, 20 of epoch 1
  CHECK(loader.position() == grass::LoaderPosition{.epoch = 1, .index = 3});
  CHECK(wrapped.inputs == reference.next().inputs);
  CHECK(wrapped.inputs[0] == static_cast<int32_t>(tokens[0]));

  for (int step = 0; step < 20; ++step) {
    const Batch expected = reference.next();
    const Batch got = next(loader);
    REQUIRE(got.inputs == expected.inputs);
    REQUIRE(got.targets == expected.targets);
  }
}

TEST_CASE("loader windows span shard boundaries, empty shards included", "[loader]") {
  TempDir dir("grass_test_loader");
  const std::vector<uint32_t> a = random_tokens(25, 900, 3);
  const std::vector<uint32_t> empty;
  const std::vector<uint32_t> c = random_tokens(40, 900, 4);
  const std::vector<std::string> paths = {
      write_shard(dir.file("a.bin"), a, {.vocab_size = 900}),
      write_shard(dir.file("b.bin"), empty, {.vocab_size = 900}),
      write_shard(dir.file("c.bin"), c, {.vocab_size = 900}),
  };
  grass::TokenLoader loader(paths, 2, 10);
  CHECK(loader.total_tokens() == 65);

  std::vector<uint32_t> stream = a;
  stream.insert(stream.end(), c.begin(), c.end());
  ReferenceStream reference{stream, 2, 10};
  // The second window (tokens 10..20) stays in a.bin; the third (20..30) crosses into c.bin.
  for (int step = 0; step < 12; ++step) {
    const Batch expected = reference.next();
    const Batch got = next(loader);
    REQUIRE(got.inputs == expected.inputs);
    REQUIRE(got.targets == expected.targets);
  }
  CHECK(loader.epoch() >= 3);
}

TEST_CASE("loader position restores the same batches", "[loader]") {
  TempDir dir("grass_test_loader");
  const std::vector<uint32_t> tokens = random_tokens(500, 32000, 5);
  const std::string path = write_shard(dir.file("a.bin"), tokens, {.vocab_size = 32000});
  grass::TokenLoader loader({path}, 4, 12);
  for (int step = 0; step < 13; ++step) next(loader);  // past one epoch
  const grass::LoaderPosition saved = loader.position();
  CHECK(saved.epoch == 1);
  const Batch after_a = next(loader), after_b = next(loader);

  grass::TokenLoader resumed({path}, 4, 12);
  resumed.set_position(saved);
  CHECK(resumed.epoch() == 1);
  CHECK(next(resumed).inputs == after_a.inputs);
  CHECK(next(resumed).targets == after_b.targets);

  // 500 tokens hold (500 - 1) / 12 = 41 windows.
  CHECK_THAT(user_error_of([&] { resumed.set_position({.epoch = 0, .index = 41}); }),
             Contains(path) && Contains("window 41") && Contains("different data"));
}

TEST_CASE("loader needs at least one window of seq_len + 1 tokens", "[loader]") {
  TempDir dir("grass_test_loader");
  const std::vector<uint32_t> tokens = random_tokens(11, 100, 6);
  const std::string path = write_shard(dir.file("tiny.bin"), tokens, {.vocab_size = 100});
  CHECK_THAT(user_error_of([&] { grass::TokenLoader loader({path}, 1, 11); }),
             Contains(path + ": 11 tokens in all, fewer than one window of seq_len + 1 = 12"));

  // Exactly one window: every row is that window, and each row ends an epoch.
  grass::TokenLoader loader({path}, 3, 10);
  const Batch out = next(loader);
  for (int b = 0; b < 3; ++b) {
    for (int t = 0; t < 10; ++t) {
      CHECK(out.inputs[b * 10 + t] == static_cast<int32_t>(tokens[t]));
      CHECK(out.targets[b * 10 + t] == static_cast<int32_t>(tokens[t + 1]));
    }
  }
  CHECK(loader.epoch() == 3);

  CHECK_THAT(user_error_of([&] { grass::TokenLoader none({}, 1, 8); }),
             Contains("data.train: no token shards given"));
}

namespace {

// Window index of every row of `batches` batches (a row's first input token, with the stream
// made of distinct tokens 0, 1, 2, ..., names its window: token / seq_len).
std::vector<uint64_t> windows_read(grass::TokenLoader& loader, int batches) {
  std::vector<uint64_t> windows;
  for (int i = 0; i < batches; ++i) {
    const Batch out = next(loader);
    for (int b = 0; b < loader.batch(); ++b) {
      const int32_t first = out.inputs[static_cast<size_t>(b) * loader.seq_len()];
      for (int t = 0; t < loader.seq_len(); ++t) {  // still whole windows of the stream
        REQUIRE(out.inputs[b * loader.seq_len() + t] == first + t);
        REQUIRE(out.targets[b * loader.seq_len() + t] == first + t + 1);
      }
      windows.push_back(static_cast<uint64_t>(first) / loader.seq_len());
    }
  }
  return windows;
}

std::vector<uint32_t> counting_tokens(uint32_t n) {
  std::vector<uint32_t> tokens(n);
  for (uint32_t i = 0; i < n; ++i) tokens[i] = i;
  return tokens;
}

}  // namespace

TEST_CASE("WindowPermutation is a permutation of 0..n-1 that depends on its key", "[loader]") {
  for (const uint64_t n : {1ull, 2ull, 3ull, 5ull, 64ull, 1000ull, 4097ull}) {
    const grass::WindowPermutation permutation(n, 7);
    std::vector<uint64_t> values(n);
    for (uint64_t i = 0; i < n; ++i) values[i] = permutation(i);
    std::sort(values.begin(), values.end());
    for (uint64_t i = 0; i < n; ++i) REQUIRE(values[i] == i);
  }
  const grass::WindowPermutation a(1000, 1), b(1000, 2), a_again(1000, 1);
  int same = 0, moved = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    REQUIRE(a(i) == a_again(i));
    same += a(i) == b(i);
    moved += a(i) != i;
  }
  CHECK(same < 20);    // two keys give unrelated orders (about 1 agreement expected)
  CHECK(moved > 980);  // and neither is close to the identity
}

TEST_CASE("shuffled loader visits every window once per epoch, in a seeded order", "[loader]") {
  TempDir dir("grass_test_loader");
  // 1 + 8 * 250 tokens: exactly 250 windows of seq_len 8; batch 5 makes 50 batches an epoch.
  const std::string path =
      write_shard(dir.file("count.bin"), counting_tokens(2001), {.vocab_size = 65536});
  const grass::LoaderOptions options{.shuffle = true, .seed = 1234};
  grass::TokenLoader loader({path}, 5, 8, options);
  REQUIRE(loader.num_windows() == 250);

  const std::vector<uint64_t> epoch0 = windows_read(loader, 50);
  CHECK(loader.position() == grass::LoaderPosition{.epoch = 1, .index = 0});
  const std::vector<uint64_t> epoch1 = windows_read(loader, 50);
  for (const auto* epoch : {&epoch0, &epoch1}) {
    std::vector<uint64_t> sorted = *epoch;
    std::sort(sorted.begin(), sorted.end());
    for (uint64_t w = 0; w < 250; ++w) REQUIRE(sorted[w] == w);
  }
  CHECK(epoch0 != epoch1);  // a fresh order every epoch
  std::vector<uint64_t> in_order(250);
  for (uint64_t w = 0; w < 250; ++w) in_order[w] = w;
  CHECK(epoch0 != in_order);

  // Same seed: same order; another seed: another order.
  grass::TokenLoader same({path}, 5, 8, options);
  CHECK(windows_read(same, 50) == epoch0);
  grass::TokenLoader other({path}, 5, 8, {.shuffle = true, .seed = 1235});
  CHECK(windows_read(other, 50) != epoch0);
  // Unshuffled: stream order.
  grass::TokenLoader sequential({path}, 5, 8);
  CHECK(windows_read(sequential, 50) == in_order);
}

TEST_CASE("rank slices are disjoint and together cover every window of an epoch", "[loader]") {
  TempDir dir("grass_test_loader");
  // 1 + 4 * 103 tokens: 103 windows of seq_len 4; 103 is prime, so no world size divides it.
  const std::string path =
      write_shard(dir.file("count.bin"), counting_tokens(413), {.vocab_size = 65536});
  for (const bool shuffle : {false, true}) {
    for (const int world : {1, 2, 3, 4, 7}) {
      std::vector<uint64_t> all;
      uint64_t largest = 0, smallest = UINT64_MAX;
      for (int rank = 0; rank < world; ++rank) {
        grass::TokenLoader loader(
            {path}, 1, 4, {.shuffle = shuffle, .seed = 99, .rank = rank, .world = world});
        const uint64_t slice = loader.windows_per_epoch();
        largest = std::max(largest, slice);
        smallest = std::min(smallest, slice);
        const std::vector<uint64_t> windows = windows_read(loader, static_cast<int>(slice));
        CHECK(loader.position() == grass::LoaderPosition{.epoch = 1, .index = 0});
        all.insert(all.end(), windows.begin(), windows.end());
      }
      CAPTURE(shuffle, world);
      CHECK(largest - smallest <= 1);
      std::sort(all.begin(), all.end());
      REQUIRE(all.size() == 103);  // disjoint (no window twice) and complete (every one once)
      for (uint64_t w = 0; w < 103; ++w) REQUIRE(all[w] == w);
    }
  }
  CHECK_THAT(user_error_of([&] {
               grass::TokenLoader loader({path}, 1, 4, {.rank = 103, .world = 104});
             }),
             Contains("103 windows of seq_len + 1 tokens, fewer than the 104 ranks"));
}

TEST_CASE("a resumed shuffled loader continues exactly, across epochs and ranks", "[loader]") {
  TempDir dir("grass_test_loader");
  const std::vector<uint32_t> tokens = random_tokens(1500, 32000, 10);
  const std::string path = write_shard(dir.file("a.bin"), tokens, {.vocab_size = 32000});
  for (const bool prefetch : {false, true}) {
    const grass::LoaderOptions options{
        .shuffle = true, .seed = 5, .rank = 1, .world = 2, .prefetch = prefetch};
    grass::TokenLoader loader({path}, 3, 16, options);  // 93 windows: 46 for rank 1 per epoch
    std::vector<Batch> reference;
    std::vector<grass::LoaderPosition> positions;
    for (int step = 0; step < 40; ++step) {  // about 2.6 epochs of 46 windows
      positions.push_back(loader.position());
      reference.push_back(next(loader));
    }
    CHECK(positions.back().epoch == 2);
    for (const int from : {0, 7, 15, 16, 31}) {
      grass::TokenLoader resumed({path}, 3, 16, options);
      resumed.set_position(positions[from]);
      for (int step = from; step < 40; ++step) {
        CAPTURE(prefetch, from, step);
        REQUIRE(resumed.position() == positions[step]);
        const Batch got = next(resumed);
        REQUIRE(got.inputs == reference[step].inputs);
        REQUIRE(got.targets == reference[step].targets);
      }
    }
    // A position set mid-run (the prefetched batch is dropped) also continues exactly.
    grass::TokenLoader rewound({path}, 3, 16, options);
    next(rewound);
    next(rewound);
    rewound.set_position(positions[20]);
    CHECK(next(rewound).inputs == reference[20].inputs);
  }
}

TEST_CASE("prefetching gives the same batches as reading on demand", "[loader]") {
  TempDir dir("grass_test_loader");
  const std::vector<std::string> paths = {
      write_shard(dir.file("a.bin"), random_tokens(1500, 4000, 11), {.vocab_size = 4000}),
      write_shard(dir.file("b.bin"), random_tokens(700, 4000, 12), {.vocab_size = 4000}),
  };
  for (const bool shuffle : {false, true}) {
    grass::TokenLoader direct(paths, 4, 32, {.shuffle = shuffle, .seed = 3});
    grass::TokenLoader prefetched(paths, 4, 32, {.shuffle = shuffle, .seed = 3, .prefetch = true});
    for (int step = 0; step < 60; ++step) {  // several epochs of 68 windows
      const Batch expected = next(direct);
      const Batch got = next(prefetched);
      REQUIRE(got.inputs == expected.inputs);
      REQUIRE(got.targets == expected.targets);
      REQUIRE(prefetched.position() == direct.position());
    }
  }
  // Destroying a loader whose thread has a batch ready, or none yet, shuts down cleanly.
  { grass::TokenLoader unused(paths, 4, 32, {.prefetch = true}); }
  {
    grass::TokenLoader one(paths, 4, 32, {.prefetch = true});
    next(one);
  }
}
