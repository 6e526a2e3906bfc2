// Model and run configuration: parsed from JSON, validated with one clear line per problem.
//
// Model configs use Hugging Face LlamaConfig keys, so GaLore's and HF's config.json files load
// unchanged. Run configs (configs/runs/*.json) describe one training run; docs/configs.md lists
// every key with its default.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/config/choices.h"

namespace grass {

struct ModelConfig {
  int hidden_size = 0;              // d
  int intermediate_size = 0;        // ffn width (need not be a multiple of 8: 5461 must work)
  int num_attention_heads = 0;      // query heads
  int num_key_value_heads = 0;      // GQA: defaults to num_attention_heads
  int num_hidden_layers = 0;
  int vocab_size = 0;
  int max_position_embeddings = 2048;  // also read from GaLore's "max_sequence_length"
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;

  int head_dim() const { return hidden_size / num_attention_heads; }
  // [out, in] of a projection
  std::pair<int, int> linear_shape(ProjectionTarget target) const;
  int64_t num_parameters() const;   // every trainable element, embeddings and norms included
  bool operator==(const ModelConfig&) const = default;
};

// The projected optimizers' settings: GRASS (docs/grass.md), GaLore and
// FLORA (docs/lowrank.md). Their targets train at rank r; the other tensors train with AdamW.
struct ProjectionConfig {
  int rank = 128;                   // r: rows, columns or projected dimensions per target
  // K: steps between refreshes: GRASS's selection, GaLore's SVD (its update_proj_gap), FLORA's
  // resampling (its kappa; FLORA's default is 1000)
  int64_t update_interval = 200;
  double scale = 0.25;              // α: the update is lr·α·(ρ·Δ or the back-projected Adam step)
  Selection selection = Selection::TopR;   // GRASS only
  SelectDim select_dim = SelectDim::Auto;  // GRASS only; Auto: the smaller of out and in features
  // GRASS only: multiply each selected slice's Adam step by its ρ (docs/grass.md, "ρ under
  // Adam"); off, a slice drawn once moves at the learning rate top_r's do, and one drawn c times
  // (the rules with replacement) c times as far.
  bool rho_in_update = false;
  // GRASS and GaLore: target k of n re-selects (GaLore: forms a new P) at the steps ≡ k·K/n
  // (mod K) instead of all at once at multiples of K; every target does so at step 0.
  bool refresh_stagger = false;
  // FLORA only: the bound on the RMS of each target's update before lr·scale (flora-opt's
  // clip_threshold, Adafactor's update clipping); 0: unbounded. FLORA's default is 1.
  double max_update_rms = 0;
  // GaLore only: how a refresh finds P (GaloreSvd); the randomized range finder's power
  // iterations and extra columns (docs/lowrank.md).
  GaloreSvd svd = GaloreSvd::Auto;
  int svd_power_iters = 2;
  int svd_oversample = 8;
  // GaLore with the randomized refresh: whether a refresh of every target solves each layer's
  // eigenproblems in one batched call, in a pass of its own before the step's backward
  // (GaloreSvdBatch; docs/lowrank.md).
  GaloreSvdBatch svd_batch = GaloreSvdBatch::None;
  std::vector<ProjectionTarget> targets = {ProjectionTarget::Q,    ProjectionTarget::K,
                                           ProjectionTarget::V,    ProjectionTarget::O,
                                           ProjectionTarget::Gate, ProjectionTarget::Up,
                                           ProjectionTarget::Down};
  uint64_t seed = 0;                // GRASS's draws, FLORA's projections (default: the run's seed)
  bool operator==(const ProjectionConfig&) const = default;

