// Hugging Face weights in and out of a LlamaModel: tensors are matched by their HF names.
#pragma once
#include <string>

#include "io/safetensors.h"
#include "model/llama.h"

namespace grass {

// Copies every parameter from the file (tensor "<prefix><hf name>", any float dtype) into the
// model. A missing tensor or a shape that differs from the model config is a UserError naming
// the file and tensor; tensors the model does not use are ignored (e.g. rotary inv_freq).
void load_hf_weights(LlamaModel& model, const SafetensorsFile& file, const std::string& prefix = "");

}  // namespace grass
