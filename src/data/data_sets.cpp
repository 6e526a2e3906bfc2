#include "src/data/data_sets.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>

#include "src/core/error.h"
#include "src/core/format.h"
#include "src/io/hash.h"
#include "src/io/untrusted_json.h"

namespace grass {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kManifestSuffix = ".manifest.json";
constexpr size_t kMaxManifestBytes = size_t{64} << 20;  // ~300 bytes a shard: far past any real one

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

bool is_manifest_name(const std::string& path) { return path.ends_with(kManifestSuffix); }

std::string in_quotes(const std::string& s) { return "\"" + s + "\""; }

// A manifest's shards, each checked to exist with the byte size its recorded token count needs.
std::vector<ShardSource> manifest_shards(const std::string& where, const std::string& manifest) {
  json m;
  try {
    m = read_untrusted_json_file(manifest, kMaxManifestBytes);
  } catch (const UserError& e) {
    throw UserError(where + ": " + e.what());
  }
  const auto invalid = [&](const std::string& what) {
    return UserError(where + ": " + manifest + ": not a grass prepare manifest (" + what +
                     "); name the shards themselves, or the manifest grass prepare wrote");
  };
  if (!m.is_object() || m.value("format", json()) != "grass-prepare")
    throw invalid("no \"format\": \"grass-prepare\"");
  const json* vocab = m.contains("tokenizer") && m["tokenizer"].is_object() &&
                              m["tokenizer"].contains("vocab_size")
                          ? &m["tokenizer"]["vocab_size"]
                          : nullptr;
  if (!vocab || !vocab->is_number_unsigned() || *vocab == 0 || *vocab > UINT32_MAX)
    throw invalid("no positive tokenizer.vocab_size");
  const uint32_t token_bytes = shard_token_bytes(vocab->get<uint32_t>());
  if (!m.contains("shards") || !m["shards"].is_array() || m["shards"].empty())
    throw invalid("no list of shards");

  const fs::path dir = fs::path(manifest).parent_path();
  std::vector<ShardSource> shards;
  for (size_t i = 0; i < m["shards"].size(); ++i) {
    const json& entry = m["shards"][i];
    const std::string item = "shards[" + std::to_string(i) + "]";
    if (!entry.is_object() || !entry.contains("file") || !entry["file"].is_string() ||
        entry["file"].get<std::string>().empty())
      throw invalid(item + " has no \"file\"");
    if (!entry.contains("tokens") || !entry["tokens"].is_number_unsigned() ||
        entry["tokens"].get<uint64_t>() > (UINT64_MAX - kShardHeaderBytes) / token_bytes)
      throw invalid(item + " has no valid \"tokens\" count");
    const std::string path = (dir / entry["file"].get<std::string>()).string();
    const uint64_t tokens = entry["tokens"].get<uint64_t>();
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
      throw UserError(where + ": " + manifest + " lists " + path +
                      ", which is missing; restore it, or re-run grass prepare" +
                      relative_path_note(path));
    const uint64_t expected = kShardHeaderBytes + tokens * token_bytes;
    const uint64_t found = fs::file_size(path, ec);
    if (ec || found != expected)
      throw UserError(where + ": " + manifest + " records " + std::to_string(tokens) +
                      " tokens (" + std::to_string(expected) + " bytes) for " + path +
                      ", but the file has " + (ec ? "an unknown size" : std::to_string(found) +
                      " bytes") + "; the shards changed since grass prepare wrote the "
                      "manifest: re-run it");
    shards.push_back({path, manifest, tokens});
  }
  return shards;
}

// A directory's shards: its one manifest's, else its "*.bin" files.
std::vector<ShardSource> directory_shards(const std::string& where, const std::string& dir) {
  std::vector<std::string> manifests, bins;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code unreadable;  // a dangling link, say: not a shard
    if (!it->is_regular_file(unreadable)) continue;
    const std::string path = it->path().string();
    if (is_manifest_name(path)) manifests.push_back(path);
    else if (path.ends_with(".bin")) bins.push_back(path);
  }
  if (ec) throw UserError(where + ": " + dir + ": cannot list the directory: " + ec.message());
  std::sort(manifests.begin(), manifests.end());
  std::sort(bins.begin(), bins.end());
  if (manifests.size() == 1) return manifest_shards(where, manifests.front());
  if (manifests.size() > 1) {
    std::string names;
    for (const std::string& m : manifests)
      names += (names.empty() ? "" : ", ") + fs::path(m).filename().string();
    throw UserError(where + ": the directory " + dir + " holds " +
                    std::to_string(manifests.size()) + " manifests (" + names +
                    "), one per prepared set; name the one to use, e.g. " +
                    in_quotes(manifests.front()));
  }
  if (bins.empty())
    throw UserError(where + ": the directory " + dir + " holds no *.bin shard and no " +
                    "manifest; give shards, a glob such as " +
                    in_quotes((fs::path(dir) / "*.bin").string()) + " or a manifest");
  std::vector<ShardSource> shards;
  for (std::string& path : bins) shards.push_back({std::move(path), "", std::nullopt});
  return shards;
}

