#include "src/core/arena.h"

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

namespace {
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
  for (auto& b : blocks_)
    if (b.ptr) memory_->deallocate(b.ptr);
}

void* Arena::alloc_bytes(MemCategory cat, const std::string& name, int64_t bytes) {
  GRASS_CHECK(bytes >= 0, "negative allocation for " + name);
  void* p = bytes && !planning_ ? memory_->allocate_zeroed(size_t(bytes)) : nullptr;
  if (bytes && !p && !planning_)
    throw UserError(std::string("out of ") + memory_->memory_name() + " allocating " + name +
                    " (" + format_bytes(bytes) + ") with " + format_bytes(total_) +
                    " already held: reduce micro_batch_size or seq_len (grass mem <run.json> "
                    "shows the plan)");
  if (p && (cat == MemCategory::Activations || cat == MemCategory::Workspace))
    memory_->mark_unwritten(p, size_t(bytes));
  blocks_.push_back({p, bytes, cat, name});
  live_[int(cat)] += bytes;
  total_ += bytes;
  if (total_ > peak_) peak_ = total_;
  return p;
}

void Arena::free(void* ptr) {
  GRASS_CHECK(!planning_, "Arena::free on a planning arena (its pointers are all null)");
  for (size_t i = 0; i < blocks_.size(); i++)
    if (blocks_[i].ptr == ptr) {
      live_[int(blocks_[i].cat)] -= blocks_[i].bytes;
      total_ -= blocks_[i].bytes;
      memory_->deallocate(ptr);
      blocks_.erase(blocks_.begin() + i);
      return;
    }
  GRASS_CHECK(false, "Arena::free of a pointer it does not own");
}

std::string Arena::report() const {
  std::string out;
  char line[128];
  for (int c = 0; c < kMemCategories; c++) {
    std::snprintf(line, sizeof line, "  %-12s %12s\n", mem_category_name(MemCategory(c)),
                  format_bytes(live_[c]).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-12s %12s\n", "total", format_bytes(total_).c_str());
  out += line;
  return out;
}

}  // namespace grass
