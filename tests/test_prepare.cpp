// prepare(): text -> shards equals SentencePiece's own encoding with BOS/EOS, the same bytes for
// any thread count, shard splitting, options, the manifest (and a run reading its set through it),
// bad records (stop or skip), that a failed run leaves nothing behind, and that progress reaches
// the input's size only with its last record.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>

#include "src/data/data_sets.h"
#include "src/data/jsonl_reader.h"
#include "src/data/loader.h"
#include "src/data/prepare.h"
#include "src/data/tokenizer.h"
#include "src/io/hash.h"
#include "tests/test_util.h"
#include "tests/text_corpus_util.h"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using namespace grass;
using namespace grass::test;
namespace fs = std::filesystem;

namespace {

// Two inputs as C4 ships them (gzipped JSON lines) and one plain: 600 documents in all.
struct Corpus {
  TempDir dir{"test_prepare"};
  std::vector<std::string> docs;
  std::vector<std::string> inputs;
  Corpus() {
    docs = english_like_documents(600, 11);
    const std::vector<std::string> a(docs.begin(), docs.begin() + 250);
    const std::vector<std::string> b(docs.begin() + 250, docs.begin() + 500);
    const std::vector<std::string> c(docs.begin() + 500, docs.end());
    write_text_file(dir.file("c4-train.00000-of-01024.json.gz"), gzip_bytes(jsonl_of(a)));
    write_text_file(dir.file("c4-train.00001-of-01024.json.gz"), gzip_bytes(jsonl_of(b)));
    write_text_file(dir.file("extra.jsonl"), jsonl_of(c));
    inputs = expand_input_patterns({dir.file("c4-train.*.json.gz"), dir.file("extra.jsonl")});
  }
  PrepareOptions options(const std::string& out_name) const {
    PrepareOptions o;
    o.inputs = inputs;
    o.tokenizer_path = tiny_tokenizer_path();
    o.out_dir = dir.file(out_name);
    o.progress = false;
    return o;
  }
};

std::vector<uint32_t> expected_stream(const std::vector<std::string>& docs, bool bos, bool eos) {
  const Tokenizer tokenizer(tiny_tokenizer_path());
  std::vector<uint32_t> stream;
  for (const std::string& doc : docs) {
    if (bos) stream.push_back(1);
    for (int id : tokenizer.encode(doc)) stream.push_back(static_cast<uint32_t>(id));
    if (eos) stream.push_back(2);
  }
  return stream;
}

std::vector<uint32_t> read_stream(const std::vector<PreparedShard>& shards) {
  std::vector<std::string> paths;
  for (const PreparedShard& shard : shards) paths.push_back(shard.path);
  const TokenStream stream("data.train", paths);
  for (const ShardReader& shard : stream.shards())
    REQUIRE(shard.info().tokenizer_hash == fnv1a64_file(tiny_tokenizer_path()));
  std::vector<uint32_t> tokens(stream.total_tokens());
  stream.read(0, tokens.size(), tokens.data());
  return tokens;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  if (!fs::exists(dir)) return names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("prepared shards hold SentencePiece's encoding of each document with BOS and EOS",
          "[prepare]") {
  Corpus corpus;
  PrepareOptions options = corpus.options("out");
  options.shard_tokens = 5000;
  const PrepareSummary summary = prepare(options);

  const std::vector<uint32_t> expected = expected_stream(corpus.docs, true, true);
  CHECK(summary.documents == 600);
  CHECK(summary.tokens == expected.size());
  REQUIRE(summary.shards.size() == (expected.size() + 4999) / 5000);
  for (size_t i = 0; i < summary.shards.size(); ++i) {
    CHECK(summary.shards[i].path == prepared_shard_path(options.out_dir, "shard", i));
    const ShardReader reader(summary.shards[i].path);
    CHECK(reader.info().token_bytes == 2);
    CHECK(reader.info().vocab_size == 400);
    CHECK(reader.info().bos_id == 1);
    CHECK(reader.info().eos_id == 2);
    CHECK(reader.info().tokenizer_hash == fnv1a64_file(tiny_tokenizer_path()));
    CHECK(reader.token_count() == (i + 1 < summary.shards.size() ? 5000 : expected.size() % 5000));
  }
  CHECK(read_stream(summary.shards) == expected);

  const auto manifest = nlohmann::json::parse(file_bytes(summary.manifest_path));
  CHECK(summary.manifest_path == options.out_dir + "/shard.manifest.json");
  CHECK(manifest["documents"] == 600);
  CHECK(manifest["tokens"] == expected.size());
  CHECK(manifest["shards"].size() == summary.shards.size());
  CHECK(manifest["shards"][0]["file"] == "shard_00000.bin");
  CHECK(manifest["inputs"].size() == 3);
  CHECK(manifest["tokenizer"]["vocab_size"] == 400);
  CHECK(summary.shards[0].path == options.out_dir + "/shard_00000.bin");
  CHECK(names_in(options.out_dir).size() == summary.shards.size() + 1);  // no staging left
}

TEST_CASE("prepared shards are the same bytes for 1 and 2 threads", "[prepare]") {
  Corpus corpus;
  std::vector<std::vector<std::string>> outputs;
  for (int threads : {1, 2}) {
    PrepareOptions options = corpus.options("out" + std::to_string(threads));
    options.threads = threads;
    options.shard_tokens = 7000;
    const PrepareSummary summary = prepare(options);
    std::vector<std::string> bytes;
    for (const PreparedShard& shard : summary.shards) bytes.push_back(file_bytes(shard.path));
    outputs.push_back(bytes);
  }
  CHECK(outputs[0].size() > 1);
  CHECK(outputs[0] == outputs[1]);
}

TEST_CASE("prepare options --no-bos --no-eos --max-docs and --prefix", "[prepare]") {
  Corpus corpus;
  PrepareOptions options = corpus.options("out");
  options.add_bos = false;
  options.max_docs = 260;  // past the end of the first file
  options.prefix = "val";
  const PrepareSummary summary = prepare(options);
  CHECK(summary.documents == 260);
  REQUIRE(summary.shards.size() == 1);
  CHECK(summary.shards[0].path == options.out_dir + "/val_00000.bin");
  CHECK(summary.manifest_path == options.out_dir + "/val.manifest.json");
  const std::vector<std::string> first(corpus.docs.begin(), corpus.docs.begin() + 260);
  CHECK(read_stream(summary.shards) == expected_stream(first, false, true));
  CHECK(ShardReader(summary.shards[0].path).info().bos_id == -1);

  options.add_eos = false;
  options.prefix = "bare";
  CHECK(read_stream(prepare(options).shards) == expected_stream(first, false, false));
}

TEST_CASE("a bad record stops prepare with its file and line, and leaves nothing behind",
          "[prepare]") {
  Corpus corpus;
  // A bad record near the end of the last input, after several shards are finished.
  std::string last = jsonl_of({corpus.docs.begin() + 500, corpus.docs.end()});
  const size_t line_start = last.find('\n', last.size() / 2) + 1;
  last.insert(line_start, "{\"text\": \"cut short\n");
  write_text_file(corpus.dir.file("extra.jsonl"), last);
  const uint64_t bad_line = 1 + std::count(last.begin(), last.begin() + line_start, '\n');

  PrepareOptions options = corpus.options("out");
  options.shard_tokens = 2000;
  const std::string message = user_error_of([&] { prepare(options); });
  CHECK_THAT(message, StartsWith(corpus.dir.file("extra.jsonl") + ":" +
                                 std::to_string(bad_line) + ": malformed JSON"));
  CHECK_THAT(message, Contains("--skip-bad-records"));
  CHECK_FALSE(fs::exists(options.out_dir));  // created by the run, so removed with it

  // An out_dir that existed before keeps its other files and gets nothing of the failed run.
  fs::create_directories(options.out_dir);
  write_text_file(options.out_dir + "/README", "mine");
  user_error_of([&] { prepare(options); });
  CHECK(names_in(options.out_dir) == std::vector<std::string>{"README"});

  options.skip_bad_records = true;
  const PrepareSummary summary = prepare(options);
  CHECK(summary.bad_records == 1);
  CHECK(summary.documents == 600);
  REQUIRE(summary.bad_record_examples.size() == 1);
  CHECK_THAT(summary.bad_record_examples[0], Contains(":" + std::to_string(bad_line) + ": "));
  CHECK(read_stream(summary.shards) == expected_stream(corpus.docs, true, true));
}

TEST_CASE("prepare --skip-bad-records counts every kind of bad record", "[prepare]") {
  TempDir dir("test_prepare");
  write_text_file(dir.file("mixed.jsonl"),
                  "{\"text\": \"good one\"}\n"
                  "{\"text\": \"broken\n"
                  "{\"url\": \"no text\"}\n"
                  "{\"text\": null}\n"
                  "{\"text\": \"bad \xc3\x28 utf8\"}\n"
                  "{\"text\": \"good two\"}\n");
  PrepareOptions options;
  options.inputs = {dir.file("mixed.jsonl")};
  options.tokenizer_path = tiny_tokenizer_path();
  options.out_dir = dir.file("out");
  options.progress = false;
  options.skip_bad_records = true;
  const PrepareSummary summary = prepare(options);
  CHECK(summary.documents == 2);
  CHECK(summary.bad_records == 4);
  CHECK(read_stream(summary.shards) == expected_stream({"good one", "good two"}, true, true));
}

TEST_CASE("prepare refuses bad tokenizers, empty input, and an out_dir holding shards",
          "[prepare]") {
  Corpus corpus;
  PrepareOptions options = corpus.options("out");
  options.tokenizer_path = corpus.dir.file("extra.jsonl");
  CHECK_THAT(user_error_of([&] { prepare(options); }),
             StartsWith(corpus.dir.file("extra.jsonl") + ": not a SentencePiece model"));
  CHECK_FALSE(fs::exists(options.out_dir));

  options = corpus.options("out");
  write_text_file(corpus.dir.file("empty.jsonl"), "");
  options.inputs.push_back(corpus.dir.file("empty.jsonl"));
  CHECK_THAT(user_error_of([&] { prepare(options); }),
             StartsWith(corpus.dir.file("empty.jsonl") + ": empty input"));
  CHECK_FALSE(fs::exists(options.out_dir));

  options = corpus.options("out");
  options.out_dir = corpus.dir.file("extra.jsonl") + "/out";  // a file stands where a directory must
  CHECK_THAT(user_error_of([&] { prepare(options); }),
             StartsWith(options.out_dir + ": Not a directory"));

  options = corpus.options("out");
  const PrepareSummary first = prepare(options);
  const std::string before = file_bytes(first.shards[0].path);
  CHECK_THAT(user_error_of([&] { prepare(options); }), Contains("from an earlier prepare"));
  CHECK(file_bytes(first.shards[0].path) == before);
  fs::remove(first.manifest_path);  // shards without a manifest (a killed run) still block
  CHECK_THAT(user_error_of([&] { prepare(options); }), Contains("already holds shard_00000.bin"));
}

TEST_CASE("a truncated gzip input fails the whole prepare", "[prepare]") {
  Corpus corpus;
  const std::string gz = file_bytes(corpus.inputs[1]);
  write_text_file(corpus.inputs[1], gz.substr(0, gz.size() * 2 / 3));
  PrepareOptions options = corpus.options("out");
  options.skip_bad_records = true;  // a broken file is not a bad record: never skipped
  CHECK_THAT(user_error_of([&] { prepare(options); }),
             StartsWith(corpus.inputs[1] + ": truncated gzip"));
  CHECK_FALSE(fs::exists(options.out_dir));
}

TEST_CASE("a prepared set reads back through its manifest or its directory", "[prepare][data]") {
  Corpus corpus;
  PrepareOptions options = corpus.options("out");
  options.shard_tokens = 5000;
  options.prefix = "train";
  const PrepareSummary summary = prepare(options);
  REQUIRE(summary.shards.size() > 2);
  std::vector<std::string> written;
  for (const PreparedShard& shard : summary.shards) written.push_back(shard.path);
  for (const std::string& spec : {summary.manifest_path, options.out_dir}) {
    const TokenStream stream("data.train", {spec});
    std::vector<std::string> opened;
    for (const ShardReader& shard : stream.shards()) opened.push_back(shard.info().path);
    CHECK(opened == written);
    CHECK(stream.total_tokens() == summary.tokens);
  }

  // A second set prepared beside it makes the directory ambiguous; its manifest names it.
  options.prefix = "val";
  options.max_docs = 50;
  const PrepareSummary val = prepare(options);
  CHECK_THAT(user_error_of([&] { TokenStream("data.train", {options.out_dir}); }),
             StartsWith("data.train: the directory " + options.out_dir +
                        " holds 2 manifests (train.manifest.json, val.manifest.json)"));
  CHECK(TokenStream("data.val", {val.manifest_path}).total_tokens() == val.tokens);
}

TEST_CASE("a reader's bytes consumed reach the file size only with its last record",
          "[prepare]") {
  // About 3 MiB of lines of random letters (they compress about 1.7x): several times the reader's
  // and zlib's buffers, whose read-ahead must not count as progress.
  TempDir dir("test_prepare_progress");
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> letter(0, 26), length(100, 400);
  std::string text;
  size_t lines = 0;
  while (text.size() < (size_t{3} << 20)) {
    for (int n = length(rng); n > 0; --n) {
      const int c = letter(rng);
      text += c == 26 ? ' ' : static_cast<char>('a' + c);
    }
    text += "x\n";
    ++lines;
  }
  write_text_file(dir.file("plain.txt"), text);
  write_text_file(dir.file("packed.txt.gz"), gzip_bytes(text));

  for (const std::string& path : {dir.file("plain.txt"), dir.file("packed.txt.gz")}) {
    INFO(path);
    const uint64_t size = fs::file_size(path);
    RecordReader reader(path);
    std::string_view line;
    size_t read = 0;
    uint64_t previous = 0;
    bool backwards = false, full_early = false;
    double at_half = 0;
    while (reader.next(line)) {
      const uint64_t consumed = reader.bytes_consumed();
      backwards |= consumed < previous;
      full_early |= ++read < lines && consumed >= size;
      if (read == lines / 2) at_half = static_cast<double>(consumed) / static_cast<double>(size);
      previous = consumed;
    }
    CHECK(read == lines);
    CHECK_FALSE(backwards);
    CHECK_FALSE(full_early);
    CHECK(at_half > 0.45);
    CHECK(at_half < 0.55);
    CHECK(reader.bytes_consumed() == size);
  }
}
