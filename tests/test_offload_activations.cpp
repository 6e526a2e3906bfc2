// offload.activations (model/x_in_ring.h): under per-layer checkpointing each layer's input waits
// for the backward in the host tier or in a file ring on disk, and only three layers' are on the
// device at once. It changes where bytes live, never the numbers: losses, weights and optimizer
// states equal the resident run's bit for bit (the same computation on the same machine), with
// the CPU backend's copy threads and lazy (GRASS_LAZY_COPIES: a copy or file task runs only when
// waited for, a copy's destination NaN until then, so a missing wait, or a file read not ordered
// after its write on the other queue, shows).
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kernels/backend.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/core/error.h"
#include "src/io/activation_file.h"
#include "src/train/memory_plan.h"
#include "src/train/run_resolution.h"
#include "src/train/training_state.h"
#include "tests/named_choice.h"
#include "tests/offload_training.h"

using namespace grass;
using test::LazyCopies;
using test::Trained;
using test::check_plan_is_arena;
using test::train;
namespace fs = std::filesystem;

namespace {

constexpr int kLayers = 6;  // three inputs leave the device, three stay in the ring

RunConfig layer_run(const std::string& optimizer, const std::string& precision, bool fused) {
  RunConfig c;
  c.model.hidden_size = 32;
  c.model.intermediate_size = 40;
  c.model.num_attention_heads = 4;
  c.model.num_key_value_heads = 2;
  c.model.num_hidden_layers = kLayers;
  c.model.vocab_size = test::NgramBatches::V;
  c.model.max_position_embeddings = 64;
  c.micro_batch_size = 2;
  c.total_batch_size = fused ? 2 : 4;  // deferred: two micro-batches a step, the ring reused
  c.seq_len = 16;
  c.precision = test::named<PrecisionChoice>(precision);
  c.fused_update = fused ? Switch::On : Switch::Off;
  c.activation_checkpointing = Checkpointing::Layer;
  c.optimizer.kind = test::named<OptimizerKind>(optimizer);
  c.optimizer.lr = 1e-2;
  c.optimizer.projection.rank = 4;
  c.optimizer.projection.update_interval = 2;  // a refresh inside 4 steps
  c.optimizer.projection.seed = 11;
  return c;
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::string name = (fs::temp_directory_path() / "grass-xin-XXXXXX").string();
    REQUIRE(mkdtemp(name.data()) != nullptr);
    path = name;
  }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("offloaded layer inputs train to the resident run's bits", "[offload][train]") {
  const TempDir dir;
  for (const std::string optimizer : {"adamw", "grass"})
    for (const std::string precision : {"bf16-mixed", "bf16"})
      for (const bool fused : {false, true}) {
        RunConfig cfg = layer_run(optimizer, precision, fused);
        const Trained resident = train(cfg, 4);
        for (const ActivationOffload where : {ActivationOffload::Host, ActivationOffload::Disk})
          for (const bool lazy : {false, true}) {
            INFO(optimizer << " " << precision << (fused ? ", fused" : ", deferred") << ", inputs "
                           << name_of(where) << (lazy ? ", lazy copies" : ", copy threads"));
            cfg.offload = {.optimizer_states = lazy, .activations = where,
                           .disk_dir = dir.path.string()};
            const LazyCopies mode(lazy);
            const Trained offloaded = train(cfg, 4);
            CHECK(offloaded.losses == resident.losses);
            const bool same_state = offloaded.state == resident.state;  // (not printed: MBs)
            CHECK(same_state);
            CHECK(fs::is_empty(dir.path));  // the ring's file was never visible, and is gone
          }
      }
}

TEST_CASE("offloaded layer inputs: plan = arena, the ring on the device, the rest off it",
          "[offload][memory]") {
  for (const ActivationOffload where : {ActivationOffload::Host, ActivationOffload::Disk})
    for (const bool states : {false, true})
      for (const bool fused : {false, true}) {
        INFO("inputs " << name_of(where) << (states ? ", states offloaded" : "")
                       << (fused ? ", fused" : ", deferred"));
        RunConfig cfg = layer_run("grass", "bf16", fused);
        const Storage storage = storage_for(cfg.precision, false);
        const MemoryPlan resident = plan_memory(cfg, storage);
        const TempDir dir;
        cfg.offload = {.optimizer_states = states, .activations = where,
                       .disk_dir = dir.path.string()};
        const MemoryPlan plan = plan_memory(cfg, storage);
        const std::unique_ptr<Backend> backend = make_cpu_backend(storage);
        Arena real(false, *backend, &backend->host_tier());
        const TrainingState s = build_training_state(cfg, real, *backend);
        check_plan_is_arena(plan, real);
        // each layer's input, N x C: all six on the device before; three ring slots now
        const int64_t input = int64_t(cfg.micro_batch_size) * cfg.seq_len *
                              cfg.model.hidden_size * storage.act_bytes;
        const int act = int(MemCategory::Activations), work = int(MemCategory::Workspace);
        CHECK(resident.bytes[size_t(act)] - plan.bytes[size_t(act)] == kLayers * input);
        const MemoryPlan states_only = [&] {
          RunConfig c = cfg;
          c.offload.activations = ActivationOffload::None;
          return plan_memory(c, storage);
        }();
        CHECK(plan.bytes[size_t(work)] - states_only.bytes[size_t(work)] == 3 * input);
        // three inputs leave each micro-batch and come back
        const int64_t moved = 3 * input * cfg.micro_batches_per_rank();
        CHECK(plan.activation_bytes_per_step == moved);
        CHECK(plan.h2d_bytes_per_step - states_only.h2d_bytes_per_step == moved);
        CHECK(plan.d2h_bytes_per_step - states_only.d2h_bytes_per_step == moved);
        // the step-time bound's copies, pass by pass: the inputs out in the forward, back in the
        // backward beside the states' fetches, while the states' write-backs take the other queue
        // (two queues) or follow (one)
        const auto bound = [&](int queues) {
          const LinkModel link{.copy_queues = queues, .tflops = 1e-3};
          return nlohmann::json::parse(memory_plan_json(cfg, storage, link))["step_bound"];
        };
        const double inputs_s = double(moved) / 25e9 + double(plan.disk_bytes_per_step) / 7e9;
        const double states_s = double(states_only.h2d_bytes_per_step) / 25e9;
        CHECK(states_only.h2d_bytes_per_step == states_only.d2h_bytes_per_step);
        for (const int queues : {1, 2}) {
          INFO(queues << " copy queues");
          const nlohmann::json b = bound(queues);
          // states: both ways at once, or in turn; the inputs' two trips are in different passes
          const double fixed_s = (queues == 1 ? 2 : 1) * states_s;
          CHECK(b["copy_s"].get<double>() == Approx(2 * inputs_s + fixed_s).epsilon(1e-12));
          CHECK(b["forward"]["copy_s"].get<double>() == Approx(inputs_s).epsilon(1e-12));
          // the bytes over the link each way, pass by pass (the disk's time is not bytes)
          CHECK(b["forward"]["to_host_bytes"] == moved);
          CHECK(b["forward"]["to_device_bytes"] == 0);
          CHECK(b["backward"]["to_device_bytes"] == plan.h2d_bytes_per_step);
          CHECK(b["backward"]["to_host_bytes"] == plan.d2h_bytes_per_step - moved);
          CHECK(b["backward"]["copy_s"].get<double>() ==
                Approx(inputs_s + fixed_s).epsilon(1e-12));
          // the smallest step whose backward covers its copies, the inputs' growing with it (the
          // forward's, inputs alone, grow no faster than its compute at this rate)
          const double tokens = double(cfg.micro_batches_per_rank()) * cfg.micro_batch_size *
                                cfg.seq_len;
          const double backward_s = b["backward"]["compute_s"].get<double>();
          REQUIRE(b["forward"]["compute_s"].get<double>() > inputs_s);
          const double spare = (backward_s - inputs_s) / tokens;
          REQUIRE(spare > 0);
          CHECK(b["hiding_tokens"].get<int64_t>() == int64_t(std::ceil(fixed_s / spare - 1e-9)));
          CHECK(b["step_s"].get<double>() ==
                Approx(b["forward"]["compute_s"].get<double>() + backward_s).epsilon(1e-12));
        }
        const int64_t host_inputs =
            plan.host_bytes[size_t(act)] - states_only.host_bytes[size_t(act)];
        if (where == ActivationOffload::Host) {
          CHECK(host_inputs == 3 * input);
          CHECK(plan.disk_bytes == 0);
          CHECK(plan.disk_bytes_per_step == 0);
        } else {  // the file holds them, in O_DIRECT-aligned records; one bounce buffer
          CHECK(host_inputs == 0);
          CHECK(plan.host_bytes[size_t(work)] == ActivationFile::stride_for(input) +
                                                     ActivationFile::kAlign);
          CHECK(plan.disk_bytes == 3 * ActivationFile::stride_for(input));
          CHECK(plan.disk_bytes_per_step == moved);
          CHECK(s.model->x_in_ring()->disk_bytes() == plan.disk_bytes);
        }
      }
}

TEST_CASE("offload.activations needs per-layer checkpointing and a usable disk_dir",
          "[offload][config]") {
  const auto parse = [](const std::string& extra) {
    return parse_run_config(nlohmann::json::parse(
                                R"({"model": {"hidden_size": 32, "intermediate_size": 40,
                                     "num_attention_heads": 4, "num_hidden_layers": 6,
                                     "vocab_size": 64, "max_position_embeddings": 64},
                                    "data": {"train": "x.bin"}, "seq_len": 16)" +
                                extra + "}"),
                            "run.json");
  };
  CHECK_THROWS_WITH(parse(R"(, "offload": {"activations": "host"})"),
                    Catch::Contains("run.json: offload.activations") &&
                        Catch::Contains("activation_checkpointing \"layer\""));
  CHECK_THROWS_WITH(parse(R"(, "activation_checkpointing": "layer", "offload": {"activations": "ssd"})"),
                    Catch::Contains("unknown place \"ssd\""));
  CHECK_THROWS_WITH(parse(R"(, "offload": "everything")"),
                    Catch::Contains("offload: expected \"auto\" or an object"));
  const RunConfig automatic = parse(R"(, "offload": "auto", "host_memory_limit": "2GiB")");
  CHECK(automatic.offload.automatic);
  CHECK(automatic.host_memory_limit == int64_t(2) << 30);
  const RunConfig disk = parse(
      R"(, "activation_checkpointing": "layer", "offload": {"activations": "disk", "disk_dir": "/d"})");
  CHECK(disk.offload.activations == ActivationOffload::Disk);
  CHECK(disk.offload.disk_dir == "/d");
  CHECK(parse_run_config(to_json(disk), "again").offload == disk.offload);
  // a directory nobody can create files in (root included): one line naming the key and the path
  CHECK_THROWS_WITH(ActivationFile("/proc/grass-ring", 3, 4096),
                    Catch::StartsWith("offload.disk_dir /proc/grass-ring: cannot create"));
}

