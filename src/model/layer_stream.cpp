#include "src/model/layer_stream.h"

#include <algorithm>
#include <string>
#include <utility>

#include "src/core/error.h"

namespace grass {

namespace {
int64_t aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }
}  // namespace

LayerStream::LayerStream(Backend& backend, Arena& arena, const ParameterSet& tensors, int slots)
    : backend_(backend),
      weight_bytes_(backend.storage().weight_bytes),
      block_bytes_(tensors.layer_block() * backend.storage().weight_bytes),
      layers_(tensors.streamed_layers()),
      spans_(layers_.size()) {
  GRASS_CHECK(!layers_.empty(), "a layer stream with no streamed layers");
  GRASS_CHECK(slots >= 2, "a layer stream needs two slots at least");
  for (size_t i = 0; i < tensors.size(); i++) {
    const ParamTensor& t = tensors[i];
    if (t.place != Place::Streamed) continue;
    GRASS_CHECK(t.shape.size() == 2, "a streamed tensor that is not a matrix: " + t.name);
    spans_[size_t(position(t.layer))].push_back({.tensor = int(i),
                                                 .at = t.place_offset * weight_bytes_,
                                                 .bytes = t.numel * weight_bytes_,
                                                 .out = int(t.shape[0]),
                                                 .in = int(t.shape[1])});
  }
  for (const int l : layers_)
    host_.push_back(static_cast<char*>(arena.alloc_bytes(
        MemCategory::Weights, "layer " + std::to_string(l) + " weights (offload.layers)",
        block_bytes_, MemPlace::Host)));
  slots_.resize(size_t(std::min<int>(slots, int(layers_.size()))));
  for (size_t i = 0; i < slots_.size(); i++)
    slots_[i].base = static_cast<char*>(arena.alloc_bytes(
        MemCategory::Workspace, "layer weights slot " + std::to_string(i), block_bytes_));
}

