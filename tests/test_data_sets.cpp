// A run's data sets (src/data/data_sets.h): data.train / data.val specs (files, globs,
// directories, manifests, and lists mixing them) expanded in a fixed order, the one-line errors of
// a spec without shards or with a broken manifest, and check_run_data: one tokenizer within and
// across the sets, the run's data.tokenizer, the model's vocab_size (smaller: error, larger:
// warning) and damaged token ids.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/core/error.h"
#include "src/data/data_sets.h"
#include "src/data/loader.h"
#include "src/io/hash.h"
#include "tests/test_util.h"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using namespace grass;
using namespace grass::test;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> paths_of(const TokenStream& stream) {
  std::vector<std::string> paths;
  for (const ShardReader& shard : stream.shards()) paths.push_back(shard.info().path);
  return paths;
}

std::vector<uint32_t> tokens_of(const TokenStream& stream) {
  std::vector<uint32_t> tokens(stream.total_tokens());
  stream.read(0, tokens.size(), tokens.data());
  return tokens;
}

// A manifest as grass prepare writes it, for shards already in `dir`.
void write_manifest(const std::string& path, uint32_t vocab_size,
                    const std::vector<std::pair<std::string, uint64_t>>& shards) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [file, tokens] : shards) list.push_back({{"file", file}, {"tokens", tokens}});
  const nlohmann::json manifest = {{"format", "grass-prepare"},
                                   {"version", 1},
                                   {"tokenizer", {{"vocab_size", vocab_size}}},
                                   {"shards", list}};
  std::ofstream(path) << manifest.dump(2) << "\n";
}

RunConfig run_with_vocab(int vocab_size) {
  RunConfig cfg;
  cfg.source = "run.json";
  cfg.model_path = "configs/models/m.json";
  cfg.model.vocab_size = vocab_size;
  return cfg;
}

}  // namespace

TEST_CASE("a directory, a glob and a list expand to their shards in byte order", "[data]") {
  TempDir dir("grass_test_data_sets");
  // Eight names, so that the order a directory lists them in (creation, hash) is not byte order
  // by chance; "B" sorts before "a" in byte order, whatever the locale says.
  const std::vector<std::string> names = {"f.bin", "a.bin", "h.bin", "c.bin",
                                          "B.bin", "g.bin", "e.bin", "d.bin"};
  std::map<std::string, std::vector<uint32_t>> tokens;
  for (const std::string& name : names) {
    tokens[name] = random_tokens(300 + 10 * tokens.size(), 500, 40 + tokens.size());
    write_shard(dir.file(name), tokens[name], {.vocab_size = 500});
  }
  std::ofstream(dir.file("notes.txt")) << "not a shard";
  fs::create_directories(dir.file("old.bin"));  // a directory named like a shard is no shard
  std::vector<std::string> sorted;
  for (const char* name : {"B.bin", "a.bin", "c.bin", "d.bin", "e.bin", "f.bin", "g.bin", "h.bin"})
    sorted.push_back(dir.file(name));

  CHECK(paths_of(TokenStream("data.train", {dir.path.string()})) == sorted);
  CHECK(paths_of(TokenStream("data.train", {dir.file("*.bin")})) == sorted);
  CHECK(paths_of(TokenStream("data.train", {dir.file("[hc].bin")})) ==
        std::vector<std::string>{dir.file("c.bin"), dir.file("h.bin")});

  // A list concatenates its entries in list order, each expanded; the stream is their tokens.
  const TokenStream mixed("data.train", {dir.file("c.bin"), dir.file("[aB].bin")});
  CHECK(paths_of(mixed) == std::vector<std::string>{dir.file("c.bin"), dir.file("B.bin"),
                                                    dir.file("a.bin")});
  std::vector<uint32_t> expected;
  for (const char* name : {"c.bin", "B.bin", "a.bin"})
    expected.insert(expected.end(), tokens[name].begin(), tokens[name].end());
  CHECK(tokens_of(mixed) == expected);

  // A name that exists is taken as written, glob characters and all.
  write_shard(dir.file("x[1].bin"), tokens["a.bin"], {.vocab_size = 500});
  CHECK(paths_of(TokenStream("data.val", {dir.file("x[1].bin")})) ==
        std::vector<std::string>{dir.file("x[1].bin")});
}

