#include "src/config/config.h"

#include <algorithm>
#include <climits>
#include <map>
#include <optional>
#include <set>
#include <filesystem>

#include "src/config/json_check.h"
#include "src/core/error.h"

namespace grass {

int projected_side(OptimizerKind kind, const ProjectionConfig& g, const ModelConfig& m,
                   ProjectionTarget target) {
  const auto [out, in] = m.linear_shape(target);
  return projects_rows(kind, g, out, in) ? out : in;
}

ProjectionTarget narrowest_target(OptimizerKind kind, const ProjectionConfig& g,
                                  const ModelConfig& m) {
  GRASS_CHECK(!g.targets.empty(), "a projection without targets");
  return *std::min_element(g.targets.begin(), g.targets.end(),
                           [&](ProjectionTarget a, ProjectionTarget b) {
                             return projected_side(kind, g, m, a) < projected_side(kind, g, m, b);
                           });
}

using json_check::brief;
using json_check::describe;
using json_check::format_number;
using json_check::Location;
using json_check::ObjectReader;
using nlohmann::json;

namespace {

// ---- model config -------------------------------------------------------------------------

// Keys read into ModelConfig ("max_sequence_length" is GaLore's name for the positions limit).
const std::vector<std::string> kModelKeys = {
    "hidden_size",       "intermediate_size", "num_attention_heads",     "num_key_value_heads",
    "num_hidden_layers", "vocab_size",        "max_position_embeddings", "max_sequence_length",
    "rms_norm_eps",      "rope_theta",        "tie_word_embeddings",     "initializer_range",
    "head_dim"};

// Hugging Face and GaLore bookkeeping that does not change the model grass builds. "dtype" is
// transformers >= 4.56's name for "torch_dtype" (the dtype the weights were saved in);
// "pretraining_tp" > 1 splits transformers' projections into slices that compute the same sums.
const std::vector<std::string> kIgnoredModelKeys = {
    "architectures",  "model_type",   "torch_dtype",  "dtype",        "transformers_version",
    "use_cache",      "bos_token_id", "eos_token_id", "pad_token_id", "pretraining_tp",
    "_name_or_path"};

// Keys that select architecture variants: accepted only with the value grass implements.
struct FixedModelKey {
  std::string key;
  json supported;
  std::string meaning;
};
const std::vector<FixedModelKey> kFixedModelKeys = {
    {"hidden_act", "silu", "the SwiGLU MLP of LLaMA"},
    {"attention_bias", false, "attention projections without bias"},
    {"mlp_bias", false, "MLP projections without bias"},
    {"rope_scaling", nullptr, "plain RoPE without scaling"},
    {"attention_dropout", 0.0, "attention without dropout"},
};

// transformers >= 5 writes RoPE's settings as "rope_parameters": {"rope_type": "default",
// "rope_theta": θ} where older versions wrote a top-level "rope_theta" (and "rope_scaling").
const std::string kRopeParameters = "rope_parameters";

std::vector<std::string> accepted_model_keys() {
  std::vector<std::string> keys = kModelKeys;
  keys.insert(keys.end(), kIgnoredModelKeys.begin(), kIgnoredModelKeys.end());
  for (const FixedModelKey& fixed : kFixedModelKeys) keys.push_back(fixed.key);
  keys.push_back(kRopeParameters);
  return keys;
}

// Number checks share one wording: "<key>: must be <rule>, got <value>".
void require(bool ok, const Location& at, const std::string& rule, double value) {
  if (!ok) at.fail("must be " + rule + ", got " + format_number(value));
}

int positive_int(const ObjectReader& obj, const std::string& key) {
  return int(json_check::to_integer(obj.required(key), obj.at(key), 1, INT_MAX));
}

void check_fixed_keys(const ObjectReader& obj) {
  for (const FixedModelKey& fixed : kFixedModelKeys) {
    const json* value = obj.find(fixed.key);
    if (value && *value != fixed.supported)
      obj.at(fixed.key).fail(brief(*value) + " is not supported; grass implements " +
                             fixed.supported.dump() + " (" + fixed.meaning + ")");
  }
}

int read_max_positions(const ObjectReader& obj, int fallback) {
  const auto hf = obj.integer("max_position_embeddings", 1, INT_MAX);
  const auto galore = obj.integer("max_sequence_length", 1, INT_MAX);
  if (hf && galore && *hf != *galore)
    obj.at("max_sequence_length")
        .fail(std::to_string(*galore) + " conflicts with max_position_embeddings " +
              std::to_string(*hf) + " (two names for one setting: keep one)");
  return int(hf ? *hf : galore.value_or(fallback));
}

void check_model_shape(const ObjectReader& obj, const ModelConfig& m) {
  const std::string d = std::to_string(m.hidden_size), h = std::to_string(m.num_attention_heads);
  if (m.hidden_size % m.num_attention_heads != 0)
    obj.at("hidden_size").fail(d + " is not a multiple of num_attention_heads (" + h + ")");
  if (m.num_attention_heads % m.num_key_value_heads != 0)
    obj.at("num_key_value_heads")
        .fail(std::to_string(m.num_key_value_heads) + " does not divide num_attention_heads (" + h +
              "): each key/value head serves a whole group of query heads");
  if (m.head_dim() % 2 != 0)
    obj.at("num_attention_heads")
        .fail("head_dim = hidden_size / num_attention_heads = " + d + " / " + h + " = " +
              std::to_string(m.head_dim()) + " is odd; RoPE rotates pairs, so it must be even");
  if (const auto head_dim = obj.integer("head_dim", 1, INT_MAX);
      head_dim && *head_dim != m.head_dim())
    obj.at("head_dim")
        .fail(std::to_string(*head_dim) +
              " is not supported; grass uses hidden_size / num_attention_heads = " +
              std::to_string(m.head_dim()));
  require(m.rms_norm_eps > 0, obj.at("rms_norm_eps"), "positive", m.rms_norm_eps);
  require(m.initializer_range >= 0, obj.at("initializer_range"), "non-negative",
          m.initializer_range);
}

// rope_parameters' θ, if it names one; fails on a RoPE variant other than plain RoPE.
std::optional<double> read_rope_parameters(const ObjectReader& obj) {
  const json* parameters = obj.find(kRopeParameters);
  if (!parameters || parameters->is_null()) return std::nullopt;
  const ObjectReader rope(*parameters, obj.at(kRopeParameters));
  // Checked before the other keys, so a scaled RoPE is named as such rather than by its
  // "factor"; transformers still reads the legacy spelling "type".
  for (const char* type_key : {"rope_type", "type"})
    if (const auto type = rope.string(type_key); type && *type != "default")
      rope.at(type_key).fail(brief(*type) +
                             " is not supported; grass implements \"default\" (plain RoPE "
                             "without scaling)");
  rope.reject_unknown_keys({"rope_type", "type", "rope_theta"});
  return rope.number("rope_theta");
}

// θ from "rope_theta" or "rope_parameters.rope_theta": either, or both when they agree.
double read_rope_theta(const ObjectReader& obj, double fallback) {
  const auto top_level = obj.number("rope_theta");
  const auto nested = read_rope_parameters(obj);
  const Location nested_at = obj.at(kRopeParameters).child("rope_theta");
  if (top_level && nested && *top_level != *nested)
    nested_at.fail(format_number(*nested) + " conflicts with rope_theta " +
                   format_number(*top_level) + " (two places for one setting: keep one)");
  const double theta = nested.value_or(top_level.value_or(fallback));
  require(theta > 0, nested ? nested_at : obj.at("rope_theta"), "positive", theta);
  return theta;
}

ModelConfig parse_model(const json& j, const Location& where) {
  const ObjectReader obj(j, where);
  obj.reject_unknown_keys(accepted_model_keys());
  check_fixed_keys(obj);
  ModelConfig m;
  m.hidden_size = positive_int(obj, "hidden_size");
  m.intermediate_size = positive_int(obj, "intermediate_size");
  m.num_attention_heads = positive_int(obj, "num_attention_heads");
  m.num_hidden_layers = positive_int(obj, "num_hidden_layers");
  m.vocab_size = positive_int(obj, "vocab_size");
  m.num_key_value_heads =
      int(obj.integer("num_key_value_heads", 1, INT_MAX).value_or(m.num_attention_heads));
  m.max_position_embeddings = read_max_positions(obj, m.max_position_embeddings);
  m.rms_norm_eps = obj.number("rms_norm_eps").value_or(m.rms_norm_eps);
  m.rope_theta = read_rope_theta(obj, m.rope_theta);
  m.tie_word_embeddings = obj.boolean("tie_word_embeddings").value_or(m.tie_word_embeddings);
  m.initializer_range = obj.number("initializer_range").value_or(m.initializer_range);
  check_model_shape(obj, m);
  return m;
}

// ---- run config ---------------------------------------------------------------------------

const std::vector<std::string> kRunKeys = {
    "model",
    "data",
    "optimizer",
    "schedule",
    "grad_clip",
    "micro_batch_size",
    "total_batch_size",
    "seq_len",
    "steps",
    "precision",
    "device",
    "activation_checkpointing",
    "activations",
    "fused_update",
    "pad_ffn",
    "attention",
    "memory_limit",
    "host_memory_limit",
    "offload",
    "seed",
    "out_dir",
    "log_every",
    "eval_every",
    "eval_tokens",
    "eval_batch_size",
    "checkpoint_every",
    "checkpoint_keep",
    "checkpoint_keep_every",
    "init_from",
};
const std::vector<std::string> kProjectionKeys = {"rank", "update_interval", "scale", "targets",
                                                  "seed"};
const std::vector<std::string> kGrassKeys = {"selection", "select_dim", "rho_in_update"};
// GRASS's re-selections and GaLore's SVDs spread over the interval (FLORA's resampling is a
// regeneration from the seed: nothing to spread)
const std::vector<std::string> kStaggerKeys = {"refresh_stagger"};
const std::vector<std::string> kFloraKeys = {"max_update_rms"};
const std::vector<std::string> kGaloreKeys = {"svd", "svd_power_iters", "svd_oversample",
                                              "svd_batch"};
constexpr int64_t kFloraUpdateInterval = 1000;  // flora-opt's kappa
constexpr double kFloraMaxUpdateRms = 1.0;      // flora-opt's clip_threshold
constexpr double kGaloreEps = 1e-6;             // galore_torch's AdamW
// A choice of enum E by its name (config/choices.h), e.g. optimizer.name.
template <typename E>
E read_enum(const ObjectReader& obj, const std::string& key, const std::string& what, E fallback) {
  const std::string value = obj.string(key).value_or(name_of(fallback));
  const std::optional<E> choice = choice_from_name<E>(value);
  if (!choice)
    obj.at(key).fail("unknown " + what + " \"" + value + "\" (supported: " + choice_list<E>() +
                     ")");
  return *choice;
}

void read_model(const ObjectReader& run, RunConfig& c) {
  const json& model = run.required("model");
  const Location at = run.at("model");
  if (model.is_object()) {
    c.model = parse_model(model, at);
    return;
  }
  if (!model.is_string() || model.get<std::string>().empty())
    at.fail("expected a model config path (string) or an inline model config (object), got " +
            describe(model));
  c.model_path = model.get<std::string>();
  std::error_code ec;
  if (!std::filesystem::exists(c.model_path, ec))
    at.fail("file not found: " + c.model_path + relative_path_note(c.model_path));
  c.model = load_model_config(c.model_path);
}

void read_data(const ObjectReader& run, RunConfig& c) {
  const json no_data = json::object();  // so a missing "data" reports "data.train" as missing
  const json* data_json = run.find("data");
  const ObjectReader data(data_json ? *data_json : no_data, run.at("data"));
  data.reject_unknown_keys({"train", "val", "tokenizer", "shuffle"});
  const auto read_path = [](const json& value, const Location& where) {
    std::string path = json_check::to_string(value, where);
    if (path.empty()) where.fail("expected a path, got an empty string");
    return path;
  };
  // Only the form is checked here: the shards and the tokenizer are opened, and the specs
  // expanded, by what reads them (src/data/data_sets.h), so a plan needs no data on this machine.
  const auto read_specs = [&](const std::string& key) {
    const json& value = data.required(key);
    const Location at = data.at(key);
    std::vector<std::string> specs;
    if (value.is_string()) {
      specs.push_back(read_path(value, at));
    } else if (value.is_array() && !value.empty()) {
      for (size_t i = 0; i < value.size(); ++i) specs.push_back(read_path(value[i], at.element(i)));
    } else {
      at.fail("expected a token shard path or a non-empty array of paths (each a shard, a glob, "
              "a directory or a manifest), got " + describe(value));
    }
    return specs;
  };
  c.train_files = read_specs("train");
  if (data.find("val")) c.val_files = read_specs("val");
  if (const json* tokenizer = data.find("tokenizer"))
    c.tokenizer = read_path(*tokenizer, data.at("tokenizer"));
  c.shuffle = data.boolean("shuffle").value_or(c.shuffle);
}

// The projected optimizers' keys of the optimizer object; they mean nothing to AdamW (and
// selection, select_dim nothing to GaLore and FLORA), so they are refused there.
void read_projection(const ObjectReader& obj, OptimizerKind kind, ProjectionConfig& g) {
  if (!is_projected(kind))
    for (const std::string& key : kProjectionKeys)
      if (obj.find(key))
        obj.at(key).fail("only the projected optimizers (grass, galore, flora) use this key");
  if (kind != OptimizerKind::Grass)
    for (const std::string& key : kGrassKeys)
      if (obj.find(key)) obj.at(key).fail("only the grass optimizer uses this key");
  if (kind != OptimizerKind::Grass && kind != OptimizerKind::GaLore)
    for (const std::string& key : kStaggerKeys)
      if (obj.find(key)) obj.at(key).fail("only the grass and galore optimizers use this key");
  if (kind != OptimizerKind::Flora)
    for (const std::string& key : kFloraKeys)
      if (obj.find(key)) obj.at(key).fail("only the flora optimizer uses this key");
  if (kind != OptimizerKind::GaLore)
    for (const std::string& key : kGaloreKeys)
      if (obj.find(key)) obj.at(key).fail("only the galore optimizer uses this key");
  if (!is_projected(kind)) return;
  if (kind == OptimizerKind::Flora) {
    g.update_interval = kFloraUpdateInterval;
    g.max_update_rms = obj.number("max_update_rms").value_or(kFloraMaxUpdateRms);
    require(g.max_update_rms >= 0, obj.at("max_update_rms"), "non-negative (0: unbounded)",
            g.max_update_rms);
  }
  g.rank = int(obj.integer("rank", 1, INT_MAX).value_or(g.rank));
  g.update_interval = obj.integer("update_interval", 1, INT64_MAX).value_or(g.update_interval);
  g.scale = obj.number("scale").value_or(g.scale);
  require(g.scale > 0, obj.at("scale"), "positive", g.scale);
  if (kind == OptimizerKind::Grass) {
    g.selection = read_enum(obj, "selection", "selection", g.selection);
    g.select_dim = read_enum(obj, "select_dim", "select_dim", g.select_dim);
    g.rho_in_update = obj.boolean("rho_in_update").value_or(g.rho_in_update);
  }
  if (kind == OptimizerKind::Grass || kind == OptimizerKind::GaLore)
    g.refresh_stagger = obj.boolean("refresh_stagger").value_or(g.refresh_stagger);
  if (kind == OptimizerKind::GaLore) {
    g.svd = read_enum(obj, "svd", "svd", g.svd);
    g.svd_power_iters = int(obj.integer("svd_power_iters", 0, 16).value_or(g.svd_power_iters));
    g.svd_oversample = int(obj.integer("svd_oversample", 0, 1024).value_or(g.svd_oversample));
    g.svd_batch = read_enum(obj, "svd_batch", "svd_batch", g.svd_batch);
    if (g.svd_batch == GaloreSvdBatch::Layer && g.svd == GaloreSvd::Exact)
      obj.at("svd_batch").fail("\"layer\" batches the randomized refresh's eigenproblems, and "
                               "optimizer.svd \"exact\" has none: use \"none\"");
  }
  g.seed = uint64_t(obj.integer("seed", 0, INT64_MAX).value_or(int64_t(g.seed)));
  if (const json* targets = obj.find("targets")) {
    const Location at = obj.at("targets");
    if (!targets->is_array() || targets->empty())
      at.fail("expected a non-empty array of target names (" + choice_list<ProjectionTarget>() +
              "), got " + describe(*targets));
    g.targets.clear();
    for (size_t i = 0; i < targets->size(); ++i) {
      const std::string name = json_check::to_string((*targets)[i], at.element(i));
      const std::optional<ProjectionTarget> target = choice_from_name<ProjectionTarget>(name);
      if (!target)
        at.element(i).fail("unknown target \"" + name + "\" (supported: " +
                           choice_list<ProjectionTarget>() + ")");
      if (std::find(g.targets.begin(), g.targets.end(), *target) != g.targets.end())
        at.element(i).fail("target \"" + name + "\" is listed twice");
      g.targets.push_back(*target);
    }
  }
}

// Rank must fit the projected side of every target (GRASS: the side select_dim picks; GaLore,
// FLORA: the shorter side), so the narrowest target decides, and the message names it and the
// rank that fits. The seed defaults to the run's.
void check_projection_against_model(const ObjectReader& run, RunConfig& c) {
  ProjectionConfig& g = c.optimizer.projection;
  const ObjectReader optimizer(run.required("optimizer"), run.at("optimizer"));
  if (!optimizer.find("seed")) g.seed = c.seed;
  const ProjectionTarget narrowest = narrowest_target(c.optimizer.kind, g, c.model);
  const int side = projected_side(c.optimizer.kind, g, c.model, narrowest);
  if (g.rank <= side) return;
  const bool grass = c.optimizer.kind == OptimizerKind::Grass;
  const auto [out, in] = c.model.linear_shape(narrowest);
  const bool rows = projects_rows(c.optimizer.kind, g, out, in);
  const std::string given =
      optimizer.find("rank") ? "" : " (" + std::string(name_of(c.optimizer.kind)) + "'s default)";
  optimizer.at("rank").fail(
      std::to_string(g.rank) + given +
      " exceeds the " + std::to_string(side) + " " + (grass ? "selectable " : "projected ") +
      (rows ? "rows" : "columns") + " of target " + name_of(narrowest) + " (" +
      std::to_string(out) + " x " + std::to_string(in) +
      (grass ? ", select_dim " + std::string(name_of(g.select_dim)) : std::string()) +
      "), the narrowest target: a rank up to " + std::to_string(side) + " fits them all (--set " +
      "optimizer.rank=" + std::to_string(side) + ")");
}

// optimizer.proximal: {"lambda": λ, "inner_steps": S}. GRASS's inner loop is its refresh interval,
// so inner_steps may only repeat it there.
void read_proximal(const ObjectReader& optimizer, const OptimizerConfig& o, ProximalConfig& p) {
  const json* proximal = optimizer.find("proximal");
  if (!proximal) return;
  const Location at = optimizer.at("proximal");
  if (o.kind != OptimizerKind::AdamW && o.kind != OptimizerKind::Grass)
    at.fail("the proximal method is built for adamw and grass, not " +
            std::string(name_of(o.kind)));
  if (!proximal->is_object())
    at.fail("expected {\"lambda\": ..., \"inner_steps\": ...}, got " + describe(*proximal));
  const ObjectReader obj(*proximal, at);
  obj.reject_unknown_keys({"lambda", "inner_steps"});
  obj.required("lambda");
  p.lambda = obj.number("lambda").value_or(0);
  require(p.lambda > 0, obj.at("lambda"), "positive", p.lambda);
  const int64_t K = o.projection.update_interval;
  if (o.kind == OptimizerKind::Grass) {
    p.inner_steps = obj.integer("inner_steps", 1, INT64_MAX).value_or(K);
    if (p.inner_steps != K)
      obj.at("inner_steps").fail(std::to_string(p.inner_steps) + ": GRASS's inner loop is its "
                                 "refresh interval (update_interval " + std::to_string(K) +
                                 "); leave inner_steps out");
  } else {
    obj.required("inner_steps");
    p.inner_steps = *obj.integer("inner_steps", 1, INT64_MAX);
  }
}

// optimizer.state_dtype and state_block. Which precisions allow fp32 and bf16 is the run
// resolution's question (train/run_resolution.cpp), which knows the precision "auto" becomes.
void read_state_dtype(const ObjectReader& obj, OptimizerConfig& o) {
  o.state_dtype = read_enum(obj, "state_dtype", "state_dtype", o.state_dtype);
  for (const char* key : {"state_block", "state_blocking"})
    if (obj.find(key) && o.state_dtype != StateDtype::Q8)
      obj.at(key).fail("only q8 states (state_dtype \"q8\") have blocks");
  if (obj.find("state_blocking") && !is_projected(o.kind))
    obj.at("state_blocking").fail("only the projected optimizers' states have features to block by");
  o.state_blocking = read_enum(obj, "state_blocking", "state_blocking", o.state_blocking);
  if (!obj.find("state_block")) return;
  o.state_block = int(*obj.integer("state_block", 64, 4096));
  if ((o.state_block & (o.state_block - 1)) != 0)
    obj.at("state_block").fail(std::to_string(o.state_block) +
                               " is not a power of two (64, 128, ..., 4096)");
}

void read_optimizer(const ObjectReader& obj, OptimizerConfig& o) {
  std::vector<std::string> keys = {"name", "lr", "betas", "eps", "weight_decay",
                                   "target_lr_scale", "proximal", "state_dtype", "state_block",
                                   "state_blocking"};
  keys.insert(keys.end(), kProjectionKeys.begin(), kProjectionKeys.end());
  keys.insert(keys.end(), kGrassKeys.begin(), kGrassKeys.end());
  keys.insert(keys.end(), kStaggerKeys.begin(), kStaggerKeys.end());
  keys.insert(keys.end(), kFloraKeys.begin(), kFloraKeys.end());
  keys.insert(keys.end(), kGaloreKeys.begin(), kGaloreKeys.end());
  obj.reject_unknown_keys(keys);
  o.kind = read_enum(obj, "name", "optimizer", o.kind);
  read_projection(obj, o.kind, o.projection);
  o.lr = obj.number("lr").value_or(o.lr);
  require(o.lr > 0, obj.at("lr"), "positive", o.lr);
  if (const json* betas = obj.find("betas")) {
    const Location at = obj.at("betas");
    if (!betas->is_array() || betas->size() != 2)
      at.fail("expected an array of two numbers [beta1, beta2], got " + describe(*betas));
    o.beta1 = json_check::to_number((*betas)[0], at.element(0));
    o.beta2 = json_check::to_number((*betas)[1], at.element(1));
    require(o.beta1 >= 0 && o.beta1 < 1, at.element(0), "in [0, 1)", o.beta1);
    require(o.beta2 >= 0 && o.beta2 < 1, at.element(1), "in [0, 1)", o.beta2);
  }
  // galore_torch's AdamW defaults to 1e-6 (the rest to torch's 1e-8), and a GaLore run follows it
  o.eps = obj.number("eps").value_or(o.kind == OptimizerKind::GaLore ? kGaloreEps : o.eps);
  require(o.eps > 0, obj.at("eps"), "positive", o.eps);
  o.weight_decay = obj.number("weight_decay").value_or(o.weight_decay);
  require(o.weight_decay >= 0, obj.at("weight_decay"), "non-negative", o.weight_decay);
  if (obj.find("target_lr_scale") && o.kind != OptimizerKind::AdamW)
    obj.at("target_lr_scale").fail("only adamw uses this key (the projected optimizers' `scale` "
                                    "sets their targets' learning rate)");
  o.target_lr_scale = obj.number("target_lr_scale").value_or(o.target_lr_scale);
  require(o.target_lr_scale > 0, obj.at("target_lr_scale"), "positive", o.target_lr_scale);
  read_proximal(obj, o, o.proximal);
  read_state_dtype(obj, o);
}

void read_schedule(const ObjectReader& obj, ScheduleConfig& s) {
  obj.reject_unknown_keys({"name", "warmup_steps", "min_lr_ratio"});
  s.kind = read_enum(obj, "name", "schedule", s.kind);
  s.warmup_steps = obj.integer("warmup_steps", 0, INT64_MAX).value_or(s.warmup_steps);
  s.min_lr_ratio = obj.number("min_lr_ratio").value_or(s.min_lr_ratio);
  require(s.min_lr_ratio >= 0 && s.min_lr_ratio <= 1, obj.at("min_lr_ratio"), "in [0, 1]",
          s.min_lr_ratio);
}

void read_batch(const ObjectReader& run, RunConfig& c) {
  c.micro_batch_size =
      int(run.integer("micro_batch_size", 1, INT_MAX).value_or(c.micro_batch_size));
  // Without total_batch_size a step is one micro-batch: no gradient accumulation.
  c.total_batch_size =
      int(run.integer("total_batch_size", 1, INT_MAX).value_or(c.micro_batch_size));
  const int64_t micro = c.micro_batch_size, total = c.total_batch_size;
  if (total % micro != 0) {
    const int64_t nearest = std::max<int64_t>(1, (total + micro / 2) / micro) * micro;
    run.at("total_batch_size")
        .fail(std::to_string(total) + " is not a multiple of micro_batch_size (" +
              std::to_string(micro) + "); nearest valid value: " + std::to_string(nearest));
  }
  if (total % (micro * c.ranks) != 0)  // every rank takes the same number of micro-batches
    run.at("total_batch_size")
        .fail(std::to_string(total) + " must be a multiple of micro_batch_size x ranks = " +
              std::to_string(micro) + " x " + std::to_string(c.ranks) +
              " (every rank takes the same number of micro-batches)");
}

void read_precision(const ObjectReader& run, RunConfig& c) {
  const std::string precision = run.string("precision").value_or(name_of(c.precision));
  const std::optional<PrecisionChoice> choice = choice_from_name<PrecisionChoice>(precision);
  if (!choice)
    run.at("precision")
        .fail("\"" + precision + "\" is not a precision (supported: " +
              choice_list<PrecisionChoice>() + ")");
  c.precision = *choice;
  const std::string device = run.string("device").value_or(name_of(c.device));
  const std::optional<DeviceChoice> choice_of_device = choice_from_name<DeviceChoice>(device);
  if (!choice_of_device)
    run.at("device").fail("\"" + device + "\" is not a device (supported: " +
                          choice_list<DeviceChoice>() + ")");
  c.device = *choice_of_device;
}

// A size key ("40GiB", "512MiB", "40GB", or bytes).
std::optional<int64_t> read_memory_size(const ObjectReader& obj, const std::string& key) {
  const json* value = obj.find(key);
  if (!value) return std::nullopt;
  std::optional<int64_t> bytes;
  if (value->is_number_integer() && value->get<int64_t>() >= 0) bytes = value->get<int64_t>();
  else if (value->is_string()) bytes = parse_memory_size(value->get<std::string>());
  if (!bytes)
    obj.at(key).fail("expected a size such as \"40GiB\", \"512MiB\" or \"40GB\", got " +
                     describe(*value));
  return bytes;
}

void read_offload(const ObjectReader& o, RunConfig& c) {
  o.reject_unknown_keys({"optimizer_states", "piece_bytes", "activations", "disk_dir", "layers",
                          "layer_slots"});
  c.offload.optimizer_states = o.boolean("optimizer_states").value_or(false);
  if (const std::optional<int64_t> piece = read_memory_size(o, "piece_bytes")) {
    if (*piece < 4096)
      o.at("piece_bytes").fail("expected a size of at least 4 KiB such as \"16MiB\", got " +
                               describe(*o.find("piece_bytes")));
    c.offload.piece_bytes = *piece;
  }
  c.offload.activations = read_enum(o, "activations", "place", c.offload.activations);
  if (c.offload.activations != ActivationOffload::None &&
      c.activation_checkpointing != Checkpointing::Layer)
    o.at("activations").fail(std::string("offloads each layer's input, which only "
                                         "activation_checkpointing \"layer\" keeps alone; the "
                                         "run's is \"") +
                             name_of(c.activation_checkpointing) + "\"");
  c.offload.disk_dir = o.string("disk_dir").value_or("");
  if (o.find("disk_dir") && c.offload.disk_dir.empty()) o.at("disk_dir").fail("must not be empty");
  if (const json* layers = o.find("layers"); layers && layers->is_string()) {
    if (layers->get<std::string>() != "auto")
      o.at("layers").fail("expected an integer from 0 to " +
                          std::to_string(c.model.num_hidden_layers) + " or \"auto\", got " +
                          describe(*layers));
    c.offload.layers_auto = true;
  } else {
    c.offload.layers = int(o.integer("layers", 0, c.model.num_hidden_layers).value_or(0));
  }
  c.offload.layer_slots = int(o.integer("layer_slots", 2, 8).value_or(c.offload.layer_slots));
  if (c.offload.layers == 0 && !c.offload.layers_auto) return;
  if (c.precision == PrecisionChoice::Bf16Mixed)
    o.at("layers").fail("does not stream bf16-mixed's fp32 master copy yet: use precision "
                        "\"bf16\" (pure bf16, the 13B mode) or \"fp32\"");
  if (galore_refresh_pass(c.optimizer))
    o.at("layers").fail("does not stream with GaLore's optimizer.svd_batch \"layer\" yet (its "
                        "refresh pass would fetch every streamed layer once more): use \"none\"");
}

void read_memory(const ObjectReader& run, RunConfig& c) {
  c.activation_checkpointing =
      read_enum(run, "activation_checkpointing", "mode", c.activation_checkpointing);
  if (const json* sampled = run.find("activations")) {
    const ObjectReader a(*sampled, run.at("activations"));
    a.reject_unknown_keys({"sample", "keep", "selected_columns"});
    c.activations.sample = read_enum(a, "sample", "sampler", c.activations.sample);
    c.activations.selected_columns =
        read_enum(a, "selected_columns", "mode", c.activations.selected_columns);
    c.activations.keep = a.number("keep").value_or(c.activations.keep);
    require(c.activations.keep > 0 && c.activations.keep < 1, a.at("keep"),
            "in (0, 1): the share of token rows stored", c.activations.keep);
    if (c.activations.on() && c.activation_checkpointing != Checkpointing::None)
      a.at("sample").fail(std::string("samples the inputs that only weight gradients read, which "
                                      "activation_checkpointing \"") +
                          name_of(c.activation_checkpointing) +
                          "\" does not keep: sampling needs \"none\"");
  }
  c.fused_update = read_enum(run, "fused_update", "mode", c.fused_update);
  c.pad_ffn = read_enum(run, "pad_ffn", "mode", c.pad_ffn);
  c.attention = read_enum(run, "attention", "kernel", c.attention);
  if ((c.attention == AttentionChoice::Cudnn || c.attention == AttentionChoice::Mma) &&
      c.device == DeviceChoice::Cpu)
    run.at("attention").fail("\"" + std::string(name_of(c.attention)) +
                             "\" runs on the GPU; with device \"cpu\" use \"grass\"");
  if (c.fused_update == Switch::On && c.micro_batches_per_rank() > 1)
    run.at("fused_update")
        .fail("\"on\" needs one micro-batch per step (total_batch_size " +
              std::to_string(c.total_batch_size) + " is " + std::to_string(c.grad_accum_steps()) +
              " micro-batches of " + std::to_string(c.micro_batch_size) +
              (c.ranks > 1 ? " over " + std::to_string(c.ranks) + " ranks" : std::string()) +
              "): the gradients of several micro-batches must be summed before they are applied");
  c.memory_limit = read_memory_size(run, "memory_limit").value_or(0);
  c.host_memory_limit = read_memory_size(run, "host_memory_limit").value_or(0);
  if (const json* offload = run.find("offload")) {
    if (offload->is_string() && offload->get<std::string>() == "auto") {
      c.offload.automatic = true;
    } else {
      if (!offload->is_object())
        run.at("offload").fail("expected \"auto\" or an object such as {\"optimizer_states\": "
                               "true}, got " + describe(*offload));
      read_offload(ObjectReader(*offload, run.at("offload")), c);
    }
  }
}

void read_checkpointing(const ObjectReader& run, RunConfig& c) {
  c.checkpoint_every = run.integer("checkpoint_every", 0, INT64_MAX).value_or(c.checkpoint_every);
  c.checkpoint_keep = run.integer("checkpoint_keep", 1, INT64_MAX).value_or(c.checkpoint_keep);
  c.checkpoint_keep_every =
      run.integer("checkpoint_keep_every", 0, INT64_MAX).value_or(c.checkpoint_keep_every);
  if (const auto init_from = run.string("init_from")) {
    if (init_from->empty()) run.at("init_from").fail("expected a path, got an empty string");
    std::error_code ec;
    if (!std::filesystem::exists(*init_from, ec))
      run.at("init_from").fail("not found: " + *init_from +
                               "; expected a Hugging Face model directory or a .safetensors "
                               "file" + relative_path_note(*init_from));
    c.init_from = *init_from;
  }
}

}  // namespace

int64_t ModelConfig::num_parameters() const {
  const int64_t d = hidden_size, f = intermediate_size, v = vocab_size;
  const int64_t q_width = int64_t(num_attention_heads) * head_dim();
  const int64_t kv_width = int64_t(num_key_value_heads) * head_dim();
  const int64_t attention = d * q_width + 2 * d * kv_width + q_width * d;  // q, k, v, o
  const int64_t mlp = 3 * d * f;                                           // gate, up, down
  const int64_t layer = attention + mlp + 2 * d;                           // + two RMSNorm gains
  const int64_t embeddings = v * d, lm_head = tie_word_embeddings ? 0 : v * d;
  return embeddings + num_hidden_layers * layer + d + lm_head;
}

std::pair<int, int> ModelConfig::linear_shape(ProjectionTarget target) const {
  const int d = hidden_size, f = intermediate_size;
  const int q_width = num_attention_heads * head_dim(), kv_width = num_key_value_heads * head_dim();
  switch (target) {
    case ProjectionTarget::Q: return {q_width, d};
    case ProjectionTarget::K:
    case ProjectionTarget::V: return {kv_width, d};
    case ProjectionTarget::O: return {d, q_width};
    case ProjectionTarget::Gate:
    case ProjectionTarget::Up: return {f, d};
    case ProjectionTarget::Down: return {d, f};
  }
  throw InternalError("linear_shape: unknown target");
}

ModelConfig parse_model_config(const json& j, const std::string& where) {
  return parse_model(j, Location{where, ""});
}

ModelConfig load_model_config(const std::string& path) {
  return parse_model_config(json_check::read_json_file(path), path);
}

bool changes_results(const std::string& key) {
  static const std::set<std::string> free = {
      "out_dir",          "log_every",       "eval_every",            "eval_tokens",
      "eval_batch_size",
      "checkpoint_every", "checkpoint_keep", "checkpoint_keep_every", "init_from",
      "pad_ffn",          "attention"};
  // offload and the memory caps move bytes between places, never a number computed, but for
  // the GPU head's chunk, which memory_limit may choose: state.json records it and a resume on
  // another warns (train/checkpointing.h, head_rows_resume_warning), as for "attention"
  return !(free.count(key) || key == "data.val" || key.starts_with("data.val[") ||
           key == "offload" || key.starts_with("offload.") || key == "memory_limit" ||
           key == "host_memory_limit");
}

namespace {
void flatten(const json& j, const std::string& prefix, std::map<std::string, json>& out) {
  if (j.is_object() && !j.empty()) {
    for (const auto& [key, value] : j.items())
      flatten(value, prefix.empty() ? key : prefix + "." + key, out);
  } else {
    out[prefix] = j;
  }
}
}  // namespace

std::vector<ConfigDifference> result_differences(const json& saved, const json& now) {
  std::map<std::string, json> a, b;
  flatten(saved, "", a);
  flatten(now, "", b);
  std::set<std::string> keys;
  for (const auto& [k, v] : a) keys.insert(k);
  for (const auto& [k, v] : b) keys.insert(k);
  std::vector<ConfigDifference> out;
  for (const std::string& key : keys) {
    if (!changes_results(key)) continue;
    const json x = a.count(key) ? a[key] : json(), y = b.count(key) ? b[key] : json();
    if (x != y) out.push_back({key, x, y});
  }
  return out;
}

RunConfig parse_run_config(const json& j, const std::string& where, int ranks) {
  const ObjectReader run(j, Location{where, ""});
  run.reject_unknown_keys(kRunKeys);
  RunConfig c;
  c.source = where;
  c.ranks = ranks;
  read_model(run, c);
  read_data(run, c);
  if (const json* optimizer = run.find("optimizer"))
    read_optimizer(ObjectReader(*optimizer, run.at("optimizer")), c.optimizer);
  if (const json* schedule = run.find("schedule"))
    read_schedule(ObjectReader(*schedule, run.at("schedule")), c.schedule);
  c.grad_clip = run.number("grad_clip").value_or(c.grad_clip);
  require(c.grad_clip >= 0, run.at("grad_clip"), "non-negative (0 turns clipping off)",
          c.grad_clip);
  read_batch(run, c);
  c.seq_len = int(run.integer("seq_len", 1, INT_MAX).value_or(c.seq_len));
  if (c.seq_len > c.model.max_position_embeddings)
    run.at("seq_len").fail(std::to_string(c.seq_len) +
                           " exceeds the model's max_position_embeddings (" +
                           std::to_string(c.model.max_position_embeddings) + ")");
  c.steps = run.integer("steps", 1, INT64_MAX).value_or(c.steps);
  read_precision(run, c);
  read_memory(run, c);
  c.seed = uint64_t(run.integer("seed", 0, INT64_MAX).value_or(int64_t(c.seed)));
  if (is_projected(c.optimizer.kind)) check_projection_against_model(run, c);
  c.out_dir = run.string("out_dir").value_or(c.out_dir);
  if (c.out_dir.empty()) run.at("out_dir").fail("must not be empty");
  c.log_every = int(run.integer("log_every", 1, INT_MAX).value_or(c.log_every));
  c.eval_every = run.integer("eval_every", 0, INT64_MAX).value_or(c.eval_every);
  c.eval_tokens = run.integer("eval_tokens", 1, INT64_MAX).value_or(c.eval_tokens);
  if (const json* eval_batch = run.find("eval_batch_size")) {
    if (!eval_batch->is_string())
      c.eval_batch_size = int(run.integer("eval_batch_size", 1, INT_MAX).value_or(0));
    else if (eval_batch->get<std::string>() != "auto")
      run.at("eval_batch_size").fail("expected \"auto\" or a number of sequences, got " +
                                     describe(*eval_batch));
  }
  read_checkpointing(run, c);
  return c;
}

void apply_overrides(json& run, const std::vector<std::string>& overrides) {
  for (const std::string& override_text : overrides) {
    const auto fail = [&](const std::string& problem) {
      throw UserError("--set \"" + override_text + "\": " + problem);
    };
    const size_t equals = override_text.find('=');
    const std::string key = override_text.substr(0, equals);
    if (equals == std::string::npos || key.empty() || key.front() == '.' || key.back() == '.' ||
        key.find("..") != std::string::npos)
      fail("expected key=value with a dotted key, e.g. --set optimizer.lr=3e-4");
    // "3e-4", "true", "[0.9,0.95]" are JSON; anything else (a path) is taken as a string.
    const std::string text = override_text.substr(equals + 1);
    json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) value = text;

    json* node = &run;
    for (size_t start = 0;;) {
      if (!node->is_object())
        fail((start ? key.substr(0, start - 1) : "the run config") + " is " + describe(*node) +
             ", not an object");
      const size_t dot = key.find('.', start);
      if (dot == std::string::npos) {
        (*node)[key.substr(start)] = std::move(value);
        break;
      }
      node = &(*node)[key.substr(start, dot - start)];
      if (node->is_null()) *node = json::object();
      start = dot + 1;
    }
  }
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides,
                          int ranks) {
  json run = json_check::read_json_file(path);
  apply_overrides(run, overrides);
  return parse_run_config(run, path, ranks);
}

