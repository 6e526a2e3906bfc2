// The model's weights, and the one way to them. Each tensor's place (ParamTensor::place) says
// where its values live, and every access dispatches on it here: the model's forward and backward
// (weight(): LlamaModel::layer_weights, the embedding, the final norm, lm_head), the optimizers'
// updates (ref()), init and init_from (write_hf()), tests (read_hf()), exports and
// checkpoints (hf_bytes(), load_hf_bytes(), holds()). Today every tensor is Place::Device: one
// flat buffer on the device, each tensor at its offset, beside the fp32 master copy when the
// storage keeps one. Weight streaming (../shared/WEIGHT_STREAMING.md §3) adds a place to each
// of these functions: layers whose weights live in pinned host memory and pass through device
// slots.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/core/arena.h"
#include "src/model/parameter_set.h"

namespace grass {

class WeightStore {
 public:
  WeightStore() = default;  // no weights yet
  // The weights of `tensors`, every one resident: the buffer "<prefix>parameters" (Weights
  // category) and, with `master`, "master weights (fp32)" (counted with the optimizer states, as
  // ZeRO does: only the optimizers read it). The arena must hand out `backend`'s memory.
  WeightStore(const ParameterSet& tensors, Arena& arena, Backend& backend,
              const std::string& prefix, bool master);
  // The same weights without the master copy: a forward-only model's view of a training model's
  // (it sees every update).
  WeightStore view_without_master() const;

  // Where the compute reads tensor t (the backend's memory, weight-typed).
  void* weight(const ParamTensor& t) const;
  // What an optimizer update of t writes: its weights and, with a master copy, its fp32 master.
  WeightRef ref(const ParamTensor& t) const;

  // Tensor t from fp32 values on the host in Hugging Face's layout (hf_numel of them), weights and
  // master copy; and the weights back as such values.
  void write_hf(const ParamTensor& t, const float* values);
  std::vector<float> read_hf(const ParamTensor& t) const;
  // Tensor t's weights as bytes of their own dtype in Hugging Face's layout, on the host: a view
  // of the weights where the backend's memory is the host's and nothing needs cutting, else a
  // copy appended to `keep`. Valid while `keep` and the weights are unchanged.
  const std::byte* hf_bytes(const ParamTensor& t, std::vector<std::vector<std::byte>>& keep) const;
  // The reverse: t's weights from such bytes. Not the master copy (a checkpoint restores it with
  // the optimizer states, byte for byte).
  void load_hf_bytes(const ParamTensor& t, const std::byte* hf);
  // Whether `buffer` is one of the arena blocks that hold the weights themselves (which
  // checkpoints save as tensors, not as state buffers).
  bool holds(const void* buffer) const { return buffer == resident_; }

  // The resident buffers whole, in ParameterSet offsets: the weights [num_stored] and the master
  // copy (null without one). For tests, which read them in place on the CPU.
  void* resident() const { return resident_; }
  float* master() const { return master_; }

 private:
  Backend* backend_ = nullptr;
  void* resident_ = nullptr;
  float* master_ = nullptr;
};

}  // namespace grass
