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

struct ResolvedRun {
  Storage storage;            // the device and its bytes for the precision
  ModelMemoryOptions memory;  // for that storage
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
// attention "cudnn" is the GPU's (the CPU computes with its reference kernels).
ModelMemoryOptions model_memory_options(const RunConfig& cfg, const Storage& storage);

// How a run keeps its activations, in words (the start-up table, `grass mem`).
std::string activations_kept(const ModelConfig& model, const ModelMemoryOptions& memory);

}  // namespace grass