  // Whether a weight of out x in features selects rows (out) rather than columns (in).
  bool selects_rows(int out, int in) const {
    return select_dim == SelectDim::Rows || (select_dim == SelectDim::Auto && out <= in);
  }
};

// The side of a target weight of out x in features (Hugging Face's shape, so padding never
// changes it) that a projected optimizer trains at rank r: rows (true) or columns. GRASS selects
// select_dim's side; GaLore and FLORA project the shorter side, columns for a square weight.
inline bool projects_rows(OptimizerKind kind, const ProjectionConfig& g, int64_t out, int64_t in) {
  return kind == OptimizerKind::Grass ? g.selects_rows(int(out), int(in)) : out < in;
}
// That side's length for one target of the model, and the target whose side is the shortest
// (the largest rank the run can take; g.targets must not be empty).
int projected_side(OptimizerKind kind, const ProjectionConfig& g, const ModelConfig& m,
                   ProjectionTarget target);
ProjectionTarget narrowest_target(OptimizerKind kind, const ProjectionConfig& g,
                                  const ModelConfig& m);

// The small-batch proximal method (Zhang, Qu, Chen, Metaxas, IJCAI 2019; docs/proximal.md):
// inner loops of S steps; at a loop's first step the anchor θ̄ takes the weights, each step's
// gradient gains 2·(λ/η)·(θ − θ̄) (η the run's learning rate at that step) and the step runs at
// η/(t+1), t = 0..S−1 the step within the loop. AdamW: every tensor, S = inner_steps.
// GRASS: its targets' selected slices only (the dense tensors train without it), S = the refresh
// interval, the anchor taken again at each refresh.
struct ProximalConfig {
  double lambda = 0;        // 0: off
  int64_t inner_steps = 0;  // S (AdamW; GRASS's is update_interval)
  bool enabled() const { return lambda > 0; }
  bool operator==(const ProximalConfig&) const = default;
};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::AdamW;  // JSON "name"
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;  // JSON: "betas": [b1, b2]
  double eps = 1e-8;                // GaLore's default: 1e-6 (galore_torch's AdamW)
  double weight_decay = 0.0;        // decoupled; never applied to RMSNorm gains
  // AdamW only: the learning rate of the tensors the projected optimizers target by default
  // (every layer's q/k/v/o/gate/up/down) is lr × target_lr_scale, so an AdamW run can have
  // GRASS's split (its targets move at lr × scale, the rest at lr) without the projection. Their
  // weight decay stays lr·wd, as the projected optimizers' targets decay.
  double target_lr_scale = 1.0;
  // How the moments are stored (StateDtype; docs/configs.md): q8 keeps 1-byte codes per moment
  // element and an fp32 absmax per block of state_block elements (a power of two, 64 to 4096);
  // a tensor under kQuant8MinElements elements keeps the precision's moments. A projected
  // optimizer's states are blocked as state_blocking says (its dense tensors' always flat); per
  // feature by default, which docs/memory.md's measurement chose.
  StateDtype state_dtype = StateDtype::Auto;
  int state_block = 256;
  StateBlocking state_blocking = StateBlocking::Feature;
  ProjectionConfig projection;      // grass, galore, flora: their targets; the rest AdamW
  ProximalConfig proximal;          // adamw and grass only
  // Not a key: the run's offload.optimizer_states, which the optimizers' states follow.
  bool offload_states = false;
  bool operator==(const OptimizerConfig&) const = default;
};

// Whether GaLore forms its refreshes in a pass of their own before the step's backward
// (optimizer.svd_batch "layer"; the pass runs only where the refresh is randomized).
inline bool galore_refresh_pass(const OptimizerConfig& o) {
  return o.kind == OptimizerKind::GaLore && o.projection.svd_batch == GaloreSvdBatch::Layer;
}

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::Cosine;  // JSON "name": warmup + cosine to min_lr_ratio,
                                            // or constant
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1;        // cosine only: final lr = lr * min_lr_ratio
  bool operator==(const ScheduleConfig&) const = default;
};

// Sampled inputs of the weight gradients (model/row_sampling.h): the sampler, and the share of
// a micro-batch's token rows stored (bernoulli: each row's probability).
struct SampledActivations {
  ActivationSample sample = ActivationSample::None;
  double keep = 0.5;
  // activations.selected_columns: GRASS `cols` targets' inputs kept as their selected columns
  // (model/llama.h, ModelMemoryOptions::columns; exact). auto: wherever that saves memory; on:
  // the same, and an error where it saves nothing; off: the inputs kept whole.
  Switch selected_columns = Switch::Auto;
  bool on() const { return sample != ActivationSample::None; }
  bool operator==(const SampledActivations&) const = default;
};