json to_json(const ModelConfig& m) {
  return {
      {"architectures", json::array({"LlamaForCausalLM"})},
      {"model_type", "llama"},
      {"hidden_act", "silu"},
      {"hidden_size", m.hidden_size},
      {"intermediate_size", m.intermediate_size},
      {"num_attention_heads", m.num_attention_heads},
      {"num_key_value_heads", m.num_key_value_heads},
      {"num_hidden_layers", m.num_hidden_layers},
      {"vocab_size", m.vocab_size},
      {"max_position_embeddings", m.max_position_embeddings},
      {"rms_norm_eps", m.rms_norm_eps},
      {"rope_theta", m.rope_theta},
      {"tie_word_embeddings", m.tie_word_embeddings},
      {"initializer_range", m.initializer_range},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"rope_scaling", nullptr},
  };
}

json to_json(const RunConfig& c) {
  const OptimizerConfig& o = c.optimizer;
  const ScheduleConfig& s = c.schedule;
  json optimizer = {{"name", name_of(o.kind)},
                    {"lr", o.lr},
                    {"betas", json::array({o.beta1, o.beta2})},
                    {"eps", o.eps},
                    {"weight_decay", o.weight_decay}};
  if (o.target_lr_scale != 1.0) optimizer["target_lr_scale"] = o.target_lr_scale;
  // only when set, so a checkpoint from before the key resumes without a warning about it
  if (o.state_dtype != StateDtype::Auto) optimizer["state_dtype"] = name_of(o.state_dtype);
  if (o.state_dtype == StateDtype::Q8) optimizer["state_block"] = o.state_block;
  if (o.state_dtype == StateDtype::Q8 && is_projected(o.kind))
    optimizer["state_blocking"] = name_of(o.state_blocking);
  if (is_projected(o.kind)) {
    const ProjectionConfig& g = o.projection;
    json targets = json::array();
    for (const ProjectionTarget t : g.targets) targets.push_back(name_of(t));
    optimizer.update({{"rank", g.rank},
                      {"update_interval", g.update_interval},
                      {"scale", g.scale},
                      {"targets", targets},
                      {"seed", g.seed}});
    if (o.kind == OptimizerKind::Grass)
      optimizer.update({{"selection", name_of(g.selection)},
                        {"select_dim", name_of(g.select_dim)},
                        {"rho_in_update", g.rho_in_update},
                        {"refresh_stagger", g.refresh_stagger}});
    if (o.kind == OptimizerKind::Flora) optimizer["max_update_rms"] = g.max_update_rms;
    if (o.kind == OptimizerKind::GaLore)
      optimizer.update({{"svd", name_of(g.svd)},
                        {"svd_power_iters", g.svd_power_iters},
                        {"svd_oversample", g.svd_oversample},
                        {"svd_batch", name_of(g.svd_batch)},
                        {"refresh_stagger", g.refresh_stagger}});
  }
  if (o.proximal.enabled())
    optimizer["proximal"] = {{"lambda", o.proximal.lambda}, {"inner_steps", o.proximal.inner_steps}};
  json data = {{"train", c.train_files}, {"shuffle", c.shuffle}};
  if (!c.val_files.empty()) data["val"] = c.val_files;
  if (!c.tokenizer.empty()) data["tokenizer"] = c.tokenizer;
  json run = {
      {"model", to_json(c.model)},
      {"data", data},
      {"optimizer", optimizer},
      {"schedule",
       {{"name", name_of(s.kind)}, {"warmup_steps", s.warmup_steps}, {"min_lr_ratio", s.min_lr_ratio}}},
      {"grad_clip", c.grad_clip},
      {"micro_batch_size", c.micro_batch_size},
      {"total_batch_size", c.total_batch_size},
      {"seq_len", c.seq_len},
      {"steps", c.steps},
      {"precision", name_of(c.precision)},
      {"device", name_of(c.device)},
      {"activation_checkpointing", name_of(c.activation_checkpointing)},
      {"fused_update", name_of(c.fused_update)},
      {"pad_ffn", name_of(c.pad_ffn)},
      {"attention", name_of(c.attention)},
      {"seed", c.seed},
      {"out_dir", c.out_dir},
      {"log_every", c.log_every},
      {"eval_every", c.eval_every},
      {"eval_tokens", c.eval_tokens},
      {"eval_batch_size", c.eval_batch_size > 0 ? json(c.eval_batch_size) : json("auto")},
      {"checkpoint_every", c.checkpoint_every},
      {"checkpoint_keep", c.checkpoint_keep},
      {"checkpoint_keep_every", c.checkpoint_keep_every},
  };
  if (!c.init_from.empty()) run["init_from"] = c.init_from;
  if (c.memory_limit > 0) run["memory_limit"] = format_memory_size(c.memory_limit);
  if (c.host_memory_limit > 0) run["host_memory_limit"] = format_memory_size(c.host_memory_limit);
  if (c.offload.automatic) {
    run["offload"] = "auto";
  } else if (c.offload.any() || c.offload.layers_auto) {
    run["offload"] = {{"optimizer_states", c.offload.optimizer_states},
                      {"piece_bytes", format_memory_size(c.offload.piece_bytes)},
                      {"activations", name_of(c.offload.activations)}};
    if (c.offload.layers > 0 || c.offload.layers_auto) {
      run["offload"]["layers"] = c.offload.layers_auto ? json("auto") : json(c.offload.layers);
      run["offload"]["layer_slots"] = c.offload.layer_slots;
    }
    if (!c.offload.disk_dir.empty()) run["offload"]["disk_dir"] = c.offload.disk_dir;
  }
  // only when on, so a checkpoint from before the key resumes without a warning about it
  if (c.activations.on())
    run["activations"] = {{"sample", name_of(c.activations.sample)}, {"keep", c.activations.keep}};
  if (c.activations.selected_columns != Switch::Auto)
    run["activations"]["selected_columns"] = name_of(c.activations.selected_columns);
  return run;
}

