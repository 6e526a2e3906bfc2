// offload.layers (model/layer_stream.h): some layers' matrices live in the host tier and pass
// through device slots for each pass. It changes where bytes live, never the numbers: losses,
// every weight and every optimizer state buffer equal the resident run's bit for bit (the same
// computation on the same machine), with the CPU backend's copies lazy (GRASS_LAZY_COPIES: a copy
// runs only when waited for, its destination NaN until then, so a missing wait or a missing
// order between the two queues shows).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kernels/backend.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/core/error.h"
#include "src/model/layer_stream.h"
#include "src/model/llama.h"
#include "src/train/memory_plan.h"
#include "src/train/run_resolution.h"
#include "src/train/training_state.h"
#include "tests/named_choice.h"
#include "tests/ngram_batches.h"
#include "tests/offload_training.h"
#include "tests/test_util.h"

using namespace grass;
using test::LazyCopies;

namespace {

// offload_run's model with 4 layers, fused updates.
RunConfig stream_run(const std::string& optimizer, const std::string& precision) {
  RunConfig c = test::offload_run(optimizer, precision, true);
  c.model.num_hidden_layers = 4;
  return c;
}

struct StreamTrained {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;          // every tensor, Hugging Face's layout
  std::vector<std::vector<std::byte>> states;       // every optimizer buffer, in order
  std::vector<std::string> state_names;
  std::vector<int64_t> unprefetched;                // per step, layers fetched on demand
  std::vector<int64_t> fetched, written_back;       // per step, bytes
};

StreamTrained train_streamed(const RunConfig& cfg, int steps) {
  const std::unique_ptr<Backend> backend = make_cpu_backend(storage_for(cfg.precision, false));
  Arena arena(false, *backend, &backend->host_tier());
  TrainingState s = build_training_state(cfg, arena, *backend);
  s.model->init_weights(3);
  const LayerStream* stream = s.model->weight_store().stream();
  REQUIRE((stream != nullptr) == (cfg.offload.layers > 0));
  const test::NgramBatches data;
  StreamTrained out;
  int64_t batch = 0;
  for (int64_t step = 0; step < steps; step++) {
    const int64_t before = stream ? stream->unprefetched() : 0;
    const int64_t fetched = stream ? stream->fetched_bytes() : 0;
    const int64_t written = stream ? stream->written_back_bytes() : 0;
    out.losses.push_back(test::ngram_step(s, cfg, step, data, batch).loss);
    if (!stream) continue;
    out.unprefetched.push_back(stream->unprefetched() - before);
    out.fetched.push_back(stream->fetched_bytes() - fetched);
    out.written_back.push_back(stream->written_back_bytes() - written);
  }
  for (const ParamTensor& t : s.model->tensors()) out.weights.push_back(s.model->read_tensor(t));
  backend->synchronize();  // the states' last write-backs
  for (const Arena::Block& b : arena.blocks())
    if (b.cat == MemCategory::Optimizer) {
      const auto* bytes = static_cast<const std::byte*>(b.ptr);
      out.states.emplace_back(bytes, bytes + b.bytes);
      out.state_names.push_back(b.name);
    }
  return out;
}

void check_same(const StreamTrained& streamed, const StreamTrained& resident,
                const ParameterSet& names) {
  CHECK(streamed.losses == resident.losses);
  REQUIRE(streamed.weights.size() == resident.weights.size());
  for (size_t i = 0; i < resident.weights.size(); i++) {
    INFO(names[i].name);
    CHECK(streamed.weights[i] == resident.weights[i]);
  }
  REQUIRE(streamed.state_names == resident.state_names);
  for (size_t i = 0; i < resident.states.size(); i++) {
    INFO(resident.state_names[i]);
    CHECK(streamed.states[i] == resident.states[i]);
  }
}

ParameterSet tensors_of(const RunConfig& cfg) {
  Arena planning(true);
  const std::unique_ptr<Backend> backend = make_planning_backend(storage_for(cfg.precision, false));
  const LlamaModel model(cfg.model, planning, 1, cfg.seq_len, {}, *backend);
  return model.tensors();
}

}  // namespace

