// Hugging Face weights in and out of a LlamaModel: tensors are matched by their HF names.
#pragma once
#include <functional>
#include <string>

#include "src/io/safetensors.h"
#include "src/model/llama.h"

namespace grass {

// The file that holds tensor `name`, or null.
using TensorLookup = std::function<const SafetensorsFile*(const std::string& name)>;

// Copies every parameter (tensor "<prefix><hf name>", any float dtype, from the file `lookup`
// names) into the model, through its backend (weights and master copy). A missing tensor, named
// against `where`, or a shape that differs from the model config, named against its file, is a
// UserError; tensors the model does not use are not looked at.
void load_hf_tensors(LlamaModel& model, const TensorLookup& lookup, const std::string& where,
                     const std::string& prefix = "");

// The same from one file, tensors the model does not use ignored (e.g. rotary inv_freq).
void load_hf_weights(LlamaModel& model, const SafetensorsFile& file, const std::string& prefix = "");

}  // namespace grass
