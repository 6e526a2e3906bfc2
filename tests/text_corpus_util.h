// Text inputs for the data-pipeline tests: English-like documents, JSON-lines and gzip files made
// from them, and a tiny SentencePiece tokenizer trained on them once per test process.
#pragma once
#include <zlib.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "src/data/tokenizer.h"
#include "tests/test_util.h"

namespace grass::test {

// n documents of random common words with punctuation, digits, a few non-ASCII characters and
// newlines, the same for the same seed.
inline std::vector<std::string> english_like_documents(size_t n, uint64_t seed) {
  static const char* kWords[] = {
      "the",  "of",    "and",   "to",    "in",     "a",      "is",    "that",  "for",
      "it",   "as",    "was",   "with",  "be",     "by",     "on",    "not",   "this",
      "are",  "or",    "from",  "at",    "which",  "but",    "have",  "an",    "they",
      "you",  "were",  "there", "been",  "one",    "all",    "would", "when",  "will",
      "more", "about", "people", "time", "year",   "new",    "could", "first", "water",
      "city", "river", "music", "garden", "review", "report", "café",  "naïve", "2024",
      "3.5",  "über",  "price", "school", "house",  "small",  "great", "world", "data"};
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> word(0, std::size(kWords) - 1);
  std::uniform_int_distribution<int> length(5, 80);
  std::vector<std::string> docs(n);
  for (std::string& doc : docs) {
    const int words = length(rng);
    for (int w = 0; w < words; ++w) {
      if (w) doc += (rng() % 13 == 0) ? ". " : (rng() % 29 == 0) ? "\n" : " ";
      doc += kWords[word(rng)];
    }
    doc += ".";
  }
  return docs;
}

// One C4-style record per document: {"text": ..., "timestamp": ..., "url": ...}.
inline std::string jsonl_of(const std::vector<std::string>& docs) {
  std::string out;
  for (size_t i = 0; i < docs.size(); ++i) {
    const nlohmann::json record = {{"text", docs[i]},
                                   {"timestamp", "2019-04-25T12:57:54Z"},
                                   {"url", "https://example.com/" + std::to_string(i)}};
    out += record.dump() + "\n";
  }
  return out;
}

inline void write_text_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

inline std::string gzip_bytes(const std::string& bytes) {
  z_stream z{};
  REQUIRE(deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) ==
          Z_OK);
  std::string out(deflateBound(&z, bytes.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// A 400-piece LLaMA-style BPE tokenizer trained on english_like_documents (well under a second),
// shared by every test of the process; the path stays valid until the process exits.
inline const std::string& tiny_tokenizer_path() {
  static TempDir dir("text_corpus_tokenizer");
  static const std::string path = [] {
    const std::string corpus = dir.file("corpus.jsonl");
    write_text_file(corpus, jsonl_of(english_like_documents(2000, 99)));
    TokenizerTrainOptions options;
    options.inputs = {corpus};
    options.out_path = dir.file("tiny.model");
    options.vocab_size = 400;
    options.threads = 2;
    train_tokenizer(options);
    return options.out_path;
  }();
  return path;
}

}  // namespace grass::test
