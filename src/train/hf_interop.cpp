#include "src/train/hf_interop.h"

#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "src/config/config.h"
#include "src/config/json_check.h"
#include "src/core/arena.h"
#include "src/core/bf16.h"
#include "src/core/error.h"
#include "src/core/format.h"
#include "src/data/tokenizer.h"
#include "src/io/durable_file.h"
#include "src/io/hf_model_dir.h"
#include "src/io/safetensors.h"
#include "src/model/hf_weights.h"
#include "src/train/checkpointing.h"

namespace grass {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The keys that decide the weights' shapes and meaning, HF spelling.
void check_hf_config(const ModelConfig& run, const std::string& config_path) {
  const ModelConfig hf = load_model_config(config_path);
  const json a = to_json(hf), b = to_json(run);
  for (const char* key : {"hidden_size", "intermediate_size", "num_attention_heads",
                          "num_key_value_heads", "num_hidden_layers", "vocab_size",
                          "rms_norm_eps", "rope_theta", "tie_word_embeddings"})
    if (a[key] != b[key])
      throw UserError(config_path + ": " + key + " is " + a[key].dump() +
                      ", but the run's model config has " + b[key].dump() +
                      "; init_from needs weights of the same architecture");
}

}  // namespace

void load_hf_model(LlamaModel& model, const std::string& path) {
  const HfModelWeights weights(path);
  std::error_code ec;
  if (fs::is_directory(path, ec) && fs::exists(path + "/config.json", ec))
    check_hf_config(model.config(), path + "/config.json");
  load_hf_tensors(
      model,
      [&](const std::string& name) {
        return weights.contains(name) ? &weights.file_of(name) : nullptr;
      },
      path);
  std::set<std::string> used;
  for (const ParamTensor& t : model.tensors()) used.insert(t.name);
  for (const std::string& name : weights.names())
    if (!used.count(name) && !name.ends_with("rotary_emb.inv_freq"))
      throw UserError(weights.file_of(name).path() + ": tensor " + name +
                      " is not part of the run's model (" +
                      std::to_string(model.config().num_hidden_layers) + " layers, " +
                      (model.config().tie_word_embeddings ? "tied" : "untied") +
                      " embeddings): the weights belong to another architecture");
}

namespace {

constexpr const char* kRunFile = "grass_run.json";  // in a final model: which step, why it ended

// The final model's step, from its grass_run.json (0 when it has none).
int64_t final_model_step(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir + "/" + kRunFile, ec)) return 0;
  const json run = json_check::read_json_file(dir + "/" + kRunFile);
  return run.is_object() && run.contains("step") && run["step"].is_number_integer()
             ? run["step"].get<int64_t>()
             : 0;
}

ExportSource final_model_source(const std::string& dir) {
  std::error_code ec;
  ExportSource s;
  s.dir = dir;
  s.step = final_model_step(dir);
  s.description = "final model " + dir + " (step " + std::to_string(s.step) + ")";
  s.weights = dir + "/model.safetensors";
  s.model = load_model_config(dir + "/config.json");
  if (fs::exists(dir + "/tokenizer.model", ec)) s.tokenizer = dir + "/tokenizer.model";
  return s;
}

}  // namespace

std::string final_model_dir(const std::string& out_dir) { return out_dir + "/model"; }

LoadedWeights load_model_weights(LlamaModel& model, const std::string& path) {
  std::error_code ec;
  const auto tokenizer_in = [&](const std::string& dir) {
    return fs::exists(dir + "/tokenizer.model", ec) ? dir + "/tokenizer.model" : std::string();
  };
  const auto is_hf_dir = [&](const std::string& dir) {
    return !fs::exists(dir + "/" + kCheckpointManifest, ec) &&
           (fs::exists(dir + "/model.safetensors", ec) ||
            fs::exists(dir + "/model.safetensors.index.json", ec));
  };
  if (!fs::is_directory(path, ec)) {
    load_hf_weights(model, SafetensorsFile(path));
    return {path, ""};
  }
  if (is_hf_dir(path)) {
    load_hf_model(model, path);
    return {"Hugging Face model " + path, tokenizer_in(path)};
  }
  if (const std::optional<Checkpoint> checkpoint = newest_valid_checkpoint(path, false)) {
    load_hf_model(model, checkpoint->path("model.safetensors"));
    return {"checkpoint " + checkpoint->dir() + " (step " + std::to_string(checkpoint->step()) + ")",
            checkpoint->has("tokenizer.model") ? checkpoint->path("tokenizer.model") : ""};
  }
  if (const std::string final_model = final_model_dir(path); is_hf_dir(final_model)) {
    load_hf_model(model, final_model);
    return {final_model_source(final_model).description, tokenizer_in(final_model)};
  }
  throw UserError(path + ": no weights there: not a .safetensors file, a Hugging Face model "
                  "directory, a checkpoint, or a run's out_dir with checkpoints or a final model (" +
                  final_model_dir(path) + ")");
}

