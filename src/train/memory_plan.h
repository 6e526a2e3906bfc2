// The memory a run will take, stated before anything is allocated: the run's own allocations,
// made on a planning arena (train/training_state.h), summed by category.
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "config/config.h"
#include "core/arena.h"
#include "model/storage.h"

namespace grass {

struct MemoryPlan {
  std::array<int64_t, kMemCategories> bytes{};  // by MemCategory
  int64_t total = 0;
  int64_t buffers = 0;  // named allocations (a device reservation pads each to its alignment)
};

MemoryPlan plan_memory(const RunConfig& cfg, const Storage& storage);

// The storage `grass mem` plans for: the CPU backend's for device "cpu", else the GPU's.
Storage planned_storage(const RunConfig& cfg);

// The table `grass mem` prints: the run's plan beside full AdamW's on the same model, batch and
// storage.
std::string format_memory_plans(const RunConfig& cfg, const Storage& storage);

}  // namespace grass