// offload: what the run keeps off the device (MemPlace, core/arena.h; docs/memory.md), a layout
// of memory that never changes a number computed.
// optimizer_states: every optimizer's moments (and proximal anchors) live in the host tier and
// pass through two device slots for each update. GRASS's σ and ρ, GaLore's projections and the
// master weights stay on the device. A projected target's states move whole; AdamW's in pieces
// of up to piece_bytes (JSON: a size, "16MiB"), or the largest target's if larger, which sizes
// the slots.
// activations (needs activation_checkpointing "layer"): each layer's input, the one activation
// kept from the forward to the backward, waits in the host tier or in a file ring in disk_dir
// (default: out_dir) and comes back through a three-slot device ring (model/x_in_ring.h).
// layers: this many decoder layers' matrices live in the host tier, spread evenly over the
// model, and pass through layer_slots device slots (default 3) for each pass
// (model/layer_stream.h); needs fused updates and no fp32 master copy (precision "fp32" or
// "bf16").
// JSON "auto" (automatic): the planner picks the placement that fits memory_limit (and
// host_memory_limit) with the least traffic (train/offload_choice.h).
struct OffloadConfig {
  bool optimizer_states = false;
  int64_t piece_bytes = int64_t(16) << 20;
  ActivationOffload activations = ActivationOffload::None;
  std::string disk_dir;  // "": out_dir
  int layers = 0;
  int layer_slots = 3;
  bool layers_auto = false;  // "layers": "auto": the fewest streamed layers that fit memory_limit
  bool automatic = false;    // offload "auto": states, inputs and layers placed by the planner
  bool any() const {
    return optimizer_states || activations != ActivationOffload::None || layers > 0;
  }
  bool operator==(const OffloadConfig&) const = default;
};

struct RunConfig {
  std::string source;               // the file this came from (for messages); "" if inline
  ModelConfig model;
  std::string model_path;           // "" when the model was given inline
  // data.train and data.val as written (a string is a list of one): shard files, globs,
  // directories, manifests, expanded only where the shards are opened (src/data/data_sets.h)
  std::vector<std::string> train_files;
  std::vector<std::string> val_files;    // empty: no evaluation
  std::string tokenizer;            // data.tokenizer: the .model the shards must come from; "": any
                                    // (checked with the shards, not while parsing)
  bool shuffle = true;              // data.shuffle: windows in a seeded order per epoch
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  double grad_clip = 1.0;           // global L2 norm; 0 disables clipping
  int micro_batch_size = 1;         // sequences per forward/backward
  int total_batch_size = 1;         // sequences per optimizer step (multiple of micro_batch_size;
                                    // JSON without it means micro_batch_size: no accumulation)
  int seq_len = 256;
  int64_t steps = 100;
  // fp32 | bf16-mixed (bf16 weights, fp32 master weights and states) | bf16 (bf16 weights
  // and states, stochastic rounding) | auto: bf16-mixed on a GPU, fp32 on the CPU.
  PrecisionChoice precision = PrecisionChoice::Auto;
  DeviceChoice device = DeviceChoice::Auto;  // auto: the GPU when one is usable
  // layer: keep only each layer's input and recompute the rest of the layer in the backward
  // (one layer's activations at a time instead of every layer's).
  Checkpointing activation_checkpointing = Checkpointing::None;
  // activations: {"sample", "keep"}: with activation_checkpointing "none", the inputs that only
  // weight gradients read stored as keep·N sampled token rows (the estimate, unbiased, replaces
  // those gradients on steps without a refresh; docs/configs.md).
  SampledActivations activations;
  // Apply each gradient as soon as the backward forms it, so no gradient buffer for the whole
  // model exists (needs one micro-batch per step; auto: on in pure bf16).
  Switch fused_update = Switch::Auto;
  // Store an ffn width that is not a multiple of 8 (LLaMA-1B's 5461) padded to one, with zero
  // pad rows and columns, so the MLP's bf16 GEMMs get 16-byte-aligned rows; the numbers computed
  // are the same to rounding (auto: on with the CUDA backend).
  Switch pad_ffn = Switch::Auto;
  // The GPU's attention kernels: the engine's own (the readable ones the CPU checks) or cuDNN's
  // fused flash attention (GPU only). "auto" takes cuDNN's where they load and build for the
  // run's shapes, else the engine's (train/backend_choice.h); config.json keeps "auto", the
  // start-up table, metrics.jsonl and the checkpoint's state.json what it took (docs/configs.md).
  AttentionChoice attention = AttentionChoice::Auto;
  // The most bytes the run's memory plan may take (its device arena is exactly the plan); 0: no
  // cap. JSON: "40GiB", "32 GiB", "512MiB", "40GB" (10^9) or a number of bytes.
  int64_t memory_limit = 0;
  int64_t host_memory_limit = 0;  // caps the host tier's bytes (offload); 0: no cap
  OffloadConfig offload;
  uint64_t seed = 42;
  std::string out_dir = "runs/default";
  int log_every = 1;                // print a step line every N steps (metrics.jsonl gets all)
  int64_t eval_every = 0;           // evaluate every N steps; 0: only after the last step
  int64_t eval_tokens = 10'000'000;  // validation targets per evaluation (GaLore: first 10M)
  // Sequences per evaluation forward; 0: "auto", as many as memory allows
  // (train/memory_plan.h: resolve_eval_batch). Changes the loss only by rounding.
  int eval_batch_size = 0;
  int64_t checkpoint_every = 0;     // save <out_dir>/checkpoints/step_N every N steps and after the
                                    // last; 0: never
  int64_t checkpoint_keep = 3;      // keep the newest N checkpoints ...
  int64_t checkpoint_keep_every = 0;  // ... and, forever, those whose step is a multiple of this
  std::string init_from;            // Hugging Face model dir (or .safetensors) to start from;
                                    // "": weights initialised from seed