TEST_CASE("offload auto picks the placement that fits with the least traffic", "[offload][memory]") {
  RunConfig cfg = layer_run("grass", "bf16", true);
  const Storage storage = storage_for(cfg.precision, false);
  cfg.offload.automatic = true;
  const auto plan_of = [&](bool states, ActivationOffload inputs) {
    RunConfig c = cfg;
    c.offload = {.optimizer_states = states, .activations = inputs};
    return plan_memory(c, storage);
  };
  const MemoryPlan none = plan_of(false, ActivationOffload::None);
  const MemoryPlan states = plan_of(true, ActivationOffload::None);
  const MemoryPlan inputs = plan_of(false, ActivationOffload::Host);
  const MemoryPlan both = plan_of(true, ActivationOffload::Host);
  REQUIRE(states.total < none.total);
  REQUIRE(inputs.total < none.total);
  // no limit: nothing moves
  OffloadChoice c = choose_offload(cfg, storage);
  CHECK_FALSE(c.cfg.offload.any());
  CHECK_FALSE(c.cfg.offload.automatic);
  // a limit the resident run meets: nothing moves
  cfg.memory_limit = none.total;
  CHECK_FALSE(choose_offload(cfg, storage).cfg.offload.any());
  // one byte less: the single move with the least traffic that fits
  cfg.memory_limit = none.total - 1;
  c = choose_offload(cfg, storage);
  const bool states_cheaper = states.h2d_bytes_per_step < inputs.h2d_bytes_per_step;
  CHECK(c.cfg.offload.optimizer_states == states_cheaper);
  CHECK((c.cfg.offload.activations == ActivationOffload::Host) == !states_cheaper);
  CHECK_THAT(c.why, Catch::StartsWith("offload auto: ") && Catch::Contains("fastest placement"));
  // only both together fit
  cfg.memory_limit = both.total;
  c = choose_offload(cfg, storage);
  CHECK(c.cfg.offload.optimizer_states);
  CHECK(c.cfg.offload.activations == ActivationOffload::Host);
  // the host tier capped below the inputs (above one bounce buffer): they go to disk
  const MemoryPlan to_disk = plan_of(true, ActivationOffload::Disk);
  REQUIRE(to_disk.host_total < both.host_total);
  cfg.host_memory_limit = to_disk.host_total;
  c = choose_offload(cfg, storage);
  CHECK(c.cfg.offload.optimizer_states);
  CHECK(c.cfg.offload.activations == ActivationOffload::Disk);
  CHECK(plan_memory(c.cfg, storage).host_total <= cfg.host_memory_limit);
  // nothing fits: the least on the device, said so: states and inputs in the host tier, every
  // layer streamed
  cfg.memory_limit = 1;
  c = choose_offload(cfg, storage);
  CHECK_THAT(c.why, Catch::Contains("no placement fits"));
  RunConfig least = cfg;
  least.offload = {.optimizer_states = true, .activations = ActivationOffload::Host,
                   .layers = kLayers};
  CHECK(c.cfg.offload == least.offload);
  CHECK(plan_memory(c.cfg, storage).total == plan_memory(least, storage).total);
  // and in bf16-mixed no layer streams (its fp32 master copy does not): the least is both
  // moves, with why
  cfg.precision = PrecisionChoice::Bf16Mixed;
  const Storage mixed = storage_for(cfg.precision, false);
  c = choose_offload(cfg, mixed);
  CHECK(c.cfg.offload.layers == 0);
  RunConfig both_moves = cfg;
  both_moves.offload = {.optimizer_states = true, .activations = ActivationOffload::Host};
  CHECK(plan_memory(c.cfg, mixed).total == plan_memory(both_moves, mixed).total);
  CHECK_THAT(c.why, Catch::Contains("(no layer streams: bf16-mixed's fp32 master copy does not"));
}

