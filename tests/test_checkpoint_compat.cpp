// Checkpoints keep loading across engine versions: tests/fixtures/checkpoint_v1 holds a GRASS
// checkpoint (bf16-mixed: master copy, AdamW and GRASS moments, σ, ρ, the counters in
// grass_targets) written at step 2 by the engine before the optimizer-step redesign, that run's
// metrics.jsonl, and the model.safetensors, state.safetensors and state.json of the step-4
// checkpoint that engine went on to write (their FNV-1a hashes in expected.json are the ones it
// recorded). Today's engine resumes step 2 and writes step 4 again.
//
// The same bytes are a promise only for the same computation on the same machine: that engine
// ran on OpenBLAS's SkylakeX kernels with 2 threads, and another kernel family (Haswell on an
// AVX2 machine, Sandybridge) sums the same GEMMs in another order. So what no arithmetic touches
// is checked exactly (every buffer's name, dtype and shape, σ and ρ, state.json), the rest
// within bounds that a misplaced buffer exceeds by orders of magnitude, and the test shows that
// it does: the same resume with two GRASS moments swapped in the old checkpoint must fail them.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/config/config.h"
#include "src/io/checkpoint.h"
#include "src/io/hash.h"
#include "src/io/safetensors.h"
#include "src/train/trainer.h"
#include "tests/test_util.h"

using namespace grass;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kFixture = std::string(GRASS_SOURCE_DIR) + "/tests/fixtures/checkpoint_v1";

// Bounds, from the arithmetic between the checkpoints: one forward per step in fp32 whose widest
// sums have 64 terms (the 64 tokens of a step; hidden 32, ffn 40), where two orders of one sum
// differ by at most 2·64·u ≈ 7.6e-6 of its absolute terms (u = 2^-24), and an Adam step that
// carries a gradient's relative error into its moments and update without amplifying it.
// Measured between SkylakeX, Haswell, Sandybridge and Nehalem kernels: losses within 7e-10,
// state tensors within 2.8e-7 (norm-relative). Swapping two moments moves them by ~1.
constexpr double kLossTolerance = 1e-6;    // relative
constexpr double kStateTolerance = 1e-5;   // ‖a - b‖ / ‖b‖ per fp32 buffer
// model.safetensors holds the bf16 weights (widened to F32): each is the rounding of a master
// weight within the bound above, so it is the reference's value or one bf16 step beside it.

std::vector<float> as_floats(const TensorEntry& e) {
  std::vector<float> v(e.bytes.size() / sizeof(float));
  std::memcpy(v.data(), e.bytes.data(), v.size() * sizeof(float));
  return v;
}

double norm_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); i++) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// One bf16 step (2^-7 of the binade) at the larger magnitude of a and b.
bool within_one_bf16_step(float a, float b) {
  int exponent;
  std::frexp(std::max(std::abs(a), std::abs(b)), &exponent);  // |x| = m·2^exponent, m in [0.5, 1)
  return std::abs(double(a) - b) <= std::ldexp(1.0, exponent - 8);
}

// σ (the selected rows) and ρ (their scales) were set at the last refresh, before step 2:
// steps 3 and 4 only read them.
bool set_at_refresh(const std::string& name) {
  return name.ends_with(".grass.sigma") || name.ends_with(".grass.rho");
}

// How far a step-4 checkpoint is from the old engine's: the largest bound-relative distances.
struct Distance {
  double state = 0;           // max over fp32 buffers of norm_relative_difference / kStateTolerance
  int64_t weights_beyond = 0;  // bf16 weights more than one bf16 step from the reference
};

Distance distance_to_reference(const std::string& dir) {
  Distance d;
  for (const std::string file : {"model.safetensors", "state.safetensors"}) {
    INFO(file);
    const SafetensorsFile got(dir + "/" + file), want(kFixture + "/step_00000004/" + file);
    REQUIRE(got.names() == want.names());
    for (const std::string& name : want.names()) {
      INFO(name);
      const TensorEntry &g = got.get(name), &w = want.get(name);
      REQUIRE(g.dtype == w.dtype);
      REQUIRE(g.shape == w.shape);
      REQUIRE(g.bytes.size() == w.bytes.size());
      if (set_at_refresh(name)) {
        CHECK(std::memcmp(g.bytes.data(), w.bytes.data(), w.bytes.size()) == 0);
        continue;
      }
      const std::vector<float> a = as_floats(g), b = as_floats(w);
      if (file == std::string("model.safetensors")) {
        for (size_t i = 0; i < a.size(); i++) d.weights_beyond += !within_one_bf16_step(a[i], b[i]);
      } else {
        d.state = std::max(d.state, norm_relative_difference(a, b) / kStateTolerance);
      }
    }
  }
  return d;
}

