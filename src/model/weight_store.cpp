#include "src/model/weight_store.h"

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
                         const std::string& prefix, bool master)
    : backend_(&backend) {
  resident_ = arena.alloc_bytes(MemCategory::Weights, prefix + "parameters",
                                tensors.num_stored() * backend.storage().weight_bytes);
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
      return static_cast<std::byte*>(resident_) + t.offset * backend_->storage().weight_bytes;
  }
  no_such_place(t);
}

WeightRef WeightStore::ref(const ParamTensor& t) const {
  switch (t.place) {
    case Place::Device: return {weight(t), master_ ? master_ + t.offset : nullptr};
  }
  no_such_place(t);
}

void WeightStore::write_hf(const ParamTensor& t, const float* values) {
  switch (t.place) {
    case Place::Device: {
      std::vector<float> stored;
      if (t.padded()) {
        stored.resize(size_t(t.numel));
        hf_to_stored(t, values, stored.data(), sizeof(float));
        values = stored.data();
      }
      backend_->write_weights(resident_, master_, t.offset, values, t.numel);
      return;
    }
  }
  no_such_place(t);
}

std::vector<float> WeightStore::read_hf(const ParamTensor& t) const {
  switch (t.place) {
    case Place::Device: {
      std::vector<float> stored(size_t(t.numel));
      backend_->read_weights(stored.data(), resident_, t.offset, t.numel);
      if (!t.padded()) return stored;
      std::vector<float> hf(size_t(t.hf_numel));
      stored_to_hf(t, stored.data(), hf.data(), sizeof(float));
      return hf;
    }
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
  }
  no_such_place(t);
}

}  // namespace grass
