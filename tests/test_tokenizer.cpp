// Tokenizer: training with LLaMA's settings, loading, thread-safe encoding, the checksum, and the
// errors for models that cannot be loaded.
#include <catch2/catch.hpp>

#include <thread>

#include "src/data/tokenizer.h"
#include "src/io/hash.h"
#include "tests/test_util.h"
#include "tests/text_corpus_util.h"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using namespace grass;
using namespace grass::test;

TEST_CASE("a trained tokenizer has LLaMA's special ids, byte fallback and split digits",
          "[tokenizer]") {
  const Tokenizer tokenizer(tiny_tokenizer_path());
  CHECK(tokenizer.vocab_size() == 400);
  CHECK(tokenizer.unk_id() == 0);
  CHECK(tokenizer.bos_id() == 1);
  CHECK(tokenizer.eos_id() == 2);
  CHECK(tokenizer.hash() == fnv1a64_file(tiny_tokenizer_path()));

  // A character never seen in training becomes its UTF-8 bytes, not <unk>.
  const auto snowman = tokenizer.pieces(tokenizer.encode("\xe2\x98\x83"));
  CHECK(std::find(snowman.begin(), snowman.end(), "<0xE2>") != snowman.end());
  CHECK(std::find(snowman.begin(), snowman.end(), "<0x98>") != snowman.end());
  // "2024" was a training word, yet every digit stays a piece of its own.
  const auto digits = tokenizer.pieces(tokenizer.encode("2024"));
  CHECK(digits.size() >= 4);
  for (size_t i = digits.size() - 3; i < digits.size(); ++i) CHECK(digits[i].size() == 1);
  // Identity normalization: no whitespace collapsing, no NFKC ("ﬁ" stays one character).
  const auto ids = tokenizer.encode("a  b \xef\xac\x81");
  CHECK(tokenizer.encode("a b \xef\xac\x81") != ids);
  CHECK(tokenizer.encode("a  b fi") != ids);
}

TEST_CASE("training is deterministic", "[tokenizer]") {
  TempDir dir("test_tokenizer");
  write_text_file(dir.file("corpus.txt"),
                  [] {
                    std::string text;
                    for (const std::string& doc : english_like_documents(500, 5)) text += doc + "\n";
                    return text;
                  }());
  TokenizerTrainOptions options;
  options.inputs = {dir.file("corpus.txt")};
  options.vocab_size = 300;
  options.out_path = dir.file("a.model");
  const TokenizerTrainStats stats = train_tokenizer(options);
  CHECK(stats.documents > 500);  // the documents' own newlines made more lines
  options.out_path = dir.file("b.model");
  train_tokenizer(options);
  CHECK(fnv1a64_file(dir.file("a.model")) == fnv1a64_file(dir.file("b.model")));
  CHECK_FALSE(std::filesystem::exists(dir.file("a.model.tmp")));
}

TEST_CASE("encoding from several threads at once matches encoding alone", "[tokenizer]") {
  const Tokenizer tokenizer(tiny_tokenizer_path());
  const auto docs = english_like_documents(400, 3);
  std::vector<std::vector<int>> alone;
  for (const std::string& doc : docs) alone.push_back(tokenizer.encode(doc));
  std::vector<std::vector<int>> together(docs.size());
  std::vector<std::thread> threads;
  for (size_t t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (size_t i = t; i < docs.size(); i += 4) together[i] = tokenizer.encode(docs[i]);
    });
  for (std::thread& thread : threads) thread.join();
  CHECK(together == alone);
}

TEST_CASE("models that cannot be loaded are one-line errors naming the file", "[tokenizer]") {
  TempDir dir("test_tokenizer");
  CHECK_THAT(user_error_of([&] { Tokenizer t(dir.file("missing.model")); }),
             StartsWith(dir.file("missing.model") + ": cannot open tokenizer: No such file"));
  write_text_file(dir.file("text.model"), "this is not a model\n");
  const std::string message = user_error_of([&] { Tokenizer t(dir.file("text.model")); });
  CHECK_THAT(message, StartsWith(dir.file("text.model") + ": not a SentencePiece model"));
  CHECK(message.find('\n') == std::string::npos);
  write_text_file(dir.file("empty.model"), "");
  CHECK_THAT(user_error_of([&] { Tokenizer t(dir.file("empty.model")); }),
             StartsWith(dir.file("empty.model") + ": not a SentencePiece model"));
}

TEST_CASE("training reports a vocabulary the corpus cannot reach, and bad input", "[tokenizer]") {
  TempDir dir("test_tokenizer");
  write_text_file(dir.file("small.txt"), "just a few words\nand a few more\n");
  TokenizerTrainOptions options;
  options.inputs = {dir.file("small.txt")};
  options.out_path = dir.file("m.model");
  options.vocab_size = 5000;
  CHECK_THAT(user_error_of([&] { train_tokenizer(options); }),
             StartsWith("tokenizer train: SentencePiece: "));
  write_text_file(dir.file("bad.jsonl"), "{\"text\": \"ok\"}\n{\"text\": 1}\n");
  options.inputs = {dir.file("bad.jsonl")};
  CHECK_THAT(user_error_of([&] { train_tokenizer(options); }),
             StartsWith(dir.file("bad.jsonl") + ":2: \"text\" is a number"));
  CHECK_FALSE(std::filesystem::exists(dir.file("m.model")));
}
