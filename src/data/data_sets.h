// A run's data sets: what data.train and data.val name, expanded to token shards, and the one
// check that a run's shards belong together, to the model and to the run's tokenizer.
//
// A data spec is a list of entries (a config's single string is a list of one), each of them
//   - a shard file;
//   - a manifest, "<prefix>.manifest.json" as grass prepare writes it: its shards, in its order,
//     each of which must exist with the size and token count the manifest records;
//   - a directory: the manifest in it when it holds exactly one, else every "*.bin" file directly
//     in it (none, or several manifests, is an error: name the one to use);
//   - a glob ("c4/tokens/train_*.bin", * ? and [...]): every regular file it matches.
// Directories and globs list their files in byte order of the names, so the same files always
// make the same stream (a resumed run must see its shards in the same order). A name that exists
// is taken as written even when it holds glob characters. The entries' shards are concatenated
// in list order. Expansion happens where the shards are opened (TokenStream), never while a config
// is parsed: `grass mem` plans configs whose data lives elsewhere, and config.json keeps the spec
// as written.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/config/config.h"
#include "src/data/loader.h"

namespace grass {

// One shard of an expanded spec.
struct ShardSource {
  std::string path;
  std::string manifest;                   // the manifest that listed it; "" when none did
  std::optional<uint64_t> manifest_tokens;  // the token count that manifest records for it
};

// Expands `specs` (the value of config key `key`, "data.train" or "data.val") to shards. UserError
// naming the key (and the list element, "data.train[2]", when there are several), the spec and
// what to do, for: a path that does not exist, a glob or directory without shards, a directory
// with several manifests, a manifest that is not one, or one whose shards are missing or have
// other sizes than it records. Relative paths resolve against the working directory, and every
// "not found" says so.
std::vector<ShardSource> expand_data_spec(const std::string& key,
                                          const std::vector<std::string>& specs);

// The run's data checked in one place, before training or evaluation reads a token (train or val
// may be null: `grass eval` opens only data.val). UserError, one line naming the keys and shards:
//   - two shards of one set, or a data.val shard and a data.train shard, made with different
//     tokenizers (both recording one: shards with tokenizer_hash 0, e.g. synthetic, match any);
//   - with data.tokenizer, a shard not made with that file (or recording none);
//   - a model vocab_size smaller than a shard's vocabulary (naming the model config's key);
//   - a token id at or above its shard's vocab_size (damaged data; this reads every token).
// Returns the warnings, one line each without the "warning: " prefix, for the caller to print
// once: a model vocab_size larger than the tokenizer's (the extra embedding rows never train;
// Hugging Face's LLaMA pads its vocabulary on purpose, so it is allowed).
std::vector<std::string> check_run_data(const RunConfig& cfg, const TokenStream* train,
                                        const TokenStream* val);

}  // namespace grass