TEST_CASE("streamed layers are spread evenly, and keep each tensor's alignment class",
          "[stream]") {
  CHECK(streamed_layers_for(40, 10) == std::vector<int>{2, 6, 10, 14, 18, 22, 26, 30, 34, 38});
  CHECK(streamed_layers_for(4, 1) == std::vector<int>{2});
  CHECK(streamed_layers_for(4, 4) == std::vector<int>{0, 1, 2, 3});
  CHECK(streamed_layers_for(32, 13).size() == 13);
  // a layout with an odd hidden size: offsets fall in every alignment class
  RunConfig cfg = stream_run("adamw", "fp32");
  cfg.model.hidden_size = 36;
  cfg.model.intermediate_size = 44;
  cfg.model.num_attention_heads = 3;
  cfg.model.num_key_value_heads = 1;
  ParameterSet ts = tensors_of(cfg);
  const ParameterSet flat = ts;
  ts.stream_layers({1, 3});
  int64_t streamed = 0;
  for (size_t i = 0; i < ts.size(); i++) {
    const ParamTensor& t = ts[i];
    INFO(t.name);
    CHECK(t.place_offset % ParameterSet::kPlaceAlign == t.offset % ParameterSet::kPlaceAlign);
    CHECK(flat[i].place_offset == flat[i].offset);  // nothing streamed: the flat layout
    const bool in_streamed_layer = t.layer == 1 || t.layer == 3;
    CHECK((t.place == Place::Streamed) == (in_streamed_layer && !t.is_norm));
    if (t.place == Place::Streamed) {
      streamed += t.numel;
      CHECK(t.place_offset + t.numel <= ts.layer_block());
    } else {
      CHECK(t.place_offset + t.numel <= ts.num_resident());
    }
  }
  // the resident weights shrink by about the streamed ones (alignment gaps under a class each)
  CHECK(ts.num_resident() <= ts.num_stored() - streamed + 8 * ParameterSet::kPlaceAlign);
  CHECK(ts.num_resident() >= ts.num_stored() - streamed);
  // tensors of one place never overlap, and q, k, v (gate, up) stay adjacent: one GEMM reads them
  for (size_t i = 0; i + 1 < ts.size(); i++) {
    const ParamTensor &a = ts[i], &b = ts[i + 1];
    if (a.place == b.place && (a.place == Place::Device || a.layer == b.layer))
      CHECK(a.place_offset + a.numel <= b.place_offset);
    if (a.layer == b.layer && !a.is_norm && !b.is_norm &&
        (b.name.ends_with("k_proj.weight") || b.name.ends_with("v_proj.weight") ||
         b.name.ends_with("up_proj.weight")))
      CHECK(a.place_offset + a.numel == b.place_offset);
  }
}

TEST_CASE("streamed layers train to the resident run's bits", "[stream][offload][train]") {
  for (const std::string optimizer : {"adamw", "grass", "galore", "flora"})
    for (const std::string precision : {"fp32", "bf16"}) {
      RunConfig cfg = stream_run(optimizer, precision);
      const StreamTrained resident = train_streamed(cfg, 5);
      const ParameterSet names = tensors_of(cfg);
      for (const int layers : {1, 2, 4})
        for (const int slots : {2, 3}) {
          if (layers == 1 && slots == 3) continue;  // one layer: one slot's worth
          cfg.offload.layers = layers;
          cfg.offload.layer_slots = slots;
          INFO(optimizer << " " << precision << ", " << layers << " layers streamed through "
                         << slots << " slots");
          const LazyCopies lazy(true);
          const StreamTrained streamed = train_streamed(cfg, 5);
          check_same(streamed, resident, names);
          // the first forward fetched its first layers on demand; every later fetch was ahead
          REQUIRE(streamed.unprefetched.size() == 5);
          CHECK(streamed.unprefetched[0] == 1);
          for (size_t step = 1; step < 5; step++) CHECK(streamed.unprefetched[step] == 0);
          // a step's copies: the plan's, 2·(k − slots) layers fetched, every streamed one back
          const MemoryPlan plan = plan_memory(cfg, storage_for(cfg.precision, false));
          int64_t whole = 0;  // the streamed layers' matrices, bytes
          for (const ParamTensor& t : names)
            if (t.layer == 0 && !t.is_norm)
              whole += layers * t.numel * storage_for(cfg.precision, false).weight_bytes;
          if (optimizer != "grass") {  // every layer goes back whole
            for (size_t step = 1; step < 5; step++) {
              CHECK(streamed.written_back[step] == plan.d2h_bytes_per_step);
              CHECK(streamed.fetched[step] == plan.h2d_bytes_per_step);
            }
            CHECK(plan.d2h_bytes_per_step == whole);
            CHECK(plan.h2d_bytes_per_step == 2 * std::max(layers - slots, 0) * whole / layers);
            continue;
          }
          // GRASS: steps 1 and 3 change σ's slices alone, which go back packed (the plan's);
          // refresh steps 2 and 4 write every target whole, once; step 4's fetches bring the
          // slices step 3 packed (the plan's)
          CHECK(plan.d2h_bytes_per_step < whole / 4);
          CHECK(streamed.written_back[3] == plan.d2h_bytes_per_step);
          CHECK(streamed.written_back[2] == whole);
          CHECK(streamed.written_back[4] == whole);
          CHECK(streamed.fetched[4] == plan.h2d_bytes_per_step);
          if (layers > slots) CHECK(plan.h2d_bytes_per_step > 2 * (layers - slots) * whole / layers);
        }
    }
}

