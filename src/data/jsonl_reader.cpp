#include "src/data/jsonl_reader.h"

#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace grass {

namespace {

constexpr size_t kReadChunk = size_t{1} << 20;
constexpr size_t kMaxLineBytes = size_t{64} << 20;

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

bool is_blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

// A readable regular file, or a UserError saying what it is instead.
void check_input_file(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status))
    throw UserError(path + ": no such file (check the --input path)");
  if (std::filesystem::is_directory(status))
    throw UserError(path + ": is a directory; give files or a glob such as '" + path +
                    "/*.json.gz'");
  input_format(path);
}

// "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error ..." ->
// "column 5: syntax error ...": the line is always 1 (one record), and the file's line is ours.
std::string json_error_detail(const std::string& what) {
  const std::string marker = "at line 1, ";
  const size_t at = what.find(marker);
  if (at != std::string::npos) return what.substr(at + marker.size());
  const size_t bracket = what.find("] ");
  return bracket == std::string::npos ? what : what.substr(bracket + 2);
}

}  // namespace

InputFormat input_format(const std::string& path) {
  std::string_view name = path;
  if (ends_with(name, ".gz")) name.remove_suffix(3);
  if (ends_with(name, ".jsonl") || ends_with(name, ".json")) return InputFormat::kJsonLines;
  if (ends_with(name, ".txt")) return InputFormat::kText;
  throw UserError(path + ": unknown input type; expected .jsonl, .json or .txt, optionally .gz");
}

std::vector<std::string> expand_input_patterns(const std::vector<std::string>& patterns) {
  std::vector<std::string> files;
  for (const std::string& pattern : patterns) {
    if (!has_glob_chars(pattern)) {
      check_input_file(pattern);
      files.push_back(pattern);
      continue;
    }
    glob_t matches{};
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &matches);
    if (rc == GLOB_NOMATCH || (rc == 0 && matches.gl_pathc == 0)) {
      globfree(&matches);
      throw UserError("--input '" + pattern + "' matches no files (check the path and quote the "
                      "pattern so the shell does not expand it)");
    }
    if (rc != 0) {
      globfree(&matches);
      throw UserError("--input '" + pattern + "': cannot expand the pattern (read error)");
    }
    std::vector<std::string> matched(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
    globfree(&matches);
    for (std::string& file : matched) {
      check_input_file(file);
      files.push_back(std::move(file));
    }
  }
  return files;
}

std::optional<size_t> first_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // ASCII runs are the common case: skip them 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, s + i, 8);
      if (word & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong forms
      if (c == 0xED) hi = 0x9F;  // no UTF-16 surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // no overlong forms
      if (c == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
    } else {
      return i;
    }
    if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
    i += len;
  }
  return std::nullopt;
}

RecordReader::RecordReader(const std::string& path)
    : path_(path), format_(input_format(path)), buffer_(kReadChunk) {
  file_ = gzopen(path.c_str(), "rb");
  if (!file_) throw UserError(path + ": cannot open: " + std::strerror(errno));
  // zlib inflates straight into our buffer when a read asks for at least twice this size (ours
  // ask for kReadChunk / 2 or more), so no text waits inside zlib and bytes_consumed() sees all
  // that was inflated.
  gzbuffer(file_, kReadChunk / 4);
}

RecordReader::~RecordReader() {
  if (file_) gzclose(file_);
}

uint64_t RecordReader::bytes_consumed() const {
  const auto delivered = static_cast<uint64_t>(gztell(file_));  // text bytes read into buffer_
  const uint64_t used = delivered - (end_ - begin_);
  if (delivered == 0 || gzdirect(file_)) return used;  // plain: text bytes are file bytes
  const auto inflated = static_cast<uint64_t>(gzoffset(file_));  // compressed bytes behind them
  return static_cast<uint64_t>(static_cast<unsigned __int128>(inflated) * used / delivered);
}

bool RecordReader::refill() {
  if (at_eof_) return false;
  // Keep the unread bytes, moved to the front; grow the buffer only when a line fills it.
  std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
  end_ -= begin_;
  begin_ = 0;
  if (buffer_.size() - end_ < kReadChunk / 2) {
    if (buffer_.size() >= kMaxLineBytes)
      throw UserError(path_ + ":" + std::to_string(line_number_ + 1) +
                      ": line longer than 64 MiB; is this really " +
                      (format_ == InputFormat::kText ? "text" : "JSON lines") + "?");
    buffer_.resize(buffer_.size() * 2);
  }
  const int got = gzread(file_, buffer_.data() + end_, static_cast<unsigned>(buffer_.size() - end_));
  int err = Z_OK;
  const char* message = gzerror(file_, &err);
  if (got < 0 || (got == 0 && err != Z_OK)) {
    // zlib's message is "<path>: <what>"; the path is already ours.
    std::string what = err == Z_ERRNO ? std::strerror(errno) : message;
    if (what.starts_with(path_ + ": ")) what.erase(0, path_.size() + 2);
    throw UserError(path_ + ": " + (err == Z_BUF_ERROR ? "truncated gzip" : "corrupt gzip") +
                    " (" + what + " after line " + std::to_string(line_number_) +
                    "); download the file again");
  }
  if (got == 0) {
    at_eof_ = true;
    return false;
  }
  end_ += static_cast<size_t>(got);
  return true;
}

bool RecordReader::next(std::string_view& line) {
  for (;;) {
    const char* start = buffer_.data() + begin_;
    const auto* newline = static_cast<const char*>(std::memchr(start, '\n', end_ - begin_));
    std::string_view candidate;
    if (newline) {
      candidate = std::string_view(start, static_cast<size_t>(newline - start));
      begin_ += candidate.size() + 1;
    } else if (refill()) {
      continue;
    } else if (begin_ < end_) {  // the last line has no "\n"
      candidate = std::string_view(buffer_.data() + begin_, end_ - begin_);
      begin_ = end_;
    } else {
      if (records_ == 0)
        throw UserError(path_ + ": empty input (no records); check the file or leave it out");
      return false;
    }
    ++line_number_;
    if (!candidate.empty() && candidate.back() == '\r') candidate.remove_suffix(1);
    if (is_blank(candidate)) continue;
    ++records_;
    line = candidate;
    return true;
  }
}

std::string record_text(std::string_view line, InputFormat format, const std::string& path,
                        uint64_t line_number) {
  const std::string where = path + ":" + std::to_string(line_number) + ": ";
  if (const auto bad = first_invalid_utf8(line))
    throw BadRecord(where + "invalid UTF-8 at byte " + std::to_string(*bad + 1) +
                    " of the line; the input must be UTF-8");
  if (format == InputFormat::kText) return std::string(line);

  nlohmann::json record;
  try {
    record = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    throw BadRecord(where + "malformed JSON: " + json_error_detail(e.what()));
  }
  if (!record.is_object())
    throw BadRecord(where + "record is a JSON " + record.type_name() +
                    ", expected an object with a \"text\" field");
  const auto text = record.find("text");
  if (text == record.end()) throw BadRecord(where + "record has no \"text\" field");
  if (!text->is_string())
    throw BadRecord(where + "\"text\" is a " + text->type_name() + ", expected a string");
  return text->get<std::string>();
}

}  // namespace grass