TEST_CASE("a manifest expands to its shards, checked against what it records", "[data]") {
  TempDir dir("grass_test_data_sets");
  const std::vector<uint32_t> first = random_tokens(700, 500, 50), second = random_tokens(300, 500, 51);
  write_shard(dir.file("train_00000.bin"), first, {.vocab_size = 500, .tokenizer_hash = 9});
  write_shard(dir.file("train_00001.bin"), second, {.vocab_size = 500, .tokenizer_hash = 9});
  const std::string manifest = dir.file("train.manifest.json");
  write_manifest(manifest, 500, {{"train_00000.bin", 700}, {"train_00001.bin", 300}});
  write_shard(dir.file("stray.bin"), second, {.vocab_size = 500});  // listed by no manifest

  const std::vector<std::string> listed = {dir.file("train_00000.bin"), dir.file("train_00001.bin")};
  CHECK(paths_of(TokenStream("data.train", {manifest})) == listed);
  CHECK(paths_of(TokenStream("data.train", {dir.path.string()})) == listed);  // its one manifest
  std::vector<uint32_t> expected = first;
  expected.insert(expected.end(), second.begin(), second.end());
  CHECK(tokens_of(TokenStream("data.train", {manifest})) == expected);

  const auto error = [&](const std::string& spec) {
    return user_error_of([&] { TokenStream("data.train", {spec}); });
  };
  // A shard of another size than the manifest records (here: 699 tokens where it says 700).
  write_manifest(manifest, 500, {{"train_00000.bin", 699}, {"train_00001.bin", 300}});
  CHECK(error(manifest) == "data.train: " + manifest + " records 699 tokens (1654 bytes) for " +
                               dir.file("train_00000.bin") + ", but the file has 1656 bytes; the "
                               "shards changed since grass prepare wrote the manifest: re-run it");
  // The same bytes read with another token width: the size fits, the header's count does not.
  write_manifest(manifest, 70000, {{"train_00000.bin", 350}});
  CHECK_THAT(error(manifest), StartsWith("data.train: " + manifest + " records 350 tokens for " +
                                         dir.file("train_00000.bin") + " but its header says 700"));
  // A shard it lists is gone.
  write_manifest(manifest, 500, {{"train_00000.bin", 700}, {"train_00002.bin", 300}});
  CHECK_THAT(error(manifest), StartsWith("data.train: " + manifest + " lists " +
                                         dir.file("train_00002.bin") + ", which is missing"));
  // Not a manifest at all.
  std::ofstream(manifest) << R"({"format": "something-else", "shards": []})";
  CHECK_THAT(error(manifest), StartsWith("data.train: " + manifest +
                                         ": not a grass prepare manifest"));
  std::ofstream(manifest) << "{ broken";
  CHECK_THAT(error(manifest), StartsWith("data.train: " + manifest + ": invalid JSON"));
}

