#include "src/model/hf_weights.h"

#include <algorithm>

#include "src/core/error.h"
#include "src/core/format.h"

namespace grass {

void load_hf_tensors(LlamaModel& model, const TensorLookup& lookup, const std::string& where,
                     const std::string& prefix) {
  for (const ParamTensor& t : model.tensors()) {
    const std::string name = prefix + t.name;
    const SafetensorsFile* file = lookup(name);
    if (!file)
      throw UserError(where + ": tensor " + name + " is missing (the model config expects " +
                      shape_str(t.hf_shape) + ")");
    const TensorEntry& e = file->get(name);
    if (e.shape != t.hf_shape)
      throw UserError(file->path() + ": tensor " + name + " has shape " + shape_str(e.shape) +
                      " but the model config needs " + shape_str(t.hf_shape));
    const std::vector<float> values = file->read_f32(name);
    model.write_tensor(t, values.data());
  }
}

void load_hf_weights(LlamaModel& model, const SafetensorsFile& file, const std::string& prefix) {
  load_hf_tensors(
      model, [&](const std::string& name) { return file.contains(name) ? &file : nullptr; },
      file.path(), prefix);
}

const char* hf_weight_dtype(const LlamaModel& model) {
  return model.storage().weight_bytes == 2 ? "BF16" : "F32";
}

void add_hf_tensors(SafetensorsWriter& writer, LlamaModel& model,
                    std::vector<std::vector<std::byte>>& keep) {
  const int wbytes = model.storage().weight_bytes;
  for (const ParamTensor& t : model.tensors())
    writer.add(t.name, hf_weight_dtype(model), t.hf_shape, model.weight_store().hf_bytes(t, keep),
               size_t(t.hf_numel) * wbytes);
}

}  // namespace grass
