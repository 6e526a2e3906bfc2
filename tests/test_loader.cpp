// TokenLoader: window layout (inputs/targets shifted by one, stride seq_len), wrap-around and
// epochs, windows spanning shards, resume positions, and the vocabulary check.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/loader.h"
#include "test_util.h"

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
  CHECK(loader.position().next_offset == 2 * batch * seq_len);
  CHECK(loader.epoch() == 0);
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

  for (int step = 0; step < 3; ++step) {  // windows 0..8
    next(loader);
    reference.next();
  }
  CHECK(loader.epoch() == 0);
  CHECK(loader.position().next_offset == 90);
  const Batch wrapped = next(loader);  // windows 0, 10, 20 of epoch 1
  CHECK(loader.epoch() == 1);
  CHECK(loader.position().next_offset == 30);
  CHECK(wrapped.inputs == reference.next().inputs);
  CHECK(wrapped.inputs[0] == static_cast<int32_t>(tokens[0]));

  for (int step = 0; step < 20; ++step) {
    const Batch expected = reference.next();
    const Batch got = next(loader);
    REQUIRE(got.inputs == expected.inputs);
    REQUIRE(got.targets == expected.targets);
    REQUIRE(loader.epoch() == reference.epoch);
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
  CHECK(loader.epoch() == reference.epoch);
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

  CHECK_THAT(user_error_of([&] { resumed.set_position({.next_offset = 501, .epoch = 0}); }),
             Contains(path) && Contains("offset 501") && Contains("different data"));
}

TEST_CASE("loader needs at least one window of seq_len + 1 tokens", "[loader]") {
  TempDir dir("grass_test_loader");
  const std::vector<uint32_t> tokens = random_tokens(11, 100, 6);
  const std::string path = write_shard(dir.file("tiny.bin"), tokens, {.vocab_size = 100});
  CHECK_THAT(user_error_of([&] { grass::TokenLoader loader({path}, 1, 11); }),
             Contains(path + ": 11 tokens in all, fewer than one window of seq_len + 1 = 12"));

  // Exactly one window: every row is that window, and each row after the first wraps.
  grass::TokenLoader loader({path}, 3, 10);
  const Batch out = next(loader);
  for (int b = 0; b < 3; ++b) {
    for (int t = 0; t < 10; ++t) {
      CHECK(out.inputs[b * 10 + t] == static_cast<int32_t>(tokens[t]));
      CHECK(out.targets[b * 10 + t] == static_cast<int32_t>(tokens[t + 1]));
    }
  }
  CHECK(loader.epoch() == 2);

  CHECK_THAT(user_error_of([&] { grass::TokenLoader none({}, 1, 8); }),
             Contains("no training data"));
}

TEST_CASE("loader requires shards from one tokenizer", "[loader]") {
  TempDir dir("grass_test_loader");
  const std::vector<uint32_t> tokens = random_tokens(100, 1000, 7);
  const std::string a =
      write_shard(dir.file("a.bin"), tokens, {.vocab_size = 32000, .tokenizer_hash = 11});
  const std::string b =
      write_shard(dir.file("b.bin"), tokens, {.vocab_size = 32100, .tokenizer_hash = 11});
  const std::string c =
      write_shard(dir.file("c.bin"), tokens, {.vocab_size = 32000, .tokenizer_hash = 12});
  CHECK_THAT(user_error_of([&] {
               grass::TokenLoader loader({a, b}, 1, 8);
             }),
             Contains(b + ": vocab_size 32100 differs from " + a + "'s 32000"));
  CHECK_THAT(user_error_of([&] {
               grass::TokenLoader loader({a, c}, 1, 8);
             }),
             Contains(c + ": tokenizer_hash differs from " + a + "'s"));
  CHECK_THAT(user_error_of([&] {
               grass::TokenLoader loader({a, dir.file("gone.bin")}, 1, 8);
             }),
             Contains(dir.file("gone.bin") + ": cannot open"));
}

TEST_CASE("loader check_vocab names the shard, the token and its position", "[loader]") {
  TempDir dir("grass_test_loader");
  const std::string good =
      write_shard(dir.file("good.bin"), random_tokens(3000, 1000, 8), {.vocab_size = 1000});
  const std::string bad =
      write_shard(dir.file("bad.bin"), random_tokens(3000, 1000, 9), {.vocab_size = 1000});
  {
    grass::TokenLoader loader({good, bad}, 2, 64);
    loader.check_vocab(1000);
    loader.check_vocab(32000);
    CHECK_THAT(user_error_of([&] { loader.check_vocab(999); }),
               Contains(good + ": the shard's vocab_size 1000 exceeds the model's vocab_size 999"));
  }

  // Damage two token ids in the payload (the header checksum does not cover tokens).
  {
    std::fstream file(bad, std::ios::in | std::ios::out | std::ios::binary);
    const uint16_t out_of_range = 4000;
    for (uint64_t position : {2900u, 777u}) {
      file.seekp(static_cast<std::streamoff>(256 + position * 2));
      file.write(reinterpret_cast<const char*>(&out_of_range), 2);
    }
  }
  grass::TokenLoader loader({good, bad}, 2, 64);
  CHECK_THAT(user_error_of([&] { loader.check_vocab(32000); }),
             Contains(bad + ": token id 4000 at position 777 is out of range"));
}
