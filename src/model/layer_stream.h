// offload.layers (docs/memory.md, ../shared/WEIGHT_STREAMING.md §3): the matrices of some decoder
// layers live in the host tier, each layer in a block of its own, and pass through a few device
// slots while a pass computes with them. Their norm gains stay resident: the forward reads layer
// l + 1's input_layernorm in layer l's last op. The embedding, the final norm and lm_head stay
// resident too.
//
//   forward    acquire S0 ─ compute S0 ─ acquire S1 ─ compute S1 ...   (S: streamed layers)
//                 └─ fetch S1, S2 (the slots' other occupants leave)
//   backward   acquire Sk ─ recompute, backward, fused updates in the slot ─ release: write back
//                 └─ fetch S(k-1), S(k-2)
//
// Acquiring a layer makes the compute queued from then on wait for its fetch, and queues the
// fetches of the next slots - 1 layers in the pass's direction into the slots no layer of that
// window holds: the copies run beside the compute. The last layers a forward fetched are the
// backward's first, and the first layers a backward updated are the next forward's, so at each
// turnaround the slots' contents are reused, not fetched again.
// A fetch runs after the compute queued before it (Backend::copy_async), so after the reads of the
// slot's previous occupant, and after every write-back queued before it (a cross-queue wait,
// Backend::order_copy_after): after its slot's last write-back, and after its own layer's.
// Each tensor is its own copy, so an urgent small copy never waits behind a whole layer.
// GRASS's targets (pack_slices_of) change between refreshes only in their selected slices, so
// their write-back is those slices packed (Δ: 3.6-6.3% of a layer), not the tensor: a host block
// then holds the tensor's base, current everywhere but at σ, and its Δ, which a fetch brings up
// beside the base and unpacks into the slot on the compute queue. A write-back after σ changed
// (a refresh) is the whole tensor, once; the next one packs again. Host reads of such a tensor
// (checkpoints, exports) merge the two in a slot.
// The numbers are the resident run's: the same kernels read and update the same bytes, in a slot
// that keeps each tensor's alignment class (ParameterSet::kPlaceAlign).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "src/core/arena.h"
#include "src/model/parameter_set.h"

namespace grass {

// The slices of a tensor that its optimizer's updates change (GRASS's σ), as the stream asks for
// them after the tensor's update: σ in backend memory, their count, and a number that changes
// whenever σ does.
struct SliceSet {
  const int32_t* sigma = nullptr;
  int count = 0;
  int64_t generation = 0;
};
class SliceSource {
 public:
  virtual SliceSet changed_slices(int tensor) const = 0;

 protected:
  ~SliceSource() = default;
};

class LayerStream {
 public:
  static constexpr int kDefaultSlots = 3;
  enum class Direction { Forward, Backward };

  // The streamed layers of `tensors` (ParameterSet::stream_layers): a host block each (the
  // Weights category, MemPlace::Host) and `slots` device slots (Workspace), all of
  // tensors.layer_block() weight-typed elements. On a planning arena nothing is copied.
  LayerStream(Backend& backend, Arena& arena, const ParameterSet& tensors, int slots);

  int slots() const { return int(slots_.size()); }
  bool streams(int layer) const { return position(layer) >= 0; }
  const std::vector<int>& layers() const { return layers_; }

  // Layer l (streamed) on the device for the compute queued from now until release(l): fetched
  // now unless it is in a slot already; then the next layers in `direction` are fetched ahead.
  void acquire(int l, Direction direction);
  // The compute that reads layer l is queued. `updated`: it also wrote the slot (fused updates):
  // the layer goes back to its host block.
  void release(int l, bool updated);
  // Tensors (streamed) whose updates change only the slices `source` names, at most max_slices
  // of them, rows or columns: their write-backs take those slices packed. One call, before the
  // first pass; it allocates their packed blocks (host) and each slot's (device).
  struct Packed {
    int tensor, max_slices;
    bool rows;
  };
  void pack_slices_of(const std::vector<Packed>& tensors, const SliceSource& source, Arena& arena);