  int ranks = 1;                    // data-parallel ranks (mpirun's -np), set by the launcher,
                                    // not a config key

  int grad_accum_steps() const { return total_batch_size / micro_batch_size; }  // all ranks'
  int micro_batches_per_rank() const { return grad_accum_steps() / ranks; }
  int64_t tokens_per_step() const { return int64_t(total_batch_size) * seq_len; }
  bool operator==(const RunConfig&) const = default;
};

// Parse and validate a model config (HF LlamaConfig JSON). `where` names the file in messages.
// Throws UserError with one line: "<where>: <key>: <problem>".
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& where);
ModelConfig load_model_config(const std::string& path);

// Load a run config file, apply "--set key=value" overrides (dotted keys, value parsed as JSON
// when it is valid JSON, else taken as a string), then validate. Relative paths inside (model,
// init_from, data.*, offload.disk_dir) resolve against the working directory, not the config's
// folder. Parsing checks that model and init_from exist; the data is opened only by the commands
// that read it, so `grass mem` plans a run whose data is elsewhere. ranks: the data-parallel ranks
// the run will have, against which the batch sizes are checked.
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {},
                          int ranks = 1);
RunConfig parse_run_config(const nlohmann::json& j, const std::string& where, int ranks = 1);

// Whether a run config key (dotted, as to_json's output flattens: "optimizer.lr", "data.val[0]")
// changes what a run computes. Those that do not may differ between a run and its resumption:
// where and how often it writes, evaluates and logs, init_from (a resumed run has weights),
// pad_ffn (a layout: a checkpoint of the other layout does not fit and says so), and attention
// (the key names a wish, "auto" most often: the kernels a run took are in its checkpoints'
// state.json, and a resume on others warns; train/checkpointing.h).
bool changes_results(const std::string& key);

// The keys that change results (changes_results) whose values differ between two run configs as
// to_json writes them (objects flattened to dotted keys; a key one side lacks is null there), in
// key order: what a resume warns about, and what tells another run from this one.
struct ConfigDifference {
  std::string key;
  nlohmann::json saved, now;
};
std::vector<ConfigDifference> result_differences(const nlohmann::json& saved,
                                                 const nlohmann::json& now);

// Applies "key=value" overrides to a run config's JSON before it is parsed: the dotted key is
// created where absent (parse_run_config then rejects unknown keys). Throws UserError naming a
// malformed override, or one whose path runs through a value that is not an object.
void apply_overrides(nlohmann::json& run, const std::vector<std::string>& overrides);

// For a relative path, " (relative paths resolve against the working directory, /home/u)", else
// "": every "not found" message about a run config's path ends with it.
std::string relative_path_note(const std::string& path);

// "40GiB", "40 GiB", "512MiB", "40GB", "1.5TiB", "1073741824" -> bytes; nullopt when malformed.
std::optional<int64_t> parse_memory_size(const std::string& text);
// Bytes as the shortest exact size text parse_memory_size reads back: "40GiB", "1536MiB", "1000B".
std::string format_memory_size(int64_t bytes);

// The run config as JSON (all keys, defaults filled in): written to <out_dir>/config.json.
nlohmann::json to_json(const RunConfig& c);
nlohmann::json to_json(const ModelConfig& m);

}  // namespace grass
