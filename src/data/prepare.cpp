#include "src/data/prepare.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "src/core/error.h"
#include "src/core/format.h"
#include "src/data/jsonl_reader.h"
#include "src/data/shard.h"
#include "src/data/tokenizer.h"

namespace grass {

namespace fs = std::filesystem;

std::string prepared_shard_path(const std::string& out_dir, const std::string& prefix,
                                size_t index) {
  char name[32];
  std::snprintf(name, sizeof name, "_%05zu.bin", index);
  return (fs::path(out_dir) / (prefix + name)).string();
}

std::string prepared_manifest_path(const std::string& out_dir, const std::string& prefix) {
  return (fs::path(out_dir) / (prefix + ".manifest.json")).string();
}

namespace {

using Clock = std::chrono::steady_clock;

// A batch is tokenized in parallel, then written in order; its size bounds the memory in flight
// and keeps the progress line moving (1 MiB of text is about a second of one thread's work).
constexpr size_t kBatchBytes = size_t{1} << 20;
constexpr size_t kBatchRecords = 4096;
constexpr size_t kBadRecordExamples = 5;

struct Record {
  std::string line;
  size_t input = 0;  // index into the inputs
  uint64_t line_number = 0;
};

struct EncodedRecord {
  std::vector<int> ids;
  size_t text_bytes = 0;
  std::exception_ptr error;  // a BadRecord, or a bug
};

// Reads the inputs one record at a time, file after file.
class InputStream {
 public:
  explicit InputStream(const std::vector<std::string>& inputs) : inputs_(inputs) {}

  // Appends up to `max_records` records (fewer when about kBatchBytes are reached or the inputs
  // end) to batch; false when there was nothing left.
  bool read_batch(size_t max_records, std::vector<Record>& batch) {
    batch.clear();
    size_t bytes = 0;
    std::string_view line;
    while (batch.size() < max_records && bytes < kBatchBytes) {
      if (!reader_ || !reader_->next(line)) {
        if (reader_) done_bytes_ += fs::file_size(reader_->path());
        reader_.reset();
        if (next_input_ == inputs_.size()) break;
        reader_ = std::make_unique<RecordReader>(inputs_[next_input_++]);
        continue;
      }
      batch.push_back({std::string(line), next_input_ - 1, reader_->line_number()});
      bytes += line.size();
    }
    return !batch.empty();
  }

  // Bytes of the input files behind the records returned so far (compressed bytes for .gz, see
  // RecordReader::bytes_consumed): the total only when every record has been read.
  uint64_t bytes_read() const { return done_bytes_ + (reader_ ? reader_->bytes_consumed() : 0); }

 private:
  const std::vector<std::string>& inputs_;
  size_t next_input_ = 0;
  std::unique_ptr<RecordReader> reader_;
  uint64_t done_bytes_ = 0;
};

// Shards of shard_tokens tokens each, written into a staging directory and moved into out_dir by
// publish(). Until then, destroying it removes everything it wrote.
class ShardSequence {
 public:
  ShardSequence(const PrepareOptions& options, const ShardSpec& spec)
      : options_(options), spec_(spec),
        staging_(fs::path(options.out_dir) / (options.prefix + ".partial")) {
    fs::remove_all(staging_);  // left by a killed run; nothing in it was ever published
    fs::create_directories(staging_);
  }
  ~ShardSequence() {
    writer_.reset();  // deletes its temporary file
    std::error_code ignored;
    fs::remove_all(staging_, ignored);
  }

  void append(std::span<const uint32_t> tokens) {
    while (!tokens.empty()) {
      if (!writer_) {
        const std::string name = fs::path(prepared_shard_path("", options_.prefix, shards_.size()))
                                     .filename()
                                     .string();
        writer_.emplace((staging_ / name).string(), spec_);
      }
      const uint64_t room = options_.shard_tokens - writer_->token_count();
      const size_t n = static_cast<size_t>(std::min<uint64_t>(room, tokens.size()));
      writer_->append(tokens.first(n));
      tokens = tokens.subspan(n);
      if (writer_->token_count() == options_.shard_tokens) close_shard();
    }
  }

  // Finishes the last shard and moves every shard into out_dir, appending each to `published`
  // as soon as it is there (so a failure part-way still knows what to remove).
  void publish(std::vector<PreparedShard>& published) {
    if (writer_) close_shard();
    for (size_t i = 0; i < shards_.size(); ++i) {
      const std::string final_path = prepared_shard_path(options_.out_dir, options_.prefix, i);
      fs::rename(shards_[i].path, final_path);
      published.push_back({final_path, shards_[i].tokens});
    }
  }