// Copies the fixture's step-2 checkpoint, metrics and shard into `dir`, resumes it to step 4
// and returns the run's losses. `swap_moments`: first exchange the first GRASS moments of
// layer 0's and layer 1's q_proj (same shape) in the old checkpoint, as a loader that put
// buffers on the wrong tensors would.
std::vector<double> resume_fixture(const test::TempDir& dir, bool swap_moments) {
  const json expected = test::read_json(kFixture + "/expected.json");
  const std::string root = dir.file("out/checkpoints");
  fs::create_directories(root);
  fs::copy_file(kFixture + "/shard.bin", dir.file("shard.bin"));
  fs::copy_file(kFixture + "/metrics.jsonl", dir.file("out/metrics.jsonl"));  // cut back to step 2
  const std::string old = kFixture + "/step_00000002";
  if (!swap_moments) {
    fs::copy(old, root + "/step_00000002");
  } else {
    const std::string a = "model.layers.0.self_attn.q_proj.weight.grass.m";
    const std::string b = "model.layers.1.self_attn.q_proj.weight.grass.m";
    const SafetensorsFile state(old + "/state.safetensors");
    CheckpointWriter writer(root, 2);
    SafetensorsWriter swapped;
    for (const std::string& name : state.names()) {
      const std::string& source = name == a ? b : name == b ? a : name;
      const TensorEntry& e = state.get(source);
      swapped.add(name, e.dtype, e.shape, e.bytes.data(), e.bytes.size());
    }
    swapped.write(writer.file_path("state.safetensors"), state.metadata());
    writer.add_written("state.safetensors");
    for (const std::string file : {"model.safetensors", "state.json", "config.json"})
      writer.copy_file(file, old + "/" + file);
    writer.commit();
  }
  json run = expected["run"];
  run["optimizer"]["rho_in_update"] = true;  // that engine's update; no refresh in steps 3 and 4
  run["data"]["train"] = dir.file("shard.bin");
  run["out_dir"] = dir.file("out");
  // by name: the checkpoint's config.json spells its shard's path and that engine's update its
  // own way, so rerun into out_dir this would be another run (train/out_dir.h)
  const TrainResult result =
      train(parse_run_config(run, "checkpoint_v1 run"), {.resume = dir.file("out")});
  CHECK(result.first_step == 2);
  REQUIRE(result.losses.size() == 2);
  return result.losses;
}

}  // namespace

TEST_CASE("the old engine's step-4 files in the fixture are the ones it recorded", "[checkpoint]") {
  const json expected = test::read_json(kFixture + "/expected.json");
  for (const std::string file : {"model.safetensors", "state.safetensors", "state.json"}) {
    INFO(file);
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx",
                  (unsigned long long)fnv1a64_file(kFixture + "/step_00000004/" + file));
    CHECK(hash == expected["step_4"][file].get<std::string>());
  }
}

TEST_CASE("a checkpoint of the engine before the step redesign resumes to its step-4 checkpoint",
          "[checkpoint]") {
  const json expected = test::read_json(kFixture + "/expected.json");
  const test::TempDir dir("grass_test_checkpoint_compat");
  const std::vector<double> losses = resume_fixture(dir, /*swap_moments=*/false);
  for (int i = 0; i < 2; i++) {
    const double want = expected["step_4"]["losses"][2 + i].get<double>();
    INFO("step " << 3 + i << ": loss " << losses[i] << ", the old engine's " << want);
    CHECK(std::abs(losses[i] - want) <= kLossTolerance * want);
  }
  const std::string step4 = dir.file("out/checkpoints/step_00000004");
  // the same state.json, but for the keys checkpoints have had since: the moments' format, the
  // attention kernels (the CPU's reference: the engine's) and the head's chunk (the CPU's: all
  // of a micro-batch's rows)
  json state = test::read_json(step4 + "/state.json");
  CHECK(state.value("optimizer_states", "") == "fp32");
  state.erase("optimizer_states");
  CHECK(state["attention"] == json{{"kernel", "grass"}});
  state.erase("attention");
  CHECK(state["head_rows"].is_number_integer());
  state.erase("head_rows");
  CHECK(state == test::read_json(kFixture + "/step_00000004/state.json"));
  const Distance d = distance_to_reference(step4);
  CHECK(d.state <= 1.0);
  CHECK(d.weights_beyond == 0);
}

TEST_CASE("the bounds of the checkpoint test catch two GRASS moments loaded onto each other's "
          "tensors",
          "[checkpoint]") {
  const test::TempDir dir("grass_test_checkpoint_compat");
  resume_fixture(dir, /*swap_moments=*/true);
  const Distance d = distance_to_reference(dir.file("out/checkpoints/step_00000004"));
  INFO("state buffers at " << d.state << " x their bound; " << d.weights_beyond
                           << " bf16 weights beyond one step");
  CHECK(d.state > 100);
  CHECK(d.weights_beyond > 0);
}