TEST_CASE("offload auto streams the fewest layers that fit and so does offload.layers auto "
          "beside the placement given", "[offload][memory][stream]") {
  RunConfig cfg = layer_run("grass", "bf16", true);
  cfg.model.num_hidden_layers = 8;  // past the three slots, each streamed layer frees one
  const Storage storage = storage_for(cfg.precision, false);
  const auto plan_with = [&](const OffloadConfig& o) {
    RunConfig c = cfg;
    c.offload = o;
    return plan_memory(c, storage);
  };
  const OffloadConfig both{.optimizer_states = true, .activations = ActivationOffload::Host};
  // the device total with k layers streamed beside both moves: it falls past the slots
  std::vector<int64_t> total;
  for (int k = 0; k <= 8; k++) {
    OffloadConfig o = both;
    o.layers = k;
    total.push_back(plan_with(o).total);
  }
  for (int k = 4; k <= 8; k++) CHECK(total[size_t(k)] < total[size_t(k - 1)]);
  for (int k = 1; k <= 3; k++) CHECK(total[size_t(k)] >= total[0]);  // the slots cost a layer each
  {  // the step-time bound pass by pass: half the layer fetches in each, the write-backs in the
     // backward beside the states, the inputs out in the forward and back in the backward
    RunConfig c = cfg;
    c.offload = both;
    c.offload.layers = 6;
    const MemoryPlan p = plan_memory(c, storage);
    REQUIRE(p.layer_fetch_bytes_per_step > 0);
    REQUIRE(p.layer_write_back_bytes_per_step > 0);
    const double bw = 25e9;
    const double fetch = double(p.layer_fetch_bytes_per_step) / bw;
    const double back = double(p.layer_write_back_bytes_per_step) / bw;
    const double inputs = double(p.activation_bytes_per_step) / bw;
    const double states = double(p.h2d_bytes_per_step - p.activation_bytes_per_step -
                                 p.layer_fetch_bytes_per_step) / bw;
    CHECK(p.d2h_bytes_per_step - p.activation_bytes_per_step - p.layer_write_back_bytes_per_step ==
          p.h2d_bytes_per_step - p.activation_bytes_per_step - p.layer_fetch_bytes_per_step);
    for (const int queues : {1, 2}) {
      INFO(queues << " copy queues");
      const nlohmann::json b = nlohmann::json::parse(memory_plan_json(
          c, storage, LinkModel{.copy_queues = queues, .tflops = 1e-3}))["step_bound"];
      const double forward = queues == 2 ? std::max(fetch / 2, inputs) : fetch / 2 + inputs;
      const double backward = queues == 2 ? std::max(fetch / 2 + inputs + states, states + back)
                                          : fetch / 2 + inputs + 2 * states + back;
      CHECK(b["forward"]["copy_s"].get<double>() == Approx(forward).epsilon(1e-12));
      CHECK(b["backward"]["copy_s"].get<double>() == Approx(backward).epsilon(1e-12));
      // the forward computes a third of the model's FLOPs; the backward the rest and, under
      // layer checkpointing, every layer's forward again
      const double f = b["forward"]["compute_s"].get<double>();
      CHECK(f == Approx(p.forward_flops_per_token * 2 * 16 / 1e9).epsilon(1e-12));
      CHECK(b["backward"]["compute_s"].get<double>() ==
            Approx((p.flops_per_token + p.recompute_flops_per_token) * 2 * 16 / 1e9 - f)
                .epsilon(1e-12));
    }
  }
  cfg.offload.automatic = true;
  for (int k = 4; k <= 8; k++) {
    INFO(k << " layers streamed");
    // the limit that k layers meet and k - 1 do not: auto streams k, beside both moves (every
    // other placement keeps more on the device)
    cfg.memory_limit = total[size_t(k)];
    const OffloadChoice c = choose_offload(cfg, storage);
    CHECK(c.cfg.offload.layers == k);
    CHECK(c.cfg.offload.optimizer_states);
    CHECK(c.cfg.offload.activations == ActivationOffload::Host);
    CHECK_FALSE(c.cfg.offload.automatic);
    CHECK_THAT(c.why, Catch::Contains(std::to_string(k) + " layers' weights streamed"));
    CHECK(plan_memory(c.cfg, storage).total <= cfg.memory_limit);
  }
  // offload.layers "auto": the placement given (states only), the fewest layers beside it
  cfg.offload = {.optimizer_states = true, .layers_auto = true};
  std::vector<int64_t> states_only;
  for (int k = 0; k <= 8; k++)
    states_only.push_back(plan_with({.optimizer_states = true, .layers = k}).total);
  cfg.memory_limit = states_only[6];
  OffloadChoice c = choose_offload(cfg, storage);
  CHECK(c.cfg.offload == OffloadConfig{.optimizer_states = true, .layers = 6});
  CHECK_THAT(c.why, Catch::StartsWith("offload.layers auto: optimizer states in the host tier, 6 "
                                      "layers' weights streamed"));
  // a limit the placement meets without streaming: none streams
  cfg.memory_limit = states_only[0];
  CHECK(choose_offload(cfg, storage).cfg.offload ==
        OffloadConfig{.optimizer_states = true, .layers = 0});
  // no limit: nothing to choose against, none streams, said so
  cfg.memory_limit = 0;
  c = choose_offload(cfg, storage);
  CHECK(c.cfg.offload.layers == 0);
  CHECK_THAT(c.why, Catch::StartsWith("offload.layers auto: no memory_limit"));
  // host_memory_limit below the host tier k layers need: more cannot stream, and the least on
  // the device is named
  cfg.memory_limit = states_only[7];
  cfg.host_memory_limit = plan_with({.optimizer_states = true, .layers = 6}).host_total;
  c = choose_offload(cfg, storage);
  CHECK_THAT(c.why, Catch::Contains("no placement fits"));
}

