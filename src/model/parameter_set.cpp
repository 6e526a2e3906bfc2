#include "model/parameter_set.h"

#include <algorithm>

#include "core/error.h"

namespace grass {

void ParameterSet::add(const std::string& name, std::vector<int64_t> shape, bool is_norm) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  tensors_.push_back({name, std::move(shape), num_params_, numel, is_norm, num_dense_grads_});
  num_params_ += numel;
  num_dense_grads_ += numel;
}

void ParameterSet::set_projected(const std::vector<std::string>& names) {
  for (const std::string& name : names) index_of(name);  // each must exist
  num_dense_grads_ = 0;
  for (ParamTensor& t : tensors_) {
    const bool projected = std::find(names.begin(), names.end(), t.name) != names.end();
    t.grad_offset = projected ? -1 : num_dense_grads_;
    if (!projected) num_dense_grads_ += t.numel;
  }
}

int ParameterSet::index_of(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); i++)
    if (tensors_[i].name == name) return int(i);
  throw InternalError("no parameter named " + name);
}

}  // namespace grass
