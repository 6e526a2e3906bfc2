// `grass prepare`: text in (C4 JSON lines or plain text, see data/jsonl_reader.h), token shards
// out (data/shard.h). Documents are read in order, tokenized in parallel batches and written in
// their input order, so the shards are the same bytes whatever the thread count.
//
// Output, in out_dir:
//   <prefix>_00000.bin, <prefix>_00001.bin, ...   shard_tokens tokens each (the last one fewer);
//                                                  documents run on across shard boundaries
//   <prefix>.manifest.json                         shards, token counts, tokenizer, inputs;
//                                                  written last: its presence marks a complete run
// Shards are written into <out_dir>/<prefix>.partial/ and moved into place only when every input
// has been read, so a failed or killed run never leaves shards that look complete.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace grass {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files, already expanded (expand_input_patterns)
  std::string tokenizer_path;       // a SentencePiece .model
  std::string out_dir;
  std::string prefix = "shard";
  int threads = 1;
  uint64_t max_docs = 0;                  // 0: every document
  uint64_t shard_tokens = 100'000'000;    // tokens per shard (200 MB as uint16)
  bool add_bos = true;                    // each document: [BOS] tokens [EOS]
  bool add_eos = true;
  bool skip_bad_records = false;  // count bad records instead of stopping at the first
  bool progress = true;           // a progress line on stderr about once a second
};

struct PreparedShard {
  std::string path;
  uint64_t tokens = 0;
};

struct PrepareSummary {
  uint64_t documents = 0;
  uint64_t bad_records = 0;
  std::vector<std::string> bad_record_examples;  // the first few messages, file:line: what
  uint64_t tokens = 0;
  uint64_t text_bytes = 0;   // UTF-8 bytes of document text given to the tokenizer
  uint64_t input_bytes = 0;  // bytes of the input files (compressed, for .gz)
  double seconds = 0;
  std::vector<PreparedShard> shards;
  std::string manifest_path;
};

std::string prepared_shard_path(const std::string& out_dir, const std::string& prefix,
                                size_t index);
std::string prepared_manifest_path(const std::string& out_dir, const std::string& prefix);

// Runs the whole pipeline. UserError for bad input, a bad tokenizer, or an out_dir that already
// holds shards or a manifest under this prefix; after any error nothing of this run is left.
PrepareSummary prepare(const PrepareOptions& options);

}  // namespace grass