 private:
  void close_shard() {
    writer_->finish();
    shards_.push_back({writer_->path(), writer_->token_count()});
    writer_.reset();
  }

  const PrepareOptions& options_;
  ShardSpec spec_;
  fs::path staging_;
  std::optional<ShardWriter> writer_;
  std::vector<PreparedShard> shards_;  // finished, in the staging directory
};

// The line on stderr: documents, rates, tokens, and an ETA from the input bytes read.
class Progress {
 public:
  Progress(bool enabled, uint64_t total_bytes, uint64_t max_docs)
      : enabled_(enabled), total_bytes_(total_bytes), max_docs_(max_docs),
        tty_(::isatty(STDERR_FILENO)), start_(Clock::now()), last_(start_) {}
  ~Progress() {
    if (open_line_) std::fputc('\n', stderr);
  }

  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  void update(const PrepareSummary& s, uint64_t bytes_read) {
    if (!enabled_ || Clock::now() - last_ < std::chrono::seconds(1)) return;
    last_ = Clock::now();
    const double t = elapsed();
    double done = total_bytes_ ? static_cast<double>(bytes_read) / total_bytes_ : 0;
    if (max_docs_) done = std::max(done, static_cast<double>(s.documents) / max_docs_);
    const std::string eta = done > 0 ? human_duration(t * (1 - done) / done) : "?";
    std::fprintf(stderr,
                 "%sprepare: %" PRIu64 " docs | %.0f docs/s | %.2f MB/s | %.1fM tokens | "
                 "%.0f%% | ETA %s%s",
                 tty_ ? "\r" : "", s.documents, s.documents / t, s.text_bytes / t / 1e6,
                 s.tokens / 1e6, 100 * done, eta.c_str(), tty_ ? "\033[K" : "\n");
    std::fflush(stderr);
    open_line_ = tty_;
  }

