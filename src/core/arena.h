// Every byte the engine holds comes from here, tagged with what it is for. The arena is the memory
// report (`mem` on the step line, the table at start-up), and later the cap and the planner's truth.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace grass {

// Gradients are the dense ones; CompressedGradients are GRASS's G_C (r x n or m x r per target).
enum class MemCategory { Weights, Gradients, CompressedGradients, Optimizer, Activations, Workspace };
constexpr int kMemCategories = 6;
const char* mem_category_name(MemCategory c);

// Where a buffer lives. Device: the backend's memory, which memory_limit caps and the GPU
// reserves in one piece. Host: the tier beside it (offload, docs/memory.md): pinned host memory
// on the GPU, a separate allocation outside the capped arena on the CPU. Only bytes that a copy
// queue moves to the device when they are needed go there (Backend::copy_async).
enum class MemPlace { Device, Host };
constexpr int kMemPlaces = 2;
const char* mem_place_name(MemPlace p);

// Where an arena's bytes come from: host memory by default, a backend's device memory otherwise.
class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  // Zero-filled, 64-byte aligned; null when the memory is exhausted.
  virtual void* allocate_zeroed(size_t bytes) = 0;
  virtual void deallocate(void* ptr) = 0;
  virtual const char* memory_name() const = 0;  // "host memory", "GPU memory": for messages
  // Called for activation and workspace buffers, whose contents before a first write are nobody's
  // business: a debugging mode may fill them with NaN (the CUDA backend's GRASS_POISON=1).
  virtual void mark_unwritten(void* ptr, size_t bytes) {
    (void)ptr;
    (void)bytes;
  }
};
MemoryResource& host_memory();

class Arena {
 public:
  // A planning arena records every allocation's size and category but allocates nothing and hands
  // out null pointers: constructors that only allocate (the model's, the optimizers') can run on
  // it to state the exact memory a run will take, for models far larger than this machine.
  // host_tier: where MemPlace::Host buffers come from (the backend's, Backend::host_tier());
  // null: plain host memory.
  explicit Arena(bool planning = false, MemoryResource& memory = host_memory(),
                 MemoryResource* host_tier = nullptr)
      : memory_{&memory, host_tier ? host_tier : &host_memory()}, planning_(planning) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena();

  // Zero-filled (activations and workspace: unless the memory's debugging mode poisons them),
  // 64-byte aligned. `name` shows up in reports and out-of-memory messages.
  void* alloc_bytes(MemCategory cat, const std::string& name, int64_t bytes,
                    MemPlace place = MemPlace::Device);
  template <typename T>
  T* alloc(MemCategory cat, const std::string& name, int64_t count,
           MemPlace place = MemPlace::Device) {
    return static_cast<T*>(alloc_bytes(cat, name, count * int64_t(sizeof(T)), place));
  }
  void free(void* ptr);

  bool planning() const { return planning_; }
  // The device's figures (what memory_limit caps and the GPU reserves): its buffers, bytes by
  // category, total and peak.
  int64_t num_blocks() const { return blocks_[size_t(MemPlace::Device)]; }
  int64_t bytes(MemCategory cat) const { return bytes(MemPlace::Device, cat); }
  int64_t total_bytes() const { return total_bytes(MemPlace::Device); }
  int64_t peak_bytes() const { return peak_bytes(MemPlace::Device); }
  // Any place's.
  int64_t bytes(MemPlace place, MemCategory cat) const { return live_[int(place)][int(cat)]; }
  int64_t total_bytes(MemPlace place) const { return total_[int(place)]; }
  int64_t peak_bytes(MemPlace place) const { return peak_[int(place)]; }
  // One line per category with bytes (a column per place when the host holds any), and the
  // total: for the start-up table.
  std::string report() const;

  // Every live buffer, in allocation order: what state exists (checkpoints save the weights and
  // optimizer categories from this list). `ptr` is null on a planning arena.
  struct Block {
    void* ptr;
    int64_t bytes;
    MemCategory cat;
    std::string name;
    MemPlace place = MemPlace::Device;
  };
  const std::vector<Block>& blocks() const { return list_; }

 private:
  std::vector<Block> list_;
  std::array<MemoryResource*, kMemPlaces> memory_;
  bool planning_ = false;
  std::array<std::array<int64_t, kMemCategories>, kMemPlaces> live_{};
  std::array<int64_t, kMemPlaces> total_{}, peak_{}, blocks_{};
};


}  // namespace grass
