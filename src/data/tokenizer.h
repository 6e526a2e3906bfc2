// SentencePiece tokenizers: loading any model (LLaMA's BPE, T5's unigram, one of our own) and
// training a LLaMA-style one from a corpus.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace grass {

class Tokenizer {
 public:
  // Loads a SentencePiece .model file. UserError naming the file when it cannot be read or is not
  // a SentencePiece model.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`, no BOS/EOS added. Safe to call from several threads at once.
  void encode(std::string_view text, std::vector<int>& ids) const;
  std::vector<int> encode(std::string_view text) const;
  // The text of `ids` (ids below vocab_size()): pieces joined, "▁" as spaces, byte pieces as
  // their bytes, BOS and EOS as nothing.
  std::string decode(const std::vector<int>& ids) const;
  // The pieces of `ids` (for debugging: "▁The", "<0x0A>", ...).
  std::vector<std::string> pieces(const std::vector<int>& ids) const;

  uint32_t vocab_size() const;
  int bos_id() const;  // -1 when the model has none
  int eos_id() const;
  int unk_id() const;
  // 64-bit FNV-1a of the model file's bytes, the identity recorded in token shards.
  uint64_t hash() const { return hash_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  uint64_t hash_ = 0;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

// `grass tokenizer train`: SentencePiece BPE with LLaMA's settings (byte fallback, split digits,
// identity normalization, unk=0 bos=1 eos=2, no pad).
struct TokenizerTrainOptions {
  std::vector<std::string> inputs;  // files (expanded), see data/jsonl_reader.h for formats
  std::string out_path;             // the .model file to write
  uint32_t vocab_size = 32000;
  uint64_t max_sentences = 0;  // 0: all; else a uniform sample of this many lines
  int threads = 1;
  bool verbose = false;  // SentencePiece's own training log on stderr
};

// What training read, for the summary.
struct TokenizerTrainStats {
  uint64_t documents = 0;
  uint64_t sentences = 0;  // non-empty lines of the documents, SentencePiece's training unit
  uint64_t text_bytes = 0;
};

// Trains and writes the model to out_path (through a temporary file, so a failed run leaves no
// model behind). UserError for bad input (see RecordReader) or a vocabulary SentencePiece cannot
// reach on this corpus.
TokenizerTrainStats train_tokenizer(const TokenizerTrainOptions& options);

}  // namespace grass
