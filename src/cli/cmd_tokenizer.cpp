// grass tokenizer train | encode | info
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <thread>

#include "src/cli/commands.h"
#include "src/cli/options.h"
#include "src/core/error.h"
#include "src/data/jsonl_reader.h"
#include "src/data/tokenizer.h"

namespace grass::cli {

namespace {
const char* kTokenizerUsage =
    "usage: grass tokenizer train --input <file|glob> ... --vocab-size <n> --out <model> [options]\n"
    "       grass tokenizer encode --tokenizer <model> [--pieces] [text ...]\n"
    "       grass tokenizer info <model>\n"
    "\n"
    "train   trains a SentencePiece BPE tokenizer with LLaMA's settings (byte fallback, split\n"
    "        digits, identity normalization, unk=0 bos=1 eos=2, no pad) on the lines of the\n"
    "        inputs' documents (.jsonl / .json \"text\" fields, or .txt lines; gzipped or not)\n"
    "          --max-sentences <n>  train on a uniform sample of n lines (default: all)\n"
    "          --threads <n>        trainer threads (default: all cores)\n"
    "          --verbose            SentencePiece's own training log on stderr\n"
    "encode  prints the token ids of each text argument (or of each stdin line), no BOS/EOS;\n"
    "        --pieces prints the pieces instead\n"
    "info    prints the vocabulary size, special ids and the checksum shards record\n";

int tokenizer_train(const Args& args) {
  TokenizerTrainOptions options;
  options.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::string> patterns;
  bool have_vocab = false;
  std::string value;
  for (size_t i = 1; i < args.size(); i++) {
    if (take_option(args, i, "--input", value)) {
      patterns.push_back(value);
      while (i + 1 < args.size() && !args[i + 1].starts_with("-")) patterns.push_back(args[++i]);
    } else if (take_option(args, i, "--vocab-size", value)) {
      options.vocab_size = static_cast<uint32_t>(parse_count("--vocab-size", value, 1));
      have_vocab = true;
    } else if (take_option(args, i, "--out", value)) {
      options.out_path = value;
    } else if (take_option(args, i, "--max-sentences", value)) {
      options.max_sentences = parse_count("--max-sentences", value, 1);
    } else if (take_option(args, i, "--threads", value)) {
      options.threads = static_cast<int>(parse_count("--threads", value, 1));
    } else if (args[i] == "--verbose") {
      options.verbose = true;
    } else {
      throw UserError("tokenizer train: unknown argument " + args[i] +
                      " (see grass tokenizer --help)");
    }
  }
  if (patterns.empty() || !have_vocab || options.out_path.empty())
    throw UserError("tokenizer train: needs --input, --vocab-size and --out "
                    "(see grass tokenizer --help)");
  options.inputs = expand_input_patterns(patterns);
  std::fprintf(stderr, "tokenizer train: reading %zu files, training BPE with %u pieces...\n",
               options.inputs.size(), options.vocab_size);
  const TokenizerTrainStats stats = train_tokenizer(options);
  const Tokenizer trained(options.out_path);
  const bool sampled = options.max_sentences && stats.sentences > options.max_sentences;
  std::printf("trained %s: %u pieces from %" PRIu64 " lines of %" PRIu64
              " documents (%.2f MB of text)%s, checksum 0x%016" PRIx64 "\n",
              options.out_path.c_str(), trained.vocab_size(), stats.sentences, stats.documents,
              stats.text_bytes / 1e6,
              sampled ? (", a sample of " + std::to_string(options.max_sentences)).c_str() : "",
              trained.hash());
  return 0;
}

void print_encoding(const Tokenizer& tokenizer, const std::string& text, bool pieces) {
  const std::vector<int> ids = tokenizer.encode(text);
  if (pieces) {
    const std::vector<std::string> names = tokenizer.pieces(ids);
    for (size_t i = 0; i < names.size(); ++i)
      std::printf("%s%s", i ? " " : "", names[i].c_str());
  } else {
    for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? " " : "", ids[i]);
  }
  std::printf("\n");
}

int tokenizer_encode(const Args& args) {
  std::string model;
  bool pieces = false;
  std::vector<std::string> texts;
  std::string value;
  for (size_t i = 1; i < args.size(); i++) {
    if (take_option(args, i, "--tokenizer", value)) model = value;
    else if (args[i] == "--pieces") pieces = true;
    else if (args[i].starts_with("--"))
      throw UserError("tokenizer encode: unknown option " + args[i] + " (see grass tokenizer --help)");
    else texts.push_back(args[i]);
  }
  if (model.empty()) throw UserError("tokenizer encode: missing --tokenizer <model>");
  const Tokenizer tokenizer(model);
  if (!texts.empty()) {
    for (const std::string& text : texts) print_encoding(tokenizer, text, pieces);
    return 0;
  }
  std::string line;
  for (uint64_t n = 1; std::getline(std::cin, line); ++n) {
    if (const auto bad = first_invalid_utf8(line))
      throw UserError("stdin:" + std::to_string(n) + ": invalid UTF-8 at byte " +
                      std::to_string(*bad + 1));
    print_encoding(tokenizer, line, pieces);
  }
  return 0;
}

int tokenizer_info(const Args& args) {
  if (args.size() != 2) throw UserError("tokenizer info: expected one <model> argument");
  const Tokenizer tokenizer(args[1]);
  std::printf("%s: vocab_size %u, unk_id %d, bos_id %d, eos_id %d, checksum 0x%016" PRIx64 "\n",
              args[1].c_str(), tokenizer.vocab_size(), tokenizer.unk_id(), tokenizer.bos_id(),
              tokenizer.eos_id(), tokenizer.hash());
  return 0;
}
}  // namespace

int cmd_tokenizer(const Args& args) {
  for (const std::string& a : args) {
    if (is_help(a)) {
      std::fputs(kTokenizerUsage, stdout);
      return 0;
    }
  }
  const std::string action = args.empty() ? "" : args[0];
  if (action == "train") return tokenizer_train(args);
  if (action == "encode") return tokenizer_encode(args);
  if (action == "info") return tokenizer_info(args);
  throw UserError("tokenizer: expected train, encode or info (see grass tokenizer --help)");
}

}  // namespace grass::cli
