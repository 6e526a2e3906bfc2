// The one interface every optimizer implements (AdamW, GRASS; docs/architecture.md has the step
// in one picture and the checklist for adding one). An optimizer trains a set of the model's
// tensors, declares its state buffers by allocating them from the arena in its constructor (so
// the memory plan sees them), and updates one tensor at a time from the gradient a step strategy
// (optim/step.h) hands it. It has no modes: when updates happen, which buffer holds a gradient,
// and how gradients are clipped are the strategy's business.
//
// Two kinds of tensors:
//   dense      the optimizer reads the model's dense gradient (grad-typed, numel elements);
//   projected  the optimizer forms a low-rank gradient of projected_numel(t) grad-typed elements
//              straight from the layer's dy and x (accumulate), in a buffer the strategy owns and
//              zeroes at the start of a step, then updates from it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/adam_args.h"
#include "kernels/storage.h"
#include "src/core/arena.h"
#include "src/config/config.h"
#include "src/model/gradient_sink.h"

namespace grass {

// The scalars of one Adam update from the run's optimizer settings; clip: the clipping
// coefficient in backend memory (AdamArgs::clip).
AdamArgs adam_args(const OptimizerConfig& cfg, const double* clip, double lr, double weight_decay,
                   int64_t step);
// The same arguments at step `inner` (from 0) of a proximal inner loop (docs/proximal.md): the
// step, decay included, at args.lr/(inner+1); the gradient gains 2·(λ/lr)·(θ − anchor), lr the
// run's learning rate; at inner 0 the anchor (state-typed, shaped like the gradient) takes θ.
AdamArgs proximal_args(AdamArgs args, double lambda, double lr, int64_t inner, void* anchor);

// How the run's moments are stored, in words: "fp32", "bf16", or "q8 (blocks of 256; tensors
// under 4096 elements: fp32)", the last with the precision's type (bf16 in pure bf16). The run
// table, `grass mem` and checkpoints (which refuse another format) name it so.
std::string state_format(const OptimizerConfig& cfg, const Storage& storage);

// What an optimizer reads back from a checkpoint beside its buffers (which are arena blocks,
// saved and restored byte for byte by train/checkpointing.cpp). Failures are UserErrors naming
// the checkpoint's file.
class StateReader {
 public:
  virtual ~StateReader() = default;
  [[noreturn]] virtual void fail(const std::string& problem) const = 0;  // names state.json
  // names the buffers' file and the buffer
  [[noreturn]] virtual void fail_buffer(const void* buffer, const std::string& problem) const = 0;
  // The checkpoint's bytes of one of this run's buffers (checked to have the buffer's size).
  virtual std::span<const std::byte> saved_bytes(const void* buffer) const = 0;

  // Checked fields of state.json, which a damaged or hostile checkpoint may get wrong.
  const nlohmann::json& field(const nlohmann::json& obj, const std::string& key,
                              const std::string& where) const;
  uint64_t u64(const nlohmann::json& obj, const std::string& key, const std::string& where) const;
  bool boolean(const nlohmann::json& obj, const std::string& key, const std::string& where) const;
  // A projected optimizer's entry: an array of one object per target, in order, each naming its
  // tensor (`tensor`) and holding its Adam step counter (`adam_step`). `what` names the
  // optimizer in messages ("GRASS").
  void target_list(const nlohmann::json& saved, const std::string& key,
                   const std::vector<std::string>& tensors, const std::string& what) const;
  // The end of a message about a checkpoint that belongs to another kind of run.
  static constexpr const char* kMismatch =
      ": does not fit this run (was the checkpoint made with another model or optimizer? its "
      "config.json has the settings it was made with)";
};

class StateSlots;  // optim/state_slots.h

// Bytes of one tensor's optimizer state that its update reads or writes (moments, 8-bit absmax,
// a proximal anchor): what offload.optimizer_states keeps in the host tier and copies into a
// device slot around the update.
struct StateSpan {
  void* at;       // where the bytes live (null on a planning arena)
  int64_t bytes;
  bool fetch;     // false: this step's update overwrites the bytes before it reads them (a reset)
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual const char* name() const = 0;  // the config's optimizer name, for messages
  // The ParameterSet indices it trains, ascending.
  const std::vector<int>& tensors() const { return tensors_; }

