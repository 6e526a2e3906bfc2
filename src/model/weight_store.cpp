#include "src/model/weight_store.h"

#include <cstring>

#include "src/core/error.h"

namespace grass {

// Each access is a switch on the tensor's place with no default, so that a new place is a
// compiler warning (-Wswitch) at every function that must learn it.
namespace {
[[noreturn]] void no_such_place(const ParamTensor& t) {
  throw InternalError("weight store: tensor " + t.name + " has an unknown place");
}
}  // namespace

WeightStore::WeightStore(const ParameterSet& tensors, Arena& arena, Backend& backend,
                         const std::string& prefix, bool master, int layer_slots)
    : backend_(&backend) {
  resident_ = arena.alloc_bytes(MemCategory::Weights, prefix + "parameters",
                                tensors.num_resident() * backend.storage().weight_bytes);
  if (!tensors.streamed_layers().empty()) {
    GRASS_CHECK(!master, "streamed layers with a master copy");
    stream_ = std::make_shared<LayerStream>(backend, arena, tensors, layer_slots);
  }
  if (master)
    master_ = arena.alloc<float>(MemCategory::Optimizer, "master weights (fp32)",
                                 tensors.num_stored());
}

WeightStore WeightStore::view_without_master() const {
  WeightStore view = *this;
  view.master_ = nullptr;
  return view;
}

void* WeightStore::weight(const ParamTensor& t) const {
  switch (t.place) {
    case Place::Device:
      if (!resident_) return nullptr;  // a planning arena's
      return static_cast<std::byte*>(resident_) + t.place_offset * backend_->storage().weight_bytes;
    case Place::Streamed: return stream_->device(t);
  }
  no_such_place(t);
}

WeightRef WeightStore::ref(const ParamTensor& t) const {
  switch (t.place) {
    case Place::Device: return {weight(t), master_ ? master_ + t.offset : nullptr};
    case Place::Streamed: return {stream_->device(t), nullptr};
  }
  no_such_place(t);
}

void WeightStore::write_hf(const ParamTensor& t, const float* values) {
  std::vector<float> stored;
  if (t.padded()) {
    stored.resize(size_t(t.numel));
    hf_to_stored(t, values, stored.data(), sizeof(float));
    values = stored.data();
  }
  switch (t.place) {
    case Place::Device:  // the master copy, when there is one, is in flat offsets (= place's)
      backend_->write_weights(resident_, master_, t.place_offset, values, t.numel);
      return;
    case Place::Streamed: {  // rounded to weights in a slot by the backend, then to the host
      void* slot = stream_->staging(t);
      if (!slot) return;  // a planning arena's
      backend_->write_weights(slot, nullptr, 0, values, t.numel);
      backend_->copy_async(stream_->host(t), slot, size_t(t.numel) * backend_->storage().weight_bytes,
                           Backend::Copy::ToHost);
      backend_->synchronize();
      stream_->host_written(t);
      return;
    }
  }
  no_such_place(t);
}

std::vector<float> WeightStore::read_hf(const ParamTensor& t) const {
  std::vector<float> stored(size_t(t.numel));
  const auto hf = [&] {
    if (!t.padded()) return stored;
    std::vector<float> values(size_t(t.hf_numel));
    stored_to_hf(t, stored.data(), values.data(), sizeof(float));
    return values;
  };
  switch (t.place) {
    case Place::Device:
      backend_->read_weights(stored.data(), resident_, t.place_offset, t.numel);
      return hf();
    case Place::Streamed:  // up to a slot, merged, then read as the backend reads weights
      backend_->read_weights(stored.data(), stream_->stage(t), 0, t.numel);
      return hf();
  }
  no_such_place(t);
}

const std::byte* WeightStore::hf_bytes(const ParamTensor& t,
                                       std::vector<std::vector<std::byte>>& keep) const {
  const int wbytes = backend_->storage().weight_bytes;
  switch (t.place) {
    case Place::Device: {
      const auto* stored = static_cast<const std::byte*>(weight(t));
      std::vector<std::byte> downloaded;
      if (backend_->storage().cuda) {
        downloaded.resize(size_t(t.numel) * wbytes);
        backend_->download(downloaded.data(), stored, downloaded.size());
        stored = downloaded.data();
      }
      if (t.padded()) {
        std::vector<std::byte>& hf = keep.emplace_back(size_t(t.hf_numel) * wbytes);
        stored_to_hf(t, stored, hf.data(), wbytes);
        return hf.data();
      }
      if (downloaded.empty()) return stored;
      return keep.emplace_back(std::move(downloaded)).data();
    }
    case Place::Streamed: {  // the host block, once the write-backs have landed
      stream_->settle_host();
      const auto* stored = static_cast<const std::byte*>(stream_->host(t));
      if (stream_->packed(t)) {  // its selected slices are in their own block: merged in a slot
        std::vector<std::byte>& merged = keep.emplace_back(size_t(t.numel) * wbytes);
        backend_->download(merged.data(), stream_->stage(t), merged.size());
        stored = merged.data();
      }
      if (!t.padded()) return stored;
      std::vector<std::byte>& hf = keep.emplace_back(size_t(t.hf_numel) * wbytes);
      stored_to_hf(t, stored, hf.data(), wbytes);
      return hf.data();
    }
  }
  no_such_place(t);
}

void WeightStore::load_hf_bytes(const ParamTensor& t, const std::byte* hf) {
  const int wbytes = backend_->storage().weight_bytes;
  switch (t.place) {
    case Place::Device: {
      std::vector<std::byte> stored;
      if (t.padded()) {
        stored.resize(size_t(t.numel) * wbytes);
        hf_to_stored(t, hf, stored.data(), wbytes);
        hf = stored.data();
      }
      backend_->upload(weight(t), hf, size_t(t.numel) * wbytes);
      return;
    }
    case Place::Streamed: {
      stream_->settle_host();
      void* host = stream_->host(t);
      if (!host) return;  // a planning arena's
      if (t.padded()) hf_to_stored(t, hf, host, wbytes);
      else std::memcpy(host, hf, size_t(t.numel) * wbytes);
      stream_->host_written(t);
      return;
    }
  }
  no_such_place(t);
}

}  // namespace grass
