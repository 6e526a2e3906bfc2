// Hugging Face weights in and out of a LlamaModel: tensors are matched by their HF names.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

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

// The dtype the model's weights are saved in: the forward's own, F32 on the CPU and BF16 on the
// GPU, so a saved model holds exactly the bits that were trained.
const char* hf_weight_dtype(const LlamaModel& model);

// Adds every parameter to `writer` under its Hugging Face name and shape (a padded ffn's tensors
// cut back to Hugging Face's), in hf_weight_dtype. The writer reads the bytes when it writes: the
// model's own buffers on the CPU, copies downloaded into `keep` on the GPU (and the unpadded
// copies: WeightStore::hf_bytes), so `keep` and the model must outlive the writer's write().
void add_hf_tensors(SafetensorsWriter& writer, LlamaModel& model,
                    std::vector<std::vector<std::byte>>& keep);

}  // namespace grass