namespace {

// config.json (LlamaConfig, with the weights' dtype and the tokenizer's special ids) and, with a
// tokenizer, tokenizer.model and tokenizer_config.json: what transformers reads beside the
// weights.
void write_hf_metadata(const std::string& dir, const ModelConfig& mc, bool bf16,
                       const std::optional<Tokenizer>& tok, const std::string& tokenizer_path) {
  json config = to_json(mc);
  config["torch_dtype"] = bf16 ? "bfloat16" : "float32";
  config["use_cache"] = true;
  if (tok) {
    if (tok->bos_id() >= 0) config["bos_token_id"] = tok->bos_id();
    if (tok->eos_id() >= 0) config["eos_token_id"] = tok->eos_id();
  }
  write_file_durably(dir + "/config.json", config.dump(2) + "\n");
  if (!tok) return;
  const auto piece = [&](int id) -> json { return id >= 0 ? json(tok->pieces({id})[0]) : json(nullptr); };
  const json tokenizer_config = {{"tokenizer_class", "LlamaTokenizer"},
                                 {"bos_token", piece(tok->bos_id())},
                                 {"eos_token", piece(tok->eos_id())},
                                 {"unk_token", piece(tok->unk_id())},
                                 {"pad_token", nullptr},
                                 {"add_bos_token", tok->bos_id() >= 0},
                                 {"add_eos_token", false},
                                 {"model_max_length", mc.max_position_embeddings},
                                 {"clean_up_tokenization_spaces", false}};
  copy_file_durably(tokenizer_path, dir + "/tokenizer.model");
  write_file_durably(dir + "/tokenizer_config.json", tokenizer_config.dump(2) + "\n");
}

// The tokenizer at `path` ("": none) into `tok`, checked against the model's vocabulary.
void open_tokenizer(std::optional<Tokenizer>& tok, const std::string& path, const ModelConfig& mc) {
  if (path.empty()) return;
  tok.emplace(path);
  if (tok->vocab_size() > uint32_t(mc.vocab_size))
    throw UserError(path + ": " + std::to_string(tok->vocab_size()) +
                    " pieces, more than the model's vocab_size " + std::to_string(mc.vocab_size));
}

}  // namespace

ExportSource export_source(const Checkpoint& checkpoint) {
  const std::string config_path = checkpoint.path("config.json");
  const json run = checkpoint.read_json("config.json");
  if (!run.is_object() || !run.contains("model"))
    throw UserError(config_path + ": not a run config with an inline \"model\"");
  ExportSource s;
  s.dir = checkpoint.dir();
  s.step = checkpoint.step();
  s.description = "checkpoint " + checkpoint.dir() + " (step " + std::to_string(s.step) + ")";
  s.weights = checkpoint.path("model.safetensors");
  s.model = parse_model_config(run["model"], config_path + ": model");
  if (checkpoint.has("tokenizer.model")) s.tokenizer = checkpoint.path("tokenizer.model");
  return s;
}

ExportSource export_source(const std::string& path) {
  std::error_code ec;
  const bool is_final_model = fs::exists(path + "/" + kRunFile, ec);
  if (is_final_model) return final_model_source(path);
  if (const std::optional<Checkpoint> checkpoint = newest_valid_checkpoint(path, false))
    return export_source(*checkpoint);
  if (fs::exists(final_model_dir(path) + "/" + kRunFile, ec))
    return final_model_source(final_model_dir(path));
  throw UserError(path + ": no checkpoint and no final model there (a run writes " +
                  final_model_dir("<out_dir>") + " at its end, and checkpoints to "
                  "<out_dir>/checkpoints when checkpoint_every > 0)");
}

ExportResult export_hf(const Checkpoint& checkpoint, const std::string& out_dir, bool bf16,
                       const std::string& tokenizer) {
  return export_hf(export_source(checkpoint), out_dir, bf16, tokenizer);
}

