// Hugging Face interop: a run's weights from a Hugging Face model directory (`init_from`), and a
// checkpoint exported as one (`grass export`): config.json (LlamaConfig), model.safetensors with
// HF tensor names and the tokenizer, which transformers loads as LlamaForCausalLM.
#pragma once
#include <cstdint>
#include <string>

#include "src/io/checkpoint.h"
#include "src/model/llama.h"

namespace grass {

// Copies every parameter of `model` from the HF model directory (or .safetensors file) at
// `path`, single-file or sharded. UserError naming the file and tensor for a missing tensor, a
// shape that differs from the model config, a non-float dtype, or a tensor the model does not
// have (another layer count, an lm_head for tied embeddings); and, when the directory holds a
// config.json, for an architecture key that differs from the run's model config.
void load_hf_model(LlamaModel& model, const std::string& path);

// Where a run keeps its final model: <out_dir>/model, a Hugging Face model directory (written at
// the end of a run without checkpoints, and when a signal stops one).
std::string final_model_dir(const std::string& out_dir);

// What load_model_weights read.
struct LoadedWeights {
  std::string description;  // for output lines: "checkpoint runs/x/checkpoints/step_00000600"
  std::string tokenizer;    // the tokenizer.model that came with the weights; "" when none
};
// Copies every parameter of `model` from `path`: a .safetensors file, a Hugging Face model
// directory (single or sharded), a checkpoint directory (verified first), or a run's out_dir
// (its newest complete checkpoint, else its final model). UserError naming `path` when it holds
// none of these.
LoadedWeights load_model_weights(LlamaModel& model, const std::string& path);

struct ExportResult {
  int64_t parameters = 0;
  uint64_t weight_bytes = 0;  // of model.safetensors
  std::string tokenizer;      // the tokenizer model copied, "" when none
};

// A model to export: its weights (a model.safetensors with Hugging Face names, F32 or BF16) and
// the model config and tokenizer that came with them.
struct ExportSource {
  std::string description;  // for output lines: "checkpoint runs/x/checkpoints/step_00000600"
  std::string dir;          // the directory it is read from (an export must go elsewhere)
  int64_t step = 0;         // the optimizer steps the weights had
  std::string weights;      // its model.safetensors
  ModelConfig model;
  std::string tokenizer;    // "" when none came with it
};
// A checkpoint (verified first), a run's final model (<out_dir>/model), or a run's out_dir: its
// newest complete checkpoint, else its final model. UserError naming `path` when it is none.
ExportSource export_source(const std::string& path);
ExportSource export_source(const Checkpoint& checkpoint);

// Writes config.json, model.safetensors ("F32" or "BF16", round to nearest even) and, when the
// source carries a tokenizer or `tokenizer` names one, tokenizer.model and
// tokenizer_config.json into out_dir (created). Every file goes through a temporary name, so
// an existing export is replaced file by file and a failure leaves no partial file.
ExportResult export_hf(const ExportSource& source, const std::string& out_dir, bool bf16,
                       const std::string& tokenizer = "");
ExportResult export_hf(const Checkpoint& checkpoint, const std::string& out_dir, bool bf16,
                       const std::string& tokenizer = "");

// Writes the model's weights (as trained: F32 on the CPU, BF16 on the GPU) as a Hugging Face
// model directory, final_model_dir(cfg.out_dir), with the run's tokenizer and grass_run.json
// (the step, and what stopped the run: "" when it ran to the end, else the signal's name). It is
// written beside under a temporary name and swapped in whole, so a kill leaves the earlier one or
// the new one. Returns the directory.
std::string save_final_model(LlamaModel& model, const RunConfig& cfg, int64_t step,
                             const std::string& stopped_by);

}  // namespace grass
