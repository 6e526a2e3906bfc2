// offload.optimizer_states (optim/state_slots.h): the states live in the host tier and pass through
// device slots around each update. It changes where bytes live, never the numbers: losses,
// weights and every state buffer equal the resident run's bit for bit (the same computation on
// the same machine), with the CPU backend's copies on their two threads (one each way) and lazy
// (GRASS_LAZY_COPIES: a copy runs only when waited for, its destination NaN until then, so a
// missing wait, or a missing order between the two queues, shows).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kernels/backend.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/optim/step.h"
#include "src/train/memory_plan.h"
#include "src/train/run_resolution.h"
#include "src/train/training_state.h"
#include "tests/named_choice.h"
#include "tests/ngram_batches.h"
#include "tests/offload_training.h"

using namespace grass;
using test::LazyCopies;
using test::Trained;
using test::check_plan_is_arena;
using test::train;

using test::offload_run;

TEST_CASE("copy queues: each way its own, ordered across only by order_copy_after", "[offload]") {
  // A slot's write-back (to the host), the fetch of the bytes it wrote (to the device), and a
  // fetch into the slot itself: the order_copy_after reuse of StateSlots and XInRing.
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  const auto random = [&] {
    std::vector<float> v(1000);
    for (float& x : v) x = normal(rng);
    return v;
  };
  const size_t bytes = 1000 * sizeof(float);
  using Copy = Backend::Copy;
  for (const bool lazy : {false, true})
    for (const bool ordered : {true, false}) {
      if (!lazy && !ordered) continue;  // a race: the threads' timing decides
      INFO((lazy ? "lazy copies" : "copy threads") << (ordered ? "" : ", no order"));
      const LazyCopies mode(lazy);
      const std::unique_ptr<Backend> backend =
          make_cpu_backend(storage_for(PrecisionChoice::F32, false));
      const std::vector<float> a = random(), b = random(), c = random();
      std::vector<float> slot = a, host = b, next = c, fetched(1000);
      // the threads: a write-back that takes its time, and a fetch that would overtake it
      backend->copy_queue_task(Copy::ToHost, [] { usleep(20000); }, nullptr, 0);
      backend->copy_async(host.data(), slot.data(), bytes, Copy::ToHost);
      if (ordered) backend->order_copy_after(backend->mark_copies(Copy::ToHost));
      backend->copy_async(fetched.data(), host.data(), bytes, Copy::ToDevice);
      backend->copy_async(slot.data(), next.data(), bytes, Copy::ToDevice);
      backend->wait_copies(backend->mark_copies(Copy::ToDevice));  // the fetches only
      backend->synchronize();
      if (ordered) {
        CHECK(fetched == a);  // the bytes the write-back wrote
        CHECK(host == a);     // the slot's bytes before the fetch into it
      } else {  // lazy: the fetches ran first (the host bytes still the write-back's poison),
                // the write-back when the synchronize reached it
        CHECK(std::all_of(fetched.begin(), fetched.end(), [](float x) { return std::isnan(x); }));
        CHECK(host == c);
      }
      CHECK(slot == c);
      CHECK(backend->copy_totals().bytes == int64_t(3 * bytes));
    }
}

TEST_CASE("offloaded optimizer states train to the resident run's bits", "[offload][train]") {
  // AdamW's tensors whole (the default 16 MiB pieces) and in 4 KiB pieces: the embedding's and
  // lm_head's 16 KiB of fp32 moments in 4 (and 2 in bf16), a pure-bf16 rounding stream across them
  for (const std::string optimizer : {"adamw", "grass", "galore", "flora"})
    for (const std::string precision : {"fp32", "bf16-mixed", "bf16"})
      for (const bool fused : {false, true}) {
        RunConfig cfg = offload_run(optimizer, precision, fused);
        const Trained resident = train(cfg, 5);
        cfg.offload.optimizer_states = true;
        for (const bool lazy : {false, true}) {
          cfg.offload.piece_bytes = lazy ? 4096 : OffloadConfig{}.piece_bytes;
          INFO(optimizer << " " << precision << (fused ? ", fused" : ", deferred")
                         << (lazy ? ", lazy copies, 4 KiB pieces" : ", copy threads"));
          const LazyCopies mode(lazy);
          const Trained offloaded = train(cfg, 5);
          CHECK(offloaded.host_bytes > 0);
          CHECK(offloaded.losses == resident.losses);
          // the first step learns the order; from the second every piece was on its way
          REQUIRE(offloaded.unprefetched.size() == 5);
          CHECK(offloaded.unprefetched[0] > 0);
          for (size_t step = 1; step < 5; step++) CHECK(offloaded.unprefetched[step] == 0);
          REQUIRE(offloaded.names == resident.names);
          for (size_t i = 0; i < resident.state.size(); i++) {
            INFO(resident.names[i]);
            CHECK(offloaded.state[i] == resident.state[i]);
          }
        }
      }
}