TEST_CASE("streamed layers with deferred updates keep the resident bits and fetch what the plan "
          "says", "[stream][offload][train]") {
  // Two micro-batches a step (and one with fused_update "off"): each micro-batch's passes
  // fetch the layers, unchanged; after the last, an update pass acquires each streamed layer,
  // updates its matrices in the slot and writes it back.
  for (const std::string optimizer : {"adamw", "grass", "galore", "flora"})
    for (const int micro_batches : {1, 2}) {
      RunConfig cfg = stream_run(optimizer, "bf16");
      cfg.fused_update = Switch::Off;
      cfg.total_batch_size = micro_batches * cfg.micro_batch_size;
      const StreamTrained resident = train_streamed(cfg, 5);
      const ParameterSet names = tensors_of(cfg);
      const Storage storage = storage_for(cfg.precision, false);
      for (const int layers : {1, 4}) {
        cfg.offload.layers = layers;
        cfg.offload.layer_slots = 2;
        INFO(optimizer << ", " << micro_batches << " micro-batches, " << layers
                       << " layers streamed through 2 slots");
        const LazyCopies lazy(true);
        const StreamTrained streamed = train_streamed(cfg, 5);
        check_same(streamed, resident, names);
        // a step's copies, once the first has run: the plan's
        const MemoryPlan plan = plan_memory(cfg, storage);
        int64_t layer_bytes = 0;  // one streamed layer's matrices
        for (const ParamTensor& t : names)
          if (t.layer == 0 && !t.is_norm) layer_bytes += t.numel * storage.weight_bytes;
        // the slots' policy: every pass past the first two layers fetches, and a step's first
        // forward fetches the two the update pass left in them as well (4 layers); one layer
        // stays in its slot
        const int64_t fetches = layers == 1 ? 0 : (2 * micro_batches + 1) * (layers - 2) + 2;
        if (optimizer != "grass") {
          CHECK(plan.layer_fetch_bytes_per_step == fetches * layer_bytes);
          CHECK(plan.layer_write_back_bytes_per_step == layers * layer_bytes);
          for (size_t step = 1; step < 5; step++) {
            CHECK(streamed.fetched[step] == plan.layer_fetch_bytes_per_step);
            CHECK(streamed.written_back[step] == plan.layer_write_back_bytes_per_step);
          }
        } else {  // steps 1 and 3 between refreshes write the slices back packed, and step 3
                  // fetches what step 2's update pass packed (a refresh step's backward writes a
                  // layer whose σ it moved back whole: its update pass fetches no slices)
          CHECK(streamed.written_back[3] == plan.layer_write_back_bytes_per_step);
          CHECK(streamed.fetched[3] == plan.layer_fetch_bytes_per_step);
          if (fetches > 0) CHECK(streamed.fetched[4] < plan.layer_fetch_bytes_per_step);
          CHECK(plan.layer_fetch_bytes_per_step >= fetches * layer_bytes);
        }
        // the first forward fetched its first layer on demand, and each step's first forward
        // its own: the update pass leaves the last layers in the slots
        for (size_t step = 1; step < 5; step++) CHECK(streamed.unprefetched[step] == (layers > 2 ? 1 : 0));
      }
    }
}

