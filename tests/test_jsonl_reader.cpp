// RecordReader and record_text: plain and gzipped JSON lines and text, line numbers, long lines,
// UTF-8 validation, glob expansion, and the one-line error for each kind of bad input.
#include <catch2/catch.hpp>

#include <filesystem>

#include "src/data/jsonl_reader.h"
#include "tests/test_util.h"
#include "tests/text_corpus_util.h"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using namespace grass;
using namespace grass::test;

namespace {

struct ReadRecord {
  std::string text;
  uint64_t line;
};

std::vector<ReadRecord> read_all(const std::string& path) {
  RecordReader reader(path);
  std::vector<ReadRecord> out;
  std::string_view line;
  while (reader.next(line))
    out.push_back({record_text(line, reader.format(), path, reader.line_number()),
                   reader.line_number()});
  return out;
}

// The message of the first error reading every record of `path`.
std::string error_reading(const std::string& path) {
  return user_error_of([&] { read_all(path); });
}

}  // namespace

TEST_CASE("JSON lines and gzipped JSON lines give the same documents", "[jsonl]") {
  TempDir dir("test_jsonl");
  const auto docs = english_like_documents(300, 1);
  write_text_file(dir.file("a.jsonl"), jsonl_of(docs));
  write_text_file(dir.file("a.json.gz"), gzip_bytes(jsonl_of(docs)));
  for (const std::string name : {"a.jsonl", "a.json.gz"}) {
    const auto records = read_all(dir.file(name));
    REQUIRE(records.size() == docs.size());
    for (size_t i = 0; i < docs.size(); ++i) {
      CHECK(records[i].text == docs[i]);
      CHECK(records[i].line == i + 1);
    }
  }
}

TEST_CASE("blank lines are skipped but counted, CRLF endings and a missing last newline work",
          "[jsonl]") {
  TempDir dir("test_jsonl");
  write_text_file(dir.file("a.jsonl"), "{\"text\": \"one\"}\r\n\n  \n{\"text\": \"two\"}");
  const auto records = read_all(dir.file("a.jsonl"));
  REQUIRE(records.size() == 2);
  CHECK(records[0].text == "one");
  CHECK(records[1].text == "two");
  CHECK(records[1].line == 4);
}

TEST_CASE("text files give one document per line", "[jsonl]") {
  TempDir dir("test_jsonl");
  write_text_file(dir.file("a.txt.gz"), gzip_bytes("first line\nsecond {not json}\n"));
  const auto records = read_all(dir.file("a.txt.gz"));
  REQUIRE(records.size() == 2);
  CHECK(records[1].text == "second {not json}");
}