TEST_CASE("offload: 8-bit states and GRASS's proximal anchors keep the resident bits too",
          "[offload][train]") {
  for (const std::string what : {"q8 adamw", "q8 grass", "q8 flora", "proximal grass"}) {
    RunConfig cfg = offload_run(what.substr(what.find(' ') + 1), "bf16", true);
    if (what.starts_with("q8")) cfg.optimizer.state_dtype = StateDtype::Q8;
    else cfg.optimizer.proximal = {.lambda = 1e-3, .inner_steps = 2};
    cfg.optimizer.state_block = 64;
    cfg.model.intermediate_size = 136;  // gate, up and down reach kQuant8MinElements
    const Trained resident = train(cfg, 5);
    cfg.offload.optimizer_states = true;
    cfg.offload.piece_bytes = 4096;  // pieces of whole 64-element blocks
    INFO(what);
    const LazyCopies mode(true);
    const Trained offloaded = train(cfg, 5);
    CHECK(offloaded.losses == resident.losses);
    REQUIRE(offloaded.names == resident.names);
    for (size_t i = 0; i < resident.state.size(); i++) {
      INFO(resident.names[i]);
      CHECK(offloaded.state[i] == resident.state[i]);
    }
  }
}

TEST_CASE("offload puts the states in the host tier and two slots on the device", "[offload][memory]") {
  for (const std::string optimizer : {"adamw", "grass", "galore", "flora"}) {
    INFO(optimizer);
    RunConfig cfg = offload_run(optimizer, "bf16", true);
    const Storage storage = storage_for(cfg.precision, false);
    const MemoryPlan resident = plan_memory(cfg, storage);
    cfg.offload.optimizer_states = true;
    const MemoryPlan offloaded = plan_memory(cfg, storage);
    const int opt = int(MemCategory::Optimizer), work = int(MemCategory::Workspace);
    CHECK(resident.host_total == 0);
    CHECK(offloaded.host_total == offloaded.host_bytes[size_t(opt)]);  // states only
    // what left the device is what the host holds; σ, ρ and GaLore's P stay
    CHECK(resident.bytes[size_t(opt)] - offloaded.bytes[size_t(opt)] == offloaded.host_total);
    if (optimizer == "grass")
      CHECK(offloaded.bytes[size_t(opt)] > 0);
    // every state crosses once each way a step
    CHECK(offloaded.h2d_bytes_per_step == offloaded.host_total);
    CHECK(offloaded.d2h_bytes_per_step == offloaded.host_total);
    // the slots are workspace: two of the largest tensor's states (lm_head's or the embedding's
    // dense AdamW moments here), each span 64-byte aligned
    const int64_t V = cfg.model.vocab_size, C = cfg.model.hidden_size;
    const int64_t slot = 2 * ((V * C * storage.state_bytes + 63) / 64 * 64);
    CHECK(offloaded.bytes[size_t(work)] - resident.bytes[size_t(work)] == 2 * slot);
    for (int c = 0; c < kMemCategories; c++)
      if (c != opt && c != work) CHECK(offloaded.bytes[size_t(c)] == resident.bytes[size_t(c)]);
    // in 4 KiB pieces, AdamW's slots shrink to them (GRASS's targets still move whole: r x 40 x 2
    // states of 2 bytes, under 4 KiB)
    cfg.offload.piece_bytes = 4096;
    const MemoryPlan pieces = plan_memory(cfg, storage);
    const int64_t slots = pieces.bytes[size_t(work)] - resident.bytes[size_t(work)];
    CHECK(slots <= 2 * 4096);
    CHECK(slots >= 2 * (4096 - 2 * 64));  // as many 64-element quanta as fit
    CHECK(pieces.host_total == offloaded.host_total);
    CHECK(pieces.h2d_bytes_per_step == offloaded.h2d_bytes_per_step);
  }
}

TEST_CASE("offload's plan equals the arena with 8-bit states, proximal anchors and pieces",
          "[offload][memory]") {
  // The planning arena's pointers are all null: what a piece holds must not lean on them.
  for (const std::string optimizer : {"adamw", "grass", "galore", "flora"})
    for (const std::string states : {"bf16", "q8", "proximal"})
      for (const int64_t piece : {int64_t(4096), OffloadConfig{}.piece_bytes}) {
        if (states == "proximal" && optimizer != "adamw" && optimizer != "grass") continue;
        INFO(optimizer << ", " << states << " states, pieces of " << piece << " bytes");
        RunConfig cfg = offload_run(optimizer, "bf16", true);
        cfg.model.intermediate_size = 136;  // gate, up and down reach kQuant8MinElements
        cfg.optimizer.state_block = 64;
        if (states == "q8") cfg.optimizer.state_dtype = StateDtype::Q8;
        if (states == "proximal") cfg.optimizer.proximal = {.lambda = 1e-3, .inner_steps = 2};
        cfg.offload = {.optimizer_states = true, .piece_bytes = piece};
        const Storage storage = storage_for(cfg.precision, false);
        const MemoryPlan plan = plan_memory(cfg, storage);
        const std::unique_ptr<Backend> backend = make_cpu_backend(storage);
        Arena real(false, *backend, &backend->host_tier());
        const TrainingState s = build_training_state(cfg, real, *backend);
        check_plan_is_arena(plan, real);
        // every host byte crosses once each way a step (GRASS's σ and ρ, GaLore's P: device)
        CHECK(plan.h2d_bytes_per_step == plan.host_total);
        CHECK(plan.d2h_bytes_per_step == plan.host_total);
      }
}