TEST_CASE("streamed GRASS layers go back as their packed slices: every selection rule, staggered "
          "refreshes, the resident run's bits", "[stream][offload][train]") {
  // Repeated draws (multinomial, uniform) merge into fewer slices; refresh_stagger refreshes one target
  // at a time, so a layer mixes packed and whole write-backs in one step.
  for (const std::string selection : {"top_r", "multinomial", "uniform"})
    for (const bool stagger : {false, true}) {
      RunConfig cfg = stream_run("grass", "bf16");
      cfg.optimizer.projection.selection = test::named<Selection>(selection);
      cfg.optimizer.projection.refresh_stagger = stagger;
      cfg.optimizer.projection.update_interval = 3;
      const StreamTrained resident = train_streamed(cfg, 7);
      cfg.offload.layers = 3;
      cfg.offload.layer_slots = 2;
      INFO(selection << (stagger ? ", staggered" : ""));
      const LazyCopies lazy(true);
      const StreamTrained streamed = train_streamed(cfg, 7);
      check_same(streamed, resident, tensors_of(cfg));
      const MemoryPlan plan = plan_memory(cfg, storage_for(cfg.precision, false));
      for (size_t step = 1; step < 7; step++) CHECK(streamed.written_back[step] > 0);
      if (!stagger) {  // steps 1, 2, 4, 5 between refreshes: at most r slices each
        for (const size_t step : {1, 2, 4, 5}) {
          INFO("step " << step);
          if (selection == "top_r") CHECK(streamed.written_back[step] == plan.d2h_bytes_per_step);
          else CHECK(streamed.written_back[step] <= plan.d2h_bytes_per_step);  // repeats merged
        }
      }
    }
}

TEST_CASE("streamed layers with offloaded states and layer inputs, q8 states and the proximal "
          "anchors keep the resident bits", "[stream][offload][train]") {
  for (const std::string what : {"states grass", "inputs adamw", "disk galore", "q8 grass",
                                 "proximal adamw"}) {
    RunConfig cfg = stream_run(what.substr(what.find(' ') + 1), "bf16");
    cfg.optimizer.state_block = 64;
    cfg.model.intermediate_size = 136;  // gate, up and down reach kQuant8MinElements
    if (what.starts_with("q8")) cfg.optimizer.state_dtype = StateDtype::Q8;
    if (what.starts_with("proximal")) cfg.optimizer.proximal = {.lambda = 1e-3, .inner_steps = 2};
    if (what.starts_with("inputs") || what.starts_with("disk"))
      cfg.activation_checkpointing = Checkpointing::Layer;
    const StreamTrained resident = train_streamed(cfg, 5);
    cfg.offload.layers = 2;
    cfg.offload.optimizer_states = what.starts_with("states");
    cfg.offload.piece_bytes = 4096;
    if (what.starts_with("inputs")) cfg.offload.activations = ActivationOffload::Host;
    const test::TempDir dir("test_stream_layers");
    if (what.starts_with("disk")) {
      cfg.offload.activations = ActivationOffload::Disk;
      cfg.offload.disk_dir = dir.path.string();
    }
    INFO(what);
    const LazyCopies lazy(true);
    check_same(train_streamed(cfg, 5), resident, tensors_of(cfg));
  }
}