  // Elements of tensor t's projected gradient; 0 for a dense tensor.
  virtual int64_t projected_numel(int tensor) const { (void)tensor; return 0; }
  // Before the step's first forward; step counts from 0.
  virtual void begin_step(int64_t step) = 0;
  // Projected tensors: pg += the low-rank gradient formed from dy[N, out] and x[N, in], or with
  // x_selected from xs[N, count] = x[:, σ]·ρ, the columns selected_columns() gave.
  virtual void accumulate(int tensor, void* pg, const void* dy, const void* x, int64_t N,
                          bool x_selected);
  // Whether it can form the projected gradients of tensors first .. first + count - 1 (all its
  // own; one of LlamaModel::projected_stacks) together, at the steps stacks() says: the step
  // strategies then keep their gradients next to each other.
  virtual bool stackable(int first, int count) const {
    (void)first, (void)count;
    return false;
  }
  // GradientSink::stacks: whether it forms them together this step, with accumulate_stack.
  virtual bool stacks(int first, int count) const { return stackable(first, count); }
  // Their accumulate() at once (GradientSink::projected_stack: dy [N, Σ out], x per tensor), into
  // their projected gradients lying next to each other from pg, each projected_numel() long.
  virtual void accumulate_stack(int first, int count, void* pg, const void* dy,
                                const void* const* x, int64_t N, bool x_selected) {
    (void)first, (void)count, (void)pg, (void)dy, (void)x, (void)N, (void)x_selected;
    throw InternalError(std::string(name()) + " stacks no gradients");
  }
  // GradientSink::selected_columns: the columns of its input tensor t's gradient reads alone
  // until its next refresh, if it reads only some.
  virtual bool selected_columns(int tensor, SelectedColumns* columns) const {
    (void)tensor, (void)columns;
    return false;
  }
  // One update of tensor t from its gradient g (dense, or its projected gradient, which may be
  // overwritten) read as g·(*clip), clip being the clipping coefficient in backend memory (the
  // host never reads it), at learning rate lr.
  virtual void update(int tensor, void* g, const double* clip, double lr) = 0;
  // Weight-gradient FLOPs per token saved against dense gradients (for MFU), and how the run
  // table's FLOPs line says it ("" when it saves none).
  virtual double flops_saved_per_token() const { return 0; }
  virtual const char* flops_note() const { return ""; }
  // Its own line of the run table, after its name ("" for none: AdamW's settings are the
  // optimizer line's).
  virtual std::string describe() const { return ""; }
  // Whether a refresh sums every target's full gradient (fp32) over the ranks (the memory plan's
  // refresh figure).
  virtual bool refresh_sums_full_gradients() const { return false; }
  // After begin_step: whether this step's backward must hand it exact dy and x (a refresh that
  // selects from or decomposes the full gradient); sampled activations then draw nothing.
  virtual bool needs_exact_activations() const { return false; }
  // After begin_step: whether this step's refreshes are formed in a pass of their own before the
  // step's backward (GaLore's optimizer.svd_batch "layer"): a forward and a backward of the first
  // micro-batch whose backward hands each projected tensor's exact dy and x to
  // refresh_pass_projected (RefreshPass), then end_refresh_pass. The step's own backward then
  // finds every projection formed.
  virtual bool wants_refresh_pass() const { return false; }
  virtual void refresh_pass_projected(int tensor, const void* dy, const void* x, int64_t N) {
    (void)tensor, (void)dy, (void)x, (void)N;
    throw InternalError(std::string(name()) + " has no refresh pass");
  }
  virtual void end_refresh_pass() {}

