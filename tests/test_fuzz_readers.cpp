// Hostile input for the readers of untrusted files: a deterministic mutation loop (bit flips,
// interesting bytes and numbers, cut, repeated and spliced ranges, a rewritten length field)
// over a valid safetensors file, a valid checkpoint and a Hugging Face index. Every mutant must be
// either accepted, with every tensor inside the file, or refused with a grass::UserError: never
// a crash, another exception, or a partly restored state. Iteration i of a target is a pure
// function of (target, i); a failure prints both, so it replays. Each loop stops after its
// iterations or its time budget, whichever comes first, to stay a few seconds in CI.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/data/loader.h"
#include "src/io/checkpoint.h"
#include "src/io/hash.h"
#include "src/io/hf_model_dir.h"
#include "src/io/safetensors.h"
#include "src/train/checkpointing.h"
#include "src/train/training_state.h"
#include "tests/test_util.h"

using namespace grass;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using test::read_bytes;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// One deterministic mutation of `in`; `what` says which, for the failure message.
std::string mutate(const std::string& in, std::mt19937_64& rng, std::string& what) {
  std::string s = in;
  const auto pick = [&](size_t n) { return n ? size_t(rng() % n) : 0; };
  static const char kBytes[] = {0, '\xff', '\x7f', '\x80', '0', '9', '"', '[', ']', '{', '}',
                                ',', ':', '-', 'e', '.', ' ', '\\', 'n', 't'};
  static const char* const kNumbers[] = {"0", "-1", "1", "4294967296", "9223372036854775807",
                                         "18446744073709551615", "18446744073709551616", "1e30",
                                         "2.5", "-0", "65536", "null", "[]", "{}", "\"F32\"",
                                         "\"BF16\"", "\"U8\"", "\"I32\"", "true"};
  const int kind = int(rng() % 9);
  switch (kind) {
    case 0: {  // flip a bit
      const size_t at = pick(s.size());
      if (!s.empty()) s[at] = char(s[at] ^ (1 << (rng() % 8)));
      what = "flip bit at " + std::to_string(at);
      break;
    }
    case 1: {  // an interesting byte
      const size_t at = pick(s.size());
      if (!s.empty()) s[at] = kBytes[pick(sizeof kBytes)];
      what = "set byte at " + std::to_string(at);
      break;
    }
    case 2: {  // cut the file
      const size_t at = pick(s.size() + 1);
      s.resize(at);
      what = "truncate to " + std::to_string(at);
      break;
    }
    case 3: {  // delete a range
      const size_t at = pick(s.size()), n = 1 + pick(std::min<size_t>(64, s.size() - at + 1));
      s.erase(at, n);
      what = "erase " + std::to_string(n) + " at " + std::to_string(at);
      break;
    }
    case 4: {  // repeat a range elsewhere
      const size_t from = pick(s.size()), n = 1 + pick(64), to = pick(s.size() + 1);
      s.insert(to, s.substr(from, n));
      what = "copy " + std::to_string(n) + " from " + std::to_string(from) + " to " + std::to_string(to);
      break;
    }
    case 5:
    case 6: {  // replace a number (or a quoted token) in JSON text by an interesting one
      std::vector<std::pair<size_t, size_t>> tokens;
      for (size_t i = 0; i < s.size();) {
        if ((s[i] >= '0' && s[i] <= '9') || s[i] == '"') {
          size_t j = i + 1;
          if (s[i] == '"') {
            while (j < s.size() && s[j] != '"') j++;
            j = std::min(j + 1, s.size());
          } else {
            while (j < s.size() && s[j] >= '0' && s[j] <= '9') j++;
          }
          tokens.push_back({i, j - i});
          i = j;
        } else {
          i++;
        }
      }
      if (tokens.empty()) break;
      const auto [at, n] = tokens[pick(tokens.size())];
      const char* by = kNumbers[pick(std::size(kNumbers))];
      s.replace(at, n, by);
      what = "replace token at " + std::to_string(at) + " by " + by;
      break;
    }
    case 7: {  // the safetensors length field
      if (s.size() < 8) break;
      uint64_t len;
      std::memcpy(&len, s.data(), 8);
      const uint64_t choices[] = {0, 1, len + 1, len - 1, s.size() - 8, s.size() - 7, s.size(),
                                  ~uint64_t(0), uint64_t(1) << 63, 100'000'001};
      const uint64_t v = choices[pick(std::size(choices))];
      std::memcpy(s.data(), &v, 8);
      what = "length field " + std::to_string(v);
      break;
    }
    default: {  // splice two mutations
      std::string first, second;
      s = mutate(mutate(s, rng, first), rng, second);
      what = first + " then " + second;
    }
  }
  return s;
}

// Runs `body(i, rng)` for up to `iterations`, within `seconds`; returns the iterations run.
template <typename Body>
int fuzz_loop(uint64_t target, int iterations, double seconds, Body body) {
  const auto start = std::chrono::steady_clock::now();
  int i = 0;
  for (; i < iterations; i++) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds)
      break;
    std::mt19937_64 rng(target * 1000003 + uint64_t(i));
    body(i, rng);
  }
  return i;
}

