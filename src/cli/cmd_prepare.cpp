// grass prepare --input <files> --tokenizer <model> --out <dir> [options]
#include <cstdio>
#include <thread>

#include "src/cli/commands.h"
#include "src/cli/options.h"
#include "src/core/error.h"
#include "src/data/jsonl_reader.h"
#include "src/data/prepare.h"

namespace grass::cli {

namespace {
const char* kPrepareUsage =
    "usage: grass prepare --input <file|glob> ... --tokenizer <model> --out <dir> [options]\n"
    "\n"
    "Tokenizes documents into token shards for training: <dir>/<prefix>_00000.bin, ... and\n"
    "<dir>/<prefix>.manifest.json, written last (docs/data.md). Inputs are C4-style JSON lines\n"
    "(.jsonl / .json, the \"text\" field of each line) or text (.txt, one document per line),\n"
    "gzipped or not. Each document becomes BOS + tokens + EOS. The shards are the same bytes\n"
    "whatever --threads is. Progress goes to stderr, the summary to stdout.\n"
    "\n"
    "options:\n"
    "  --input <file|glob> ...  input files, in order; quote globs ('c4/c4-train.*.json.gz');\n"
    "                           takes every argument up to the next option\n"
    "  --tokenizer <model>      SentencePiece .model file\n"
    "  --out <dir>              output directory (must not hold shards of the same prefix)\n"
    "  --prefix <name>          shard file prefix (default shard)\n"
    "  --threads <n>            tokenizer threads (default: all cores)\n"
    "  --max-docs <n>           stop after n documents (default: all)\n"
    "  --shard-tokens <n>       tokens per shard (default 100000000)\n"
    "  --no-bos, --no-eos       leave out BOS / EOS around each document\n"
    "  --skip-bad-records       skip malformed records (bad JSON, no \"text\", invalid UTF-8)\n"
    "                           and count them, instead of stopping at the first\n"
    "  --quiet                  no progress line\n"
    "  -h, --help               this help\n";

void print_summary(const PrepareOptions& options, const PrepareSummary& s) {
  for (const std::string& example : s.bad_record_examples)
    std::fprintf(stderr, "warning: skipped %s\n", example.c_str());
  if (s.bad_records > s.bad_record_examples.size())
    std::fprintf(stderr, "warning: ... and %llu more bad records\n",
                 static_cast<unsigned long long>(s.bad_records - s.bad_record_examples.size()));
  std::printf("prepared %llu documents from %zu files (%llu bad records skipped): %.2f MB of text"
              " -> %llu tokens in %zu shards\n",
              static_cast<unsigned long long>(s.documents), options.inputs.size(),
              static_cast<unsigned long long>(s.bad_records), s.text_bytes / 1e6,
              static_cast<unsigned long long>(s.tokens), s.shards.size());
  for (const PreparedShard& shard : s.shards)
    std::printf("  %s  %llu tokens\n", shard.path.c_str(),
                static_cast<unsigned long long>(shard.tokens));
  std::printf("  %s\n", s.manifest_path.c_str());
  const double t = s.seconds > 0 ? s.seconds : 1e-9;
  std::printf("%.2f s on %d threads: %.0f docs/s, %.2f MB/s of text, %.0f tokens/s\n", s.seconds,
              options.threads, s.documents / t, s.text_bytes / t / 1e6, s.tokens / t);
}
}  // namespace

int cmd_prepare(const Args& args) {
  PrepareOptions options;
  options.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::string> patterns;
  std::string value;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    if (is_help(a)) {
      std::fputs(kPrepareUsage, stdout);
      return 0;
    } else if (take_option(args, i, "--input", value)) {
      patterns.push_back(value);
      while (i + 1 < args.size() && !args[i + 1].starts_with("-")) patterns.push_back(args[++i]);
    } else if (take_option(args, i, "--tokenizer", value)) {
      options.tokenizer_path = value;
    } else if (take_option(args, i, "--out", value)) {
      options.out_dir = value;
    } else if (take_option(args, i, "--prefix", value)) {
      if (value.empty() || value.find('/') != std::string::npos)
        throw UserError("--prefix " + value + ": expected a file name prefix without '/'");
      options.prefix = value;
    } else if (take_option(args, i, "--threads", value)) {
      options.threads = static_cast<int>(parse_count("--threads", value, 1));
    } else if (take_option(args, i, "--max-docs", value)) {
      options.max_docs = parse_count("--max-docs", value, 1);
    } else if (take_option(args, i, "--shard-tokens", value)) {
      options.shard_tokens = parse_count("--shard-tokens", value, 1);
    } else if (a == "--no-bos") {
      options.add_bos = false;
    } else if (a == "--no-eos") {
      options.add_eos = false;
    } else if (a == "--skip-bad-records") {
      options.skip_bad_records = true;
    } else if (a == "--quiet") {
      options.progress = false;
    } else {
      throw UserError("prepare: unknown argument " + a + " (see grass prepare --help)");
    }
  }
  if (patterns.empty()) throw UserError("prepare: missing --input (see grass prepare --help)");
  if (options.tokenizer_path.empty())
    throw UserError("prepare: missing --tokenizer (see grass prepare --help)");
  if (options.out_dir.empty()) throw UserError("prepare: missing --out (see grass prepare --help)");
  options.inputs = expand_input_patterns(patterns);
  const PrepareSummary summary = prepare(options);
  print_summary(options, summary);
  return 0;
}

}  // namespace grass::cli
