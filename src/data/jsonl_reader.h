// Text input for `grass prepare` and `grass tokenizer train`: C4-style JSON lines (.jsonl / .json,
// one {"text": ...} object per line) and plain text (.txt, one document per line), either of
// them optionally gzipped. Files are streamed line by line, never held in memory whole.
#pragma once
#include <zlib.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/core/error.h"

namespace grass {

// One record the reader cannot take (malformed JSON, no "text", text not a string, invalid
// UTF-8); the message names file:line. The file itself is still readable past it, so a caller
// may count it and go on (--skip-bad-records).
struct BadRecord : UserError {
  using UserError::UserError;
};

enum class InputFormat { kJsonLines, kText };

// The format a file's name says: .jsonl / .json -> JSON lines, .txt -> text, each optionally
// followed by .gz. UserError for any other name.
InputFormat input_format(const std::string& path);

// --input arguments to files, in order: a pattern with * ? or [ expands to its sorted matches
// (UserError when it matches nothing), anything else must name an existing regular file.
std::vector<std::string> expand_input_patterns(const std::vector<std::string>& patterns);

// Byte offset of the first invalid UTF-8 sequence in `text` (overlong forms, surrogates and code
// points past U+10FFFF count as invalid), or nullopt when it is all valid.
std::optional<size_t> first_invalid_utf8(std::string_view text);

// Streams the non-blank lines of one file, gzipped or plain (zlib tells them apart by the gzip
// magic, whatever the name says), without their "\n" or "\r\n".
class RecordReader {
 public:
  explicit RecordReader(const std::string& path);
  ~RecordReader();
  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;

  // The next non-blank line, valid until the next call; false at the end of the file. UserError
  // for a truncated or corrupt gzip, a file with no records at all, or a line over 64 MiB.
  bool next(std::string_view& line);

  const std::string& path() const { return path_; }
  InputFormat format() const { return format_; }
  uint64_t line_number() const { return line_number_; }  // of the last line returned, 1-based
  // The part of the file the records returned so far came from, in bytes of the file, as
  // progress against its size: exact for a plain file; for a gzip, the compressed bytes inflated
  // so far times the share of their text those records used. Read-ahead does not count, so it
  // equals the file size only once every record has been returned.
  uint64_t bytes_consumed() const;

 private:
  bool refill();  // reads more of the file behind the unread bytes; false at its end

  std::string path_;
  InputFormat format_;
  gzFile file_ = nullptr;
  std::vector<char> buffer_;  // unread bytes are [begin_, end_)
  size_t begin_ = 0;
  size_t end_ = 0;
  bool at_eof_ = false;
  uint64_t line_number_ = 0;
  uint64_t records_ = 0;
};

// The document text of one record: a JSON line's "text" field, or a text line itself, checked to
// be valid UTF-8. BadRecord naming path:line_number otherwise.
std::string record_text(std::string_view line, InputFormat format, const std::string& path,
                        uint64_t line_number);

}  // namespace grass
