#include "model/hf_weights.h"

#include <algorithm>

#include "core/error.h"

namespace grass {

namespace {
std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}
}  // namespace

void load_hf_weights(LlamaModel& model, const SafetensorsFile& file, const std::string& prefix) {
  for (const ParamTensor& t : model.tensors()) {
    const std::string name = prefix + t.name;
    if (!file.contains(name))
      throw UserError(file.path() + ": tensor " + name + " is missing (the model config expects " +
                      shape_str(t.shape) + ")");
    const TensorEntry& e = file.get(name);
    if (e.shape != t.shape)
      throw UserError(file.path() + ": tensor " + name + " has shape " + shape_str(e.shape) +
                      " but the model config needs " + shape_str(t.shape));
    const std::vector<float> values = file.read_f32(name);
    std::copy(values.begin(), values.end(), model.params() + t.offset);
  }
  model.weights_written();
}

}  // namespace grass
