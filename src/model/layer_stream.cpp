#include "src/model/layer_stream.h"

#include <algorithm>
#include <string>

#include "src/core/error.h"

namespace grass {

LayerStream::LayerStream(Backend& backend, Arena& arena, const ParameterSet& tensors, int slots)
    : backend_(backend),
      weight_bytes_(backend.storage().weight_bytes),
      block_bytes_(tensors.layer_block() * backend.storage().weight_bytes),
      layers_(tensors.streamed_layers()),
      spans_(layers_.size()) {
  GRASS_CHECK(!layers_.empty(), "a layer stream with no streamed layers");
  GRASS_CHECK(slots >= 2, "a layer stream needs two slots at least");
  for (const ParamTensor& t : tensors)
    if (t.place == Place::Streamed)
      spans_[size_t(position(t.layer))].push_back({t.place_offset * weight_bytes_,
                                                   t.numel * weight_bytes_});
  for (const int l : layers_)
    host_.push_back(static_cast<char*>(arena.alloc_bytes(
        MemCategory::Weights, "layer " + std::to_string(l) + " weights (offload.layers)",
        block_bytes_, MemPlace::Host)));
  slots_.resize(size_t(std::min<int>(slots, int(layers_.size()))));
  for (size_t i = 0; i < slots_.size(); i++)
    slots_[i].base = static_cast<char*>(arena.alloc_bytes(
        MemCategory::Workspace, "layer weights slot " + std::to_string(i), block_bytes_));
}

int LayerStream::position(int layer) const {
  const auto it = std::lower_bound(layers_.begin(), layers_.end(), layer);
  return it != layers_.end() && *it == layer ? int(it - layers_.begin()) : -1;
}

int LayerStream::slot_of(int layer) const {
  for (size_t i = 0; i < slots_.size(); i++)
    if (slots_[i].layer == layer) return int(i);
  return -1;
}

void LayerStream::fetch(int slot, int layer) {
  Slot& s = slots_[size_t(slot)];
  s.layer = layer;
  if (!s.base) return;  // a planning arena's
  // after every write-back queued so far: the slot's last occupant's, and this layer's own
  backend_.order_copy_after(backend_.mark_copies(Backend::Copy::ToHost));
  const char* host = host_[size_t(position(layer))];
  for (const Span& span : spans_[size_t(position(layer))]) {
    backend_.copy_async(s.base + span.at, host + span.at, size_t(span.bytes),
                        Backend::Copy::ToDevice);
    fetched_ += span.bytes;
  }
  s.ready = backend_.mark_copies(Backend::Copy::ToDevice);
}

void LayerStream::acquire(int l, Direction direction) {
  const int p = position(l);
  GRASS_CHECK(p >= 0, "layer " + std::to_string(l) + " is not streamed");
  GRASS_CHECK(held_ < 0, "two streamed layers held at once");
  // the window: l, then the layers the pass reads next, as many as there are slots
  std::vector<int> window;
  const int step = direction == Direction::Forward ? 1 : -1;
  for (int q = p; q >= 0 && q < int(layers_.size()) && window.size() < slots_.size(); q += step)
    window.push_back(layers_[size_t(q)]);
  // a free slot: one whose occupant the window does not need
  const auto free_slot = [&] {
    for (size_t i = 0; i < slots_.size(); i++)
      if (std::find(window.begin(), window.end(), slots_[i].layer) == window.end()) return int(i);
    throw InternalError("a layer stream with no free slot");
  };
  int slot = slot_of(l);
  if (slot < 0) {
    unprefetched_++;
    slot = free_slot();
    fetch(slot, l);
  }
  held_ = l;
  if (slots_[size_t(slot)].base) backend_.wait_copies(slots_[size_t(slot)].ready);
  for (size_t i = 1; i < window.size(); i++)
    if (slot_of(window[i]) < 0) fetch(free_slot(), window[i]);
}

void LayerStream::release(int l, bool updated) {
  GRASS_CHECK(held_ == l, "a release of layer " + std::to_string(l) + ", which is not held");
  held_ = -1;
  if (!updated) return;
  const Slot& s = slots_[size_t(slot_of(l))];
  if (!s.base) return;
  char* host = host_[size_t(position(l))];
  for (const Span& span : spans_[size_t(position(l))]) {
    backend_.copy_async(host + span.at, s.base + span.at, size_t(span.bytes),
                        Backend::Copy::ToHost);
    written_back_ += span.bytes;
  }
  host_pending_ = true;
}

void* LayerStream::device(const ParamTensor& t) const {
  GRASS_CHECK(t.place == Place::Streamed && held_ == t.layer,
              t.name + " read on the device outside its layer's acquire and release");
  char* base = slots_[size_t(slot_of(t.layer))].base;
  return base ? base + t.place_offset * weight_bytes_ : nullptr;
}

void* LayerStream::host(const ParamTensor& t) const {
  GRASS_CHECK(t.place == Place::Streamed, t.name + " is not streamed");
  char* block = host_[size_t(position(t.layer))];
  return block ? block + t.place_offset * weight_bytes_ : nullptr;
}

void LayerStream::settle_host() {
  if (!host_pending_) return;
  backend_.synchronize();  // waits for the copy queues too
  host_pending_ = false;
}

void LayerStream::forget(int l) {
  GRASS_CHECK(held_ != l, "layer " + std::to_string(l) + " changed while held");
  if (const int slot = slot_of(l); slot >= 0) slots_[size_t(slot)].layer = -1;
}

void* LayerStream::staging(const ParamTensor& t) {
  GRASS_CHECK(held_ < 0, "a host transfer of " + t.name + " while a streamed layer is held");
  backend_.synchronize();  // no copy still reads or writes the slot, or the host blocks
  host_pending_ = false;
  // the slot holding t's layer (its copy is stale afterwards), else the first
  const int found = slot_of(t.layer);
  Slot& s = slots_[size_t(found >= 0 ? found : 0)];
  s.layer = -1;
  return s.base ? s.base + t.place_offset * weight_bytes_ : nullptr;
}

int64_t LayerStream::fetch_bytes_per_step() const {
  int64_t fetched = 0;
  for (size_t p = 0; p + slots_.size() < layers_.size(); p++)  // forward: all but the first slots
    for (const Span& span : spans_[p + slots_.size()]) fetched += span.bytes;
  return 2 * fetched;  // the backward's, all but the last slots, are as many of the same size
}

int64_t LayerStream::write_back_bytes_per_step() const {
  int64_t bytes = 0;
  for (const std::vector<Span>& spans : spans_)
    for (const Span& span : spans) bytes += span.bytes;
  return bytes;
}

bool LayerStream::holds(const void* buffer) const {
  return std::find(host_.begin(), host_.end(), buffer) != host_.end();
}

}  // namespace grass
