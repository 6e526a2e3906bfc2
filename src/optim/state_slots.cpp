#include "src/optim/state_slots.h"

#include "src/core/error.h"

namespace grass {

namespace {
int64_t aligned(int64_t bytes) { return (bytes + 63) / 64 * 64; }
}  // namespace

StateSlots::StateSlots(Backend& backend, Arena& arena, int64_t slot_bytes)
    : backend_(backend), slot_bytes_(slot_bytes) {
  for (size_t i = 0; i < slots_.size(); i++)
    slots_[i].base = static_cast<char*>(arena.alloc_bytes(
        MemCategory::Workspace, "optimizer states slot " + std::to_string(i), slot_bytes));
}

int64_t StateSlots::slot_bytes_for(const std::vector<StateSpan>& spans) {
  int64_t bytes = 0;
  for (const StateSpan& s : spans) bytes += aligned(s.bytes);
  return bytes;
}

void StateSlots::fetch(Slot& slot, int64_t key, const std::vector<StateSpan>& spans) {
  GRASS_CHECK(slot_bytes_for(spans) <= slot_bytes_, "optimizer states larger than their slot");
  slot.key = key;
  slot.spans = spans;
  backend_.order_copy_after(backend_.mark_copies(Backend::Copy::ToHost));
  int64_t offset = 0;
  for (const StateSpan& s : spans) {
    if (s.fetch) {
      backend_.copy_async(slot.base + offset, s.at, size_t(s.bytes), Backend::Copy::ToDevice);
      fetched_ += s.bytes;
    }
    offset += aligned(s.bytes);
  }
  // after the write-backs too: the compute that then writes the slot follows them
  slot.ready = backend_.mark_copies(Backend::Copy::ToDevice);
}

void StateSlots::prefetch(int64_t key, const std::vector<StateSpan>& spans) {
  fetch(slots_[size_t(held_ < 0 ? 0 : 1 - held_)], key, spans);
}

void StateSlots::hold(int64_t key, const std::vector<StateSpan>& spans) {
  GRASS_CHECK(held_ < 0, "optimizer states held twice");
  int found = -1;
  for (int i = 0; i < 2; i++)
    if (slots_[size_t(i)].key == key) found = i;
  if (found < 0) {  // not prefetched: the order changed, or the first step
    found = 0;
    unprefetched_++;
    fetch(slots_[0], key, spans);
  }
  held_ = found;
  Slot& slot = slots_[size_t(found)];
  backend_.wait_copies(slot.ready);
  int64_t offset = 0;
  for (const StateSpan& s : slot.spans) {  // what the update overwrites first: unwritten till then
    if (!s.fetch) backend_.mark_unwritten(slot.base + offset, size_t(s.bytes));
    offset += aligned(s.bytes);
  }
}

void StateSlots::release() {
  GRASS_CHECK(held_ >= 0, "a release of optimizer states with none held");
  Slot& slot = slots_[size_t(held_)];
  int64_t offset = 0;
  for (const StateSpan& s : slot.spans) {
    backend_.copy_async(s.at, slot.base + offset, size_t(s.bytes), Backend::Copy::ToHost);
    written_back_ += s.bytes;
    offset += aligned(s.bytes);
  }
  slot.key = -1;
  held_ = -1;
}

void* StateSlots::device(const void* at) const {
  GRASS_CHECK(held_ >= 0, "an optimizer update outside its states' slot");
  const Slot& slot = slots_[size_t(held_)];
  int64_t offset = 0;
  for (const StateSpan& s : slot.spans) {
    if (s.at == at) return slot.base + offset;
    offset += aligned(s.bytes);
  }
  GRASS_CHECK(false, "an optimizer state buffer that is not among the held tensor's spans");
  return nullptr;
}

}  // namespace grass
