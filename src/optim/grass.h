// The GRASS optimizer (docs/grass.md: the method, arXiv 2406.17660, and how it is built): each
// target weight trains r selected rows (or columns) with Adam on its compressed
// gradient G_C, which accumulate() forms straight from the activations. The selection is
// refreshed every update_interval steps (and at step 0; with refresh_stagger each target at its
// own phase) from the slice norms of that step's full gradient, formed a chunk of rows at a time
// in a small transient buffer; a refresh resets the moments and the step counter. Repeated draws
// are trained once, their step multiplied by the draw count. With several micro-batches, a
// refresh step selects on the first micro-batch's gradient and the rest accumulate G_C on that
// selection. With cfg.proximal (docs/proximal.md) each target keeps an anchor of its selected
// slices, taken at the first update after each refresh: the refresh interval is the inner loop.
// The moments reset at that first update too (only updates touch them: optim/state_slots.h).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/quant8.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/dist/communicator.h"
#include "src/model/llama.h"
#include "src/optim/grass_selection.h"
#include "src/optim/optimizer.h"

namespace grass {

class Grass final : public Optimizer, public SliceSource {
 public:
  // Trains the model's projected tensors. max_tokens: the largest micro-batch, in tokens (B x T),
  // for the gather scratch. A refresh forms the full gradient in row chunks of at most
  // refresh_chunk_bytes (fp32), at least 8 rows. With several ranks (comm) each chunk is summed
  // over them before its norms, so every rank selects the same σ (and checks that it did).
  static constexpr int64_t kRefreshChunkBytes = 16 << 20;
  Grass(const OptimizerConfig& cfg, LlamaModel& model, int64_t max_tokens, Arena& arena,
        int64_t refresh_chunk_bytes = kRefreshChunkBytes, Communicator& comm = single_process());
  const char* name() const override { return "grass"; }

  // G_C's capacity, r slices: the strategy zeroes and sums all of it, and the rows (or columns)
  // beyond a selection's distinct slices stay zero.
  int64_t projected_numel(int tensor) const override {
    const Target& t = target_of(tensor);
    return int64_t(rank_) * (t.rows ? t.in : t.out);
  }
  void begin_step(int64_t step) override;  // a refresh step re-selects on the next accumulate
  void accumulate(int tensor, void* gc, const void* dy, const void* x, int64_t N,
                  bool x_selected) override;
  // A stack of targets (LlamaModel::projected_stacks) that select the same dimension, formed
  // together between their refreshes (a refresh forms each one's gradient alone, from its own
  // dy).
  bool stackable(int first, int count) const override;
  bool stacks(int first, int count) const override;
  // Rows: one gather of every target's selected columns of the packed dy (each target's r
  // columns of the scratch, the slices a merge of repeats left unused zero), then one GEMM
  // [count·r, N]·[N, in] into the adjacent G_C, whose rows of unused slices stay zero. Columns:
  // each target's gather and GEMM as accumulate()'s, its dy read in place from the packed one.
  void accumulate_stack(int first, int count, void* gc, const void* dy, const void* const* x,
                        int64_t N, bool x_selected) override;
  // A `cols` target between refreshes: its σ and ρ.
  bool selected_columns(int tensor, SelectedColumns* columns) const override;
  // The sparse Adam update of the target; the targets use lr·scale. Precision as in AdamW
  // (optim/adamw.h): the master copy's rows change and the weights re-round them, or, in pure
  // bf16, the weights and the moments are stored with stochastic rounding.
  void update(int tensor, void* gc, const double* clip, double lr) override;
  // Its moments (codes and absmax with q8) and anchor: not fetched when the update resets them.
  std::vector<StateSpan> state_spans(int tensor) const override;
  // Σ over targets of 2·out·in - 2·(r·in or out·r). (Refresh steps still form one full gradient.)
  double flops_saved_per_token() const override;
  const char* flops_note() const override { return ", less 2mn - 2rn per GRASS target"; }
  std::string describe() const override;
  // The norm-driven rules select on the summed full gradient; uniform draws read no gradient.
  bool refresh_sums_full_gradients() const override {
    return cfg_.projection.selection != Selection::Uniform &&
           cfg_.projection.selection != Selection::UniformNR;
  }
  bool needs_exact_activations() const override;  // a target selects this step

