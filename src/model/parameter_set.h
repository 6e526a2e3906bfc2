// Every trainable tensor of the model, in one list the model and the optimizers share: its
// Hugging Face name, shape and place in the flat weight buffer, and how it is trained. A dense
// tensor has a slice of the dense gradient buffer; a projected tensor has none: its optimizer
// (GRASS, GaLore, FLORA) forms what it trains on from the layer's dy and x (model/gradient_sink.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace grass {

struct ParamTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;       // in elements, into the weights (and the master copy)
  int64_t numel = 0;
  bool is_norm = false;     // RMSNorm gains: no weight decay
  int64_t grad_offset = 0;  // into the dense gradient buffer; -1 for a projected tensor
  bool dense() const { return grad_offset >= 0; }
};

class ParameterSet {
 public:
  // Appends a tensor to the flat weight buffer (dense until set_projected says otherwise).
  void add(const std::string& name, std::vector<int64_t> shape, bool is_norm);
  // The named tensors (each must exist) become projected; the others get consecutive slices of
  // the dense gradient buffer, in list order.
  void set_projected(const std::vector<std::string>& names);

  size_t size() const { return tensors_.size(); }
  const ParamTensor& operator[](size_t i) const { return tensors_[i]; }
  std::vector<ParamTensor>::const_iterator begin() const { return tensors_.begin(); }
  std::vector<ParamTensor>::const_iterator end() const { return tensors_.end(); }
  int index_of(const std::string& name) const;  // InternalError when absent
  int64_t num_params() const { return num_params_; }
  int64_t num_dense_grads() const { return num_dense_grads_; }  // elements of the gradient buffer

 private:
  std::vector<ParamTensor> tensors_;
  int64_t num_params_ = 0;
  int64_t num_dense_grads_ = 0;
};

}  // namespace grass
