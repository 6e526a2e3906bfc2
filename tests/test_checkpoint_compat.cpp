// Checkpoints keep loading across engine versions: tests/fixtures/checkpoint_v1 holds a GRASS
// checkpoint (bf16-mixed: master copy, AdamW and GRASS moments, σ, ρ, the counters in
// grass_targets) written at step 2 by the engine before the optimizer-step redesign, that run's
// metrics.jsonl, and the checksums of the step-4 checkpoint that engine went on to write.
// Today's engine must resume it and write the same bytes. That engine ran with 2 OpenMP threads,
// and a CPU run's last bits depend on the thread count (docs/architecture.md, "Thread count and
// bits"), so the resumed run takes 2 threads too, whatever the machine has.
#include <catch2/catch.hpp>
#include <omp.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "io/hash.h"
#include "test_util.h"
#include "train/trainer.h"

using namespace grass;
namespace fs = std::filesystem;
using nlohmann::json;

TEST_CASE("a checkpoint of the engine before the step redesign resumes to the same bytes",
          "[checkpoint]") {
  const std::string fixture = std::string(GRASS_SOURCE_DIR) + "/tests/fixtures/checkpoint_v1";
  const json expected = json::parse(std::ifstream(fixture + "/expected.json"));
  const test::TempDir dir("grass_test_checkpoint_compat");
  fs::copy_file(fixture + "/shard.bin", dir.file("shard.bin"));
  const std::string root = dir.file("out/checkpoints");
  fs::create_directories(root);
  fs::copy(fixture + "/step_00000002", root + "/step_00000002");
  fs::copy_file(fixture + "/metrics.jsonl", dir.file("out/metrics.jsonl"));  // cut back to step 2

  json run = expected["run"];
  run["optimizer"]["rho_in_update"] = true;  // that engine's update; no refresh in steps 3 and 4
  run["data"]["train"] = dir.file("shard.bin");
  run["out_dir"] = dir.file("out");
  const int threads = omp_get_max_threads();
  omp_set_num_threads(2);
  const TrainResult result = train(parse_run_config(run, "checkpoint_v1 run"));
  omp_set_num_threads(threads);
  CHECK(result.first_step == 2);
  REQUIRE(result.losses.size() == 2);
  CHECK(result.losses[0] == expected["step_4"]["losses"][2].get<double>());
  CHECK(result.losses[1] == expected["step_4"]["losses"][3].get<double>());
  for (const char* file : {"model.safetensors", "state.safetensors", "state.json"}) {
    INFO(file);
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx",
                  (unsigned long long)fnv1a64_file(root + "/step_00000004/" + file));
    CHECK(hash == expected["step_4"][file].get<std::string>());
  }
}