  // Per target: the steps since its refresh, whether it is due to select and, when repeated
  // draws were merged, the draw counts, in "grass_targets".
  const char* state_key() const override { return "grass_targets"; }
  nlohmann::json save_state() const override;
  void check_state(const nlohmann::json* saved, const StateReader& reader) const override;
  void restore_state(const nlohmann::json& saved) override;

  struct Target {
    int tensor_index;
    int out, in;           // the weight as stored (ParamTensor::shape)
    bool rows;             // selects rows (out) rather than columns (in)
    int selectable;        // slices that can be selected: Hugging Face's rows or columns (a
                           // padded ffn's pad slices are zero and never selected)
    int slices;            // distinct selected slices, ≤ r (repeated draws merged)
    int64_t gc_numel;      // slices·in (rows) or out·slices (cols)
    // backend memory (host on the CPU), moments state-typed; each sized for r slices
    void* m;               // Adam moments, shaped like G_C
    void* v;
    // q8 (optimizer.state_dtype; a weight of at least kQuant8MinElements elements): m and v
    // hold 8-bit codes, with an fp32 absmax per block here; null otherwise (and on a planning
    // arena, whose pointers are all null: `q8` says which)
    bool q8 = false;
    float* absmax_m;       // [absmax_blocks]
    float* absmax_v;
    int64_t absmax_blocks; // the layout's blocks at r slices (fewer slices use a prefix)
    void* anchor;          // the proximal anchor, shaped like G_C; null without the method
    int32_t* sigma;        // [slices] selected slices, ascending and distinct
    float* rho;            // [slices] their scales in G_C
    float* update_scale;   // [slices] their step factors: count·(ρ with rho_in_update, else 1)
    std::vector<int32_t> count;  // [slices] draws of each (host)
    std::vector<int32_t> host_sigma;  // [slices] σ and ρ as stored, for a stack's (host)
    std::vector<float> host_rho;
    int64_t phase = 0;     // refresh_stagger: re-selects at the steps ≡ phase (mod K)
    int64_t adam_step = 0; // steps since the last refresh
    bool needs_selection = true;
    int64_t selection = 0; // selections stored so far (SliceSource's generation)
  };
  const std::vector<Target>& targets() const { return targets_; }
  // The slices of a target that its updates change: σ (offload.layers packs them).
  SliceSet changed_slices(int tensor) const override;
  const Target& target_of(int tensor) const;

 private:
  Target& target(int tensor) { return targets_[size_t(target_index(tensor))]; }
  // The blocks of t's 8-bit moments at its current slices.
  Quant8Layout quant8_layout(const Target& t) const {
    return projected_quant8_layout(t.out, t.in, t.slices, t.rows, cfg_.state_block,
                                   cfg_.state_blocking == StateBlocking::Feature);
  }
  int target_index(int tensor) const;
  // Targets formed together (stacks()): tensors first .. first + count - 1. Rows: their σ side by
  // side, each offset by the columns of the packed dy before its own and padded to r slices with
  // ρ = 0 (backend memory), rebuilt after a member's selection changes.
  struct Stack {
    int first, count;
    bool rows;
    int32_t* sigma = nullptr;  // [count·r]
    float* rho = nullptr;
    bool stale = true;
  };
  const Stack* stack_of(int first) const;
  void store_stack_selection(Stack& stack);
  int64_t moment_bytes(const Target& t) const;  // of m (or v) at r slices
  void select(Target& t, const void* dy, const void* x, int64_t N);
  // Squared slice norms of dyᵀ·x, a chunk of rows of it at a time.
  std::vector<double> slice_norms(const Target& t, const void* dy, const void* x, int64_t N);
  // σ, ρ and the update scales of t's selection into backend memory.
  void store_selection(Target& t, const SliceSelection& s);

  OptimizerConfig cfg_;
  LlamaModel& model_;
  Communicator& comm_;
  int rank_;
  std::vector<Target> targets_;
  std::vector<int> target_of_tensor_;  // tensor index -> targets_ index, or -1
  std::vector<Stack> stacks_;
  Backend* backend_;
  void* scratch_ = nullptr;            // [max_tokens, r · the largest rows stack] gathered
                                       // columns (act-typed)
  float* chunk_grad_ = nullptr;        // [chunk_rows_ x largest in]: rows of a refresh's gradient
  int chunk_rows_ = 0;
  int64_t step_ = 0;
};

}  // namespace grass