// Opens a mutant and reads everything it claims to hold. true: accepted, false: UserError.
bool read_safetensors(const std::string& path, size_t file_size) {
  try {
    const SafetensorsFile file(path);
    const std::byte* base = nullptr;
    std::vector<std::pair<const std::byte*, size_t>> spans;
    for (const std::string& name : file.names()) {
      const TensorEntry& e = file.get(name);
      REQUIRE(safetensors_dtype_bytes(e.dtype) * size_t(e.numel()) == e.bytes.size());
      if (!e.bytes.empty()) spans.push_back({e.bytes.data(), e.bytes.size()});
      try {
        if (e.dtype.starts_with("I")) file.read_i64(name);
        else file.read_f64(name);
      } catch (const UserError&) {  // a dtype these conversions do not take
      }
    }
    std::sort(spans.begin(), spans.end());
    for (size_t k = 0; k < spans.size(); k++) {
      if (k == 0) base = spans[k].first;
      if (k > 0) REQUIRE(spans[k - 1].first + spans[k - 1].second <= spans[k].first);
    }
    if (!spans.empty()) REQUIRE(size_t(spans.back().first + spans.back().second - base) <= file_size);
    return true;
  } catch (const UserError&) {
    return false;
  }
}

// Recomputes the manifest of a checkpoint after a file changed, as a forger would.
void reseal(const std::string& dir) {
  json m = json::parse(read_bytes(dir + "/manifest.json"));
  for (json& f : m["files"]) {
    const std::string path = dir + "/" + f["name"].get<std::string>();
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", crc32_file(path));
    f["bytes"] = fs::file_size(path);
    f["crc32"] = crc;
  }
  write_bytes(dir + "/manifest.json", m.dump(2));
}

// FNV-1a of every buffer a checkpoint restores: "nothing copied" means this does not change.
uint64_t state_hash(const Arena& arena) {
  uint64_t h = kFnv1a64OffsetBasis;
  for (const Arena::Block& b : arena.blocks())
    if (b.cat == MemCategory::Weights || b.cat == MemCategory::Optimizer)
      h = fnv1a64(b.ptr, size_t(b.bytes), h);
  return h;
}

}  // namespace

TEST_CASE("fuzz: the safetensors reader refuses hostile files with a UserError", "[fuzz][safetensors]") {
  const test::TempDir dir("grass_test_fuzz");
  const std::string seed_path = dir.file("seed.safetensors");
  {
    std::vector<float> w(15, 0.5f);
    std::vector<int32_t> idx = {3, 1, 4, 1};
    std::vector<uint16_t> half = {0x3f80, 0xc020, 0x4049, 0};
    std::vector<double> one = {2.0};
    std::vector<int64_t> big = {1, -2, 3};
    SafetensorsWriter writer;
    writer.add("model.w", "F32", {3, 5}, w.data(), w.size() * 4);
    writer.add("idx", "I32", {4}, idx.data(), idx.size() * 4);
    writer.add("half", "BF16", {2, 2}, half.data(), half.size() * 2);
    writer.add("one", "F64", {}, one.data(), 8);
    writer.add("big", "I64", {3}, big.data(), big.size() * 8);
    writer.add("empty", "F32", {0, 3}, nullptr, 0);
    writer.write(seed_path, {{"format", "pt"}, {"note", "seed"}});
  }
  const std::string seed = read_bytes(seed_path);
  REQUIRE(read_safetensors(seed_path, seed.size()));
  const std::string path = dir.file("mutant.safetensors");
  int accepted = 0, refused = 0;
  const int ran = fuzz_loop(1, 4000, 3.0, [&](int i, std::mt19937_64& rng) {
    std::string what;
    const std::string mutant = mutate(seed, rng, what);
    write_bytes(path, mutant);
    INFO("safetensors iteration " << i << ": " << what);
    try {
      (read_safetensors(path, mutant.size()) ? accepted : refused)++;
    } catch (const UserError&) {
      throw;
    } catch (const std::exception& e) {
      FAIL("not a UserError: " << e.what());
    }
  });
  INFO(ran << " mutants: " << accepted << " accepted, " << refused << " refused");
  CHECK(ran >= 200);
  CHECK(refused > ran / 4);  // the mutations reach the checks, not only the tensor data
}

