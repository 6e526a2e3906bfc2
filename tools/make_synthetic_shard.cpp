// make_synthetic_shard: a learnable token shard for testing training before real data exists.
//
// The stream is a concatenation of n-grams drawn uniformly from a fixed, seeded set of K
// random n-grams of length L. Inside an n-gram the next token is determined by what came
// before, so only the start of each n-gram is uncertain: a perfect model's loss falls from
// ln(V) (uniform guessing) towards about ln(K) / L nats per token.
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/data/shard.h"

namespace {

constexpr const char* kUsage =
    "usage: make_synthetic_shard --out PATH --vocab V --tokens N [--ngrams K] [--ngram-len L] "
    "[--seed S] [--tokenizer-hash H]\n"
    "  writes N tokens (ids in [0, V)) made of K random n-grams of length L, chosen uniformly\n"
    "  --tokenizer-hash: the header's tokenizer_hash (default 0: no tokenizer); tests give\n"
    "  shards different ones to stand for data made with different tokenizers\n"
    "  defaults: --ngrams 64 --ngram-len 8 --seed 1234\n";

[[noreturn]] void usage_error(const std::string& problem) {
  std::fprintf(stderr, "make_synthetic_shard: %s\n%s", problem.c_str(), kUsage);
  std::exit(2);
}

// SplitMix64 (core/rng.h's finaliser over a Weyl sequence): tiny, fast and fully specified, so a
// seed gives the same shard everywhere.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() { return grass::mix64(state += grass::kGoldenGamma); }
  // Uniform in [0, n) by multiply-shift (bias below 2^-32 for the n used here).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }
};

uint64_t parse_count(const std::string& flag, const char* text, uint64_t min, uint64_t max) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  const bool valid = *text != '\0' && *text != '-' && *end == '\0' && errno != ERANGE;
  if (!valid || value < min || value > max)
    usage_error(flag + " must be an integer in [" + std::to_string(min) + ", " +
                std::to_string(max) + "], got '" + text + "'");
  return value;
}

struct Options {
  std::string out;
  uint64_t vocab = 0;
  uint64_t tokens = 0;
  uint64_t ngrams = 64;
  uint64_t ngram_len = 8;
  uint64_t seed = 1234;
  uint64_t tokenizer_hash = 0;
};

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) usage_error("missing value after " + flag);
    const char* value = argv[++i];
    if (flag == "--out")
      options.out = value;
    else if (flag == "--vocab")
      options.vocab = parse_count(flag, value, 2, UINT32_MAX);
    else if (flag == "--tokens")
      options.tokens = parse_count(flag, value, 1, UINT64_MAX);
    else if (flag == "--ngrams")
      options.ngrams = parse_count(flag, value, 1, 1u << 24);
    else if (flag == "--ngram-len")
      options.ngram_len = parse_count(flag, value, 1, 1u << 16);
    else if (flag == "--seed")
      options.seed = parse_count(flag, value, 0, UINT64_MAX);
    else if (flag == "--tokenizer-hash")
      options.tokenizer_hash = parse_count(flag, value, 0, UINT64_MAX);
    else
      usage_error("unknown option " + flag);
  }
  if (options.out.empty()) usage_error("--out is required");
  if (options.vocab == 0) usage_error("--vocab is required");
  if (options.tokens == 0) usage_error("--tokens is required");
  if (options.ngrams * options.ngram_len > (uint64_t{1} << 26))
    usage_error("--ngrams * --ngram-len must be at most 67108864 (the n-gram table is in memory)");
  return options;
}

void write_shard(const Options& options) {
  SplitMix64 rng{options.seed};
  // [ngrams * ngram_len]: n-gram k is entries [k * ngram_len, (k + 1) * ngram_len).
  std::vector<uint32_t> ngrams(options.ngrams * options.ngram_len);
  for (uint32_t& token : ngrams) token = static_cast<uint32_t>(rng.below(options.vocab));

  grass::ShardWriter writer(options.out, {.vocab_size = static_cast<uint32_t>(options.vocab),
                                          .tokenizer_hash = options.tokenizer_hash});
  constexpr uint64_t kChunkTokens = uint64_t{1} << 20;
  std::vector<uint32_t> chunk;
  chunk.reserve(kChunkTokens + options.ngram_len);
  uint64_t remaining = options.tokens;
  while (remaining > 0) {
    chunk.clear();
    while (chunk.size() < kChunkTokens && chunk.size() < remaining) {
      const uint32_t* ngram = &ngrams[rng.below(options.ngrams) * options.ngram_len];
      chunk.insert(chunk.end(), ngram, ngram + options.ngram_len);
    }
    // The last n-gram of the stream may be cut short to hit the requested count exactly.
    if (chunk.size() > remaining) chunk.resize(remaining);
    writer.append(chunk);
    remaining -= chunk.size();
  }
  writer.finish();

  std::printf(
      "%s: %llu tokens, vocab %llu, %llu %llu-grams (seed %llu); "
      "perfect-model loss ~ ln(K)/L = %.4f nats/token, uniform ln(V) = %.4f\n",
      options.out.c_str(), static_cast<unsigned long long>(options.tokens),
      static_cast<unsigned long long>(options.vocab),
      static_cast<unsigned long long>(options.ngrams),
      static_cast<unsigned long long>(options.ngram_len),
      static_cast<unsigned long long>(options.seed),
      std::log(static_cast<double>(options.ngrams)) / static_cast<double>(options.ngram_len),
      std::log(static_cast<double>(options.vocab)));
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse_options(argc, argv);
  try {
    write_shard(options);
  } catch (const grass::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
