// The model's weights, and the one way to them. Each tensor's place (ParamTensor::place) says
// where its values live, and every access dispatches on it here: the model's forward and backward
// (weight(): LlamaModel::layer_weights, the embedding, the final norm, lm_head), the optimizers'
// updates (ref()), init and init_from (write_hf()), tests (read_hf()), exports and
// checkpoints (hf_bytes(), load_hf_bytes(), holds()). Device: one buffer on the device, each
// tensor at its place_offset, beside the fp32 master copy when the storage keeps one. Streamed
// (offload.layers): the layer's block in the host tier, which the layer stream
// (model/layer_stream.h) brings through a device slot for each pass; the compute reads and the
// fused updates write the slot.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/core/arena.h"
#include "src/model/layer_stream.h"
#include "src/model/parameter_set.h"

namespace grass {

class WeightStore {
 public:
  WeightStore() = default;  // no weights yet
  // The weights of `tensors`: the resident ones in the buffer "<prefix>parameters" (Weights
  // category) and, with `master`, "master weights (fp32)" (counted with the optimizer states, as
  // ZeRO does: only the optimizers read it); streamed layers in a layer stream of `layer_slots`
  // slots (no master copy then). The arena must hand out `backend`'s memory.
  WeightStore(const ParameterSet& tensors, Arena& arena, Backend& backend,
              const std::string& prefix, bool master, int layer_slots);
  // The same weights without the master copy, through the same layer stream: a forward-only
  // model's view of a training model's (it sees every update).
  WeightStore view_without_master() const;
  // The layer stream of the streamed layers, or null (none).
  LayerStream* stream() const { return stream_.get(); }

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
  bool holds(const void* buffer) const {
    return buffer == resident_ || (stream_ && stream_->holds(buffer));
  }

  // The resident buffers whole, in place offsets: the weights [num_resident] and the master copy
  // [num_stored] (null without one). For tests, which read them in place on the CPU.
  void* resident() const { return resident_; }
  float* master() const { return master_; }

 private:
  Backend* backend_ = nullptr;
  void* resident_ = nullptr;
  float* master_ = nullptr;
  std::shared_ptr<LayerStream> stream_;  // shared with forward-only views
};

}  // namespace grass