void LayerStream::pack_slices_of(const std::vector<Packed>& tensors, const SliceSource& source,
                                 Arena& arena) {
  GRASS_CHECK(!source_, "a layer stream's packed tensors named twice");
  source_ = &source;
  int64_t delta_bytes = 0;  // a layer's packed block: the largest layer's
  for (std::vector<Span>& spans : spans_) {
    int64_t at = 0;
    for (Span& span : spans) {
      const auto it = std::find_if(tensors.begin(), tensors.end(),
                                   [&](const Packed& p) { return p.tensor == span.tensor; });
      if (it == tensors.end()) continue;
      span.packs = true;
      span.rows = it->rows;
      span.max_slices = it->max_slices;
      span.delta_at = at;
      at += aligned(span.max_slices * slice_bytes(span));
    }
    delta_bytes = std::max(delta_bytes, at);
  }
  if (delta_bytes == 0) return;
  for (const int l : layers_)
    host_delta_.push_back(static_cast<char*>(arena.alloc_bytes(
        MemCategory::Weights, "layer " + std::to_string(l) + " selected slices (offload.layers)",
        delta_bytes, MemPlace::Host)));
  for (size_t i = 0; i < slots_.size(); i++)
    slots_[i].delta = static_cast<char*>(arena.alloc_bytes(
        MemCategory::Workspace, "layer slices slot " + std::to_string(i), delta_bytes));
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

LayerStream::Span& LayerStream::span_of(const ParamTensor& t) {
  return const_cast<Span&>(std::as_const(*this).span_of(t));
}

const LayerStream::Span& LayerStream::span_of(const ParamTensor& t) const {
  GRASS_CHECK(t.place == Place::Streamed, t.name + " is not streamed");
  for (const Span& span : spans_[size_t(position(t.layer))])
    if (span.at == t.place_offset * weight_bytes_) return span;
  throw InternalError("no span of the layer stream holds " + t.name);
}

void LayerStream::fetch_span(Slot& s, int p, const Span& span) {
  backend_.copy_async(s.base + span.at, host_[size_t(p)] + span.at, size_t(span.bytes),
                      Backend::Copy::ToDevice);
  fetched_ += span.bytes;
  if (span.base != Base::Packed) return;
  const int64_t bytes = span.count * slice_bytes(span);
  backend_.copy_async(s.delta + span.delta_at, host_delta_[size_t(p)] + span.delta_at,
                      size_t(bytes), Backend::Copy::ToDevice);
  fetched_ += bytes;
  s.unpack = true;
}

void LayerStream::unpack(const Slot& s, const Span& span) {
  const SliceSet now = source_->changed_slices(span.tensor);
  GRASS_CHECK(now.generation == span.generation && now.count == span.count,
              "a streamed tensor's selection changed while its slices were packed");
  backend_.unpack_slices(s.base + span.at, s.delta + span.delta_at, now.sigma, span.count,
                         span.out, span.in, span.rows);
}

void LayerStream::fetch(int slot, int layer) {
  Slot& s = slots_[size_t(slot)];
  s.layer = layer;
  s.unpack = false;
  if (!s.base) return;  // a planning arena's
  // after every write-back queued so far: the slot's last occupant's, and this layer's own
  backend_.order_copy_after(backend_.mark_copies(Backend::Copy::ToHost));
  const int p = position(layer);
  for (const Span& span : spans_[size_t(p)]) fetch_span(s, p, span);
  s.ready = backend_.mark_copies(Backend::Copy::ToDevice);
}

std::vector<LayerStream::SlotFetch> LayerStream::plan_acquire(std::vector<int>& occupants, int l,
                                                              Direction direction) const {
  // the window: l, then the layers the pass reads next, as many as there are slots
  std::vector<int> window;
  const int step = direction == Direction::Forward ? 1 : -1;
  for (int q = position(l); q >= 0 && q < int(layers_.size()) && window.size() < occupants.size();
       q += step)
    window.push_back(layers_[size_t(q)]);
  std::vector<SlotFetch> fetches;
  for (const int layer : window) {
    if (std::find(occupants.begin(), occupants.end(), layer) != occupants.end()) continue;
    // a free slot: one whose occupant the window does not need
    const auto free = std::find_if(occupants.begin(), occupants.end(), [&](int occupant) {
      return std::find(window.begin(), window.end(), occupant) == window.end();
    });
    GRASS_CHECK(free != occupants.end(), "a layer stream with no free slot");
    *free = layer;
    fetches.push_back({int(free - occupants.begin()), layer});
  }
  return fetches;
}

void LayerStream::acquire(int l, Direction direction) {
  const int p = position(l);
  GRASS_CHECK(p >= 0, "layer " + std::to_string(l) + " is not streamed");
  GRASS_CHECK(held_ < 0, "two streamed layers held at once");
  std::vector<int> occupants;
  for (const Slot& s : slots_) occupants.push_back(s.layer);
  const std::vector<SlotFetch> fetches = plan_acquire(occupants, l, direction);
  size_t next = 0;  // l's own fetch first, when it is in no slot
  if (!fetches.empty() && fetches[0].layer == l) {
    unprefetched_++;
    fetch(fetches[next++].slot, l);
  }
  held_ = l;
  Slot& s = slots_[size_t(slot_of(l))];
  if (s.base) backend_.wait_copies(s.ready);
  if (s.unpack) {  // the packed slices over the base, before the compute reads the layer
    for (const Span& span : spans_[size_t(p)])
      if (span.base == Base::Packed) unpack(s, span);
    s.unpack = false;
  }
  for (; next < fetches.size(); next++) fetch(fetches[next].slot, fetches[next].layer);
}

void LayerStream::release(int l, bool updated) {
  GRASS_CHECK(held_ == l, "a release of layer " + std::to_string(l) + ", which is not held");
  held_ = -1;
  const Slot& s = slots_[size_t(slot_of(l))];
  const int p = position(l);
  if (!updated) {
    // Unchanged, but a refresh may have moved σ while the layer was held (a deferred step's
    // backward selects): a host block packed at the old σ could not be unpacked again, so the
    // tensor goes back whole, once; one whole on the host is whole at the new σ too.
    for (Span& span : spans_[size_t(p)]) {
      if (!span.packs || span.base == Base::Whole) continue;
      const SliceSet now = source_->changed_slices(span.tensor);
      if (now.generation == span.generation) continue;
      if (span.base == Base::Packed) {
        if (s.base)
          backend_.copy_async(host_[size_t(p)] + span.at, s.base + span.at, size_t(span.bytes),
                              Backend::Copy::ToHost);
        written_back_ += span.bytes;
        host_pending_ = true;
      }
      span.base = Base::WholeAt;
      span.generation = now.generation;
    }
    return;
  }
  for (Span& span : spans_[size_t(p)]) {
    const SliceSet now = span.packs ? source_->changed_slices(span.tensor) : SliceSet{};
    if (span.packs && span.base != Base::Whole && now.generation == span.generation) {
      // only σ's slices changed since the base was whole: they go back packed
      const int64_t bytes = now.count * slice_bytes(span);
      if (s.base) {
        backend_.pack_slices(s.delta + span.delta_at, s.base + span.at, now.sigma, now.count,
                             span.out, span.in, span.rows);
        backend_.copy_async(host_delta_[size_t(p)] + span.delta_at, s.delta + span.delta_at,
                            size_t(bytes), Backend::Copy::ToHost);
      }
      written_back_ += bytes;
      span.base = Base::Packed;
      span.count = now.count;
      continue;
    }
    // the whole tensor: not packed, or σ changed (a refresh), or the base came from the host
    if (s.base)
      backend_.copy_async(host_[size_t(p)] + span.at, s.base + span.at, size_t(span.bytes),
                          Backend::Copy::ToHost);
    written_back_ += span.bytes;
    if (span.packs) {
      span.base = Base::WholeAt;
      span.generation = now.generation;
    }
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

bool LayerStream::packed(const ParamTensor& t) const { return span_of(t).base == Base::Packed; }

void LayerStream::settle_host() {
  if (!host_pending_) return;
  backend_.synchronize();  // waits for the copy queues too
  host_pending_ = false;
}

void LayerStream::forget(int l) {
  GRASS_CHECK(held_ != l, "layer " + std::to_string(l) + " changed while held");
  if (const int slot = slot_of(l); slot >= 0) slots_[size_t(slot)].layer = -1;
}

void LayerStream::host_written(const ParamTensor& t) {
  forget(t.layer);
  span_of(t).base = Base::Whole;
}

LayerStream::Slot& LayerStream::host_transfer_slot(const ParamTensor& t) {
  GRASS_CHECK(held_ < 0, "a host transfer of " + t.name + " while a streamed layer is held");
  backend_.synchronize();  // no copy still reads or writes the slot, or the host blocks
  host_pending_ = false;
  const int found = slot_of(t.layer);
  Slot& s = slots_[size_t(found >= 0 ? found : 0)];
  s.layer = -1;
  return s;
}

void* LayerStream::staging(const ParamTensor& t) {
  const Slot& s = host_transfer_slot(t);
  return s.base ? s.base + t.place_offset * weight_bytes_ : nullptr;
}

void* LayerStream::stage(const ParamTensor& t) {
  Slot& s = host_transfer_slot(t);
  if (!s.base) return nullptr;  // a planning arena's
  const Span& span = span_of(t);
  const int64_t fetched = fetched_;  // not a pass's fetch: the per-step count leaves it out
  fetch_span(s, position(t.layer), span);
  fetched_ = fetched;
  backend_.synchronize();
  if (s.unpack) unpack(s, span);
  s.unpack = false;
  return s.base + t.place_offset * weight_bytes_;
}

LayerStream::StepTraffic LayerStream::step_traffic(int micro_batches, bool fused) const {
  GRASS_CHECK(micro_batches == 1 || !fused, "fused updates take one micro-batch a step");
  const auto fetched_bytes = [&](int layer) {
    int64_t bytes = 0;
    for (const Span& span : spans_[size_t(position(layer))])
      bytes += span.bytes + (span.packs ? span.max_slices * slice_bytes(span) : 0);
    return bytes;
  };
  // the passes of two steps from empty slots, the acquires' own policy: the second's fetches
  std::vector<int> occupants(slots_.size(), -1);
  StepTraffic traffic;
  for (int step = 0; step < 2; step++) {
    traffic = {};
    const auto pass = [&](Direction direction, int64_t& bytes) {
      for (size_t i = 0; i < layers_.size(); i++) {
        const int layer = direction == Direction::Forward ? layers_[i] : layers_[layers_.size() - 1 - i];
        for (const SlotFetch& f : plan_acquire(occupants, layer, direction))
          bytes += fetched_bytes(f.layer);
      }
    };
    for (int m = 0; m < micro_batches; m++) {
      pass(Direction::Forward, traffic.forward_fetched);
      pass(Direction::Backward, traffic.backward_fetched);
    }
    if (!fused) pass(Direction::Forward, traffic.update_fetched);  // the deferred updates' pass
  }
  for (const std::vector<Span>& spans : spans_)
    for (const Span& span : spans)
      traffic.written_back += span.packs ? span.max_slices * slice_bytes(span) : span.bytes;
  return traffic;
}


bool LayerStream::holds(const void* buffer) const {
  return std::find(host_.begin(), host_.end(), buffer) != host_.end() ||
         std::find(host_delta_.begin(), host_delta_.end(), buffer) != host_delta_.end();
}

}  // namespace grass