TEST_CASE("offload auto weighs the copies by the copy queues the device has", "[offload][memory]") {
  // The states' s bytes go each way in the backward, the layer inputs' i out in the forward and
  // back in the backward. Two queues overlap the states' two trips (s against the inputs' 2i),
  // one queue takes them in turn (2s against 2i): with i < s < 2i they choose differently. The
  // micro-batch sets i; the first that puts it in that window.
  RunConfig cfg = layer_run("adamw", "bf16", true);
  const Storage storage = storage_for(cfg.precision, false);
  cfg.offload.automatic = true;
  const auto plan_of = [&](bool states, ActivationOffload inputs) {
    RunConfig c = cfg;
    c.offload = {.optimizer_states = states, .activations = inputs};
    return plan_memory(c, storage);
  };
  MemoryPlan none, states, inputs;
  bool window = false;
  for (int b = 1; b <= 256 && !window; b++) {
    cfg.micro_batch_size = cfg.total_batch_size = b;
    none = plan_of(false, ActivationOffload::None);
    states = plan_of(true, ActivationOffload::None);
    inputs = plan_of(false, ActivationOffload::Host);
    const int64_t s = states.h2d_bytes_per_step, i = inputs.h2d_bytes_per_step;
    window = i < s && s < 2 * i;
  }
  REQUIRE(window);
  cfg.memory_limit = std::max(states.total, inputs.total);  // either move alone fits
  REQUIRE(cfg.memory_limit < none.total);
  const auto chosen = [&](int copy_queues) {
    return choose_offload(cfg, storage, LinkModel{.copy_queues = copy_queues}).cfg.offload;
  };
  CHECK(chosen(2).optimizer_states);
  CHECK(chosen(2).activations == ActivationOffload::None);
  CHECK_FALSE(chosen(1).optimizer_states);
  CHECK(chosen(1).activations == ActivationOffload::Host);
  // the CPU backend's two copy threads: the trainer's planner assumes two queues
  CHECK(make_cpu_backend(storage)->copy_engines() == 2);
}