TEST_CASE("lines longer than the read buffer are read whole", "[jsonl]") {
  TempDir dir("test_jsonl");
  // 3 MiB and 1 byte: past the 1 MiB chunk and past one doubling of the buffer.
  const std::vector<std::string> docs = {"short", std::string(3u << 20, 'x') + "y", "after"};
  write_text_file(dir.file("a.json.gz"), gzip_bytes(jsonl_of(docs)));
  const auto records = read_all(dir.file("a.json.gz"));
  REQUIRE(records.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(records[i].text == docs[i]);
}

TEST_CASE("UTF-8 validation", "[jsonl]") {
  CHECK_FALSE(first_invalid_utf8("plain ascii, long enough to take the 8-byte path"));
  CHECK_FALSE(first_invalid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf"));
  CHECK(first_invalid_utf8("abc\xff") == 3u);                // never valid
  CHECK(first_invalid_utf8("ab\xc3") == 2u);                 // cut short
  CHECK(first_invalid_utf8("\xc0\xaf") == 0u);               // overlong '/'
  CHECK(first_invalid_utf8("\xe0\x80\xaf") == 0u);           // overlong, 3 bytes
  CHECK(first_invalid_utf8("x\xed\xa0\x80") == 1u);          // UTF-16 surrogate
  CHECK(first_invalid_utf8("12345678\xf4\x90\x80\x80") == 8u);  // past U+10FFFF
  CHECK(first_invalid_utf8("\xe2\x82x") == 0u);              // bad continuation
}

TEST_CASE("each bad record gives one line naming file and line", "[jsonl]") {
  TempDir dir("test_jsonl");
  const std::string good = "{\"text\": \"fine\"}\n";
  struct Case {
    std::string line, message;
  };
  const std::vector<Case> cases = {
      {"{\"text\": \"unterminated", "malformed JSON"},
      {"{\"url\": \"x\"}", "record has no \"text\" field"},
      {"{\"text\": 42}", "\"text\" is a number, expected a string"},
      {"[\"text\"]", "record is a JSON array"},
      {"{\"text\": \"bad \xff byte\"}", "invalid UTF-8 at byte 15"},
  };
  for (const Case& c : cases) {
    const std::string path = dir.file("bad.jsonl");
    write_text_file(path, good + good + c.line + "\n" + good);
    const std::string message = error_reading(path);
    INFO(message);
    CHECK_THAT(message, StartsWith(path + ":3: "));
    CHECK_THAT(message, Contains(c.message));
    CHECK(message.find('\n') == std::string::npos);
    // The reader stays usable after a bad record, so callers can skip it.
    RecordReader reader(path);
    std::string_view line;
    uint64_t bad = 0, fine = 0;
    while (reader.next(line)) {
      try {
        record_text(line, reader.format(), path, reader.line_number());
        ++fine;
      } catch (const BadRecord&) {
        ++bad;
      }
    }
    CHECK(bad == 1);
    CHECK(fine == 3);
  }
}

TEST_CASE("truncated and corrupt gzip files are errors naming the file", "[jsonl]") {
  TempDir dir("test_jsonl");
  const std::string gz = gzip_bytes(jsonl_of(english_like_documents(2000, 2)));
  write_text_file(dir.file("cut.json.gz"), gz.substr(0, gz.size() / 2));
  CHECK_THAT(error_reading(dir.file("cut.json.gz")),
             StartsWith(dir.file("cut.json.gz") + ": truncated gzip (unexpected end of file"));
  std::string corrupt = gz;
  for (size_t i = 100; i < 200; ++i) corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5a);
  write_text_file(dir.file("bad.json.gz"), corrupt);
  CHECK_THAT(error_reading(dir.file("bad.json.gz")),
             StartsWith(dir.file("bad.json.gz") + ": corrupt gzip"));
}

TEST_CASE("empty inputs are errors", "[jsonl]") {
  TempDir dir("test_jsonl");
  write_text_file(dir.file("empty.jsonl"), "");
  write_text_file(dir.file("blank.jsonl"), "\n \n");
  write_text_file(dir.file("empty.json.gz"), gzip_bytes(""));
  for (const std::string name : {"empty.jsonl", "blank.jsonl", "empty.json.gz"})
    CHECK(error_reading(dir.file(name)) ==
          dir.file(name) + ": empty input (no records); check the file or leave it out");
}

TEST_CASE("input patterns expand in order and fail clearly", "[jsonl]") {
  TempDir dir("test_jsonl");
  for (const std::string name : {"c4-train.00001-of-01024.json.gz", "c4-train.00000-of-01024.json.gz",
                                 "extra.txt"})
    write_text_file(dir.file(name), "x");
  const auto files =
      expand_input_patterns({dir.file("c4-train.*.json.gz"), dir.file("extra.txt")});
  REQUIRE(files.size() == 3);
  CHECK(files[0] == dir.file("c4-train.00000-of-01024.json.gz"));
  CHECK(files[1] == dir.file("c4-train.00001-of-01024.json.gz"));
  CHECK(files[2] == dir.file("extra.txt"));

  CHECK(user_error_of([&] { expand_input_patterns({dir.file("*.jsonl")}); }) ==
        "--input '" + dir.file("*.jsonl") +
            "' matches no files (check the path and quote the pattern so the shell does not "
            "expand it)");
  CHECK_THAT(user_error_of([&] { expand_input_patterns({dir.file("missing.jsonl")}); }),
             StartsWith(dir.file("missing.jsonl") + ": no such file"));
  CHECK_THAT(user_error_of([&] { expand_input_patterns({dir.path.string()}); }),
             Contains("is a directory"));
  write_text_file(dir.file("notes.md"), "x");
  CHECK_THAT(user_error_of([&] { expand_input_patterns({dir.file("notes.md")}); }),
             Contains("unknown input type; expected .jsonl, .json or .txt, optionally .gz"));
}
