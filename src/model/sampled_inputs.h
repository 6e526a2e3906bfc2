// Sampled activations (config "activations", docs/configs.md): with activation_checkpointing
// "none", the inputs that only weight gradients read (each layer's n1, n2 and SwiGLU output) are
// kept as a sample of their token rows, each row scaled (model/row_sampling.h), so that
//
//   dW ≈ Σ_j dy[rows_j]ᵀ · (scale_j x[rows_j])     (an unbiased estimate of dyᵀ·x)
//
// The forward and the backward's dx stay exact: the forward computes every input in full in one
// buffer shared by the layers (as elementwise recomputation does) and keeps the sample of it
// before the next layer overwrites it; only weight gradients are estimated. A pass that draws
// nothing (evaluation, a step that refreshes a projection: Optimizer::needs_exact_activations)
// gets the exact gradients by recomputing each input, as "elementwise" does. The last layer's
// inputs are still in the shared buffers when the backward starts: they are always exact.
//
// Sampling weights: crs and wta-crs draw row i with p_i ∝ ‖x_i‖ (the authors' ‖dy_i‖ factor is
// unknown in the forward, and their per-sample running mean of it does not exist in pretraining,
// where no sequence is seen twice); any p_i > 0 where x_i ≠ 0 keeps the estimate unbiased.
// bernoulli keeps each row with probability keep. The draws of a micro-batch come from the
// stream (seed, step, rank, micro-batch, layer, input), so runs and resumes repeat exactly. crs
// and wta-crs draw where the rows are (Backend::draw_rows: the norms, the order, the winners and
// the draws on the GPU's stream, no host wait; the CPU's are the same bits); bernoulli, which
// reads no weights, draws on the host and uploads. Each keep is side work
// (Backend::begin_side_work): on the GPU it runs beside the layer's GEMMs, and the model joins it
// (before_write) before it writes the input's shared buffer again.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "src/config/config.h"
#include "src/core/arena.h"

namespace grass {

class SampledInputs {
 public:
  enum Input { N1, N2, Act, kInputs };
  static constexpr const char* kInputNames[kInputs] = {"n1", "n2", "act"};
  struct Kept {          // one input's kept rows this micro-batch
    void* x = nullptr;   // [capacity, D] act-typed: row j is scale_j · x[rows_j]
    int32_t* rows = nullptr;  // [capacity] backend memory
    int64_t k = 0;
  };
  // Kept rows of layers [0, layers) for micro-batches of up to max_rows token rows; width[i]: the
  // row length of input i; widest_dy: the widest dy a weight gradient of them reads.
  SampledInputs(const SampledActivations& cfg, Backend& backend, Arena& arena, int layers,
                int64_t max_rows, const int (&width)[kInputs], int widest_dy);

  // Rows kept of n token rows (bernoulli: on average); the most any draw keeps.
  int64_t rows_to_keep(int64_t n) const;
  int64_t capacity() const { return capacity_; }

  // Before a step's first training micro-batch: this rank's draws for `step`, or none (exact).
  void begin_step(uint64_t seed, int64_t step, int rank, bool exact);
  // A training forward begins: whether it draws (the next micro-batch's stream when it does).
  bool begin_pass();
  // Draws the rows of input x [n, D] of `layer` and keeps them (scaled), as side work.
  void keep(int layer, Input input, const void* x, int64_t n);
  // The shared buffer of `input` is written next: the side work that reads it (its last keep)
  // comes first. Every keep is joined by the time its kept rows are read (the last layer's
  // writes come after every kept layer's).
  void before_write(Input input);
  const Kept& kept(int layer, Input input) const { return kept_[size_t(layer)][input]; }
  void* dy_rows() const { return dy_rows_; }  // [capacity, widest_dy] act-typed workspace

 private:
  SampledActivations cfg_;
  Backend* backend_;
  int width_[kInputs];
  int64_t capacity_;
  std::vector<std::array<Kept, kInputs>> kept_;  // [layers]
  std::array<Backend::SideMark, kInputs> drawn_{};  // each input's last keep
  float* scale_ = nullptr;   // [capacity] workspace: a draw's scales on their way to gather_rows
  float* norms_ = nullptr;   // [max_rows] workspace: the sampling weights
  void* draw_workspace_ = nullptr;  // Backend::draw_rows's (none on the CPU)
  void* dy_rows_ = nullptr;
  uint64_t step_stream_ = 0;
  bool exact_ = true;
  int micro_ = 0;            // training passes this step
  uint64_t pass_stream_ = 0;
};

}  // namespace grass