TEST_CASE("streamed layers: plan = arena, the matrices in the host tier, slots on the device",
          "[stream][offload][memory]") {
  for (const std::string optimizer : {"adamw", "grass"})
    for (const int layers : {1, 3}) {
      INFO(optimizer << ", " << layers << " layers streamed");
      RunConfig cfg = stream_run(optimizer, "bf16");
      const Storage storage = storage_for(cfg.precision, false);
      const MemoryPlan resident = plan_memory(cfg, storage);
      cfg.offload.layers = layers;
      const MemoryPlan plan = plan_memory(cfg, storage);
      const std::unique_ptr<Backend> backend = make_cpu_backend(storage);
      Arena real(false, *backend, &backend->host_tier());
      const TrainingState s = build_training_state(cfg, real, *backend);
      test::check_plan_is_arena(plan, real);
      const ParameterSet& ts = s.model->tensors();
      int64_t streamed = 0;
      for (const ParamTensor& t : ts)
        if (t.place == Place::Streamed) streamed += t.numel;
      const int wbytes = storage.weight_bytes;
      const int weights = int(MemCategory::Weights), work = int(MemCategory::Workspace);
      CHECK(plan.host_total == plan.host_bytes[size_t(weights)]);
      CHECK(ts.layer_block() * layers >= streamed);
      CHECK(resident.bytes[size_t(weights)] - plan.bytes[size_t(weights)] ==
            (ts.num_stored() - ts.num_resident()) * wbytes);
      // per layer a block of its matrices and, for GRASS, one of its targets' r slices (each
      // 256-byte aligned); a slot holds both
      int64_t slices = 0;
      if (optimizer == "grass")
        for (const ParamTensor& t : ts)
          if (t.layer == 0 && !t.is_norm) {
            const int64_t side = std::min(t.shape[0], t.shape[1]) == t.shape[0] ? t.shape[1] : t.shape[0];
            slices += (cfg.optimizer.projection.rank * side * wbytes + 255) / 256 * 256;
          }
      CHECK(plan.host_total == layers * (ts.layer_block() * wbytes + slices));
      const int slots = std::min(layers, cfg.offload.layer_slots);
      CHECK(plan.bytes[size_t(work)] - resident.bytes[size_t(work)] ==
            slots * (ts.layer_block() * wbytes + slices));
    }
}

TEST_CASE("streamed layers: export and checkpoint bytes, and a resume, as the resident run's",
          "[stream][offload][train]") {
  // Each host access waits for the write-backs, and a load lands in the host blocks, not in a
  // slot's stale copy.
  RunConfig cfg = stream_run("grass", "bf16");
  const LazyCopies lazy(true);  // before the backend, which reads it
  const std::unique_ptr<Backend> backend = make_cpu_backend(storage_for(cfg.precision, false));
  auto build = [&](bool streamed, Arena& arena) {
    RunConfig c = cfg;
    c.offload.layers = streamed ? 2 : 0;
    return build_training_state(c, arena, *backend);
  };
  Arena ra(false, *backend, &backend->host_tier()), sa(false, *backend, &backend->host_tier());
  TrainingState resident = build(false, ra), streamed = build(true, sa);
  REQUIRE(streamed.model->weight_store().stream());
  resident.model->init_weights(5);
  streamed.model->init_weights(5);
  const test::NgramBatches data;
  auto step = [&](TrainingState& s, int64_t n) {
    int64_t batch = n;
    test::ngram_step(s, cfg, n, data, batch);
  };
  for (int64_t n = 0; n < 3; n++) {
    step(resident, n);
    step(streamed, n);
  }
  // one more step's backward, its write-backs still queued (the step's norm not read): the
  // bytes a checkpoint or an export writes wait for them
  for (TrainingState* s : {&resident, &streamed}) {
    s->step->begin(3, cfg.optimizer.lr);
    std::vector<int32_t> inputs, targets;
    data.batch(3, cfg.micro_batch_size, cfg.seq_len, inputs, targets);
    s->step->last_micro_batch();
    s->model->forward_backward(inputs.data(), targets.data(), cfg.micro_batch_size, 1.0);
  }
  std::vector<std::vector<std::byte>> keep;
  // (each model's own tensors: their places differ)
  const ParameterSet &rs = resident.model->tensors(), &ss = streamed.model->tensors();
  const int wbytes = backend->storage().weight_bytes;
  const auto same_weights = [&] {
    for (size_t i = 0; i < ss.size(); i++) {
      INFO(ss[i].name);
      CHECK(streamed.model->read_tensor(ss[i]) == resident.model->read_tensor(rs[i]));
    }
  };
  for (size_t i = 0; i < ss.size(); i++) {
    INFO(ss[i].name);
    const std::byte* a = resident.model->weight_store().hf_bytes(rs[i], keep);
    const std::byte* b = streamed.model->weight_store().hf_bytes(ss[i], keep);
    CHECK(std::memcmp(a, b, size_t(ss[i].hf_numel) * wbytes) == 0);
  }
  for (TrainingState* s : {&resident, &streamed}) {
    s->step->finish();
    s->model->take_losses();
  }
  // a load (a resume's weights) lands where the next step reads it, not under a slot's stale
  // copy: another initialisation's weights into both models, then one more step each
  Arena oa(false, *backend, &backend->host_tier());
  TrainingState other = build(false, oa);
  other.model->init_weights(6);
  for (TrainingState* s : {&resident, &streamed})
    for (size_t i = 0; i < ss.size(); i++) {
      std::vector<std::byte> bytes(size_t(ss[i].hf_numel) * wbytes);
      std::memcpy(bytes.data(), other.model->weight_store().hf_bytes(other.model->tensors()[i], keep),
                  bytes.size());
      s->model->weight_store().load_hf_bytes(s->model->tensors()[i], bytes.data());
    }
  step(resident, 4);
  step(streamed, 4);
  same_weights();
}

