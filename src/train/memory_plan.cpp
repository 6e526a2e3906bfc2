#include "src/train/memory_plan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "src/core/error.h"
#include "kernels/backend.h"
#include "src/config/json_check.h"
#include "src/core/format.h"
#include "src/model/llama.h"
#include "src/model/x_in_ring.h"
#include "src/train/run_resolution.h"
#include "src/train/training_state.h"

namespace grass {

MemoryPlan plan_memory(const RunConfig& cfg, const Storage& storage, int eval_batch) {
  Arena planning(/*planning=*/true);
  const std::unique_ptr<Backend> sizes_only = make_planning_backend(storage);
  const TrainingState s =
      build_training_state(cfg, planning, *sizes_only, single_process(), eval_batch);
  MemoryPlan plan;
  for (int c = 0; c < kMemCategories; c++) {
    plan.bytes[c] = planning.bytes(MemCategory(c));
    plan.host_bytes[c] = planning.bytes(MemPlace::Host, MemCategory(c));
  }
  plan.total = planning.total_bytes();
  plan.host_total = planning.total_bytes(MemPlace::Host);
  plan.buffers = planning.num_blocks();
  if (s.step->state_slots())  // every tensor's states, fetched and written back once a step
    for (size_t i = 0; i < s.model->tensors().size(); i++)
      for (const StateSpan& span : s.optimizers->of(int(i)).state_spans(int(i))) {
        plan.h2d_bytes_per_step += span.bytes;
        plan.d2h_bytes_per_step += span.bytes;
      }
  if (const XInRing* ring = s.model->x_in_ring()) {  // each micro-batch's inputs out and back
    plan.activation_bytes_per_step = ring->link_bytes_per_pass() * cfg.micro_batches_per_rank();
    plan.h2d_bytes_per_step += plan.activation_bytes_per_step;
    plan.d2h_bytes_per_step += plan.activation_bytes_per_step;
    plan.disk_bytes = ring->disk_bytes();
    if (ring->where() == ActivationOffload::Disk)
      plan.disk_bytes_per_step = plan.activation_bytes_per_step;
  }
  if (const LayerStream* stream = s.model->weight_store().stream()) {  // offload.layers
    const LayerStream::StepTraffic traffic =
        stream->step_traffic(cfg.micro_batches_per_rank(), s.model->memory_options().fused_update);
    plan.layer_fetch_bytes_per_step = traffic.fetched();
    plan.layer_forward_fetch_bytes_per_step = traffic.forward_fetched;
    plan.layer_write_back_bytes_per_step = traffic.written_back;
    plan.h2d_bytes_per_step += plan.layer_fetch_bytes_per_step;
    plan.d2h_bytes_per_step += plan.layer_write_back_bytes_per_step;
  }
  plan.flops_per_token = flops_per_token(s);
  plan.forward_flops_per_token = s.model->flops_per_token() / 3;
  if (cfg.activation_checkpointing == Checkpointing::Layer)  // every layer's forward: not the head's
    plan.recompute_flops_per_token = plan.forward_flops_per_token -
                                     2.0 * double(cfg.model.vocab_size) * cfg.model.hidden_size;
  plan.step_sum_bytes = sizeof(double);  // the loss
  for (size_t i = 0; i < s.model->tensors().size(); i++) {
    const int64_t numel = s.model->tensors()[i].numel;
    const Optimizer& o = s.optimizers->of(int(i));
    const int64_t projected = o.projected_numel(int(i));
    plan.step_sum_bytes += (projected > 0 ? projected : numel) * storage.grad_bytes;
    if (projected > 0 && o.refresh_sums_full_gradients()) plan.refresh_sum_bytes += numel * 4;
  }
  return plan;
}

int largest_micro_batch(const RunConfig& cfg, const Storage& storage, int64_t limit) {
  const int accum = cfg.grad_accum_steps();
  const auto fits = [&](int64_t micro) {
    RunConfig c = cfg;
    c.micro_batch_size = int(micro);
    c.total_batch_size = int(micro * accum);
    c.memory_limit = limit;  // the plan under `limit`: the head's chunk is the one it leaves room for
    return plan_memory(c, storage).total <= limit;
  };
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 2;  // fits(lo), and then !fits(hi)
  const int64_t most = INT32_MAX / std::max(accum, 1);
  while (hi <= most && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  if (hi > most) return int(lo);
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return int(lo);
}

int64_t eval_model_bytes(const RunConfig& cfg, const Storage& storage, int batch, bool own_weights) {
  const std::unique_ptr<Backend> sizes_only = make_planning_backend(storage);
  ModelMemoryOptions memory = model_memory_options(cfg, storage);
  if (own_weights) {
    Arena planning(/*planning=*/true);
    ModelMemoryOptions forward_only;
    forward_only.pad_ffn = memory.pad_ffn;
    forward_only.forward_only = true;
    const LlamaModel model(cfg.model, planning, batch, cfg.seq_len, {}, *sizes_only, forward_only);
    return planning.total_bytes();
  }
  Arena weights(/*planning=*/true), view(/*planning=*/true);
  memory.checkpointing = Checkpointing::None;  // only its layout, kernels and scratch matter
  memory.sampled = {};
  memory.columns = {};
  memory.x_in_offload = ActivationOffload::None;
  LlamaModel of(cfg.model, weights, 1, cfg.seq_len, {}, *sizes_only, memory);
  const LlamaModel model(of, view, batch);
  return view.total_bytes();
}

int resolve_eval_batch(const RunConfig& cfg, const Storage& storage, int64_t eval_tokens,
                       bool standalone) {
  const int64_t windows = std::min<int64_t>((eval_tokens + cfg.seq_len - 1) / cfg.seq_len, INT32_MAX);
  const bool cudnn = storage.cuda && !standalone &&
                     model_memory_options(cfg, storage).attention == AttentionKernel::Cudnn;
  if (cfg.eval_batch_size > 0) {
    if (cudnn && cfg.eval_batch_size > cfg.micro_batch_size)
      throw UserError((cfg.source.empty() ? "" : cfg.source + ": ") + "eval_batch_size: " +
                      std::to_string(cfg.eval_batch_size) + " is above micro_batch_size " +
                      std::to_string(cfg.micro_batch_size) + ", but cuDNN's attention graphs "
                      "are built for the micro-batch: lower it, or use attention \"grass\"");
    return int(std::min<int64_t>(cfg.eval_batch_size, windows));
  }
  const int64_t allowance = beyond_plan_bytes(storage);
  int64_t budget = 0;
  if (standalone) {
    budget = cfg.memory_limit > 0 ? cfg.memory_limit - allowance
                                  : plan_memory(cfg, storage).total + kEvalBudgetBytes;
  } else {
    if (cfg.val_files.empty() || cudnn || (storage.cuda && cfg.memory_limit <= 0))
      return cfg.micro_batch_size;
    const MemoryPlan base = plan_memory(cfg, storage);
    budget = cfg.memory_limit > 0
                 ? cfg.memory_limit - allowance - base.total
                 : std::max(base.bytes[int(MemCategory::Activations)] +
                                base.bytes[int(MemCategory::Workspace)],
                            kEvalBudgetBytes);
  }
  const auto fits = [&](int64_t batch) {
    return eval_model_bytes(cfg, storage, int(batch), standalone) <= budget;
  };
  int64_t lo = 1, hi = windows;  // the largest that fits in [1, windows], by bisection
  if (!fits(lo)) {
    lo = 0;
  } else if (fits(hi)) {
    lo = hi;
  } else {
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
  }
  if (standalone) return int(std::max<int64_t>(lo, 1));  // one sequence at the least
  return int(std::max<int64_t>(lo, cfg.micro_batch_size));
}

namespace {

// The run as `grass mem` plans it, with no GPU to ask which attention kernels "auto" will take
// (run_resolution.h: planned_attention).
RunConfig as_planned(const RunConfig& cfg, const Storage& storage) {
  RunConfig planned = cfg;
  planned.attention = planned_attention(cfg, storage);
  return planned;
}

double copy_seconds(const MemoryPlan& plan, const LinkModel& link);  // below
// The step time the copies and compute bound (step_bound's), or with no rate known the copies'
double step_seconds(const RunConfig& cfg, const MemoryPlan& plan, const LinkModel& link);
OffloadChoice choose_placement(const RunConfig& cfg, const Storage& storage, const LinkModel& link,
                               int64_t device_budget);  // below

// "optimizer states and layer inputs in the host tier", "nothing moves": cfg's placement.
std::string placement(const OffloadConfig& o) {
  if (!o.any()) return "nothing moves off the device";
  std::string out;
  if (o.optimizer_states) out = "optimizer states in the host tier";
  if (o.activations != ActivationOffload::None)
    out += std::string(out.empty() ? "" : ", ") + "layer inputs " +
           (o.activations == ActivationOffload::Host ? "in the host tier" : "on disk");
  if (o.layers > 0)
    out += std::string(out.empty() ? "" : ", ") + std::to_string(o.layers) +
           " layers' weights streamed from the host tier";
  return out;
}

// What offload "auto" would do for a run that does not fit, when it fits that way; else "".
std::string offload_advice(const RunConfig& cfg, const Storage& storage) {
  if (cfg.offload.automatic) return "";
  RunConfig automatic = cfg;
  automatic.offload.automatic = true;
  // cfg.memory_limit caps the plan here (the verdict's is already less what lies beyond it)
  const OffloadChoice choice = choose_placement(automatic, storage, {}, cfg.memory_limit);
  const MemoryPlan p = plan_memory(choice.cfg, storage);
  if (!choice.cfg.offload.any() || p.total > cfg.memory_limit) return "";
  return "offload \"auto\" fits it with " + placement(choice.cfg.offload) + ": " +
         format_bytes(p.total) + " on the device and " + format_bytes(p.host_total) +
         " in the host tier";
}

// What would fit cfg.memory_limit: the largest micro-batch, each checkpointing mode that
// recomputes more where it fits a larger one, and offload "auto"'s placement where it fits.
struct FitAdvice {
  std::string largest_text;  // "the largest micro_batch_size that fits is 7 (112 tokens)"
  std::string text;          // largest_text, then "; with activation_checkpointing ..." and so on
  int largest = 0;           // the run's largest micro_batch_size under the limit
  bool any = false;  // something fits: a micro-batch, another checkpointing mode or offload
};
FitAdvice fit_advice(const RunConfig& cfg, const Storage& storage) {
  FitAdvice a;
  a.largest = largest_micro_batch(cfg, storage, cfg.memory_limit);
  a.any = a.largest > 0;
  a.largest_text = a.largest > 0 ? "the largest micro_batch_size that fits is " +
                                       std::to_string(a.largest) + " (" +
                                       std::to_string(int64_t(a.largest) * cfg.seq_len) + " tokens)"
                                 : "not even micro_batch_size 1 fits";
  a.text = a.largest_text;
  for (const Checkpointing more : {Checkpointing::Elementwise, Checkpointing::Layer}) {
    if (more <= cfg.activation_checkpointing) continue;  // recomputes no more than the run does
    if (cfg.activations.on()) break;  // sampled activations need checkpointing "none"
    RunConfig other = cfg;
    other.activation_checkpointing = more;
    const int with_more = largest_micro_batch(other, storage, cfg.memory_limit);
    if (with_more > a.largest) {
      a.text += std::string("; with activation_checkpointing \"") + name_of(more) +
                "\": " + std::to_string(with_more);
      a.any = true;
    }
  }
  if (const std::string offloaded = offload_advice(cfg, storage); !offloaded.empty()) {
    a.text += "; " + offloaded;
    a.any = true;
  }
  return a;
}

// Why offload "auto" may not stream layers ("" where it may).
std::string why_no_layer_streams(const RunConfig& cfg, const Storage& storage) {
  if (storage.master)
    return "bf16-mixed's fp32 master copy does not stream yet; precision \"bf16\" or \"fp32\" "
           "streams";
  if (galore_refresh_pass(cfg.optimizer))
    return "GaLore's optimizer.svd_batch \"layer\" does not stream yet; \"none\" streams";
  return "";
}

// choose_offload with `device_budget` for the plan on the device (the memory_limit less what a
// card holds beyond the plan).
OffloadChoice choose_placement(const RunConfig& cfg, const Storage& storage, const LinkModel& link,
                               int64_t device_budget) {
  RunConfig base = cfg;
  base.offload.automatic = base.offload.layers_auto = false;
  if (cfg.offload.automatic) {
    base.offload.optimizer_states = false;
    base.offload.activations = ActivationOffload::None;
    base.offload.layers = 0;
  }
  const std::string what = cfg.offload.automatic ? "offload auto" : "offload.layers auto";
  if (cfg.memory_limit <= 0)
    return {base, what + ": no memory_limit, so nothing moves off the device"};
  if (device_budget <= 0)
    return {base, what + ": memory_limit " + format_bytes(cfg.memory_limit) + " is under the " +
                      format_bytes(cfg.memory_limit - device_budget) +
                      " a card holds beyond any plan: no placement fits"};
  struct Candidate {
    RunConfig cfg;
    MemoryPlan plan;
    double step_s, copy_s;
    bool faster_than(const Candidate& o) const {  // a shorter step, then fewer seconds of copies
      return step_s != o.step_s ? step_s < o.step_s : copy_s < o.copy_s;
    }
  };
  const auto fits = [&](const MemoryPlan& p) {
    return p.total <= device_budget &&
           (cfg.host_memory_limit <= 0 || p.host_total <= cfg.host_memory_limit);
  };
  const int L = cfg.model.num_hidden_layers;
  const bool layers_free = cfg.offload.automatic || cfg.offload.layers_auto;
  const std::string no_stream_reason = why_no_layer_streams(cfg, storage);
  const bool may_stream = layers_free && no_stream_reason.empty();
  // per placement of states and inputs, the fewest streamed layers that fit (each streamed
  // layer adds its fetches: fewer is less traffic), and the most, the least on the device
  std::vector<Candidate> fitting, least;
  const auto consider = [&](RunConfig c) {
    const auto plan_with = [&](int layers) {
      c.offload.layers = layers;
      const MemoryPlan p = plan_memory(c, storage);
      return Candidate{c, p, step_seconds(c, p, link), copy_seconds(p, link)};
    };
    if (!may_stream) {
      Candidate only = plan_with(c.offload.layers);
      (fits(only.plan) ? fitting : least).push_back(std::move(only));
      return;
    }
    if (Candidate none = plan_with(0); fits(none.plan)) return fitting.push_back(std::move(none));
    Candidate most = plan_with(L);
    if (!fits(most.plan)) return least.push_back(std::move(most));
    // !fits(lo), fits(hi): past the slots, the device total falls with each layer that leaves it
    int lo = 0, hi = L;
    Candidate found = std::move(most);
    while (hi - lo > 1) {
      const int mid = lo + (hi - lo) / 2;
      Candidate c_mid = plan_with(mid);
      if (fits(c_mid.plan)) {
        hi = mid;
        found = std::move(c_mid);
      } else {
        lo = mid;
      }
    }
    fitting.push_back(std::move(found));
  };
  if (!cfg.offload.automatic) {
    consider(base);
  } else {
    for (const bool states : {false, true})
      for (const ActivationOffload inputs :
           {ActivationOffload::None, ActivationOffload::Host, ActivationOffload::Disk}) {
        if (inputs != ActivationOffload::None &&
            cfg.activation_checkpointing != Checkpointing::Layer)
          continue;
        RunConfig c = base;
        c.offload.optimizer_states = states;
        c.offload.activations = inputs;
        consider(c);
      }
  }
  const int64_t beyond = cfg.memory_limit - device_budget;
  const std::string limits =
      "memory_limit " + format_bytes(cfg.memory_limit) +
      (beyond > 0 ? " (" + format_bytes(device_budget) + " for the plan, " + format_bytes(beyond) +
                        " for what a card holds beside it)"
                  : std::string()) +
      (cfg.host_memory_limit > 0 ? " and host_memory_limit " + format_bytes(cfg.host_memory_limit)
                                 : std::string());
  const Candidate* best = nullptr;
  for (const Candidate& c : fitting)  // the disk's copies always take longer than the host's
    if (!best || c.faster_than(*best)) best = &c;
  if (best) {
    const MemoryPlan& p = best->plan;
    if (!best->cfg.offload.any())
      return {best->cfg, what + ": nothing moves off the device: the run fits " + limits +
                             " as it is (" + format_bytes(p.total) + ")"};
    return {best->cfg, what + ": " + placement(best->cfg.offload) +
                           ", the fastest placement that fits " + limits + ": " +
                           format_bytes(p.total) + " on the device, " +
                           format_bytes(p.host_total) + " in the host tier, " +
                           format_bytes(p.h2d_bytes_per_step) + " to the device and " +
                           format_bytes(p.d2h_bytes_per_step) + " back a step"};
  }
  best = &least[0];
  for (const Candidate& c : least)
    if (c.plan.total < best->plan.total) best = &c;
  const std::string no_stream =
      layers_free && !may_stream ? " (no layer streams: " + no_stream_reason + ")" : "";
  return {best->cfg, what + ": no placement fits " + limits + "; the least on the device is " +
                         placement(best->cfg.offload) + ": " + format_bytes(best->plan.total) +
                         ", " + format_bytes(best->plan.total - device_budget) + " over" +
                         no_stream};
}

}  // namespace

OffloadChoice choose_offload(const RunConfig& given, const Storage& storage,
                            const LinkModel& link) {
  OffloadChoice choice = choose_placement(as_planned(given, storage), storage, link,
                                          given.memory_limit - beyond_plan_bytes(storage));
  choice.cfg.attention = given.attention;  // as given: it only chose the placement
  return choice;
}

void check_memory_limit(const RunConfig& cfg, const Storage& storage, const MemoryPlan& plan) {
  if (cfg.host_memory_limit > 0 && plan.host_total > cfg.host_memory_limit)
    throw UserError((cfg.source.empty() ? "" : cfg.source + ": ") +
                    "host_memory_limit: the run plans " + format_bytes(plan.host_total) +
                    " in the host tier (offload), over the limit of " +
                    format_bytes(cfg.host_memory_limit) +
                    " (grass mem <run.json> --host-memory-limit SIZE explores the options)");
  if (cfg.memory_limit <= 0 || plan.total <= cfg.memory_limit) return;
  // The breakdown on stdout, as the start-up table would have shown it; the error line on stderr.
  std::printf("memory plan of %s, %s, %s:\n", cfg.source.c_str(),
              storage.cuda ? "CUDA backend" : "CPU backend", storage.describe());
  for (int c = 0; c < kMemCategories; c++)
    std::printf("  %-12s %12s\n", mem_category_name(MemCategory(c)),
                format_bytes(plan.bytes[c]).c_str());
  std::printf("  %-12s %12s\n", "total", format_bytes(plan.total).c_str());
  if (plan.host_total > 0)
    std::printf("  and %s in the host tier (offload)\n", format_bytes(plan.host_total).c_str());
  std::fflush(stdout);
  throw UserError((cfg.source.empty() ? "" : cfg.source + ": ") + "memory_limit: the run plans " +
                  format_bytes(plan.total) + ", over the limit of " +
                  format_bytes(cfg.memory_limit) + " (breakdown above); " +
                  fit_advice(cfg, storage).text +
                  " (grass mem <run.json> --memory-limit SIZE explores the options)");
}

Storage planned_storage(const RunConfig& cfg) { return resolve(cfg, true).storage; }

namespace {

// Whether the run's rank fits every target of optimizer `kind` (GRASS may select the longer side
// of a target with select_dim; GaLore and FLORA project the shorter one).
bool rank_fits(const RunConfig& cfg, OptimizerKind kind) {
  const ProjectionConfig& g = cfg.optimizer.projection;
  return g.rank <= projected_side(kind, g, cfg.model, narrowest_target(kind, g, cfg.model));
}

// cuDNN attention's workspace for the run's micro-batch (part of the workspace category).
int64_t cudnn_workspace_bytes(const RunConfig& cfg) {
  const ModelConfig& m = cfg.model;
  return cudnn_attention_workspace_bytes(cfg.micro_batch_size, cfg.seq_len, m.num_attention_heads,
                                         m.head_dim());
}

// "n2" or "n1, act": the inputs marked in `kept`
std::string kept_input_names(const std::array<bool, 3>& kept) {
  std::string names;
  for (int i = 0; i < SampledInputs::kInputs; i++)
    if (kept[size_t(i)])
      names += (names.empty() ? "" : ", ") + std::string(SampledInputs::kInputNames[i]);
  return names;
}

// The run with its activations kept each way: the three checkpointing modes ("none" with every
// input whole, then, for GRASS targets selecting columns, with their inputs kept as those), then
// sampled at keep 0.5 and 0.3 (and the run's own keep), with the run's sampler or else wta-crs.
struct ActivationMode {
  std::string name;
  RunConfig cfg;
};
std::vector<ActivationMode> activation_modes(const RunConfig& cfg, const Storage& storage) {
  std::vector<ActivationMode> modes;
  for (const ChoiceName<Checkpointing>& c : choice_names<Checkpointing>()) {
    modes.push_back({c.name, cfg});
    modes.back().cfg.activation_checkpointing = c.value;
    modes.back().cfg.activations.sample = ActivationSample::None;
    if (c.value != Checkpointing::Layer)  // only a layer's input alone can move
      modes.back().cfg.offload.activations = ActivationOffload::None;
    else if (cfg.offload.activations != ActivationOffload::None)
      modes.back().name += std::string(", inputs offloaded (") + name_of(cfg.offload.activations) + ")";
    if (c.value != Checkpointing::None) continue;
    modes.back().cfg.activations.selected_columns = Switch::Off;
    RunConfig columns = modes.back().cfg;
    columns.activations.selected_columns = Switch::On;
    const std::string kept =
        kept_input_names(inputs_kept_as_columns(cfg.model, model_memory_options(columns, storage)));
    if (!kept.empty()) modes.push_back({"none, selected columns (" + kept + ")", columns});
  }
  std::vector<double> keeps = {0.5, 0.3};
  if (cfg.activations.on() && std::find(keeps.begin(), keeps.end(), cfg.activations.keep) == keeps.end())
    keeps.insert(keeps.begin(), cfg.activations.keep);
  const ActivationSample sampler = cfg.activations.on() ? cfg.activations.sample : ActivationSample::WtaCrs;
  for (const double keep : keeps) {
    modes.push_back({std::string("sampled (") + name_of(sampler) + ", keep " + json_check::format_number(keep) + ")", cfg});
    modes.back().cfg.activation_checkpointing = Checkpointing::None;
    modes.back().cfg.activations = {sampler, keep};
    modes.back().cfg.offload.activations = ActivationOffload::None;
  }
  return modes;
}

// One pass's copies on each queue, in seconds: a part fixed per step (states, streamed layers)
// and a part that grows with the step's tokens (the layer inputs, with the disk's time), at the
// plan's tokens; and the pass's compute at the plan's tokens.
struct QueueLoad {
  double fixed_s = 0, growing_s = 0;
  double at(double scale) const { return fixed_s + growing_s * scale; }
};
struct PassLoad {
  QueueLoad to_device, to_host;
  int64_t to_device_bytes = 0, to_host_bytes = 0;  // over the link
  double compute_s = 0;
  // both queues at once (two), or in turn (one)
  double copy_s(const LinkModel& link, double scale = 1) const {
    return link.copy_queues == 1 ? to_device.at(scale) + to_host.at(scale)
                                 : std::max(to_device.at(scale), to_host.at(scale));
  }
};
// The forward sends each layer input to the host (then to disk with the disk tier, a task on the
// same queue) and fetches its streamed layers; the backward fetches its layers (and, with
// deferred updates, the update pass's: counted with it), the inputs (read from disk first) and
// the states, and writes back the states and the layers' updates. The forward's compute is a
// third of the model's FLOPs (2 of 6 per weight and token); the backward takes the rest of what
// the MFU convention counts, and a checkpoint's recomputed forward.
std::array<PassLoad, 2> pass_loads(const MemoryPlan& plan, const LinkModel& link, double tokens) {
  const double bw = link.link_gbps * 1e9;
  const double inputs = double(plan.activation_bytes_per_step) / bw +
                        double(plan.disk_bytes_per_step) / (link.disk_gbps * 1e9);
  const double layers_in_forward = double(plan.layer_forward_fetch_bytes_per_step) / bw;
  const double layers_in_backward =
      double(plan.layer_fetch_bytes_per_step - plan.layer_forward_fetch_bytes_per_step) / bw;
  const double states_in = double(plan.h2d_bytes_per_step - plan.activation_bytes_per_step -
                                  plan.layer_fetch_bytes_per_step) / bw;
  const double states_out = double(plan.d2h_bytes_per_step - plan.activation_bytes_per_step -
                                   plan.layer_write_back_bytes_per_step) / bw;
  const double layers_out = double(plan.layer_write_back_bytes_per_step) / bw;
  const double rate = link.tflops * 1e12;
  const double forward = rate > 0 ? plan.forward_flops_per_token * tokens / rate : 0;
  const double total =
      rate > 0 ? (plan.flops_per_token + plan.recompute_flops_per_token) * tokens / rate : 0;
  PassLoad f, b;
  f.to_device = {layers_in_forward, 0};
  f.to_host = {0, inputs};
  f.to_device_bytes = plan.layer_forward_fetch_bytes_per_step;
  f.to_host_bytes = plan.activation_bytes_per_step;
  f.compute_s = forward;
  b.to_device = {layers_in_backward + states_in, inputs};
  b.to_host = {states_out + layers_out, 0};
  b.to_device_bytes = plan.h2d_bytes_per_step - f.to_device_bytes;
  b.to_host_bytes = plan.d2h_bytes_per_step - f.to_host_bytes;
  b.compute_s = total - forward;
  return {f, b};
}

double copy_seconds(const MemoryPlan& plan, const LinkModel& link) {
  double s = 0;
  for (const PassLoad& pass : pass_loads(plan, link, 0)) s += pass.copy_s(link);
  return s;
}

// Seconds of compute and of copies a step takes, pass by pass, the step time they bound, and
// the tokens a step would need for each pass's compute to cover its copies.
struct StepBound {
  std::array<double, 2> pass_compute_s{}, pass_copy_s{};  // forward, backward
  double compute_s = 0, copy_s = 0;
  double step_s = 0;  // the passes' longer side each, summed: copies overlap only their own pass
  int64_t hiding_tokens = 0;  // < 0: no step hides them (the inputs' copies outgrow the compute)
  bool link_bound() const {
    return pass_copy_s[0] > pass_compute_s[0] || pass_copy_s[1] > pass_compute_s[1];
  }
};
StepBound step_bound(const RunConfig& cfg, const MemoryPlan& plan, const LinkModel& link) {
  StepBound b;
  const double tokens = double(cfg.micro_batches_per_rank()) * cfg.micro_batch_size * cfg.seq_len;
  const std::array<PassLoad, 2> passes = pass_loads(plan, link, tokens);
  double scale = 0;  // the step's tokens over the plan's that hide every pass's copies
  for (size_t p = 0; p < passes.size(); p++) {
    const PassLoad& pass = passes[p];
    b.pass_compute_s[p] = pass.compute_s;
    b.pass_copy_s[p] = pass.copy_s(link);
    b.compute_s += pass.compute_s;
    b.copy_s += b.pass_copy_s[p];
    b.step_s += std::max(pass.compute_s, b.pass_copy_s[p]);
    // each queue (or both in turn) against the pass's compute, both growing with the tokens
    const QueueLoad one_queue = {pass.to_device.fixed_s + pass.to_host.fixed_s,
                                 pass.to_device.growing_s + pass.to_host.growing_s};
    const std::vector<QueueLoad> loads =
        link.copy_queues == 1 ? std::vector<QueueLoad>{one_queue}
                              : std::vector<QueueLoad>{pass.to_device, pass.to_host};
    for (const QueueLoad& q : loads) {
      if (q.fixed_s <= 0 && q.growing_s <= 0) continue;
      const double spare = pass.compute_s - q.growing_s;
      if (spare <= 0) scale = -1;
      else if (scale >= 0) scale = std::max(scale, q.fixed_s / spare);
    }
  }
  // (1e-9: a ratio that is a whole number of tokens is not rounded up past it)
  b.hiding_tokens = scale < 0 ? -1 : int64_t(std::ceil(scale * tokens - 1e-9));
  return b;
}

double step_seconds(const RunConfig& cfg, const MemoryPlan& plan, const LinkModel& link) {
  if (link.tflops <= 0 || plan.flops_per_token <= 0) return copy_seconds(plan, link);
  return step_bound(cfg, plan, link).step_s;
}

// "offload  ..." for the run's plan: what moves where, the bytes, the step-time bound and, with
// the disk tier, what it writes a day; "" without offload.
std::string describe_offload(const RunConfig& cfg, const MemoryPlan& plan, const LinkModel& link) {
  if (!cfg.offload.any()) return "";
  std::string what;
  if (cfg.offload.optimizer_states)
    what = "optimizer states in the host tier, through two device slots";
  if (cfg.offload.activations != ActivationOffload::None)
    what += std::string(what.empty() ? "" : "; ") + "layer inputs " +
            (cfg.offload.activations == ActivationOffload::Host ? "in the host tier"
                                                                : "on disk (offload.disk_dir)") +
            ", through a ring of " + std::to_string(XInRing::kSlots) + " device slots";
  if (cfg.offload.layers > 0) {
    const std::vector<int> streamed =
        streamed_layers_for(cfg.model.num_hidden_layers, cfg.offload.layers);
    std::string which;  // "2, 6, 10, ..., 38": the first three and the last of many
    for (size_t i = 0; i < streamed.size(); i++) {
      if (streamed.size() > 6 && i == 3) {
        which += ", ...";
        i = streamed.size() - 1;
      }
      which += (which.empty() ? "" : ", ") + std::to_string(streamed[i]);
    }
    what += std::string(what.empty() ? "" : "; ") + std::to_string(cfg.offload.layers) + " of " +
            std::to_string(cfg.model.num_hidden_layers) + " layers' matrices (" + which +
            ") in the host tier, through " +
            std::to_string(std::min(cfg.offload.layers, cfg.offload.layer_slots)) +
            " device slots";
  }
  char line[600];
  std::snprintf(line, sizeof line, "offload  %s;\n         per step %s to the device and %s back",
                what.c_str(), format_bytes(plan.h2d_bytes_per_step).c_str(),
                format_bytes(plan.d2h_bytes_per_step).c_str());
  std::string out = line;
  if (plan.disk_bytes_per_step > 0)
    out += ", " + format_bytes(plan.disk_bytes_per_step) + " written to disk and read back (a " +
           format_bytes(plan.disk_bytes) + " file)";
  if (link.tflops <= 0 || plan.flops_per_token <= 0)
    return out + " (--tflops states the step-time bound)\n";
  const StepBound b = step_bound(cfg, plan, link);
  std::snprintf(line, sizeof line,
                ":\n         %.3g s of copies over a %g GB/s link (%s)%s against %.3g s of "
                "compute at %g TFLOP/s",
                b.copy_s, link.link_gbps,
                link.copy_queues == 1 ? "one copy queue, both ways in turn"
                                      : "two copy queues, both ways at once",
                plan.disk_bytes_per_step > 0
                    ? (" and a " + json_check::format_number(link.disk_gbps) + " GB/s disk").c_str()
                    : "",
                b.compute_s, link.tflops);
  out += line;
  if (!b.link_bound()) {
    out += ": hidden\n";
  } else if (b.hiding_tokens < 0) {
    out += ": link-bound at any micro-batch (the inputs' copies take longer than their compute)\n";
  } else {
    const int64_t sequences = (b.hiding_tokens + cfg.seq_len - 1) / cfg.seq_len;
    std::snprintf(line, sizeof line,
                  ": link-bound; a step of %lld tokens (%lld sequences of %d) would hide them\n",
                  (long long)b.hiding_tokens, (long long)sequences, cfg.seq_len);
    out += line;
  }
  // pass by pass: copies overlap only their own pass's compute
  const std::array<PassLoad, 2> passes = pass_loads(plan, link, 0);
  for (size_t p = 0; p < passes.size(); p++) {
    std::snprintf(line, sizeof line,
                  "         %-9s %s to the device, %s back: %.3g s of copies, %.3g s of compute\n",
                  p == 0 ? "forward" : "backward", format_bytes(passes[p].to_device_bytes).c_str(),
                  format_bytes(passes[p].to_host_bytes).c_str(), b.pass_copy_s[p],
                  b.pass_compute_s[p]);
    out += line;
  }
  const double tokens = double(cfg.micro_batches_per_rank()) * cfg.micro_batch_size * cfg.seq_len;
  std::snprintf(line, sizeof line, "         a step takes at least %.3g s: %.0f tokens/s\n",
                b.step_s, tokens / b.step_s);
  out += line;
  if (plan.disk_bytes_per_step > 0) {  // SSD endurance: rated in terabytes written
    const double per_day = double(plan.disk_bytes_per_step) * 86400 / b.step_s;
    std::snprintf(line, sizeof line,
                  "warning  the disk tier writes %.3g TB a day at that step time: an SSD rated for "
                  "600 TB written would last %.3g days; keep layer inputs in the host tier where "
                  "it can hold them\n",
                  per_day / 1e12, 600e12 / per_day);
    out += line;
  }
  return out;
}

std::string plan_label(const RunConfig& cfg) {
  std::string label = name_of(cfg.optimizer.kind);
  if (is_projected(cfg.optimizer.kind))
    label += " r=" + std::to_string(cfg.optimizer.projection.rank);
  return label;
}

std::string precision_name(const Storage& storage) {
  switch (storage.precision) {
    case Precision::F32: return "fp32";
    case Precision::Bf16Mixed: return "bf16-mixed";
    case Precision::Bf16: return "pure bf16";
  }
  return "?";
}

// "LLaMA 13.016B, grass r=256, pure bf16, 1 x 256 tokens, checkpointed per layer": what the run
// is, as far as its memory goes.
std::string run_summary(const RunConfig& cfg, const Storage& storage) {
  char params[32];
  const double p = double(cfg.model.num_parameters());
  std::snprintf(params, sizeof params, "%.3f%s", p >= 1e9 ? p / 1e9 : p / 1e6, p >= 1e9 ? "B" : "M");
  std::string out = std::string("LLaMA ") + params + ", " + plan_label(cfg) + ", " +
                    precision_name(storage) + ", " + std::to_string(cfg.micro_batch_size) + " x " +
                    std::to_string(cfg.seq_len) + " tokens";
  const ModelMemoryOptions memory = model_memory_options(cfg, storage);
  if (memory.checkpointing == Checkpointing::Layer) out += ", checkpointed per layer";
  if (memory.checkpointing == Checkpointing::Elementwise) out += ", elementwise recomputation";
  if (cfg.offload.any()) out += ", " + placement(cfg.offload);
  if (cfg.ranks > 1) out += ", one of " + std::to_string(cfg.ranks) + " data-parallel ranks";
  return out;
}

std::string gb_card(int gib) {  // "a 32 GB card", "an 80 GB card"
  const std::string n = std::to_string(gib);
  return (n.starts_with("8") ? "an " : "a ") + n + " GB card";
}

}  // namespace

namespace {

// An eval_batch_size set by hand is memory the run always holds, so its plan counts it; "auto"
// takes what the plan leaves (resolve_eval_batch), so the question of fit is the plan's alone.
int fixed_eval_batch(const RunConfig& cfg, const Storage& storage) {
  if (cfg.val_files.empty() || cfg.eval_batch_size <= 0) return 0;
  return resolve_eval_batch(cfg, storage, cfg.eval_tokens, false);
}

// The evaluation's batch and memory, for grass mem; "" without data.val.
std::string describe_eval(const RunConfig& cfg, const Storage& storage) {
  if (cfg.val_files.empty()) return "";
  const int batch = resolve_eval_batch(cfg, storage, cfg.eval_tokens, false);
  const std::string setting =
      cfg.eval_batch_size > 0 ? "eval_batch_size " + std::to_string(cfg.eval_batch_size)
                              : std::string("eval_batch_size auto");
  if (batch <= cfg.micro_batch_size)
    return "eval    " + std::to_string(batch) + " sequences a forward, on the training model (" +
           setting + ")\n";
  return "eval    " + std::to_string(batch) + " sequences a forward (" + setting +
         "): a forward-only model on the training weights, " +
         format_bytes(eval_model_bytes(cfg, storage, batch, false)) +
         (cfg.eval_batch_size > 0 ? ", counted above"
          : cfg.memory_limit > 0  ? " beside the plan above (the room memory_limit leaves it)"
                                  : " beside the plan above (on the CPU, up to the training "
                                    "activations and workspace or 64 MiB)") +
         "\n";
}

}  // namespace

int64_t beyond_plan_bytes(const Storage& storage) {
  return storage.cuda ? kCudaOutsidePlanBytes + kGpuHeadroomBytes : 0;
}

MemoryVerdict memory_verdict(const RunConfig& given, const Storage& storage) {
  const RunConfig cfg = as_planned(given, storage);
  MemoryVerdict v;
  const MemoryPlan plan = plan_memory(cfg, storage, fixed_eval_batch(cfg, storage));
  const int64_t beyond = beyond_plan_bytes(storage);
  const int64_t GiB = int64_t(1) << 30;
  v.planned = plan.total;
  v.needed = plan.total + beyond;
  v.limited = cfg.memory_limit > 0 || cfg.host_memory_limit > 0;
  const std::string what = run_summary(cfg, storage) + " needs " + format_bytes(v.needed);
  // The largest micro-batch under `limit` and, when the run is over it, what would fit or the
  // floor the weights set: every option planned against the limit less what lies beyond the plan.
  const auto answer = [&](int64_t limit, const std::string& limit_name, const std::string& where) {
    RunConfig budget = cfg;
    budget.memory_limit = std::max<int64_t>(limit - beyond, 1);
    budget.offload.automatic = false;
    const FitAdvice advice = fit_advice(budget, storage);
    v.largest_micro_batch = advice.largest;
    if (v.needed <= limit)
      return " (" + format_bytes(limit - v.needed) + " to spare" + where + "); " + advice.largest_text;
    std::string out = " (" + format_bytes(v.needed - limit) + " over" + where + "); ";
    if (advice.any) return out + advice.text;
    const int64_t weights = plan.bytes[int(MemCategory::Weights)];
    const std::string dtype = storage.weight_bytes == 2 ? "bf16" : "fp32";
    const std::string no_placement =
        ": no placement trains this model under " + limit_name +
        " with every weight on the device: stream some layers' (offload.layers, with precision "
        "\"bf16\" or \"fp32\"" +
        (galore_refresh_pass(cfg.optimizer) ? " and GaLore's optimizer.svd_batch \"none\"" : "") +
        ")";
    if (beyond >= limit)
      return out + "a card holds " + format_bytes(beyond) +
             " beyond any plan (the CUDA context and libraries, the reservation's free memory): "
             "nothing trains under " + limit_name + " on the GPU";
    if (weights > limit) return out + "the " + dtype + " weights alone take " + format_bytes(weights) + no_placement;
    if (weights + beyond > limit)
      return out + "the " + dtype + " weights take " + format_bytes(weights) + " and a card holds " +
             format_bytes(beyond) + " beyond the plan" + no_placement;
    return out + "no micro-batch, activation checkpointing or offload fits it (the " + dtype +
           " weights alone take " + format_bytes(weights) + ")";
  };
  if (cfg.memory_limit > 0) {
    v.card = cfg.memory_limit;
    v.fits = v.needed <= cfg.memory_limit;
    const std::string limit = format_bytes(cfg.memory_limit);
    v.line = (v.fits ? "fits" : "does not fit") + std::string(" memory_limit ") + limit + ": " +
             what + answer(cfg.memory_limit, limit, "");
  } else if (storage.cuda) {
    int smallest = 0, below = 0;  // the smallest card that fits, and the one below it
    for (const int gib : kCardGiB) {
      if (v.needed <= gib * GiB) {
        smallest = gib;
        break;
      }
      below = gib;
    }
    const int biggest = kCardGiB[std::size(kCardGiB) - 1];
    v.card = int64_t(smallest ? smallest : biggest) * GiB;
    if (!smallest) {
      v.line = "fits no card up to " + std::to_string(biggest) + " GB: " + what +
               answer(v.card, std::to_string(biggest) + " GiB", " " + std::to_string(biggest) + " GB");
    } else {
      v.line = "fits " + gb_card(smallest) + (smallest == biggest ? "" : " and larger") +
               (below ? ", not " + gb_card(below) : std::string()) + ": " + what +
               answer(v.card, "", " on " + gb_card(smallest));
    }
  } else {
    v.line = "the CPU backend needs " + format_bytes(v.needed) + ": " + run_summary(cfg, storage) +
             " (--memory-limit SIZE says whether it fits a limit and the largest micro_batch_size "
             "that does)";
  }
  if (cfg.host_memory_limit > 0) {
    const bool host_fits = plan.host_total <= cfg.host_memory_limit;
    v.fits = v.fits && host_fits;
    v.line += "; its host tier's " + format_bytes(plan.host_total) +
              (host_fits ? " fits" : " does not fit") + " host_memory_limit " +
              format_bytes(cfg.host_memory_limit);
  }
  if (storage.cuda)
    v.details += "  " + format_bytes(v.needed) + " = " + format_bytes(v.planned) + " planned + " +
                 format_bytes(kCudaOutsidePlanBytes) +
                 " the CUDA context and libraries take outside the plan (measured on an H200) + " +
                 format_bytes(kGpuHeadroomBytes) + " the reservation leaves free beside it\n";
  if (cfg.memory_limit > 0 && !v.fits && plan.total <= cfg.memory_limit)
    v.details += "  (grass train's memory_limit caps the plan alone, " + format_bytes(plan.total) +
                 ", and would start it; a card of " + format_bytes(cfg.memory_limit) +
                 " would not hold the rest)\n";
  if (cfg.memory_limit <= 0 && storage.cuda)
    v.details += "  a card sold as N GB counted as N GiB, the total nvidia-smi shows for an A100 40GB "
                 "(40,960 MiB); some show less (an H100 80GB: 81,559 MiB)\n";
  return v;
}

double default_tflops(const Storage& storage) { return storage.cuda ? 0.4 * 989 : 0; }

std::string format_memory_plans(const RunConfig& given, const Storage& storage,
                                const LinkModel& link, const std::string& offload_auto) {
  const RunConfig cfg = as_planned(given, storage);
  // The run's optimizer first, then every other one on the same model, batch and rank.
  std::vector<RunConfig> configs = {cfg};
  for (const ChoiceName<OptimizerKind>& c : choice_names<OptimizerKind>()) {
    if (c.value == cfg.optimizer.kind || (is_projected(c.value) && !rank_fits(cfg, c.value)))
      continue;
    configs.push_back(cfg);
    configs.back().optimizer.kind = c.value;
  }
  std::vector<MemoryPlan> plans;
  for (const RunConfig& c : configs) plans.push_back(plan_memory(c, storage, fixed_eval_batch(c, storage)));

  char line[200];
  const MemoryVerdict verdict = memory_verdict(cfg, storage);
  std::string out = verdict.line + "\n" + verdict.details;
  if (!offload_auto.empty()) out += offload_auto + "\n";
  out += std::string("storage ") + (storage.cuda ? "CUDA backend, " : "CPU backend, ") +
         storage.describe() + (storage.master ? "; the master copy counts as optimizer state" : "") +
         "\n";
  if (cfg.optimizer.state_dtype == StateDtype::Q8)
    out += "states  " + state_format(cfg.optimizer, storage) +
           ", for every optimizer below\n";
  const ModelMemoryOptions memory = model_memory_options(cfg, storage);
  out += std::string("memory  activations ") +
         activations_kept(cfg.model, memory) +
         ", updates " + (memory.fused_update ? "fused into the backward" : "after the backward") +
         (storage.cuda ? ", head " + describe_head(cfg, storage, memory) : "") + "\n";
  if (memory.attention == AttentionKernel::Cudnn)  // in workspace; the T² term dominates long T
    out += std::string(given.attention != AttentionChoice::Cudnn  // "auto", planned as cuDNN's
                           ? "        attention \"auto\": cuDNN's where it loads on the GPU, "
                             "planned with its workspace, the larger: "
                           : "        cuDNN attention's workspace ") +
           format_bytes(cudnn_workspace_bytes(cfg)) + " (grows as seq_len²)\n";
  out += describe_eval(cfg, storage);
  const auto table_row = [&](const std::string& head, const auto& cell) {
    std::snprintf(line, sizeof line, "%-22s", head.c_str());
    out += line;
    for (size_t i = 0; i < configs.size(); i++) {
      std::snprintf(line, sizeof line, " %14s", cell(i).c_str());
      out += line;
    }
    out += "\n";
  };
  table_row("", [&](size_t i) { return plan_label(configs[i]); });
  const char* rows[kMemCategories] = {"weights", "gradients (dense)", "gradients (projected)",
                                      "optimizer states", "activations", "workspace"};
  for (int c = 0; c < kMemCategories; c++)
    table_row(rows[c], [&](size_t i) { return format_bytes(plans[i].bytes[c]); });
  table_row(cfg.offload.any() ? "total on the device" : "total",
            [&](size_t i) { return format_bytes(plans[i].total); });
  if (cfg.offload.any()) {
    table_row("host tier (offload)", [&](size_t i) { return format_bytes(plans[i].host_total); });
    const bool symmetric = std::all_of(plans.begin(), plans.end(), [](const MemoryPlan& p) {
      return p.h2d_bytes_per_step == p.d2h_bytes_per_step;
    });
    table_row(symmetric ? "copied a step, each way" : "to device a step",
              [&](size_t i) { return format_bytes(plans[i].h2d_bytes_per_step); });
    if (!symmetric)
      table_row("to host a step",
                [&](size_t i) { return format_bytes(plans[i].d2h_bytes_per_step); });
    if (cfg.offload.activations == ActivationOffload::Disk)
      table_row("disk file (offload)", [&](size_t i) { return format_bytes(plans[i].disk_bytes); });
  }
  if (cfg.ranks > 1) {  // a one-GPU question has no sums to show
    out += "summed over the " + std::to_string(cfg.ranks) + " data-parallel ranks, per rank:\n";
    table_row("each step", [&](size_t i) { return format_bytes(plans[i].step_sum_bytes); });
    table_row("+ at a refresh", [&](size_t i) {
      return plans[i].refresh_sum_bytes > 0 ? format_bytes(plans[i].refresh_sum_bytes)
                                            : std::string("-");
    });
  }
  // What each way of keeping activations takes, for the run's optimizer (the rest is the same).
  std::snprintf(line, sizeof line, "%-34s %14s %14s\n",
                ("activations kept, " + plan_label(cfg) + ":").c_str(), "activations", "total");
  out += line;
  for (const ActivationMode& mode : activation_modes(cfg, storage)) {
    const MemoryPlan p = plan_memory(mode.cfg, storage);
    std::snprintf(line, sizeof line, "  %-32s %14s %14s\n", mode.name.c_str(),
                  format_bytes(p.bytes[int(MemCategory::Activations)]).c_str(),
                  format_bytes(p.total).c_str());
    out += line;
  }
  out += describe_offload(cfg, plans[0], link);
  return out;
}

std::string memory_plan_json(const RunConfig& given, const Storage& storage,
                             const LinkModel& link, const std::string& offload_auto) {
  const RunConfig cfg = as_planned(given, storage);
  const MemoryPlan plan = plan_memory(cfg, storage, fixed_eval_batch(cfg, storage));
  const ModelMemoryOptions memory = model_memory_options(cfg, storage);
  nlohmann::json bytes = nlohmann::json::object();
  for (int c = 0; c < kMemCategories; c++) bytes[mem_category_name(MemCategory(c))] = plan.bytes[c];
  nlohmann::json out = {
      {"parameters", cfg.model.num_parameters()},
      {"optimizer", name_of(cfg.optimizer.kind)},
      {"micro_batch_size", cfg.micro_batch_size},
      {"seq_len", cfg.seq_len},
      {"device", name_of(storage.cuda ? DeviceChoice::Cuda : DeviceChoice::Cpu)},
      {"storage", storage.describe()},
      {"states", state_format(cfg.optimizer, storage)},
      {"activation_checkpointing",
       name_of(memory.checkpointing)},
      {"fused_update", memory.fused_update},
      {"head_rows", head_rows(storage, int64_t(cfg.micro_batch_size) * cfg.seq_len,
                              cfg.model.vocab_size, memory.head_chunk_rows)},
      {"ffn_stored", ffn_stored_width(cfg.model, memory)},
      {"attention", name_of(memory.attention)},
      {"attention_choice", name_of(given.attention)},
      {"bytes", bytes},
      {"total", plan.total},
      {"step_sum_bytes", plan.step_sum_bytes},
      {"refresh_sum_bytes", plan.refresh_sum_bytes},
      {"flops_per_token", plan.flops_per_token},
  };
  if (is_projected(cfg.optimizer.kind)) out["rank"] = cfg.optimizer.projection.rank;
  if (!cfg.val_files.empty()) {
    const int batch = resolve_eval_batch(cfg, storage, cfg.eval_tokens, false);
    out["eval"] = {{"batch", batch},
                   {"auto", cfg.eval_batch_size <= 0},
                   {"model_bytes", batch > cfg.micro_batch_size
                                       ? eval_model_bytes(cfg, storage, batch, false)
                                       : int64_t(0)},
                   {"in_total", cfg.eval_batch_size > 0}};
  }
  const std::array<bool, 3> columns = inputs_kept_as_columns(cfg.model, memory);
  nlohmann::json kept_as_columns = nlohmann::json::array();
  for (int i = 0; i < SampledInputs::kInputs; i++)
    if (columns[size_t(i)]) kept_as_columns.push_back(SampledInputs::kInputNames[i]);
  out["inputs_kept_as_columns"] = kept_as_columns;
  if (cfg.activations.on())
    out["activations"] = {{"sample", name_of(cfg.activations.sample)}, {"keep", cfg.activations.keep}};
  nlohmann::json modes = nlohmann::json::array();
  for (const ActivationMode& mode : activation_modes(cfg, storage)) {
    const MemoryPlan p = plan_memory(mode.cfg, storage);
    modes.push_back({{"mode", mode.name},
                     {"activations", p.bytes[int(MemCategory::Activations)]},
                     {"total", p.total}});
  }
  out["activation_modes"] = modes;
  if (memory.attention == AttentionKernel::Cudnn)
    out["cudnn_workspace_bytes"] = cudnn_workspace_bytes(cfg);
  nlohmann::json host = nlohmann::json::object();
  for (int c = 0; c < kMemCategories; c++)
    host[mem_category_name(MemCategory(c))] = plan.host_bytes[c];
  out["offload"] = {{"optimizer_states", cfg.offload.optimizer_states},
                    {"activations", name_of(cfg.offload.activations)}};
  out["disk_bytes"] = plan.disk_bytes;
  out["disk_bytes_per_step"] = plan.disk_bytes_per_step;
  out["disk_gbps"] = link.disk_gbps;
  if (!offload_auto.empty()) out["offload_auto"] = offload_auto;
  if (cfg.host_memory_limit > 0) {
    out["host_memory_limit"] = cfg.host_memory_limit;
    out["host_fits"] = plan.host_total <= cfg.host_memory_limit;
  }
  out["host_bytes"] = host;
  out["host_total"] = plan.host_total;
  out["h2d_bytes_per_step"] = plan.h2d_bytes_per_step;
  out["d2h_bytes_per_step"] = plan.d2h_bytes_per_step;
  out["link_gbps"] = link.link_gbps;
  out["copy_queues"] = link.copy_queues;
  if (link.tflops > 0 && plan.flops_per_token > 0) {
    const StepBound b = step_bound(cfg, plan, link);
    const std::array<PassLoad, 2> passes = pass_loads(plan, link, 0);
    out["tflops"] = link.tflops;
    out["step_bound"] = {{"compute_s", b.compute_s},
                         {"copy_s", b.copy_s},
                         {"step_s", b.step_s},
                         {"forward", {{"compute_s", b.pass_compute_s[0]},
                                      {"copy_s", b.pass_copy_s[0]},
                                      {"to_device_bytes", passes[0].to_device_bytes},
                                      {"to_host_bytes", passes[0].to_host_bytes}}},
                         {"backward", {{"compute_s", b.pass_compute_s[1]},
                                       {"copy_s", b.pass_copy_s[1]},
                                       {"to_device_bytes", passes[1].to_device_bytes},
                                       {"to_host_bytes", passes[1].to_host_bytes}}},
                         {"link_bound", b.link_bound()},
                         {"hiding_tokens", b.hiding_tokens}};
  }
  if (storage.cuda) out["gpu_headroom_bytes"] = kGpuHeadroomBytes;
  if (cfg.memory_limit > 0) {
    out["memory_limit"] = cfg.memory_limit;
    out["fits"] = plan.total <= cfg.memory_limit;
    out["largest_micro_batch"] = largest_micro_batch(cfg, storage, cfg.memory_limit);
  }
  const MemoryVerdict v = memory_verdict(cfg, storage);
  nlohmann::json verdict = {
      {"line", v.line},
      {"fits", v.fits},
      {"limited", v.limited},
      {"planned_bytes", v.planned},
      {"cuda_outside_plan_bytes", storage.cuda ? kCudaOutsidePlanBytes : 0},
      {"reservation_headroom_bytes", storage.cuda ? kGpuHeadroomBytes : 0},
      {"needed_bytes", v.needed},
      {"largest_micro_batch", v.largest_micro_batch},
      {"exit_code", v.exit_code()},
      {"exit_codes", {{"0", "fits, or no limit was asked"},
                      {"1", "internal error"},
                      {"2", "user error"},
                      {std::to_string(kExitDoesNotFit),
                       "does not fit memory_limit or host_memory_limit"}}},
  };
  if (v.card > 0) verdict["card_bytes"] = v.card;
  if (storage.cuda && cfg.memory_limit <= 0) {
    nlohmann::json cards = nlohmann::json::array();
    for (const int gib : kCardGiB)
      cards.push_back({{"gib", gib}, {"fits", v.needed <= (int64_t(gib) << 30)}});
    verdict["cards"] = cards;
  }
  out["verdict"] = verdict;
  return out.dump() + "\n";
}

}  // namespace grass
