// offload.optimizer_states (docs/memory.md): the optimizers' states live in the host tier and
// each piece's pass through a device slot for its update: a piece is a tensor, or a range of an
// elementwise update's (AdamW's embedding and lm_head, in slot-sized pieces). The step strategy
// holds a piece's states for its update, prefetching the next piece's into the other slot
// meanwhile, then writes them back:
//
//   to the device   ... fetch t ─┐ fetch t+1 ─┐ ...
//   to the host     ...          │            │   write back t ─ ...
//   compute         ...          wait ─ form G_C(t), update(t) ─ wait ─ form G_C(t+1) ...
//
// Two slots suffice because a fetch runs after the compute queued before it (copy_async's
// contract) and after every write-back queued before it: fetches and write-backs run on the two
// copy queues, so that order is a cross-queue wait (Backend::order_copy_after). It keeps a slot
// from being fetched into before the write-back that empties it has read it, and a piece's host
// bytes from being fetched before its last write-back has written them.
// The numbers are the resident run's: the same kernels read and write the same bytes, in a slot.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "src/core/arena.h"
#include "src/optim/optimizer.h"

namespace grass {

class StateSlots {
 public:
  // Two slots of `slot_bytes` (slot_bytes_for() of the largest piece), workspace on the device.
  StateSlots(Backend& backend, Arena& arena, int64_t slot_bytes);
  // The bytes a slot needs for these spans (each starts 64-byte aligned).
  static int64_t slot_bytes_for(const std::vector<StateSpan>& spans);

  int64_t slot_bytes() const { return slot_bytes_; }
  // A piece's name: its tensor and first element.
  static int64_t key(int tensor, int64_t first) { return (int64_t(tensor) << 40) | first; }

  // Queues piece `key`'s fetch into a slot not held (a span with fetch false is not copied).
  void prefetch(int64_t key, const std::vector<StateSpan>& spans);
  // Holds the piece's states on the device until release(): fetched now unless prefetch() did;
  // the compute queued from here waits for the fetch.
  void hold(int64_t key, const std::vector<StateSpan>& spans);
  // Queues the write-back of the held piece's states; device() no longer finds them.
  void release();
  // The slot's copy of the held span that starts at `at`.
  void* device(const void* at) const;

  // Bytes queued each way since construction (the step line's transfer rate).
  int64_t fetched_bytes() const { return fetched_; }
  int64_t written_back_bytes() const { return written_back_; }
  // Holds that found their piece not prefetched, since construction: the compute waited for
  // a whole fetch (the first step's, which learns the order).
  int64_t unprefetched_holds() const { return unprefetched_; }

 private:
  struct Slot {
    char* base = nullptr;
    int64_t key = -1;               // the piece it holds or receives; -1: none
    std::vector<StateSpan> spans;
    Backend::CopyMark ready;        // after its fetch
  };
  void fetch(Slot& slot, int64_t key, const std::vector<StateSpan>& spans);

  Backend& backend_;
  int64_t slot_bytes_;
  std::array<Slot, 2> slots_;
  int held_ = -1;  // index into slots_
  int64_t fetched_ = 0, written_back_ = 0, unprefetched_ = 0;
};

}  // namespace grass
