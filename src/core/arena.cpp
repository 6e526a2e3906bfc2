#include "src/core/arena.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "src/core/error.h"
#include "src/core/format.h"

namespace grass {

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::Weights: return "weights";
    case MemCategory::Gradients: return "gradients";
    case MemCategory::CompressedGradients: return "compressed";
    case MemCategory::Optimizer: return "optimizer";
    case MemCategory::Activations: return "activations";
    case MemCategory::Workspace: return "workspace";
  }
  return "?";
}

const char* mem_place_name(MemPlace p) { return p == MemPlace::Device ? "device" : "host"; }

namespace {
// The run key whose offload puts a category in the host tier
const char* host_tier_key(MemCategory cat) {
  switch (cat) {
    case MemCategory::Optimizer: return "offload.optimizer_states";
    case MemCategory::Weights: return "offload.layers";
    case MemCategory::Activations:
    case MemCategory::Workspace: return "offload.activations";
    default: return "offload";
  }
}

class HostMemory : public MemoryResource {
 public:
  void* allocate_zeroed(size_t bytes) override {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p) std::memset(p, 0, rounded);
    return p;
  }
  void deallocate(void* ptr) override { std::free(ptr); }
  const char* memory_name() const override { return "host memory"; }
};
}  // namespace

MemoryResource& host_memory() {
  static HostMemory memory;
  return memory;
}

Arena::~Arena() {
  for (auto& b : list_)
    if (b.ptr) memory_[int(b.place)]->deallocate(b.ptr);
}

void* Arena::alloc_bytes(MemCategory cat, const std::string& name, int64_t bytes, MemPlace place) {
  GRASS_CHECK(bytes >= 0, "negative allocation for " + name);
  const int at = int(place);
  MemoryResource& memory = *memory_[size_t(at)];
  void* p = bytes && !planning_ ? memory.allocate_zeroed(size_t(bytes)) : nullptr;
  if (bytes && !p && !planning_ && place == MemPlace::Host)  // the host tier: offload's
    throw UserError(std::string(host_tier_key(cat)) + ": cannot allocate " + format_bytes(bytes) +
                    " of " + memory.memory_name() + " for " + name + " (" +
                    format_bytes(total_[size_t(at)]) +
                    " of the host tier already held): the machine cannot pin the host tier the "
                    "run plans; offload less, or cap it with host_memory_limit (grass mem "
                    "<run.json> --host-memory-limit SIZE explores the options)");
  if (bytes && !p && !planning_)
    throw UserError(std::string("out of ") + memory.memory_name() + " allocating " + name +
                    " (" + format_bytes(bytes) + ") with " + format_bytes(total_[size_t(at)]) +
                    " already held: reduce micro_batch_size or seq_len (grass mem <run.json> "
                    "shows the plan)");
  if (p && (cat == MemCategory::Activations || cat == MemCategory::Workspace))
    memory.mark_unwritten(p, size_t(bytes));
  list_.push_back({p, bytes, cat, name, place});
  live_[size_t(at)][int(cat)] += bytes;
  total_[size_t(at)] += bytes;
  blocks_[size_t(at)]++;
  peak_[size_t(at)] = std::max(peak_[size_t(at)], total_[size_t(at)]);
  return p;
}

void Arena::free(void* ptr) {
  GRASS_CHECK(!planning_, "Arena::free on a planning arena (its pointers are all null)");
  for (size_t i = 0; i < list_.size(); i++)
    if (list_[i].ptr == ptr) {
      const size_t at = size_t(list_[i].place);
      live_[at][int(list_[i].cat)] -= list_[i].bytes;
      total_[at] -= list_[i].bytes;
      blocks_[at]--;
      memory_[at]->deallocate(ptr);
      list_.erase(list_.begin() + i);
      return;
    }
  GRASS_CHECK(false, "Arena::free of a pointer it does not own");
}

std::string Arena::report() const {
  const bool host = total_[size_t(MemPlace::Host)] > 0;
  std::string out;
  char line[128];
  const auto row = [&](const char* name, int64_t device, int64_t on_host) {
    std::snprintf(line, sizeof line, "  %-12s %12s", name, format_bytes(device).c_str());
    out += line;
    if (host) {
      std::snprintf(line, sizeof line, " %12s", format_bytes(on_host).c_str());
      out += line;
    }
    out += "\n";
  };
  if (host) {
    std::snprintf(line, sizeof line, "  %-12s %12s %12s\n", "", mem_place_name(MemPlace::Device),
                  mem_place_name(MemPlace::Host));
    out += line;
  }
  for (int c = 0; c < kMemCategories; c++)
    row(mem_category_name(MemCategory(c)), bytes(MemPlace::Device, MemCategory(c)),
        bytes(MemPlace::Host, MemCategory(c)));
  row("total", total_bytes(MemPlace::Device), total_bytes(MemPlace::Host));
  return out;
}

}  // namespace grass