std::vector<ShardSource> glob_shards(const std::string& where, const std::string& pattern) {
  glob_t matches{};
  const int rc = ::glob(pattern.c_str(), GLOB_NOSORT, nullptr, &matches);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
  globfree(&matches);
  if (rc != 0 && rc != GLOB_NOMATCH)
    throw UserError(where + ": cannot expand " + pattern + " (a directory on its way is " +
                    "unreadable)");
  // glob sorts by the locale's collation; byte order is the same on every machine.
  std::sort(paths.begin(), paths.end());
  std::vector<ShardSource> shards;
  std::error_code ec;
  for (std::string& path : paths)
    if (fs::is_regular_file(path, ec)) shards.push_back({std::move(path), "", std::nullopt});
  if (shards.empty())
    throw UserError(where + ": no shard matches " + pattern + relative_path_note(pattern));
  return shards;
}

std::vector<ShardSource> spec_shards(const std::string& where, const std::string& spec) {
  std::error_code ec;
  const fs::file_status status = fs::status(spec, ec);
  if (fs::is_directory(status)) return directory_shards(where, spec);
  if (fs::exists(status)) {
    if (is_manifest_name(spec)) return manifest_shards(where, spec);
    return {{spec, "", std::nullopt}};
  }
  if (has_glob_chars(spec)) return glob_shards(where, spec);
  throw UserError(where + ": not found: " + spec + relative_path_note(spec));
}

// The tokenizer a shard was made with, as far as its header says: its hash and vocabulary.
bool same_tokenizer(const ShardInfo& a, const ShardInfo& b) {
  return a.tokenizer_hash == b.tokenizer_hash && a.vocab_size == b.vocab_size;
}

std::string tokenizer_of(const ShardInfo& info) {
  return "tokenizer_hash " + hex64(info.tokenizer_hash) + ", vocab_size " +
         std::to_string(info.vocab_size);
}

// The first shard of `set` that records a tokenizer, after checking that every other shard that
// records one records the same; null when none does.
const ShardInfo* one_tokenizer(const TokenStream& set) {
  const ShardInfo* first = nullptr;
  for (const ShardReader& shard : set.shards()) {
    const ShardInfo& info = shard.info();
    if (info.tokenizer_hash == 0) continue;
    if (!first) {
      first = &info;
    } else if (!same_tokenizer(info, *first)) {
      throw UserError(set.key() + ": " + info.path + " was made with another tokenizer than " +
                      first->path + " (" + tokenizer_of(info) + " against " +
                      tokenizer_of(*first) + "); every shard of " + set.key() +
                      " must come from one tokenizer: prepare them all with the same one");
    }
  }
  return first;
}

void check_tokenizer_file(const TokenStream& set, const std::string& tokenizer, uint64_t hash) {
  for (const ShardReader& shard : set.shards()) {
    const ShardInfo& info = shard.info();
    if (info.tokenizer_hash == hash) continue;
    if (info.tokenizer_hash == 0)
      throw UserError(set.key() + ": " + info.path + " records no tokenizer (tokenizer_hash 0, "
                      "e.g. synthetic data) but data.tokenizer names " + tokenizer +
                      "; prepare the data with that tokenizer or drop data.tokenizer");
    throw UserError(set.key() + ": " + info.path + " was made with another tokenizer than " +
                    "data.tokenizer " + tokenizer + " (shard tokenizer_hash " +
                    hex64(info.tokenizer_hash) + ", tokenizer file " + hex64(hash) +
                    "); re-run grass prepare with " + tokenizer +
                    " or set data.tokenizer to the tokenizer the shards were made with");
  }
}