  // Where tensor t (Streamed) is: in its held layer's slot (null on a planning arena), and in its
  // host block (its base: current unless packed() says its slices are elsewhere).
  void* device(const ParamTensor& t) const;
  void* host(const ParamTensor& t) const;
  // Whether t's host block lacks its packed slices (a read must merge them: stage()).
  bool packed(const ParamTensor& t) const;
  // Tensor t's current values in a slot, merged from its host blocks, once every queued copy has
  // landed (a host wait): no layer may be held, and the slot's occupant is forgotten.
  void* stage(const ParamTensor& t);
  // The host wrote t's whole base (a load, an init): its packed slices and a slot's copy of its
  // layer are stale.
  void host_written(const ParamTensor& t);
  // Before the host reads or writes a host block: every write-back queued has landed (a host wait
  // when one is pending).
  void settle_host();
  // The host block of layer l changed (a load, an init): a slot's copy of it is stale.
  void forget(int l);
  // A slot for the host to stage tensor t through (weights <-> fp32 on the device's side), at
  // t's place in it, once every queued copy has landed (a host wait): no layer may be held, and
  // the slot's occupant is forgotten.
  void* staging(const ParamTensor& t);
  // Whether `buffer` is one of the host blocks (checkpoints save the weights as tensors).
  bool holds(const void* buffer) const;

  // What crosses the link each way in a training step between refreshes, once the first has
  // run, by the acquires' own slot policy: with fused updates (one micro-batch) 2·(k − slots)
  // layer fetches (the slots' contents are reused at both turnarounds); with deferred updates
  // each micro-batch's two passes, then a pass that updates every streamed layer (a forward's
  // order; the next step's forward finds the last ones in the slots, not its first). k
  // write-backs either way, a packed tensor's its max_slices slices.
  struct StepTraffic {
    int64_t forward_fetched = 0, backward_fetched = 0, update_fetched = 0, written_back = 0;
    int64_t fetched() const { return forward_fetched + backward_fetched + update_fetched; }
  };
  StepTraffic step_traffic(int micro_batches, bool fused) const;

  // Bytes queued each way since construction, and acquires that found their layer neither in a
  // slot nor on its way (the first pass's first layers, or a pass in an unexpected order).
  int64_t fetched_bytes() const { return fetched_; }
  int64_t written_back_bytes() const { return written_back_; }
  int64_t unprefetched() const { return unprefetched_; }

 private:
  struct Slot {
    char* base = nullptr;
    char* delta = nullptr;       // the layer's packed slices
    int layer = -1;              // the layer it holds or receives; -1: none
    bool unpack = false;         // the fetch brought packed slices: unpack them before the compute
    Backend::CopyMark ready;     // after its fetch
  };
  // A packed tensor's host block: Whole, current everywhere (from a load, or init); WholeAt, the
  // same, written back at σ's `generation`; Packed, current but at σ of `generation`, whose
  // `count` slices the packed block holds.
  enum class Base { Whole, WholeAt, Packed };
  struct Span {
    int tensor;
    int64_t at, bytes;  // in the layer's block and slot
    int out, in;
    // packed tensors (pack_slices_of)
    bool packs = false, rows = true;
    int max_slices = 0;
    int64_t delta_at = 0;  // in the layer's packed block and a slot's
    Base base = Base::Whole;
    int64_t generation = 0;
    int count = 0;
  };
  int64_t slice_bytes(const Span& span) const {
    return int64_t(span.rows ? span.in : span.out) * weight_bytes_;
  }
  int position(int layer) const;  // in layers_, or -1
  // The fetches acquiring layer l in `direction` makes into slots holding `occupants` (updated):
  // l's own first when no slot holds it, then the next layers of the pass's window, each into a
  // slot whose occupant the window does not need.
  struct SlotFetch {
    int slot, layer;
  };
  std::vector<SlotFetch> plan_acquire(std::vector<int>& occupants, int l, Direction direction) const;
  int slot_of(int layer) const;   // or -1
  Span& span_of(const ParamTensor& t);
  const Span& span_of(const ParamTensor& t) const;
  void fetch(int slot, int layer);
  // Queue span's copies from layer p's host blocks into slot s (its base; its packed slices when
  // it has them), and the unpack's arguments.
  void fetch_span(Slot& s, int p, const Span& span);
  void unpack(const Slot& s, const Span& span);
  // A slot for the host's transfer of tensor t, once every queued copy has landed: the one
  // holding t's layer (its copy is stale afterwards), else the first; its occupant is forgotten.
  Slot& host_transfer_slot(const ParamTensor& t);

  Backend& backend_;
  int weight_bytes_;
  int64_t block_bytes_;
  std::vector<int> layers_;                       // ascending
  std::vector<std::vector<Span>> spans_;          // per streamed layer, its matrices
  std::vector<char*> host_;                       // per streamed layer, its block
  std::vector<char*> host_delta_;                 // per streamed layer, its packed block
  const SliceSource* source_ = nullptr;
  std::vector<Slot> slots_;
  int held_ = -1;  // the layer acquired and not released; -1: none
  bool host_pending_ = false;  // write-backs queued since the last settle_host()
  int64_t fetched_ = 0, written_back_ = 0, unprefetched_ = 0;
};

}  // namespace grass