TEST_CASE("offload.layers: one line for a run it cannot serve", "[stream][config]") {
  const auto error_of = [](const std::string& text) {
    try {
      parse_run_config(nlohmann::json::parse(text), "run.json");
    } catch (const UserError& e) {
      const std::string message = e.what();
      CHECK(message.find('\n') == std::string::npos);
      return message;
    }
    return std::string("no error");
  };
  const std::string model =
      R"("data": {"train": "data/synthetic/train.bin"},
         "model": {"hidden_size": 32, "intermediate_size": 40, "num_attention_heads": 4,
                   "num_hidden_layers": 4, "vocab_size": 64, "max_position_embeddings": 64},
         "seq_len": 16)";
  const auto run = [&](const std::string& rest) { return "{" + model + ", " + rest + "}"; };
  CHECK_THAT(error_of(run(R"("offload": {"layers": 5})")),
             Catch::Contains("offload.layers") && Catch::Contains("4"));
  CHECK_THAT(error_of(run(R"("offload": {"layers": 2, "layer_slots": 1})")),
             Catch::Contains("offload.layer_slots"));
  // deferred updates stream too (an update pass of their own)
  CHECK(error_of(run(R"("precision": "bf16", "fused_update": "off", "offload": {"layers": 2})")) ==
        "no error");
  CHECK(error_of(run(R"("precision": "bf16", "micro_batch_size": 2, "total_batch_size": 4,
                        "offload": {"layers": 2})")) == "no error");
  CHECK_THAT(error_of(run(R"("precision": "bf16-mixed", "offload": {"layers": 2})")),
             Catch::Contains("offload.layers") && Catch::Contains("bf16-mixed"));
  CHECK(error_of(run(R"("precision": "bf16", "offload": {"layers": 2})")) == "no error");
  // precision "auto" on a GPU is bf16-mixed: refused when the run resolves
  RunConfig cfg = parse_run_config(nlohmann::json::parse(run(R"("offload": {"layers": 2})")), "run.json");
  CHECK_THROWS_WITH(resolve(cfg, true), Catch::Contains("offload.layers") &&
                                            Catch::Contains("precision \"bf16\""));
  const ResolvedRun cpu = resolve(cfg, false);
  CHECK(cpu.memory.fused_update);
  CHECK(cpu.memory.streamed_layers == std::vector<int>{1, 3});
  // two micro-batches a step: deferred updates, the layers streamed all the same
  cfg.total_batch_size = 2 * cfg.micro_batch_size;
  const ResolvedRun deferred = resolve(cfg, false);
  CHECK_FALSE(deferred.memory.fused_update);
  CHECK(deferred.memory.streamed_layers == std::vector<int>{1, 3});
  // "auto": the planner chooses (memory_plan.h); the same refusals, and the key names what else
  // it takes
  CHECK_THAT(error_of(run(R"("offload": {"layers": "some"})")),
             Catch::Contains("offload.layers") && Catch::Contains("or \"auto\", got string \"some\""));
  CHECK_THAT(error_of(run(R"("precision": "bf16-mixed", "offload": {"layers": "auto"})")),
             Catch::Contains("offload.layers") && Catch::Contains("bf16-mixed"));
  cfg = parse_run_config(nlohmann::json::parse(run(R"("offload": {"layers": "auto"})")), "run.json");
  CHECK(cfg.offload.layers_auto);
  CHECK(cfg.offload.layers == 0);
  CHECK_THROWS_WITH(resolve(cfg, true), Catch::Contains("offload.layers") &&
                                            Catch::Contains("precision \"bf16\""));
  // written back as given: a run's config.json reads again to the same run
  const nlohmann::json written = to_json(cfg);
  CHECK(written["offload"]["layers"] == "auto");
  CHECK(parse_run_config(written, "again.json").offload == cfg.offload);
}