  // The state tensor t's update uses beyond the weights (none by default), after begin_step.
  virtual std::vector<StateSpan> state_spans(int tensor) const { (void)tensor; return {}; }
  // An elementwise update (AdamW) can take a tensor in pieces, so that offloaded states pass
  // through slots far smaller than the largest tensor's (lm_head's): pieces start at multiples
  // of piece_quantum() elements (>= 1; 0: whole tensors only), and update_elements(), with the
  // states of state_spans(t, first, count), gives the bits of update() on the whole tensor.
  virtual int64_t piece_quantum() const { return 0; }
  virtual std::vector<StateSpan> state_spans(int tensor, int64_t first, int64_t count) const {
    (void)first, (void)count;
    return state_spans(tensor);
  }
  virtual void update_elements(int tensor, void* g, const double* clip, double lr, int64_t first,
                               int64_t count);
  // Where the states of the tensor being updated are now (offload.optimizer_states): resident()
  // then finds each span's bytes in its device slot. Null: where they live.
  void use_slots(const StateSlots* slots) { slots_ = slots; }

  // Checkpoints: what lives outside its buffers goes into state.json under state_key().
  virtual const char* state_key() const { return nullptr; }  // null: nothing beyond the buffers
  virtual nlohmann::json save_state() const { return nullptr; }
  // Checks a checkpoint's entry (null when the checkpoint has none) and its copy of the buffers;
  // changes nothing. Called for every optimizer before anything is restored.
  virtual void check_state(const nlohmann::json* saved, const StateReader& reader) const;
  virtual void restore_state(const nlohmann::json& saved) { (void)saved; }

 protected:
  // Where an update reads and writes the state span starting at `at` (state_spans()).
  template <typename T>
  T* resident(T* at) const {
    return slots_ ? static_cast<T*>(slots_device(at)) : at;
  }
  // Where the run's state buffers go (offload.optimizer_states: the host tier).
  MemPlace states_place(const OptimizerConfig& cfg) const {
    return cfg.offload_states ? MemPlace::Host : MemPlace::Device;
  }

  std::vector<int> tensors_;

 private:
  void* slots_device(const void* at) const;
  const StateSlots* slots_ = nullptr;
};

// refresh_stagger (GRASS's re-selections, GaLore's SVDs): target k of n refreshes at the steps
// ≡ phase (mod K) from its phase on, phase = k·K/n; without it every phase is 0.
inline int64_t refresh_phase(size_t k, size_t n, int64_t K) { return int64_t(k) * K / int64_t(n); }
inline bool refresh_due(int64_t step, int64_t phase, int64_t K) {
  return step >= phase && (step - phase) % K == 0;
}

// The run table's words for a projected optimizer's settings: "rank 4, <refresh> every 10 steps,
// scale 0.25<extra>, targets q,k (the rest: dense AdamW)".
std::string describe_projection(const ProjectionConfig& g, const char* refresh,
                                const std::string& extra = "");

// The run's optimizers, and which one trains each tensor.
class OptimizerSet {
 public:
  explicit OptimizerSet(size_t num_tensors) : owner_(num_tensors, nullptr) {}
  // Takes o; each of its tensors must not belong to another optimizer yet.
  void add(std::unique_ptr<Optimizer> o);
  Optimizer& of(int tensor) const;  // every tensor has one once the set is complete
  const std::vector<std::unique_ptr<Optimizer>>& all() const { return all_; }
  // The first optimizer of type T, or null.
  template <typename T>
  T* find() const {
    for (const auto& o : all_)
      if (auto* t = dynamic_cast<T*>(o.get())) return t;
    return nullptr;
  }
  double flops_saved_per_token() const;
  bool needs_exact_activations() const;  // any of them, this step
  bool wants_refresh_pass() const;       // any of them, this step

 private:
  std::vector<std::unique_ptr<Optimizer>> all_;
  std::vector<Optimizer*> owner_;
};

}  // namespace grass