namespace {
struct SizeUnit {
  const char* name;
  double bytes;
};
// Longest names first, so "GiB" is not read as "G" followed by junk.
const SizeUnit kSizeUnits[] = {{"TiB", 1099511627776.0}, {"GiB", 1073741824.0},
                               {"MiB", 1048576.0},       {"KiB", 1024.0},
                               {"TB", 1e12},             {"GB", 1e9},
                               {"MB", 1e6},              {"KB", 1e3},
                               {"B", 1.0}};
}  // namespace

std::string relative_path_note(const std::string& path) {
  if (std::filesystem::path(path).is_absolute()) return "";
  std::error_code ec;
  const std::filesystem::path cwd = std::filesystem::current_path(ec);
  return " (relative paths resolve against the working directory" +
         (ec ? std::string() : ", " + cwd.string()) + ")";
}

std::optional<int64_t> parse_memory_size(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  std::string unit = text.substr(used);
  unit.erase(0, unit.find_first_not_of(' '));
  double scale = unit.empty() ? 1.0 : 0.0;
  for (const SizeUnit& u : kSizeUnits)
    if (unit == u.name) scale = u.bytes;
  const double bytes = value * scale;
  if (scale == 0 || !(bytes >= 0) || bytes > 9e18) return std::nullopt;
  return int64_t(bytes);
}

std::string format_memory_size(int64_t bytes) {
  for (const SizeUnit& u : kSizeUnits) {
    const int64_t unit = int64_t(u.bytes);
    const bool binary = u.name[1] == 'i' || unit == 1;
    if (binary && bytes >= unit && bytes % unit == 0)
      return std::to_string(bytes / unit) + u.name;
  }
  return std::to_string(bytes) + "B";
}

}  // namespace grass
