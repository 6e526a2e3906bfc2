#include "src/model/sampled_inputs.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/model/row_sampling.h"

namespace grass {

namespace {

constexpr uint64_t kSampleStreamTag = 0x52414d504c45ull;  // the activation draws' own stream

}  // namespace

SampledInputs::SampledInputs(const SampledActivations& cfg, Backend& backend, Arena& arena,
                             int layers, int64_t max_rows, const int (&width)[kInputs],
                             int widest_dy)
    : cfg_(cfg), backend_(&backend), width_{width[0], width[1], width[2]}, kept_(size_t(layers)) {
  GRASS_CHECK(cfg.on() && cfg.keep > 0 && cfg.keep < 1, "sampled inputs need a sampler and keep");
  capacity_ = rows_to_keep(max_rows);
  if (cfg.sample == ActivationSample::Bernoulli) {  // a binomial count: room for 8 deviations
    const double q = double(capacity_) / double(max_rows);
    const double sd = std::sqrt(double(max_rows) * q * (1 - q));
    capacity_ = std::min<int64_t>(max_rows, int64_t(std::ceil(double(capacity_) + 8 * sd)) + 1);
  }
  const int act_bytes = backend.storage().act_bytes;
  for (int l = 0; l < layers; l++)
    for (int i = 0; i < kInputs; i++) {
      const std::string name = "layer" + std::to_string(l) + "." + SampledInputs::kInputNames[i] + " (kept rows)";
      Kept& k = kept_[size_t(l)][size_t(i)];
      k.x = arena.alloc_bytes(MemCategory::Activations, name, capacity_ * width[i] * act_bytes);
      k.rows = arena.alloc<int32_t>(MemCategory::Activations, name + ", row indices", capacity_);
    }
  scale_ = arena.alloc<float>(MemCategory::Workspace, "kept rows' scales", capacity_);
  norms_ = arena.alloc<float>(MemCategory::Workspace, "row norms (sampling weights)", max_rows);
  if (const int64_t bytes = draw_rows_workspace_bytes(backend.storage(), max_rows); bytes > 0)
    draw_workspace_ = arena.alloc_bytes(MemCategory::Workspace, "the rows' draw", bytes);
  dy_rows_ = arena.alloc_bytes(MemCategory::Workspace, "dy of the kept rows",
                               capacity_ * widest_dy * act_bytes);
}

int64_t SampledInputs::rows_to_keep(int64_t n) const {
  return std::clamp<int64_t>(std::llround(cfg_.keep * double(n)), 1, n);
}

void SampledInputs::begin_step(uint64_t seed, int64_t step, int rank, bool exact) {
  step_stream_ = derive_seed(derive_seed(derive_seed(seed, kSampleStreamTag), uint64_t(step)),
                             uint64_t(rank));
  exact_ = exact;
  micro_ = 0;
}

bool SampledInputs::begin_pass() {
  if (exact_) return false;
  pass_stream_ = derive_seed(step_stream_, uint64_t(micro_++));
  return true;
}

void SampledInputs::keep(int layer, Input input, const void* x, int64_t n) {
  Backend& be = *backend_;
  const int D = width_[input];
  const uint64_t stream = derive_seed(pass_stream_, uint64_t(layer) * kInputs + uint64_t(input));
  Kept& kept = kept_[size_t(layer)][size_t(input)];
  std::vector<int32_t> rows;  // bernoulli's draw, made on the host
  std::vector<float> scale;
  if (cfg_.sample == ActivationSample::Bernoulli) {  // no weights: the host draws, nothing to wait for
    const std::vector<double> weight(size_t(n), 1.0);
    RowSample s = sample_rows(RowSampler::Bernoulli, weight, int(rows_to_keep(n)), stream);
    kept.k = int64_t(s.rows.size());
    GRASS_CHECK(kept.k <= capacity_, "a Bernoulli draw kept more rows than planned (8 deviations)");
    if (kept.k == 0) return;
    rows = std::move(s.rows);
    scale = std::move(s.scale);
  } else {  // crs and wta-crs keep k rows whatever the weights: the backend draws them in place
    kept.k = rows_to_keep(n);
  }
  // Beside the compute: scale_, norms_ and the draw's workspace are side work's alone, and in
  // order on its queue; x, kept.rows and kept.x wait for the joins (before_write).
  be.begin_side_work();
  if (!rows.empty()) {
    be.upload_async(kept.rows, rows.data(), rows.size() * sizeof(int32_t));
    be.upload_async(scale_, scale.data(), scale.size() * sizeof(float));
  } else {
    be.row_norms(norms_, x, n, D);
    be.draw_rows(kept.rows, scale_, norms_, n, int(kept.k), cfg_.sample == ActivationSample::WtaCrs,
                 stream, draw_workspace_);
  }
  be.gather_rows(kept.x, x, kept.rows, scale_, kept.k, D);
  drawn_[size_t(input)] = be.end_side_work();
}

void SampledInputs::before_write(Input input) { backend_->join_side_work(drawn_[size_t(input)]); }

}  // namespace grass