TEST_CASE("fuzz: the checkpoint reader and restore refuse hostile checkpoints", "[fuzz][checkpoint]") {
  const test::TempDir dir("grass_test_fuzz");
  const std::string shard = dir.file("train.bin");
  test::write_shard(shard, test::random_tokens(3000, 64, 2), {.vocab_size = 64});
  const json run = {{"model", {{"hidden_size", 16}, {"intermediate_size", 24},
                               {"num_attention_heads", 2}, {"num_hidden_layers", 1},
                               {"vocab_size", 64}, {"max_position_embeddings", 16}}},
                    {"data", {{"train", shard}}},
                    {"optimizer", {{"name", "grass"}, {"rank", 4}}},
                    {"seq_len", 8}, {"out_dir", dir.file("out")}};
  const RunConfig cfg = parse_run_config(run, "");
  Arena arena;
  TrainingState state = build_training_state(cfg, arena, default_cpu_backend());
  state.model->init_weights(1);
  TokenLoader loader(cfg.train_files, 1, 8);
  const std::string good = save_checkpoint(cfg, arena, state, loader, 3, 4);

  // σ out of range behind a valid manifest: refused by name, not used as an index.
  {
    const std::string copy = dir.file("sigma/step_00000003");
    fs::create_directories(copy);
    fs::copy(good, copy);
    std::string bytes = read_bytes(copy + "/state.safetensors");
    uint64_t header_len;
    std::memcpy(&header_len, bytes.data(), 8);
    const json header = json::parse(bytes.substr(8, header_len));
    const uint64_t begin = header["model.layers.0.self_attn.q_proj.weight.grass.sigma"]["data_offsets"][0];
    const int32_t bad = 1 << 20;
    std::memcpy(bytes.data() + 8 + header_len + begin, &bad, 4);
    write_bytes(copy + "/state.safetensors", bytes);
    reseal(copy);
    const uint64_t before = state_hash(arena);
    CHECK_THAT(test::user_error_of([&] {
                 restore_checkpoint(Checkpoint(copy), cfg, arena, state, loader);
               }),
               Catch::Contains("grass.sigma: index 1048576 at position 0 lies outside [0, 16)"));
    CHECK(state_hash(arena) == before);
  }

  const std::vector<std::string> files = {"manifest.json", "state.json", "model.safetensors",
                                          "state.safetensors", "config.json"};
  const std::string mutant_dir = dir.file("m/step_00000003");
  fs::create_directories(mutant_dir);
  std::vector<std::string> originals;
  for (const std::string& f : files) {
    originals.push_back(read_bytes(good + "/" + f));
    write_bytes(mutant_dir + "/" + f, originals.back());
  }
  int opened_unsealed = 0, restored = 0, refused = 0;
  const int ran = fuzz_loop(2, 1500, 4.0, [&](int i, std::mt19937_64& rng) {
    const size_t k = size_t(rng() % files.size());
    const bool sealed = files[k] != "manifest.json" && rng() % 4 != 0;  // mostly forged
    std::string what;
    const std::string mutant = mutate(originals[k], rng, what);
    write_bytes(mutant_dir + "/" + files[k], mutant);
    if (sealed) reseal(mutant_dir);
    INFO("checkpoint iteration " << i << ": " << files[k] << (sealed ? " (resealed)" : "") << ": "
                                 << what);
    const uint64_t before = state_hash(arena);
    try {
      const Checkpoint checkpoint(mutant_dir);
      if (!sealed && mutant != originals[k] && files[k] != "manifest.json") opened_unsealed++;
      restore_checkpoint(checkpoint, cfg, arena, state, loader);
      restored++;
    } catch (const UserError&) {
      refused++;
      CHECK(state_hash(arena) == before);  // nothing was copied
    } catch (const std::exception& e) {
      FAIL("not a UserError: " << e.what());
    }
    for (size_t j = 0; j < files.size(); j++) write_bytes(mutant_dir + "/" + files[j], originals[j]);
  });
  INFO(ran << " mutants: " << restored << " restored, " << refused << " refused");
  CHECK(ran >= 100);
  CHECK(opened_unsealed == 0);  // a changed data file never passes its checksum
  CHECK(refused > ran / 4);
}

TEST_CASE("fuzz: the Hugging Face index reader refuses hostile indexes", "[fuzz][init_from]") {
  const test::TempDir dir("grass_test_fuzz");
  std::vector<float> a(6, 1.0f), b(4, 2.0f);
  SafetensorsWriter first, second;
  first.add("model.a", "F32", {2, 3}, a.data(), 24);
  second.add("model.b", "F32", {4}, b.data(), 16);
  first.write(dir.file("model-00001-of-00002.safetensors"));
  second.write(dir.file("model-00002-of-00002.safetensors"));
  const std::string index =
      json({{"metadata", {{"total_size", 40}}},
            {"weight_map", {{"model.a", "model-00001-of-00002.safetensors"},
                            {"model.b", "model-00002-of-00002.safetensors"}}}})
          .dump();
  const std::string index_path = dir.file("model.safetensors.index.json");
  write_bytes(index_path, index);
  REQUIRE(HfModelWeights(dir.path.string()).names().size() == 2);
  int refused = 0;
  const int ran = fuzz_loop(3, 1500, 2.0, [&](int i, std::mt19937_64& rng) {
    std::string what;
    write_bytes(index_path, mutate(index, rng, what));
    INFO("index iteration " << i << ": " << what);
    try {
      const HfModelWeights weights(dir.path.string());
      for (const std::string& name : weights.names()) weights.file_of(name).get(name);
    } catch (const UserError&) {
      refused++;
    } catch (const std::exception& e) {
      FAIL("not a UserError: " << e.what());
    }
  });
  INFO(ran << " mutants, " << refused << " refused");
  CHECK(ran >= 100);
  CHECK(refused > ran / 4);
}
