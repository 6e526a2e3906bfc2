// Every "auto" of a run config, decided here and nowhere else: where the run computes (device),
// how it stores its tensors (precision) and how its model holds memory (fused_update, pad_ffn,
// activation_checkpointing, attention). The backend choice, the trainer, `grass mem` and the plan
// JSON all read these answers, so a plan describes the run that `grass train` would make.
#pragma once
#include <string>

#include "kernels/storage.h"
#include "src/config/config.h"
#include "src/model/llama.h"

namespace grass {

// How the backend is asked for attention: the kernels to run, or with fall_back_to_grass (attention
// "auto" on the CUDA backend, where cuDNN's may be taken) the kernels to try before the
// reservation, which it takes if they load and build and else keeps the engine's
// (train/backend_choice.h: prepare_attention). why_not_cudnn: "auto" on the CUDA backend that
// may not take cuDNN's (an evaluation forward of more sequences than the micro-batch, which
// cuDNN's graphs, built for the micro-batch, do not serve), in words; the CPU computes with its
// reference and says nothing.
struct AttentionRequest {
  AttentionKernel kernel = AttentionKernel::Grass;
  bool fall_back_to_grass = false;
  std::string why_not_cudnn;
};

struct ResolvedRun {
  Storage storage;            // the device and its bytes for the precision
  ModelMemoryOptions memory;  // for that storage
  AttentionRequest attention;
};

// For a machine with (gpu_usable) or without a usable GPU. device "auto" takes the GPU when one is
// usable and the precision is not fp32 (the CPU reference is the only fp32 backend an "auto" run
// gets); "cuda" takes it whatever it finds (the backend choice reports a missing GPU). `grass mem`
// plans as if a GPU were usable.
ResolvedRun resolve(const RunConfig& cfg, bool gpu_usable);

// The storage of a precision choice on the GPU (cuda) or the CPU: "auto" is bf16-mixed on the GPU
// and fp32 on the CPU.
Storage storage_for(PrecisionChoice precision, bool cuda);

// How the run's model holds its memory on a backend with `storage`: fused_update "auto" is on in
// pure bf16 when a rank's step is one micro-batch; pad_ffn "auto" is on with the CUDA backend;
// attention "cudnn" is the GPU's (the CPU computes with its reference kernels), and "auto" the
// engine's kernels until a backend has settled it (with_attention); the head's chunk is
// planned_head_chunk_rows (which plans the run once more under a memory_limit).
ModelMemoryOptions model_memory_options(const RunConfig& cfg, const Storage& storage);

// How a run on `storage` asks its backend for attention.
AttentionRequest attention_request(const RunConfig& cfg, const Storage& storage);

// The attention a plan made with no backend to ask assumes (`grass mem`): "auto" as cuDNN's
// wherever it may take them, since their workspace is the larger of the two kernels' at every
// shape (backend.h: cudnn_attention_workspace_bytes against the engine's row sums and RoPE
// table), so the plan holds the run whichever it takes; else as the engine's. Other choices as
// given.
AttentionChoice planned_attention(const RunConfig& cfg, const Storage& storage);

// cfg with attention naming the kernels a backend settled on: the plan and the model of the run
// the trainer makes (its config.json keeps the choice as given).
RunConfig with_attention(const RunConfig& cfg, AttentionKernel kernel);

// The kernels' name as the run config spells them: "grass" (the engine's) or "cudnn".
const char* name_of(AttentionKernel kernel);
// "9.10.2" for cudnnGetVersion()'s 91002 (cuDNN 9's major·10000 + minor·100 + patch).
std::string cudnn_version_name(int64_t version);
// The attention kernels a run computes with, in words (the start-up table on the GPU): cuDNN's
// with their version, or the engine's; for `asked` "auto", that "auto" took them, or why not
// cuDNN's.
std::string describe_attention(AttentionChoice asked, const AttentionInUse& in_use);

// The GPU head's chunk for a run (ModelMemoryOptions::head_chunk_rows): large_head_chunk_rows
// (kernels/backend.h) where the run's plan with it fits memory_limit less what a card holds
// beyond the plan (beyond_plan_bytes), and always without a memory_limit;
// else 0, the default 64 MiB of logits. The plan is the training model's, before an evaluation
// model takes what it leaves. 0 on the CPU, which computes the head in one chunk.
int64_t planned_head_chunk_rows(const RunConfig& cfg, const Storage& storage);
// The head's chunk in words (the start-up table, `grass mem`): "logits 4096 rows at a time
// (250.0 MiB)", and why where memory_limit left no room for the larger chunk.
std::string describe_head(const RunConfig& cfg, const Storage& storage,
                          const ModelMemoryOptions& memory);

// How a run keeps its activations, in words (the start-up table, `grass mem`).
std::string activations_kept(const ModelConfig& model, const ModelMemoryOptions& memory);

}  // namespace grass