// How messages name the model config's vocab_size: in its own file, or inline in the run config.
std::string vocab_size_key(const RunConfig& cfg) {
  if (!cfg.model_path.empty()) return cfg.model_path + ": vocab_size";
  return (cfg.source.empty() ? "" : cfg.source + ": ") + "model.vocab_size";
}

}  // namespace

std::vector<ShardSource> expand_data_spec(const std::string& key,
                                          const std::vector<std::string>& specs) {
  if (specs.empty()) throw UserError(key + ": no token shards given");
  std::vector<ShardSource> shards;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string where = specs.size() > 1 ? key + "[" + std::to_string(i) + "]" : key;
    for (ShardSource& shard : spec_shards(where, specs[i])) shards.push_back(std::move(shard));
  }
  return shards;
}

std::vector<std::string> check_run_data(const RunConfig& cfg, const TokenStream* train,
                                        const TokenStream* val) {
  std::vector<const TokenStream*> sets;
  for (const TokenStream* set : {train, val})
    if (set) sets.push_back(set);

  const ShardInfo* train_tokenizer = train ? one_tokenizer(*train) : nullptr;
  const ShardInfo* val_tokenizer = val ? one_tokenizer(*val) : nullptr;
  if (train_tokenizer && val_tokenizer && !same_tokenizer(*train_tokenizer, *val_tokenizer))
    throw UserError(val->key() + "'s " + val_tokenizer->path + " was made with another " +
                    "tokenizer than " + train->key() + "'s " + train_tokenizer->path + " (" +
                    tokenizer_of(*val_tokenizer) + " against " + tokenizer_of(*train_tokenizer) +
                    "); validation must be tokenized as training was: prepare both with the "
                    "same tokenizer");

  if (!cfg.tokenizer.empty()) {
    std::error_code ec;
    if (!fs::exists(cfg.tokenizer, ec))
      throw UserError("data.tokenizer: not found: " + cfg.tokenizer +
                      relative_path_note(cfg.tokenizer));
    const uint64_t hash = fnv1a64_file(cfg.tokenizer);
    for (const TokenStream* set : sets) check_tokenizer_file(*set, cfg.tokenizer, hash);
  }

  // The largest vocabulary a shard records, and where.
  const ShardInfo* widest = nullptr;
  const TokenStream* widest_set = nullptr;
  for (const TokenStream* set : sets)
    for (const ShardReader& shard : set->shards())
      if (!widest || shard.info().vocab_size > widest->vocab_size) {
        widest = &shard.info();
        widest_set = set;
      }
  const auto model_vocab = static_cast<uint32_t>(cfg.model.vocab_size);
  std::vector<std::string> warnings;
  if (widest) {
    const std::string tokenizer_vocab = "the tokenizer's vocabulary of " +
                                        std::to_string(widest->vocab_size) + " tokens (" +
                                        widest_set->key() + "'s " + widest->path + ")";
    if (model_vocab < widest->vocab_size)
      throw UserError(vocab_size_key(cfg) + " " + std::to_string(model_vocab) +
                      " is smaller than " + tokenizer_vocab + ": its ids from " +
                      std::to_string(model_vocab) + " up have no embedding row; use a model "
                      "whose vocab_size is at least " + std::to_string(widest->vocab_size));
    if (model_vocab > widest->vocab_size)
      warnings.push_back(vocab_size_key(cfg) + " " + std::to_string(model_vocab) +
                         " is larger than " + tokenizer_vocab + ": the embedding's " +
                         std::to_string(model_vocab - widest->vocab_size) +
                         " extra rows are never trained (harmless when the vocabulary is padded "
                         "on purpose, as Hugging Face's LLaMA does)");
  }

  for (const TokenStream* set : sets)
    for (const ShardReader& shard : set->shards()) {
      const ShardInfo& info = shard.info();
      // The writer keeps every token below the shard's vocab_size (<= the model's here), so a
      // token at or above it means the token data itself is damaged.
      if (const auto position = shard.find_first_token_at_least(info.vocab_size))
        throw UserError(info.path + ": token id " + std::to_string(shard.token(*position)) +
                        " at position " + std::to_string(*position) +
                        " is out of range (shard vocab_size " + std::to_string(info.vocab_size) +
                        ", model vocab_size " + std::to_string(model_vocab) +
                        "); the shard is corrupt: re-create it");
    }
  return warnings;
}

}  // namespace grass
