// What GaLore and FLORA share (docs/lowrank.md has the formulas and the reference code): each
// target weight w[out, in] trains through a projection P [side, r] of its gradient onto its
// shorter side (rows when out < in, as both references do; a square weight projects its
// columns). Between refreshes the projected gradient R is formed straight from the activations
// (accumulate); every step runs galore_torch's Adam on R and updates the whole weight through
// the back-projection. The two differ only in P: GaLore's is the top-r singular vectors of a
// full gradient, stored and recomputed every update_interval steps; FLORA's is Gaussian,
// regenerated from (seed, tensor, refresh index) whenever it is needed and never stored.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/quant8.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/dist/communicator.h"
#include "src/model/llama.h"
#include "src/optim/optimizer.h"

namespace grass {

class LowRankOptimizer : public Optimizer {
 public:
  int64_t projected_numel(int tensor) const override { return target_of(tensor).r_numel; }
  void accumulate(int tensor, void* R, const void* dy, const void* x, int64_t N,
                  bool x_selected) override;
  void update(int tensor, void* R, const double* clip, double lr) override;
  std::vector<StateSpan> state_spans(int tensor) const override;  // its moments (and absmax)
  // Σ over targets of 2·out·in - 2·r·(out + in): R from the activations instead of dyᵀ·x.
  double flops_saved_per_token() const override;
  const char* flops_note() const override { return ", less 2mn - 2r(m+n) per projected target"; }

  nlohmann::json save_state() const override;  // per target: its Adam step counter
  void check_state(const nlohmann::json* saved, const StateReader& reader) const override;
  void restore_state(const nlohmann::json& saved) override;

  struct Target {
    int tensor_index;
    int out, in;        // the weight as stored (ParamTensor::shape)
    bool rows;          // projects the out side (R [r, in]) rather than the in side (R [out, r])
    int side;           // out or in
    int hf_side;        // the side without a padded ffn's pad: P's rows beyond it are zero, so
                        // the update never reaches the pad
    int64_t r_numel;    // r·in or out·r
    void* m;            // Adam moments, shaped like R (state-typed, or 8-bit codes with q8)
    void* v;
    float* absmax_m = nullptr;  // q8 (a weight of at least kQuant8MinElements): the blocks'
    float* absmax_v = nullptr;  // absmax; null otherwise
    int64_t absmax_blocks = 0;
    bool q8 = false;            // which (a planning arena's pointers are all null)
    int64_t adam_step = 0;  // updates so far; never reset (both references keep it)
  };
  const std::vector<Target>& targets() const { return targets_; }
  const Target& target_of(int tensor) const;
  // Target t's 8-bit moments (t.absmax_m set), where the update finds them.
  Quant8Moments quant8_moments(const Target& t) const {
    return {.m = resident(static_cast<uint8_t*>(t.m)), .v = resident(static_cast<uint8_t*>(t.v)),
            .absmax_m = resident(t.absmax_m), .absmax_v = resident(t.absmax_v),
            .block = cfg_.state_block};
  }
  bool quant8_by_feature() const { return cfg_.state_blocking == StateBlocking::Feature; }

 protected:
  // Allocates every target's moments and the workspaces; full_gradients: the transient buffer
  // for a refresh's full gradient (GaLore; FLORA never forms one).
  // comm: the data-parallel ranks, over which a refresh's full gradient is summed.
  LowRankOptimizer(const OptimizerConfig& cfg, LlamaModel& model, int64_t max_tokens,
                   Arena& arena, bool full_gradients, Communicator& comm);
  // The projection of target k for the current step (backend memory, fp32 [side, r]).
  virtual const float* projection(size_t k) = 0;
  // Whether target k must form a new projection from this step's first full gradient (GaLore's
  // refresh), and doing so from g [out, in].
  virtual bool needs_full_gradient(size_t k) const { (void)k; return false; }
  virtual void refresh_from(size_t k, const float* g) { (void)k; (void)g; }
  // Target k's full gradient dyᵀ·x, summed over the ranks, in the transient buffer (fp32 [out, in]).
  const float* full_gradient(size_t k, const void* dy, const void* x, int64_t N);
  // At the start of target k's update, its moments held (FLORA's transfer).
  virtual void before_update(size_t k) { (void)k; }
  // The bound on the RMS of an update (ops::lowrank_adam_update's max_rms); 0: none.
  virtual double max_update_rms() const { return 0; }

  LowRankProjection view(size_t k, const float* P) const {
    const Target& t = targets_[k];
    return {P, t.out, t.in, rank_, t.rows};
  }
  size_t index_of(int tensor) const;
  // Zeroes P's rows beyond the target's hf_side (none unless its projected side is padded).
  void zero_pad_rows(float* P, const Target& t);

  OptimizerConfig cfg_;
  LlamaModel& model_;
  Backend& backend_;
  Communicator& comm_;
  int rank_;
  std::vector<Target> targets_;
  int64_t step_ = 0;
  float* full_grad_ = nullptr;  // [largest out x in] fp32: a refresh's transient full gradient