TEST_CASE("a spec without shards is one line naming the key, the spec and where", "[data]") {
  TempDir dir("grass_test_data_sets");
  const std::string cwd = fs::current_path().string();
  const std::string relative_note =
      " (relative paths resolve against the working directory, " + cwd + ")";
  const auto error = [](const std::string& key, const std::vector<std::string>& specs) {
    return user_error_of([&] { TokenStream(key, specs); });
  };
  CHECK(error("data.train", {"no/such/train_*.bin"}) ==
        "data.train: no shard matches no/such/train_*.bin" + relative_note);
  CHECK(error("data.train", {dir.file("train_*.bin")}) ==
        "data.train: no shard matches " + dir.file("train_*.bin"));  // absolute: no note
  CHECK(error("data.val", {"no/such.bin"}) == "data.val: not found: no/such.bin" + relative_note);

  write_shard(dir.file("a.bin"), random_tokens(100, 50, 3), {.vocab_size = 50});
  CHECK(error("data.train", {dir.file("a.bin"), dir.file("b_*.bin")}) ==
        "data.train[1]: no shard matches " + dir.file("b_*.bin"));

  fs::create_directories(dir.file("empty"));
  std::ofstream(dir.file("empty/readme.txt")) << "no shards here";
  CHECK_THAT(error("data.train", {dir.file("empty")}),
             StartsWith("data.train: the directory " + dir.file("empty") +
                        " holds no *.bin shard and no manifest"));

  CHECK_THAT(user_error_of([&] { TokenLoader loader({"gone_*.bin"}, 1, 8); }),
             StartsWith("data.train: no shard matches gone_*.bin"));
}

TEST_CASE("shards from different tokenizers are refused, naming the keys and a shard of each",
          "[data]") {
  TempDir dir("grass_test_data_sets");
  const std::vector<uint32_t> tokens = random_tokens(200, 500, 60);
  const auto shard = [&](const std::string& name, uint32_t vocab, uint64_t hash) {
    return write_shard(dir.file(name), tokens, {.vocab_size = vocab, .tokenizer_hash = hash});
  };
  const std::string a = shard("a.bin", 500, 0x11), b = shard("b.bin", 500, 0x22),
                    a2 = shard("a2.bin", 500, 0x11), wider = shard("wider.bin", 600, 0x11),
                    synthetic = shard("synthetic.bin", 500, 0);
  const RunConfig cfg = run_with_vocab(600);
  const auto check = [&](const std::vector<std::string>& train, const std::vector<std::string>& val) {
    const TokenStream train_set("data.train", train), val_set("data.val", val);
    return check_run_data(cfg, &train_set, &val_set);
  };

  CHECK_NOTHROW(check({a, a2}, {a2}));
  CHECK_NOTHROW(check({a, synthetic}, {synthetic}));  // hash 0 records no tokenizer: matches any
  CHECK(user_error_of([&] { check({a, a2, b}, {a}); }) ==
        "data.train: " + b + " was made with another tokenizer than " + a +
            " (tokenizer_hash 0x0000000000000022, vocab_size 500 against tokenizer_hash "
            "0x0000000000000011, vocab_size 500); every shard of data.train must come from one "
            "tokenizer: prepare them all with the same one");
  CHECK_THAT(user_error_of([&] { check({a}, {a2, wider}); }),
             StartsWith("data.val: " + wider + " was made with another tokenizer than " + a2));
  CHECK(user_error_of([&] { check({synthetic, a}, {synthetic, b}); }) ==
        "data.val's " + b + " was made with another tokenizer than data.train's " + a +
            " (tokenizer_hash 0x0000000000000022, vocab_size 500 against tokenizer_hash "
            "0x0000000000000011, vocab_size 500); validation must be tokenized as training was: "
            "prepare both with the same tokenizer");
  // grass eval opens data.val alone.
  const TokenStream val_only("data.val", {b});
  CHECK_NOTHROW(check_run_data(cfg, nullptr, &val_only));
}

