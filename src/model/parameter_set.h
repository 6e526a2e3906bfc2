// Every trainable tensor of the model, in one list the model and the optimizers share: its
// Hugging Face name, shape and place in the flat weight buffer, where its weights live, and how
// it is trained. A dense
// tensor has a slice of the dense gradient buffer; a projected tensor has none: its optimizer
// (GRASS, GaLore, FLORA) forms what it trains on from the layer's dy and x (model/gradient_sink.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace grass {

// Where a tensor's weights live; model/weight_store.h dispatches every access on it. Device: in
// the device's resident weight buffer, for the whole run. Streamed (offload.layers,
// model/layer_stream.h): in the host tier, in its layer's block, and on the device only while
// the layer passes through one of the stream's slots.
enum class Place { Device, Streamed };

// A tensor is stored as `shape`, which is Hugging Face's `hf_shape` or, for the ffn tensors of a
// model with padded ffn rows (ModelMemoryOptions::pad_ffn), larger: extra rows at the end and a
// row pitch wider than the row. The pad entries are zero and stay zero (their gradients are zero,
// so every optimizer leaves them alone); what the engine computes on sees `shape`, what it reads
// and writes as files (checkpoints' weights, exports, imports) sees `hf_shape`.
struct ParamTensor {
  std::string name;
  std::vector<int64_t> shape;  // as stored
  int64_t offset = 0;          // in elements, into the flat weights (and the master copy)
  int64_t numel = 0;           // stored elements, pad included
  bool is_norm = false;        // RMSNorm gains: no weight decay
  int layer = -1;              // the decoder layer it belongs to; -1: none
  Place place = Place::Device;
  // In elements, where the tensor starts in its place's buffer: the resident weights (Device) or
  // its layer's block, host and slot alike (Streamed). Without streamed layers it is `offset`;
  // with them each keeps offset's alignment class (kPlaceAlign elements).
  int64_t place_offset = 0;
  int64_t grad_offset = 0;     // into the dense gradient buffer; -1 for a projected tensor
  std::vector<int64_t> hf_shape;  // Hugging Face's: the stored shape less its pad
  int64_t hf_numel = 0;
  bool dense() const { return grad_offset >= 0; }
  bool padded() const { return numel != hf_numel; }
};

// Copies tensor t between Hugging Face's layout (hf_numel elements of elem_bytes) and the stored
// one (numel elements, the pad written as zero bytes).
void hf_to_stored(const ParamTensor& t, const void* hf, void* stored, int elem_bytes);
void stored_to_hf(const ParamTensor& t, const void* stored, void* hf, int elem_bytes);

class ParameterSet {
 public:
  // A tensor's start in its place's buffer stays congruent to its flat offset modulo this many
  // elements: 256 bytes of bf16, 512 of fp32. The GPU's GEMMs pick their kernels by a matrix's
  // alignment, so a tensor computes the same bits in a slot as resident.
  static constexpr int64_t kPlaceAlign = 128;

  // Appends a tensor to the flat weight buffer (dense until set_projected says otherwise), stored
  // as `stored` (each dimension at least hf_shape's; empty: as hf_shape), a part of decoder
  // layer `layer` (-1: none).
  void add(const std::string& name, std::vector<int64_t> hf_shape, bool is_norm,
           std::vector<int64_t> stored = {}, int layer = -1);
  // The matrices of `layers` (ascending; not their norm gains) become Streamed, and every
  // tensor's place_offset is laid out: resident ones packed into num_resident() elements, each
  // streamed layer's into its own block of layer_block() elements at most.
  void stream_layers(const std::vector<int>& layers);
  // The named tensors (each must exist) become projected; the others get consecutive slices of
  // the dense gradient buffer, in list order.
  void set_projected(const std::vector<std::string>& names);

  size_t size() const { return tensors_.size(); }
  const ParamTensor& operator[](size_t i) const { return tensors_[i]; }
  std::vector<ParamTensor>::const_iterator begin() const { return tensors_.begin(); }
  std::vector<ParamTensor>::const_iterator end() const { return tensors_.end(); }
  int index_of(const std::string& name) const;  // InternalError when absent
  int64_t num_params() const { return num_params_; }  // the model's parameters, as HF counts them
  int64_t num_stored() const { return num_stored_; }  // elements of the weight buffer, pad included
  int64_t num_dense_grads() const { return num_dense_grads_; }  // elements of the gradient buffer
  int64_t num_resident() const { return num_resident_; }  // elements of the resident weights
  int64_t layer_block() const { return layer_block_; }    // elements of a streamed layer's block
  const std::vector<int>& streamed_layers() const { return streamed_layers_; }

 private:
  std::vector<ParamTensor> tensors_;
  int64_t num_params_ = 0;
  int64_t num_stored_ = 0;
  int64_t num_dense_grads_ = 0;
  int64_t num_resident_ = 0;
  int64_t layer_block_ = 0;
  std::vector<int> streamed_layers_;
};

}  // namespace grass
