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

}  // namespace grass