TEST_CASE("the model's vocab_size: smaller than the tokenizer's is an error, larger a warning",
          "[data]") {
  TempDir dir("grass_test_data_sets");
  const std::string train = write_shard(dir.file("train.bin"), random_tokens(400, 1000, 70),
                                        {.vocab_size = 1000, .tokenizer_hash = 5});
  const std::string val = write_shard(dir.file("val.bin"), random_tokens(400, 1000, 71),
                                      {.vocab_size = 1000, .tokenizer_hash = 5});
  const TokenStream train_set("data.train", {train}), val_set("data.val", {val});

  CHECK(check_run_data(run_with_vocab(1000), &train_set, &val_set).empty());
  CHECK(user_error_of([&] { check_run_data(run_with_vocab(999), &train_set, &val_set); }) ==
        "configs/models/m.json: vocab_size 999 is smaller than the tokenizer's vocabulary of 1000 "
        "tokens (data.train's " + train + "): its ids from 999 up have no embedding row; use a "
        "model whose vocab_size is at least 1000");
  RunConfig inline_model = run_with_vocab(512);
  inline_model.model_path.clear();
  CHECK_THAT(user_error_of([&] { check_run_data(inline_model, nullptr, &val_set); }),
             StartsWith("run.json: model.vocab_size 512 is smaller than the tokenizer's "
                        "vocabulary of 1000 tokens (data.val's " + val + ")"));

  const std::vector<std::string> warnings =
      check_run_data(run_with_vocab(1024), &train_set, &val_set);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0] ==
        "configs/models/m.json: vocab_size 1024 is larger than the tokenizer's vocabulary of 1000 "
        "tokens (data.train's " + train + "): the embedding's 24 extra rows are never trained "
        "(harmless when the vocabulary is padded on purpose, as Hugging Face's LLaMA does)");
}

TEST_CASE("a token id past its shard's vocabulary is damage, named with its position", "[data]") {
  TempDir dir("grass_test_data_sets");
  const std::string good =
      write_shard(dir.file("good.bin"), random_tokens(3000, 1000, 8), {.vocab_size = 1000});
  const std::string bad =
      write_shard(dir.file("bad.bin"), random_tokens(3000, 1000, 9), {.vocab_size = 1000});
  const RunConfig cfg = run_with_vocab(32000);
  {
    const TokenStream set("data.train", {good, bad});
    CHECK(check_run_data(cfg, &set, nullptr).size() == 1);  // the 31000 spare rows
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
  const TokenStream set("data.train", {good, bad});
  CHECK_THAT(user_error_of([&] { check_run_data(cfg, &set, nullptr); }),
             StartsWith(bad + ": token id 4000 at position 777 is out of range"));
}

TEST_CASE("shards must come from the tokenizer data.tokenizer names", "[data]") {
  TempDir dir("grass_test_data_sets");
  const std::string tokenizer = dir.file("tokenizer.model");
  const std::string other = dir.file("other.model");
  std::ofstream(tokenizer) << "pretend sentencepiece model";
  std::ofstream(other) << "another model";
  const uint64_t hash = fnv1a64_file(tokenizer);
  const std::vector<uint32_t> tokens = random_tokens(100, 1000, 13);
  const TokenStream made_with_it(
      "data.train",
      {write_shard(dir.file("a.bin"), tokens, {.vocab_size = 1000, .tokenizer_hash = hash})});
  const TokenStream synthetic(
      "data.val", {write_shard(dir.file("s.bin"), tokens, {.vocab_size = 1000})});
  RunConfig cfg = run_with_vocab(1000);
  const auto error = [&](const std::string& tokenizer_path, const TokenStream* train,
                         const TokenStream* val) {
    cfg.tokenizer = tokenizer_path;
    return user_error_of([&] { check_run_data(cfg, train, val); });
  };

  cfg.tokenizer = tokenizer;
  CHECK_NOTHROW(check_run_data(cfg, &made_with_it, nullptr));
  CHECK_THAT(error(other, &made_with_it, nullptr),
             StartsWith("data.train: " + dir.file("a.bin") +
                        " was made with another tokenizer than data.tokenizer " + other) &&
                 Contains("re-run grass prepare"));
  CHECK_THAT(error(tokenizer, &made_with_it, &synthetic),
             StartsWith("data.val: " + dir.file("s.bin") + " records no tokenizer") &&
                 Contains(tokenizer));
  CHECK(error("no/such.model", &made_with_it, nullptr) ==
        "data.tokenizer: not found: no/such.model (relative paths resolve against the working "
        "directory, " + fs::current_path().string() + ")");
}
