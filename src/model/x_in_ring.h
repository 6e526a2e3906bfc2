// offload.activations (docs/memory.md): under per-layer checkpointing a layer's input x_in is the
// one activation kept from the forward to the backward. With this ring it waits in the host tier
// or on disk instead, and only kSlots layers' inputs are on the device at once:
//
//   forward    layer l writes x_in[l+1] ─ layer l+1 reads it ─ out ─┐        (device → host/disk)
//   backward   layer l: x_in[l] back (waited) ─ recompute, backward; meanwhile x_in[l-2] comes in
//
// Layer l's input lives in slot l % kSlots. It goes out once the forward has read it; the slot is
// written again kSlots layers later, after that copy (a wait on the copy queue, not the host).
// Inputs go out on the queue to the host and come back on the queue to the device
// (Backend::copy_async), so each fetch is ordered after its input's way out: the copy into the
// host tier, or the file write (Backend::order_copy_after).
// The last kSlots layers' inputs never leave: the backward reads them first (SSDTrain's
// forwarding), and each input is stored once (its deduplication). In the backward, layer j's
// comes back into its slot as soon as layer j + kSlots's backward has been queued, so kSlots - 1
// layers of compute hide each fetch.
// The disk tier is a file ring (io/activation_file.h): each input passes through one pinned
// bounce buffer. Its file write runs as a task on the queue to the host after its copy into the
// buffer, its read on the queue to the device before the copy out of it, so each queue's order
// keeps the one buffer safe within a pass, and the cross-queue order above keeps the backward's
// first read behind the forward's last write (no compute waits for the write). The next forward's
// copies into the buffer follow the backward's copies out of it through the compute, which waits
// for each fetch before the layer's backward. The numbers are the resident run's.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "src/config/choices.h"
#include "src/core/arena.h"
#include "src/io/activation_file.h"

namespace grass {

class XInRing {
 public:
  static constexpr int kSlots = 3;
  // The inputs of `layers` layers, up to `bytes` each (a full micro-batch's). On a planning arena
  // nothing is opened; with `where` Disk a file ring in disk_dir (UserError naming it).
  XInRing(Backend& backend, Arena& arena, int layers, int64_t bytes, ActivationOffload where,
          const std::string& disk_dir);

  void* slot(int l) const { return slots_[size_t(l % kSlots)]; }
  // Whether layer l's input leaves the device (all but the last kSlots layers').
  bool leaves(int l) const { return l < layers_ - kSlots; }
  int layers_out() const { return std::max(layers_ - kSlots, 0); }

  // The forward: before layer l's input is written into its slot (the input that was there has
  // gone out), and after the forward has read it for the last time (out it goes). `bytes`: this
  // micro-batch's.
  void before_write(int l);
  void after_forward(int l, int64_t bytes);
  // The backward, before layer l reads its input: it is back in its slot (the compute waits for
  // it), and the input of layer l - kSlots + 1 is on its way into the slot layer l + 1 freed.
  void before_backward(int l, int64_t bytes);
  // The bytes crossing the host link each way per micro-batch (and written to disk and read back,
  // with the disk tier), and the disk file's size.
  int64_t link_bytes_per_pass() const { return int64_t(layers_out()) * bytes_; }
  int64_t disk_bytes() const { return file_ ? file_->file_bytes() : disk_bytes_; }
  ActivationOffload where() const { return where_; }
  bool direct_io() const { return file_ && file_->direct(); }
  // A disk read or write that failed: UserError naming offload.disk_dir (call after a wait that
  // covers the transfers: the step's losses).
  void throw_if_failed() const;

 private:
  void fetch(int l, int64_t bytes);

  Backend& backend_;
  int layers_;
  int64_t bytes_;
  ActivationOffload where_;
  std::vector<void*> slots_;          // kSlots device buffers
  char* host_ = nullptr;              // host: layers_out() records of bytes_
  char* bounce_ = nullptr;            // disk: one pinned buffer, ActivationFile::kAlign-aligned
  std::unique_ptr<ActivationFile> file_;
  int64_t disk_bytes_ = 0;            // a planning arena's: what the file would take
  // per layer: after its input left the slot (the compute waits for it before the slot is
  // written again), after it reached the host tier or the file (its fetch waits for it), and
  // after its fetch (n = 0: not fetched)
  std::vector<Backend::CopyMark> out_mark_, stored_mark_, in_mark_;
};

}  // namespace grass
