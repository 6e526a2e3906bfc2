#include "src/optim/lowrank.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/io/hash.h"

namespace grass {

using nlohmann::json;

LowRankOptimizer::LowRankOptimizer(const OptimizerConfig& cfg, LlamaModel& model,
                                   int64_t max_tokens, Arena& arena, bool full_gradients,
                                   Communicator& comm)
    : cfg_(cfg), model_(model), backend_(model.backend()), comm_(comm), rank_(cfg.projection.rank),
      target_of_tensor_(model.tensors().size(), -1) {
  const Storage& storage = model.storage();
  const std::string name = name_of(cfg.kind);
  int64_t largest = 0, workspace = 0;
  const MemPlace place = states_place(cfg);  // P stays on the device: accumulate reads it
  for (size_t i = 0; i < model.tensors().size(); i++) {
    const ParamTensor& p = model.tensors()[i];
    if (p.dense()) continue;
    GRASS_CHECK(p.shape.size() == 2, "a projected tensor must be a matrix: " + p.name);
    Target t{};
    t.tensor_index = int(i);
    t.out = int(p.shape[0]);
    t.in = int(p.shape[1]);
    t.rows = projects_rows(cfg.kind, cfg.projection, p.hf_shape[0], p.hf_shape[1]);
    t.side = t.rows ? t.out : t.in;
    t.hf_side = int(p.hf_shape[t.rows ? 0 : 1]);
    GRASS_CHECK(rank_ <= t.hf_side, "rank exceeds the projected side of " + p.name);
    t.r_numel = int64_t(rank_) * (t.rows ? t.in : t.out);
    if (cfg.state_dtype == StateDtype::Q8 && p.numel >= kQuant8MinElements) {
      const int64_t blocks =
          projected_quant8_layout(t.out, t.in, rank_, t.rows, cfg.state_block,
                                  cfg.state_blocking == StateBlocking::Feature)
              .blocks();
      t.absmax_blocks = blocks;
      t.q8 = true;
      t.m = arena.alloc<uint8_t>(MemCategory::Optimizer, p.name + "." + name + ".m_q8", t.r_numel,
                                 place);
      t.v = arena.alloc<uint8_t>(MemCategory::Optimizer, p.name + "." + name + ".v_q8", t.r_numel,
                                 place);
      t.absmax_m = arena.alloc<float>(MemCategory::Optimizer, p.name + "." + name + ".m_absmax",
                                      blocks, place);
      t.absmax_v = arena.alloc<float>(MemCategory::Optimizer, p.name + "." + name + ".v_absmax",
                                      blocks, place);
    } else {
      t.m = arena.alloc_bytes(MemCategory::Optimizer, p.name + "." + name + ".m",
                              t.r_numel * storage.state_bytes, place);
      t.v = arena.alloc_bytes(MemCategory::Optimizer, p.name + "." + name + ".v",
                              t.r_numel * storage.state_bytes, place);
    }
    largest = std::max(largest, p.numel);
    workspace = std::max(workspace, lowrank_workspace_bytes(storage, t.out, t.in, rank_));
    target_of_tensor_[i] = int(targets_.size());
    targets_.push_back(t);
    tensors_.push_back(int(i));
  }
  GRASS_CHECK(!targets_.empty(), "the " + name + " optimizer has no target tensors");
  scratch_ = arena.alloc_bytes(MemCategory::Workspace, name + ".projected_inputs",
                               max_tokens * rank_ * storage.act_bytes);
  if (workspace > 0) workspace_ = arena.alloc_bytes(MemCategory::Workspace, name + ".update", workspace);
  if (full_gradients)
    full_grad_ = arena.alloc<float>(MemCategory::Workspace, name + ".refresh_gradient", largest);
}

const float* LowRankOptimizer::full_gradient(size_t k, const void* dy, const void* x, int64_t N) {
  const Target& t = targets_[k];
  backend_.full_weight_grad(full_grad_, dy, x, N, t.in, t.out, 0, t.out);
  comm_.all_reduce_sum(full_grad_, int64_t(t.out) * t.in, Element::F32);
  return full_grad_;
}

size_t LowRankOptimizer::index_of(int tensor) const {
  const int k = target_of_tensor_.at(size_t(tensor));
  GRASS_CHECK(k >= 0, std::string("a tensor that is not a ") + name() + " target");
  return size_t(k);
}

const LowRankOptimizer::Target& LowRankOptimizer::target_of(int tensor) const {
  return targets_[index_of(tensor)];
}

void LowRankOptimizer::accumulate(int tensor, void* R, const void* dy, const void* x, int64_t N,
                                  bool x_selected) {
  GRASS_CHECK(!x_selected, "GaLore and FLORA read their targets' inputs whole");
  const size_t k = index_of(tensor);
  if (needs_full_gradient(k)) refresh_from(k, full_gradient(k, dy, x, N));
  // R from the activations with this step's projection, refresh steps included: the same as
  // projecting the full gradient (R is linear in it), on one code path.
  backend_.lowrank_compressed_grad(R, scratch_, workspace_, dy, x, N, view(k, projection(k)));
}

void LowRankOptimizer::update(int tensor, void* R, const double* clip, double lr) {
  const size_t k = index_of(tensor);
  Target& t = targets_[k];
  before_update(k);
  t.adam_step++;
  const ParamTensor& p = model_.tensors()[size_t(t.tensor_index)];
  // pure bf16's stochastic rounding: one stream per (step, target)
  const uint64_t seed =
      derive_seed(derive_seed(cfg_.projection.seed ^ 0x10a7, uint64_t(step_)), t.tensor_index);
  const AdamArgs args = adam_args(cfg_, clip, lr, cfg_.weight_decay, t.adam_step);
  if (t.q8) {
    backend_.lowrank_adam_update_q8(model_.weight_ref(p), R, quant8_moments(t), quant8_by_feature(),
                                    workspace_, view(k, projection(k)), cfg_.projection.scale,
                                    max_update_rms(), args, seed);
    return;
  }
  backend_.lowrank_adam_update(model_.weight_ref(p), R, resident(t.m), resident(t.v), workspace_,
                               view(k, projection(k)), cfg_.projection.scale, max_update_rms(),
                               args, seed);
}

std::vector<StateSpan> LowRankOptimizer::state_spans(int tensor) const {
  const Target& t = target_of(tensor);
  const int64_t bytes = t.r_numel * (t.q8 ? 1 : model_.storage().state_bytes);
  std::vector<StateSpan> spans = {{t.m, bytes, true}, {t.v, bytes, true}};
  if (t.q8) {
    spans.push_back({t.absmax_m, t.absmax_blocks * int64_t(sizeof(float)), true});
    spans.push_back({t.absmax_v, t.absmax_blocks * int64_t(sizeof(float)), true});
  }
  return spans;
}

double LowRankOptimizer::flops_saved_per_token() const {
  double saved = 0;
  for (const Target& t : targets_) {  // counted on Hugging Face's shapes, as the model's FLOPs are
    const ParamTensor& p = model_.tensors()[size_t(t.tensor_index)];
    const double out = double(p.hf_shape[0]), in = double(p.hf_shape[1]);
    saved += 2.0 * out * in - 2.0 * rank_ * (out + in);
  }
  return saved;
}

json LowRankOptimizer::save_state() const {
  json targets = json::array();
  for (const Target& t : targets_)
    targets.push_back({{"tensor", model_.tensors()[size_t(t.tensor_index)].name},
                       {"adam_step", t.adam_step}});
  return targets;
}

void LowRankOptimizer::check_state(const json* saved, const StateReader& reader) const {
  Optimizer::check_state(saved, reader);
  std::vector<std::string> names;
  for (const Target& t : targets_) names.push_back(model_.tensors()[size_t(t.tensor_index)].name);
  reader.target_list(*saved, state_key(), names, name());
}

void LowRankOptimizer::restore_state(const json& saved) {
  for (size_t k = 0; k < targets_.size(); k++)
    targets_[k].adam_step = saved[k]["adam_step"].get<int64_t>();
}

void LowRankOptimizer::zero_pad_rows(float* P, const Target& t) {
  if (t.side > t.hf_side)
    backend_.zero(P + int64_t(t.hf_side) * rank_, size_t(t.side - t.hf_side) * rank_ * sizeof(float));
}

// ---- GaLore -------------------------------------------------------------------------------------

GaloreBasisMethod galore_basis_method(const ProjectionConfig& g, const Storage& storage) {
  GaloreBasisMethod how;
  how.randomized = g.svd == GaloreSvd::Randomized || (g.svd == GaloreSvd::Auto && storage.cuda);
  how.power_iters = g.svd_power_iters;
  how.oversample = g.svd_oversample;
  return how;
}

GaLore::GaLore(const OptimizerConfig& cfg, LlamaModel& model, int64_t max_tokens, Arena& arena,
               Communicator& comm)
    : LowRankOptimizer(cfg, model, max_tokens, arena, /*full_gradients=*/true, comm),
      needs_refresh_(targets_.size(), false),  // begin_step(0) refreshes; a resumed run has P
      phase_(targets_.size(), 0),
      method_(galore_basis_method(cfg.projection, backend_.storage())) {
  if (cfg.projection.refresh_stagger)  // spread over the K steps of an interval, as GRASS's
    for (size_t k = 0; k < targets_.size(); k++)
      phase_[k] = refresh_phase(k, targets_.size(), cfg.projection.update_interval);
  int64_t workspace = 0;
  for (const Target& t : targets_) {
    P_.push_back(arena.alloc<float>(MemCategory::Optimizer,
                                    model.tensors()[size_t(t.tensor_index)].name + ".galore.P",
                                    int64_t(t.side) * rank_));
    workspace = std::max(workspace, galore_basis_workspace_bytes(backend_.storage(), t.out, t.in,
                                                                 rank_, method_));
  }
  if (workspace > 0) {
    basis_workspace_ = arena.alloc_bytes(MemCategory::Workspace, "galore.refresh_basis", workspace);
    refresh_status_ = arena.alloc<int>(MemCategory::Workspace, "galore.refresh_status", 4);
  }
  if (galore_refresh_pass(cfg) && method_.randomized) {
    // one layer's targets at a time: the most any layer has, each side and k the largest's
    std::vector<int> per_layer(size_t(model.config().num_hidden_layers) + 1, 0);
    int max_side = 0, max_k = 0;
    for (const Target& t : targets_) {
      const int layer = model.tensors()[size_t(t.tensor_index)].layer;
      batch_slots_ = std::max(batch_slots_, ++per_layer[size_t(layer + 1)]);
      max_side = std::max(max_side, t.side);
      max_k = std::max(max_k, ops::galore_sketch_columns(t.out, t.in, rank_, method_.oversample));
    }
    batch_layout_ = galore_batch_layout(backend_.storage(), max_side, max_k, batch_slots_);
    batch_ = arena.alloc_bytes(MemCategory::Workspace, "galore.refresh_batch", batch_layout_.bytes);
  }
}

std::string GaLore::describe() const {
  const std::string staggered =
      cfg_.projection.refresh_stagger ? ", each target at its own step of the interval" : "";
  if (!method_.randomized)
    return describe_projection(cfg_.projection, "exact SVD",
                               staggered + (galore_refresh_pass(cfg_)
                                                ? " (svd_batch \"layer\": the exact SVD has no "
                                                  "eigenproblem to batch)"
                                                : ""));
  const std::string batched =
      batch_ ? ", each layer's eigenproblems in one batched call, in a refresh pass of its own "
               "before the step's backward (svd_batch \"layer\")"
             : "";
  return describe_projection(cfg_.projection, "randomized SVD",
                             " (" + std::to_string(method_.power_iters) + " power iterations, " +
                                 std::to_string(method_.oversample) + " extra columns, on the " +
                                 (backend_.storage().cuda ? "GPU" : "CPU") + ")" + batched +
                                 staggered);
}

void GaLore::begin_step(int64_t step) {
  step_ = step;
  refresh_batches_.clear();
  const int64_t K = cfg_.projection.update_interval;
  bool any = false;
  for (size_t k = 0; k < targets_.size(); k++)
    if (step == 0 || refresh_due(step, phase_[k], K)) {  // every target's first P at step 0
      needs_refresh_[k] = true;
      any = true;
    }
  if (any && refresh_status_) backend_.zero(refresh_status_, 4 * sizeof(int));
}

bool GaLore::needs_exact_activations() const {
  return std::find(needs_refresh_.begin(), needs_refresh_.end(), true) != needs_refresh_.end();
}

GaloreBasisMethod GaLore::method_for(size_t k) const {
  GaloreBasisMethod how = method_;  // the test matrix: a stream per refresh and target
  // staggered, the step itself numbers the refresh (step / K would repeat: a target with a phase
  // refreshes at step 0 and again at its phase, inside the first interval)
  const int64_t refresh =
      cfg_.projection.refresh_stagger ? step_ : step_ / cfg_.projection.update_interval;
  how.seed = derive_seed(derive_seed(cfg_.projection.seed ^ 0x6a10, uint64_t(refresh)),
                         uint64_t(targets_[k].tensor_index));
  return how;
}

void GaLore::refresh_from(size_t k, const float* g) {
  const Target& t = targets_[k];
  backend_.galore_basis(P_[k], g, t.out, t.in, rank_, t.rows, method_for(k), basis_workspace_,
                        refresh_status_);
  refreshed(k);
}

bool GaLore::wants_refresh_pass() const {
  return batch_ && std::all_of(needs_refresh_.begin(), needs_refresh_.end(),
                               [](bool refresh) { return refresh; });
}

void GaLore::refresh_pass_projected(int tensor, const void* dy, const void* x, int64_t N) {
  const size_t k = index_of(tensor);
  const Target& t = targets_[k];
  GRASS_CHECK(batch_ && needs_refresh_[k], "a refresh pass reached a target it does not refresh");
  const int layer = model_.tensors()[size_t(t.tensor_index)].layer;
  const int sketch_k = ops::galore_sketch_columns(t.out, t.in, rank_, method_.oversample);
  if (!pending_.empty() && (layer != pending_layer_ || sketch_k != pending_k_ ||
                            int(pending_.size()) == batch_slots_))
    finish_batch();
  backend_.galore_sketch(full_gradient(k, dy, x, N), t.out, t.in, rank_, t.rows, method_for(k),
                         batch_, batch_layout_, int(pending_.size()), basis_workspace_,
                         refresh_status_);
  pending_.push_back(k);
  pending_layer_ = layer;
  pending_k_ = sketch_k;
}

void GaLore::finish_batch() {
  std::vector<float*> P;
  std::vector<int> sides;
  for (const size_t k : pending_) {
    P.push_back(P_[k]);
    sides.push_back(targets_[k].side);
  }
  backend_.galore_finish(P.data(), sides.data(), int(pending_.size()), pending_k_, rank_, batch_,
                         batch_layout_, basis_workspace_, refresh_status_);
  refresh_batches_.push_back(int(pending_.size()));
  const std::vector<size_t> done = std::exchange(pending_, {});
  for (const size_t k : done) refreshed(k);
}

void GaLore::end_refresh_pass() {
  if (!pending_.empty()) finish_batch();
  GRASS_CHECK(!needs_exact_activations(), "GaLore's refresh pass left a target without its new P");
}

void GaLore::refreshed(size_t k) {
  const Target& t = targets_[k];
  zero_pad_rows(P_[k], t);
  if (comm_.world() > 1) {  // the same summed gradient, but an SVD that differs in the last bit
                            // (another thread count, another library) would split the replicas
    std::vector<float> P(size_t(t.side) * size_t(rank_));
    backend_.download(P.data(), P_[k], P.size() * sizeof(float));
    comm_.check_same(fnv1a64(P.data(), P.size() * sizeof(float)),
                     "step " + std::to_string(step_ + 1) + ": GaLore's projection of " +
                         model_.tensors()[size_t(t.tensor_index)].name);
  }
  needs_refresh_[k] = false;
  if (needs_exact_activations()) return;
  // the last target
  if (refresh_status_) check_refresh_status();
  if (ops::galore_timers_enabled()) print_refresh_times();
}

void GaLore::print_refresh_times() const {
  const ops::GaloreRefreshTimes times = backend_.take_galore_refresh_times();
  if (times.targets == 0) return;  // the exact SVD: no phases
  double total = 0;
  for (const double ms : times.ms) total += ms;
  const std::string batched =  // svd_batch "layer": the eigensolver's calls
      refresh_batches_.empty() ? ""
                               : " in " + std::to_string(refresh_batches_.size()) +
                                     " batched eigensolver calls";
  std::fprintf(stderr, "galore refresh at step %lld: %d targets%s, %.3f ms in the range finder\n",
               static_cast<long long>(step_ + 1), times.targets, batched.c_str(), total);
  for (int p = 0; p < ops::kGalorePhases; p++)
    std::fprintf(stderr, "galore refresh phase %-12s %10.3f ms\n",
                 ops::name_of(ops::GalorePhase(p)), times.ms[p]);
}

void GaLore::check_refresh_status() const {
  int status[4] = {0, 0, 0, 0};
  backend_.download(status, refresh_status_, sizeof status);
  GRASS_CHECK(status[0] == 0 && status[1] == 0,
              "GaLore's refresh: cuSOLVER's QR refused its arguments (status " +
                  std::to_string(status[0]) + ", " + std::to_string(status[1]) + ")");
  GRASS_CHECK(status[2] == 0, "GaLore's refresh at step " + std::to_string(step_ + 1) +
                                  ": the eigensolver did not converge (non-finite gradient?), "
                                  "cuSOLVER's info " + std::to_string(status[2]));
  GRASS_CHECK(status[3] == 0, "GaLore's refresh at step " + std::to_string(step_ + 1) +
                                  ": the Cholesky factorisation of a power iteration's Gram matrix "
                                  "failed (non-finite gradient?), cuSOLVER's info " +
                                  std::to_string(status[3]));
}

// ---- FLORA --------------------------------------------------------------------------------------

Flora::Flora(const OptimizerConfig& cfg, LlamaModel& model, int64_t max_tokens, Arena& arena,
             Communicator& comm)
    : LowRankOptimizer(cfg, model, max_tokens, arena, /*full_gradients=*/false, comm) {
  int64_t largest_P = 0, largest_R = 0;
  for (const Target& t : targets_) {
    largest_P = std::max(largest_P, int64_t(t.side) * rank_);
    largest_R = std::max(largest_R, t.r_numel);
  }
  P_ = arena.alloc<float>(MemCategory::Workspace, "flora.projection", largest_P);
  P_old_ = arena.alloc<float>(MemCategory::Workspace, "flora.previous_projection", largest_P);
  // C, a copy of m and, for 8-bit moments, m decoded (flora_transfer_q8)
  const bool q8 = std::any_of(targets_.begin(), targets_.end(), [](const Target& t) { return t.q8; });
  transfer_ = arena.alloc<float>(MemCategory::Workspace, "flora.transfer",
                                 int64_t(rank_) * rank_ + (q8 ? 2 : 1) * largest_R);
}

void Flora::generate(float* P, size_t k, int64_t refresh) {
  const Target& t = targets_[k];
  backend_.flora_projection(P, cfg_.projection.seed, t.tensor_index, refresh, t.side, rank_);
  zero_pad_rows(P, t);
}

const float* Flora::projection(size_t k) {
  const int64_t refresh = refresh_index(step_);
  if (held_target_ != int64_t(k) || held_refresh_ != refresh) {
    generate(P_, k, refresh);
    held_target_ = int64_t(k);
    held_refresh_ = refresh;
  }
  return P_;
}

void Flora::begin_step(int64_t step) {
  step_ = step;
  resampling_ = refresh_index(step) > 0 && (step + 1) % cfg_.projection.update_interval == 0;
}

void Flora::before_update(size_t k) {
  if (!resampling_) return;
  // A resampling step: carry the first moment to the new projection before the update reads it
  // (the step's R, formed from the activations, does not read it).
  generate(P_old_, k, refresh_index(step_) - 1);
  const uint64_t seed =
      derive_seed(derive_seed(cfg_.projection.seed ^ 0x7a45, uint64_t(step_)), targets_[k].tensor_index);
  if (targets_[k].q8)
    backend_.flora_transfer_q8(quant8_moments(targets_[k]), quant8_by_feature(), transfer_, P_old_,
                               view(k, projection(k)));
  else
    backend_.flora_transfer(resident(targets_[k].m), transfer_, P_old_, view(k, projection(k)), seed);
}

}  // namespace grass
