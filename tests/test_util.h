// Helpers the CPU test files share: temporary directories, whole files, random token streams,
// shards on disk, the message of an expected UserError, and a CPU model's buffers as floats.
#pragma once
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/core/error.h"
#include "src/data/shard.h"
#include "src/model/llama.h"

namespace grass {

// What tests read of a model that its interface does not offer (LlamaModel befriends it).
struct ModelInternals {
  static const void* logits(const LlamaModel& m) { return m.logits_; }
};

}  // namespace grass

namespace grass::test {

// A model's buffers as the CPU backend's fp32 memory, to read or write in place: the weights
// [num_stored_params], the dense gradients [num_dense_grads], tensor t's gradient (null for a
// projected tensor) and the logits of the last forward [B, T, V] (dlogits after backward()).
inline float* cpu_floats(const LlamaModel& m, const void* buffer) {
  if (m.storage().cuda) throw InternalError("a model's buffers as floats: the CPU backend's only");
  return static_cast<float*>(const_cast<void*>(buffer));
}
inline float* params(LlamaModel& m) { return cpu_floats(m, m.weights()); }
inline float* grads(LlamaModel& m) { return cpu_floats(m, m.grads_buffer()); }
inline float* cpu_grad(LlamaModel& m, const ParamTensor& t) {
  return t.dense() ? grads(m) + t.grad_offset : nullptr;
}
inline const float* logits(const LlamaModel& m) { return cpu_floats(m, ModelInternals::logits(m)); }

// A fresh directory per test case, removed afterwards: "<tmp>/<prefix>_<pid>_<n>", where the
// prefix names the test file, so a leftover directory says which file left it.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix) {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// A whole file's bytes ("" when it cannot be read), and a JSON file parsed.
inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
inline nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(read_bytes(path));
}

// n tokens drawn uniformly from [0, vocab), the same for the same seed.
inline std::vector<uint32_t> random_tokens(size_t n, uint32_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint32_t> dist(0, vocab - 1);
  std::vector<uint32_t> tokens(n);
  for (uint32_t& t : tokens) t = dist(rng);
  return tokens;
}

// Writes a finished shard and returns its path.
inline std::string write_shard(const std::string& path, const std::vector<uint32_t>& tokens,
                               const ShardSpec& spec) {
  ShardWriter writer(path, spec);
  writer.append(tokens);
  writer.finish();
  return path;
}

// The message of the UserError that f throws; fails the test if it throws none.
template <typename F>
std::string user_error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  FAIL("expected a grass::UserError");
  return "";
}

}  // namespace grass::test