 private:
  bool enabled_;
  uint64_t total_bytes_;
  uint64_t max_docs_;
  bool tty_;
  bool open_line_ = false;
  Clock::time_point start_;
  Clock::time_point last_;
};

void encode_batch(const Tokenizer& tokenizer, const std::vector<std::string>& inputs,
                  const std::vector<Record>& batch, int threads,
                  std::vector<EncodedRecord>& encoded) {
  encoded.resize(batch.size());
  const auto n = static_cast<int64_t>(batch.size());
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) {
    const Record& record = batch[i];
    EncodedRecord& out = encoded[i];
    out.error = nullptr;
    try {
      const std::string& path = inputs[record.input];
      const std::string text =
          record_text(record.line, input_format(path), path, record.line_number);
      out.text_bytes = text.size();
      tokenizer.encode(text, out.ids);
    } catch (...) {
      out.error = std::current_exception();
    }
  }
}

// Refuses an out_dir that already holds this prefix's shards or manifest: mixing runs would make
// a stream no single run produced.
void check_out_dir_free(const PrepareOptions& options) {
  if (!fs::exists(options.out_dir)) return;
  if (!fs::is_directory(options.out_dir))
    throw UserError(options.out_dir + ": --out exists and is not a directory");
  const std::string shard_start = options.prefix + "_";
  const std::string manifest = fs::path(prepared_manifest_path("", options.prefix)).filename();
  for (const auto& entry : fs::directory_iterator(options.out_dir)) {
    const std::string name = entry.path().filename().string();
    const bool is_shard = name.starts_with(shard_start) && name.ends_with(".bin");
    if (is_shard || name == manifest)
      throw UserError(options.out_dir + ": already holds " + name +
                      " from an earlier prepare; remove this prefix's files or choose another "
                      "--out or --prefix");
  }
}

void write_manifest(const PrepareOptions& options, const Tokenizer& tokenizer,
                    const PrepareSummary& s) {
  nlohmann::json shards = nlohmann::json::array();
  for (const PreparedShard& shard : s.shards)
    shards.push_back({{"file", fs::path(shard.path).filename().string()}, {"tokens", shard.tokens}});
  nlohmann::json inputs = nlohmann::json::array();
  for (const std::string& input : options.inputs)
    inputs.push_back({{"path", input}, {"bytes", fs::file_size(input)}});
  const nlohmann::json manifest = {
      {"format", "grass-prepare"},
      {"version", 1},
      {"tokenizer", {{"path", tokenizer.path()},
                     {"hash", hex64(tokenizer.hash())},
                     {"vocab_size", tokenizer.vocab_size()},
                     {"bos_id", tokenizer.bos_id()},
                     {"eos_id", tokenizer.eos_id()}}},
      {"add_bos", options.add_bos},
      {"add_eos", options.add_eos},
      {"max_docs", options.max_docs},
      {"inputs", inputs},
      {"documents", s.documents},
      {"bad_records_skipped", s.bad_records},
      {"text_bytes", s.text_bytes},
      {"tokens", s.tokens},
      {"shard_tokens", options.shard_tokens},
      {"shards", shards},
  };
  const std::string tmp_path = s.manifest_path + ".tmp";
  std::ofstream out(tmp_path, std::ios::trunc);
  out << manifest.dump(2) << "\n";
  out.close();
  if (!out) {
    fs::remove(tmp_path);
    throw UserError(s.manifest_path + ": cannot write the manifest (disk full?)");
  }
  fs::rename(tmp_path, s.manifest_path);
}

PrepareSummary run_prepare(const PrepareOptions& options) {
  GRASS_CHECK(options.threads >= 1 && options.shard_tokens >= 1 && !options.inputs.empty(),
              "prepare: bad options");
  // Everything that can be checked up front is, before out_dir is touched.
  const Tokenizer tokenizer(options.tokenizer_path);
  if ((options.add_bos && tokenizer.bos_id() < 0) || (options.add_eos && tokenizer.eos_id() < 0))
    throw UserError(options.tokenizer_path + ": the tokenizer has no " +
                    (options.add_bos && tokenizer.bos_id() < 0 ? "BOS" : "EOS") +
                    " token; pass --no-bos / --no-eos");
  PrepareSummary summary;
  for (const std::string& input : options.inputs) {
    input_format(input);
    summary.input_bytes += fs::file_size(input);
  }
  check_out_dir_free(options);
  const bool created_out_dir = fs::create_directories(options.out_dir);
  summary.manifest_path = prepared_manifest_path(options.out_dir, options.prefix);

  const ShardSpec spec{tokenizer.vocab_size(), options.add_bos ? tokenizer.bos_id() : -1,
                       options.add_eos ? tokenizer.eos_id() : -1, tokenizer.hash()};
  Progress progress(options.progress, summary.input_bytes, options.max_docs);
  try {
    ShardSequence shards(options, spec);
    InputStream input(options.inputs);
    std::vector<Record> batch;
    std::vector<EncodedRecord> encoded;
    std::vector<uint32_t> document;  // one document's tokens with BOS/EOS
    const uint64_t max_docs = options.max_docs ? options.max_docs : UINT64_MAX;
    while (summary.documents < max_docs &&
           input.read_batch(std::min<uint64_t>(kBatchRecords, max_docs - summary.documents),
                            batch)) {
      encode_batch(tokenizer, options.inputs, batch, options.threads, encoded);
      for (EncodedRecord& record : encoded) {
        if (record.error) {
          try {
            std::rethrow_exception(record.error);
          } catch (const BadRecord& e) {
            if (!options.skip_bad_records)
              throw UserError(std::string(e.what()) +
                              " (--skip-bad-records skips such records)");
            if (summary.bad_records++ < kBadRecordExamples)
              summary.bad_record_examples.push_back(e.what());
            continue;
          }
        }
        document.clear();
        if (options.add_bos) document.push_back(static_cast<uint32_t>(tokenizer.bos_id()));
        document.insert(document.end(), record.ids.begin(), record.ids.end());
        if (options.add_eos) document.push_back(static_cast<uint32_t>(tokenizer.eos_id()));
        shards.append(document);
        summary.documents++;
        summary.tokens += document.size();
        summary.text_bytes += record.text_bytes;
      }
      progress.update(summary, input.bytes_read());
    }
    if (summary.documents == 0)
      throw UserError("prepare: no documents in the input (" +
                      std::to_string(summary.bad_records) + " bad records skipped)");
    shards.publish(summary.shards);
    write_manifest(options, tokenizer, summary);
  } catch (...) {
    // Shards already moved into place are this run's too; without a manifest they must go.
    std::error_code ignored;
    for (const PreparedShard& shard : summary.shards) fs::remove(shard.path, ignored);
    if (created_out_dir && fs::is_empty(options.out_dir, ignored)) fs::remove(options.out_dir, ignored);
    throw;
  }
  summary.seconds = progress.elapsed();
  return summary;
}

}  // namespace

PrepareSummary prepare(const PrepareOptions& options) {
  try {
    return run_prepare(options);
  } catch (const fs::filesystem_error& e) {  // a missing input, a read-only --out, a full disk
    throw UserError(e.path1().string() + ": " + e.code().message() + " (in prepare)");
  }
}

}  // namespace grass