ExportResult export_hf(const ExportSource& source, const std::string& out_dir, bool bf16,
                       const std::string& tokenizer) {
  const ModelConfig& mc = source.model;
  Arena planning(/*planning=*/true);
  const LlamaModel layout(mc, planning, 1, 1);  // names and shapes only; nothing is allocated

  const SafetensorsFile weights(source.weights);
  for (const ParamTensor& t : layout.tensors()) {
    if (!weights.contains(t.name))
      throw UserError(weights.path() + ": tensor " + t.name + " is missing");
    const TensorEntry& e = weights.get(t.name);
    if ((e.dtype != "F32" && e.dtype != "BF16") || e.shape != t.hf_shape)  // CPU runs, GPU runs
      throw UserError(weights.path() + ": tensor " + t.name + " is " + e.dtype + " " +
                      shape_str(e.shape) + ", the model config needs F32 or BF16 " +
                      shape_str(t.hf_shape));
  }

  const std::string tokenizer_path = tokenizer.empty() ? source.tokenizer : tokenizer;
  std::optional<Tokenizer> tok;
  open_tokenizer(tok, tokenizer_path, mc);

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw UserError(out_dir + ": cannot create: " + ec.message());
  if (fs::equivalent(out_dir, source.dir, ec))
    throw UserError(out_dir + ": is the " + (source.description.starts_with("checkpoint")
                                                 ? "checkpoint" : "model") +
                    " itself; export into another directory");
  if (fs::exists(out_dir + "/model.safetensors.index.json", ec))
    throw UserError(out_dir + ": holds model.safetensors.index.json, which Hugging Face would load "
                    "instead of the exported model.safetensors; export into another directory");

  ExportResult result;
  SafetensorsWriter out;
  // Tensors already in the wanted dtype are written from the file's mapping; the others are
  // converted into copies that stay alive until write().
  std::vector<std::vector<uint16_t>> to_bf16;
  std::vector<std::vector<float>> to_f32;
  const std::string wanted = bf16 ? "BF16" : "F32";
  for (const ParamTensor& t : layout.tensors()) {
    const TensorEntry& e = weights.get(t.name);
    result.parameters += t.hf_numel;
    if (e.dtype == wanted) {
      out.add(t.name, wanted, t.hf_shape, e.bytes.data(), e.bytes.size());
    } else if (bf16) {
      const std::vector<float> values = weights.read_f32(t.name);
      std::vector<uint16_t>& half = to_bf16.emplace_back(values.size());
      std::transform(values.begin(), values.end(), half.begin(), float_to_bf16);
      out.add(t.name, "BF16", t.hf_shape, half.data(), half.size() * sizeof(uint16_t));
    } else {  // bf16 widens to fp32 exactly
      const std::vector<float>& values = to_f32.emplace_back(weights.read_f32(t.name));
      out.add(t.name, "F32", t.hf_shape, values.data(), values.size() * sizeof(float));
    }
  }
  const std::string model_path = out_dir + "/model.safetensors";
  out.write(model_path, {{"format", "pt"}});
  result.weight_bytes = fs::file_size(model_path, ec);
  write_hf_metadata(out_dir, mc, bf16, tok, tokenizer_path);
  if (tok) result.tokenizer = tokenizer_path;
  fsync_directory(out_dir);
  return result;
}

std::string save_final_model(LlamaModel& model, const RunConfig& cfg, int64_t step,
                             const std::string& stopped_by) {
  const std::string final_dir = final_model_dir(cfg.out_dir);
  const std::string tmp = cfg.out_dir + "/.model.tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw UserError(tmp + ": cannot create: " + ec.message());
  const bool bf16 = std::string(hf_weight_dtype(model)) == "BF16";
  {
    SafetensorsWriter writer;
    std::vector<std::vector<std::byte>> keep;
    add_hf_tensors(writer, model, keep);
    writer.write(tmp + "/model.safetensors", {{"format", "pt"}});
  }
  std::optional<Tokenizer> tok;
  open_tokenizer(tok, cfg.tokenizer, model.config());
  write_hf_metadata(tmp, model.config(), bf16, tok, cfg.tokenizer);
  const nlohmann::ordered_json run = {{"step", step},
                    {"steps", cfg.steps},
                    {"stopped_by", stopped_by.empty() ? json(nullptr) : json(stopped_by)},
                    {"run_config", to_json(cfg)}};
  write_file_durably(tmp + "/" + kRunFile, run.dump(2) + "\n");
  fsync_directory(tmp);
  // The new directory takes the old one's name in one step where the file system can exchange
  // two names; else the old one goes first (a kill in between leaves the new one under .model.tmp,
  // and the next save starts over).
  if (fs::exists(final_dir, ec)) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
      fs::remove_all(final_dir, ec);
      fs::rename(tmp, final_dir, ec);
    }
    fs::remove_all(tmp, ec);
  } else {
    fs::rename(tmp, final_dir, ec);
  }
  if (ec || !fs::exists(final_dir + "/" + kRunFile))
    throw UserError(final_dir + ": cannot move the final model into place: " + ec.message());
  fsync_directory(cfg.out_dir);
  return final_dir;
}

}  // namespace grass