 private:
  std::vector<int> target_of_tensor_;  // tensor index -> targets_ index, or -1
  void* scratch_ = nullptr;            // [max_tokens, r] act-typed: dy·P or x·P
  void* workspace_ = nullptr;          // lowrank_workspace_bytes of the largest target
};

// GaLore's refresh as a run resolves optimizer.projection.svd: "auto" is the randomized range
// finder on a GPU (the exact SVD would download every target and leave the GPU idle) and the
// exact SVD on the CPU. The seed is set per refresh and target by GaLore.
GaloreBasisMethod galore_basis_method(const ProjectionConfig& g, const Storage& storage);

// GaLore (Zhao et al. 2024; galore_torch): P = the top-r singular vectors of the step's full
// gradient at step 0 and every update_interval steps (its update_proj_gap), computed from the
// first micro-batch's gradient at a refresh step; the moments and the step counter are kept
// across refreshes, as galore_torch keeps them. With refresh_stagger, target k of n refreshes at
// the steps ≡ k·K/n (mod K) after step 0 instead, so no step forms every SVD of the model.
class GaLore final : public LowRankOptimizer {
 public:
  GaLore(const OptimizerConfig& cfg, LlamaModel& model, int64_t max_tokens, Arena& arena,
         Communicator& comm = single_process());
  const char* name() const override { return "galore"; }
  std::string describe() const override;
  bool refresh_sums_full_gradients() const override { return true; }  // the SVD's input
  void begin_step(int64_t step) override;
  bool needs_exact_activations() const override;  // a refresh step
  // optimizer.svd_batch "layer": at a step where every target refreshes (randomized), the
  // refresh pass sketches each target as the pass's backward reaches it (ops::galore_sketch,
  // from the full gradient) and solves each layer's eigenproblems in one batched call
  // (galore_finish) once the backward leaves the layer. The projections are galore_basis's,
  // bit for bit where the batched eigensolver is syevd for each (the CPU, the emulator).
  bool wants_refresh_pass() const override;
  void refresh_pass_projected(int tensor, const void* dy, const void* x, int64_t N) override;
  void end_refresh_pass() override;
  // The targets of each batched eigensolver call this step's refresh pass made, in order (empty
  // at a step without one).
  const std::vector<int>& refresh_batches() const { return refresh_batches_; }
  const char* state_key() const override { return "galore_targets"; }
  // The projection of a target tensor (backend memory, fp32 [side, r]).
  const float* basis(int tensor) const { return P_[index_of(tensor)]; }

 protected:
  const float* projection(size_t k) override { return P_[k]; }
  bool needs_full_gradient(size_t k) const override { return needs_refresh_[k]; }
  void refresh_from(size_t k, const float* g) override;

 private:
  std::vector<float*> P_;             // per target [side, r] fp32, in the optimizer's state
  std::vector<bool> needs_refresh_;   // set at a refresh step until the first backward
  std::vector<int64_t> phase_;        // refresh_stagger: target k refreshes at steps ≡ phase_[k]
  GaloreBasisMethod method_;          // resolved; its seed is set per refresh and target
  void* basis_workspace_ = nullptr;   // galore_basis_workspace_bytes of the largest target
  // With the workspace (a randomized refresh on the GPU): the refresh's cuSOLVER statuses, int[4]
  // backend memory, zeroed when a refresh begins and read when its last target is done
  int* refresh_status_ = nullptr;
  // svd_batch "layer" (randomized): the slots of one layer's sketches, and the targets in them
  void* batch_ = nullptr;
  GaloreBatchLayout batch_layout_;
  int batch_slots_ = 0;
  std::vector<size_t> pending_;       // the targets sketched into the batch, in slot order
  int pending_layer_ = -1, pending_k_ = 0;
  std::vector<int> refresh_batches_;
  GaloreBasisMethod method_for(size_t k) const;  // method_ with target k's seed this step
  void refreshed(size_t k);           // P_[k] is formed
  void finish_batch();
  void check_refresh_status() const;
  // GRASS_GALORE_TIMERS=1: the refresh's phase times on stderr, one line a phase
  void print_refresh_times() const;
};

// FLORA (Hao et al. 2024; flora-opt, with the engine's exact variant of docs/lowrank.md): P is
// Gaussian N(0, 1/r), projection number k = (step + 1) / update_interval (its kappa) of each
// tensor regenerated from the seed; at a resampling step the first moment is carried to the new
// projection (down_new(up_old(M))) at the target's update, before Adam reads it. Every update's RMS is
// bounded by optimizer.max_update_rms (flora-opt's clip_threshold, 1 by default): the carried
// moment is mostly noise, about sqrt(side/r) times its old size, while v keeps its old scale.
class Flora final : public LowRankOptimizer {
 public:
  Flora(const OptimizerConfig& cfg, LlamaModel& model, int64_t max_tokens, Arena& arena,
        Communicator& comm = single_process());
  const char* name() const override { return "flora"; }
  std::string describe() const override {
    return describe_projection(cfg_.projection, "resampling");
  }
  void begin_step(int64_t step) override;
  const char* state_key() const override { return "flora_targets"; }

 protected:
  const float* projection(size_t k) override;
  void before_update(size_t k) override;  // the moment transfer at a resampling step
  double max_update_rms() const override { return cfg_.projection.max_update_rms; }

 private:
  int64_t refresh_index(int64_t step) const { return (step + 1) / cfg_.projection.update_interval; }
  void generate(float* P, size_t k, int64_t refresh);

  float* P_ = nullptr;         // [largest side x r] fp32: the current projection, regenerated
  // which target's projection, and which refresh of it, P_ holds (a fused step asks for the same
  // one twice in a row: R, then the update); -1: none
  int64_t held_target_ = -1, held_refresh_ = -1;
  bool resampling_ = false;  // this step carries each first moment to a new projection
  float* P_old_ = nullptr;     // the same size: the previous one, during a transfer
  float* transfer_ = nullptr;  // [r·r + largest r_numel] fp32: the transfer's scratch
};

}  // namespace grass
