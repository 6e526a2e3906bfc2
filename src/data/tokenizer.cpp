#include "src/data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "src/core/error.h"
#include "src/data/jsonl_reader.h"
#include "src/io/hash.h"

namespace grass {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot open tokenizer: " + std::strerror(errno));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) throw UserError(path + ": cannot read tokenizer: " + std::strerror(errno));
  return std::move(bytes).str();
}

// Feeds SentencePiece's trainer the non-empty lines of every document, file after file. Errors
// cannot cross the library, so the first one ends the iteration and is rethrown by the caller.
class CorpusLines : public sentencepiece::SentenceIterator {
 public:
  explicit CorpusLines(const std::vector<std::string>& inputs) : inputs_(inputs) { Next(); }

  bool done() const override { return done_; }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override {
    return error_ ? sentencepiece::util::Status(sentencepiece::util::StatusCode::kInternal,
                                                "input error")
                  : sentencepiece::util::Status();
  }
  void Next() override {
    try {
      done_ = !advance();
    } catch (...) {
      error_ = std::current_exception();
      done_ = true;
    }
  }

  std::exception_ptr error() const { return error_; }
  const TokenizerTrainStats& stats() const { return stats_; }

 private:
  // Moves line_ to the next non-empty line; false when every input is done.
  bool advance() {
    for (;;) {
      while (line_end_ < document_.size()) {
        const size_t start = line_end_;
        size_t end = document_.find('\n', start);
        if (end == std::string::npos) end = document_.size();
        line_end_ = end + 1;
        if (end > start) {
          line_.assign(document_, start, end - start);
          ++stats_.sentences;
          return true;
        }
      }
      if (!next_document()) return false;
    }
  }

  bool next_document() {
    std::string_view record;
    while (!reader_ || !reader_->next(record)) {
      if (next_input_ == inputs_.size()) return false;
      reader_ = std::make_unique<RecordReader>(inputs_[next_input_++]);
    }
    document_ = record_text(record, reader_->format(), reader_->path(), reader_->line_number());
    line_end_ = 0;
    ++stats_.documents;
    stats_.text_bytes += document_.size();
    return true;
  }

  const std::vector<std::string>& inputs_;
  size_t next_input_ = 0;
  std::unique_ptr<RecordReader> reader_;
  std::string document_;
  size_t line_end_ = 0;  // where the next line of document_ starts
  std::string line_;
  bool done_ = false;
  std::exception_ptr error_;
  TokenizerTrainStats stats_;
};

}  // namespace

Tokenizer::Tokenizer(const std::string& model_path)
    : path_(model_path), processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  // The model is read once, so the hash and the loaded model are of the same bytes.
  const std::string bytes = read_file(model_path);
  const auto status = processor_->LoadFromSerializedProto(bytes);
  if (!status.ok() || processor_->GetPieceSize() <= 0)
    throw UserError(model_path + ": not a SentencePiece model (it does not parse as one); pass "
                    "the .model file the tokenizer was trained to");
  hash_ = fnv1a64(bytes.data(), bytes.size());
}

Tokenizer::~Tokenizer() = default;

void Tokenizer::encode(std::string_view text, std::vector<int>& ids) const {
  const auto status = processor_->Encode(text, &ids);
  GRASS_CHECK(status.ok(), "SentencePiece encode failed: " + status.ToString());
}

std::vector<int> Tokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  encode(text, ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  std::string text;
  const auto status = processor_->Decode(ids, &text);
  GRASS_CHECK(status.ok(), "SentencePiece decode failed: " + status.ToString());
  return text;
}

std::vector<std::string> Tokenizer::pieces(const std::vector<int>& ids) const {
  std::vector<std::string> out;
  out.reserve(ids.size());
  for (int id : ids) out.push_back(processor_->IdToPiece(id));
  return out;
}

uint32_t Tokenizer::vocab_size() const { return static_cast<uint32_t>(processor_->GetPieceSize()); }
int Tokenizer::bos_id() const { return processor_->bos_id(); }
int Tokenizer::eos_id() const { return processor_->eos_id(); }
int Tokenizer::unk_id() const { return processor_->unk_id(); }

TokenizerTrainStats train_tokenizer(const TokenizerTrainOptions& options) {
  GRASS_CHECK(!options.inputs.empty() && !options.out_path.empty(), "train_tokenizer: no inputs");
  // LLaMA's tokenizer settings (its model proto's trainer_spec and normalizer_spec).
  const std::unordered_map<std::string, std::string> spec = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "true"},
      {"remove_extra_whitespaces", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"character_coverage", "0.99995"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"input_sentence_size", std::to_string(options.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(options.threads)},
      {"minloglevel", options.verbose ? "0" : "2"},  // 2: errors only
  };
  sentencepiece::SetRandomGeneratorSeed(1234);  // the same corpus gives the same model
  CorpusLines lines(options.inputs);
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(spec, &lines, &model);
  if (lines.error()) std::rethrow_exception(lines.error());
  if (!status.ok())
    throw UserError("tokenizer train: SentencePiece: " + status.ToString() +
                    " (with --vocab-size " + std::to_string(options.vocab_size) + " on " +
                    std::to_string(lines.stats().sentences) + " lines of text)");

  const std::string tmp_path = options.out_path + ".tmp";
  {
    std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
    out.write(model.data(), static_cast<std::streamsize>(model.size()));
    out.flush();
    if (!out) {
      std::filesystem::remove(tmp_path);
      throw UserError(options.out_path + ": cannot write the model: " + std::strerror(errno));
    }
  }
  std::filesystem::rename(tmp_path, options.out_path);
  return lines.stats();
}

}  // namespace grass
