#include "src/optim/grass.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/io/hash.h"
#include "src/optim/grass_selection.h"

namespace grass {

using nlohmann::json;


Grass::Grass(const OptimizerConfig& cfg, LlamaModel& model, int64_t max_tokens, Arena& arena,
             int64_t refresh_chunk_bytes, Communicator& comm)
    : cfg_(cfg), model_(model), comm_(comm), rank_(cfg.projection.rank), target_of_tensor_(model.tensors().size(), -1),
      backend_(&model.backend()) {
  const int r = rank_;
  const Storage& storage = model.storage();
  int largest_in = 0, largest_out = 0;
  for (size_t i = 0; i < model.tensors().size(); i++) {
    const ParamTensor& p = model.tensors()[i];
    if (p.dense()) continue;
    GRASS_CHECK(p.shape.size() == 2, "a GRASS target must be a matrix: " + p.name);
    Target t{};
    t.tensor_index = int(i);
    t.out = int(p.shape[0]);
    t.in = int(p.shape[1]);
    t.rows = projects_rows(OptimizerKind::Grass, cfg.projection, p.hf_shape[0], p.hf_shape[1]);
    t.selectable = int(p.hf_shape[t.rows ? 0 : 1]);
    GRASS_CHECK(r <= t.selectable, "rank exceeds the selectable side of " + p.name);
    t.slices = r;
    t.gc_numel = int64_t(r) * (t.rows ? t.in : t.out);
    t.count.assign(size_t(r), 1);
    const MemPlace place = states_place(cfg);  // σ and ρ stay on the device: accumulate reads them
    t.q8 = cfg.state_dtype == StateDtype::Q8 && int64_t(t.out) * t.in >= kQuant8MinElements;
    if (t.q8) {
      t.m = arena.alloc<uint8_t>(MemCategory::Optimizer, p.name + ".grass.m_q8", t.gc_numel, place);
      t.v = arena.alloc<uint8_t>(MemCategory::Optimizer, p.name + ".grass.v_q8", t.gc_numel, place);
      t.absmax_blocks = quant8_layout(t).blocks();
      t.absmax_m = arena.alloc<float>(MemCategory::Optimizer, p.name + ".grass.m_absmax",
                                      t.absmax_blocks, place);
      t.absmax_v = arena.alloc<float>(MemCategory::Optimizer, p.name + ".grass.v_absmax",
                                      t.absmax_blocks, place);
    } else {
      t.m = arena.alloc_bytes(MemCategory::Optimizer, p.name + ".grass.m",
                              t.gc_numel * storage.state_bytes, place);
      t.v = arena.alloc_bytes(MemCategory::Optimizer, p.name + ".grass.v",
                              t.gc_numel * storage.state_bytes, place);
    }
    if (cfg.proximal.enabled())
      t.anchor = arena.alloc_bytes(MemCategory::Optimizer, p.name + ".grass.proximal_anchor",
                                   t.gc_numel * storage.state_bytes, place);
    t.sigma = arena.alloc<int32_t>(MemCategory::Optimizer, p.name + ".grass.sigma", r);
    t.rho = arena.alloc<float>(MemCategory::Optimizer, p.name + ".grass.rho", r);
    // derived from ρ and the counts (state.json) at a restore, so not saved itself
    t.update_scale = arena.alloc<float>(MemCategory::Workspace, p.name + ".grass.update_scale", r);
    largest_in = std::max(largest_in, t.in);
    largest_out = std::max(largest_out, t.out);
    target_of_tensor_[i] = int(targets_.size());
    targets_.push_back(t);
    tensors_.push_back(int(i));
  }
  GRASS_CHECK(!targets_.empty(), "the GRASS optimizer has no target tensors");
  if (cfg.projection.refresh_stagger)  // spread over the K steps of an interval
    for (size_t k = 0; k < targets_.size(); k++)
      targets_[k].phase = refresh_phase(k, targets_.size(), cfg.projection.update_interval);
  // Stacks of targets that select the same dimension; rows stacks gather count·r columns at once.
  int gathered = 1;
  for (const LlamaModel::TensorStack& s : model.projected_stacks()) {
    bool grass = true;
    for (int i = 0; i < s.count; i++) grass = grass && target_of_tensor_[size_t(s.first + i)] >= 0;
    if (!grass) continue;
    Stack stack{s.first, s.count, target_of(s.first).rows};
    bool same_dim = true;
    for (int i = 1; i < s.count; i++) same_dim = same_dim && target_of(s.first + i).rows == stack.rows;
    if (!same_dim) continue;
    if (stack.rows) {
      const std::string name = model.tensors()[size_t(s.first)].name + " stack";
      stack.sigma = arena.alloc<int32_t>(MemCategory::Workspace, name + ".grass.sigma", s.count * r);
      stack.rho = arena.alloc<float>(MemCategory::Workspace, name + ".grass.rho", s.count * r);
      gathered = std::max(gathered, s.count);
    }
    stacks_.push_back(stack);
  }
  scratch_ = arena.alloc_bytes(MemCategory::Workspace, "grass.gather",
                               max_tokens * r * gathered * storage.act_bytes);
  // The slice norms need the full gradient one chunk of rows at a time (16 MiB by default, not
  // 270 MiB for 13B's MLP), in whole multiples of 8 rows so that each chunk's columns of dy
  // start 16-byte aligned for the GPU.
  chunk_rows_ = int(std::min<int64_t>(
      largest_out, std::max<int64_t>(8, refresh_chunk_bytes / (4 * largest_in) / 8 * 8)));
  chunk_grad_ = arena.alloc<float>(MemCategory::Workspace, "grass.refresh_gradient_rows",
                                   int64_t(chunk_rows_) * largest_in);
  // offload.layers: a streamed target changes only at σ between refreshes, so it goes back to
  // the host as its r slices (model/layer_stream.h)
  if (LayerStream* stream = model.weight_store().stream()) {
    std::vector<LayerStream::Packed> streamed;
    for (const Target& t : targets_)
      if (model.tensors()[size_t(t.tensor_index)].place == Place::Streamed)
        streamed.push_back({t.tensor_index, r, t.rows});
    if (!streamed.empty()) stream->pack_slices_of(streamed, *this, arena);
  }
}

SliceSet Grass::changed_slices(int tensor) const {
  const Target& t = target_of(tensor);
  return {t.sigma, t.slices, t.selection};
}

int Grass::target_index(int tensor) const {
  const int k = target_of_tensor_.at(size_t(tensor));
  GRASS_CHECK(k >= 0, "a tensor that is not a GRASS target");
  return k;
}

const Grass::Target& Grass::target_of(int tensor) const {
  return targets_[size_t(target_index(tensor))];
}

void Grass::begin_step(int64_t step) {
  step_ = step;
  const int64_t K = cfg_.projection.update_interval;
  for (Target& t : targets_)
    if (refresh_due(step, t.phase, K)) t.needs_selection = true;
}

bool Grass::needs_exact_activations() const {
  return std::any_of(targets_.begin(), targets_.end(),
                     [](const Target& t) { return t.needs_selection; });
}

void Grass::accumulate(int tensor, void* gc, const void* dy, const void* x, int64_t N,
                       bool x_selected) {
  Target& t = target(tensor);
  if (x_selected) {  // the forward kept x[:, σ]·ρ: the cols GEMM alone, grass_compressed_grad's
    GRASS_CHECK(!t.rows && !t.needs_selection,
                "selected columns handed for a GRASS target that reads x whole");
    backend_->grass_selected_cols_grad(gc, dy, t.out, x, N, t.out, t.slices);
    return;
  }
  if (t.needs_selection) select(t, dy, x, N);
  backend_->grass_compressed_grad(gc, scratch_, dy, x, t.sigma, t.rho, N, t.in, t.out, t.slices,
                                  t.rows);
}

const Grass::Stack* Grass::stack_of(int first) const {
  for (const Stack& s : stacks_)
    if (s.first == first) return &s;
  return nullptr;
}

bool Grass::stackable(int first, int count) const {
  const Stack* stack = stack_of(first);
  return stack && stack->count == count;
}

bool Grass::stacks(int first, int count) const {
  if (!stackable(first, count)) return false;
  for (int i = 0; i < count; i++)
    if (target_of(first + i).needs_selection) return false;
  return true;
}

void Grass::store_stack_selection(Stack& stack) {
  const int r = rank_;
  std::vector<int32_t> sigma(size_t(stack.count) * r);
  std::vector<float> rho(sigma.size(), 0.0f);
  int offset = 0;  // the member's first column in the packed dy
  for (int i = 0; i < stack.count; i++) {
    const Target& t = target_of(stack.first + i);
    for (int j = 0; j < r; j++) {
      const size_t k = size_t(i) * r + size_t(j);
      // A slot no slice fills gathers ρ = 0 times one of the member's selected columns: a zero
      // row of G_C (non-finite only where the selected columns already make G_C so).
      sigma[k] = offset + t.host_sigma[size_t(j < t.slices ? j : 0)];
      if (j < t.slices) rho[k] = t.host_rho[size_t(j)];
    }
    offset += t.out;
  }
  backend_->upload_async(stack.sigma, sigma.data(), sigma.size() * sizeof(int32_t));
  backend_->upload_async(stack.rho, rho.data(), rho.size() * sizeof(float));
  stack.stale = false;
}

void Grass::accumulate_stack(int first, int count, void* gc, const void* dy, const void* const* x,
                             int64_t N, bool x_selected) {
  GRASS_CHECK(stacks(first, count), "accumulate_stack: not a stack formed together this step");
  Stack& stack = stacks_[size_t(stack_of(first) - stacks_.data())];
  const Target& head = target_of(first);
  int width = 0;  // of the packed dy
  for (int i = 0; i < count; i++) width += target_of(first + i).out;
  if (stack.rows) {
    GRASS_CHECK(!x_selected, "selected columns handed for GRASS rows targets");
    if (stack.stale) store_stack_selection(stack);
    backend_->grass_compressed_grad(gc, scratch_, dy, x[0], stack.sigma, stack.rho, N, head.in,
                                    width, count * rank_, true);
    return;
  }
  const Storage& storage = backend_->storage();
  const char* dy_t = static_cast<const char*>(dy);
  char* gc_t = static_cast<char*>(gc);
  for (int i = 0; i < count; i++) {
    const Target& t = target_of(first + i);
    const void* xs = x[i];
    if (!x_selected) {
      backend_->grass_gather_columns(scratch_, x[i], t.sigma, t.rho, N, t.in, t.slices);
      xs = scratch_;
    }
    backend_->grass_selected_cols_grad(gc_t, dy_t, width, xs, N, t.out, t.slices);
    dy_t += int64_t(t.out) * storage.act_bytes;
    gc_t += projected_numel(first + i) * storage.grad_bytes;
  }
}

bool Grass::selected_columns(int tensor, SelectedColumns* columns) const {
  const Target& t = target_of(tensor);
  if (t.rows || t.needs_selection) return false;
  *columns = {t.sigma, t.rho, t.slices};
  return true;
}

std::vector<double> Grass::slice_norms(const Target& t, const void* dy, const void* x, int64_t N) {
  std::vector<double> norms_sq(size_t(t.selectable), 0.0);
  // The uniform rules draw without looking at the norms: no full gradient to form.
  const Selection rule = cfg_.projection.selection;
  if (rule == Selection::Uniform || rule == Selection::UniformNR) return norms_sq;
  for (int row0 = 0; row0 < t.out; row0 += chunk_rows_) {
    const int rows = std::min(chunk_rows_, t.out - row0);
    backend_->full_weight_grad(chunk_grad_, dy, x, N, t.in, t.out, row0, rows);
    comm_.all_reduce_sum(chunk_grad_, int64_t(rows) * t.in, Element::F32);
    backend_->grass_slice_norms(chunk_grad_, row0, rows, t.in, t.rows);
  }
  backend_->read_slice_norms(norms_sq.data(), int(norms_sq.size()));  // the one wait
  return norms_sq;
}

void Grass::store_selection(Target& t, const SliceSelection& s) {
  t.selection++;
  t.slices = int(s.sigma.size());
  t.gc_numel = int64_t(t.slices) * (t.rows ? t.in : t.out);
  t.count = s.count;
  t.host_sigma = s.sigma;
  t.host_rho = s.rho;
  for (Stack& stack : stacks_)
    if (t.tensor_index >= stack.first && t.tensor_index < stack.first + stack.count)
      stack.stale = true;
  std::vector<float> scale(size_t(t.slices));
  for (size_t j = 0; j < scale.size(); j++)
    scale[j] = float(s.count[j]) * (cfg_.projection.rho_in_update ? s.rho[j] : 1.0f);
  backend_->upload_async(t.sigma, s.sigma.data(), scale.size() * sizeof(int32_t));
  backend_->upload_async(t.rho, s.rho.data(), scale.size() * sizeof(float));
  backend_->upload_async(t.update_scale, scale.data(), scale.size() * sizeof(float));
}

void Grass::select(Target& t, const void* dy, const void* x, int64_t N) {
  // The draws come from the stream (seed, step, tensor); the selection itself (a sort or a draw
  // over at most max(out, in) norms) runs on the host.
  const uint64_t seed = derive_seed(derive_seed(cfg_.projection.seed, uint64_t(step_)), t.tensor_index);
  const SliceSelection s = compact_slices(select_slices(cfg_.projection.selection,
                                                       slice_norms(t, dy, x, N), rank_, seed));
  if (comm_.world() > 1)
    comm_.check_same(fnv1a64(s.sigma.data(), s.sigma.size() * sizeof(int32_t)),
                     "step " + std::to_string(step_ + 1) + ": the GRASS selection σ of " +
                         model_.tensors()[size_t(t.tensor_index)].name);
  store_selection(t, s);
  t.adam_step = 0;  // the first update from this selection resets the moments
  t.needs_selection = false;
}

int64_t Grass::moment_bytes(const Target& t) const {
  return int64_t(rank_) * (t.rows ? t.in : t.out) *
         (t.q8 ? 1 : backend_->storage().state_bytes);
}

std::vector<StateSpan> Grass::state_spans(int tensor) const {
  const Target& t = target_of(tensor);
  // a refresh resets the moments at the update (needs_selection: it selects before; adam_step
  // 0: it has selected)
  const bool fetch = !t.needs_selection && t.adam_step > 0;
  std::vector<StateSpan> spans = {{t.m, moment_bytes(t), fetch}, {t.v, moment_bytes(t), fetch}};
  if (t.q8) {
    spans.push_back({t.absmax_m, t.absmax_blocks * int64_t(sizeof(float)), fetch});
    spans.push_back({t.absmax_v, t.absmax_blocks * int64_t(sizeof(float)), fetch});
  }
  if (cfg_.proximal.enabled())
    spans.push_back({t.anchor, int64_t(rank_) * (t.rows ? t.in : t.out) *
                                   backend_->storage().state_bytes, true});
  return spans;
}

std::string Grass::describe() const {
  const ProjectionConfig& g = cfg_.projection;
  std::string extra = std::string(", ") + name_of(g.selection) + ", select_dim " +
                      name_of(g.select_dim);
  if (cfg_.proximal.enabled()) {
    char proximal[96];
    std::snprintf(proximal, sizeof proximal, ", proximal lambda %.3g (anchor: the selected slices)",
                  cfg_.proximal.lambda);
    extra += proximal;
  }
  return describe_projection(g, "selection", extra);
}

double Grass::flops_saved_per_token() const {
  double saved = 0;
  for (const Target& t : targets_) {  // counted on Hugging Face's shapes, as the model's FLOPs are
    const ParamTensor& p = model_.tensors()[size_t(t.tensor_index)];
    const double out = double(p.hf_shape[0]), in = double(p.hf_shape[1]);
    saved += 2.0 * out * in - 2.0 * rank_ * (t.rows ? in : out);
  }
  return saved;
}

void Grass::update(int tensor, void* gc, const double* clip, double lr) {
  Target& t = target(tensor);
  GRASS_CHECK(!t.needs_selection, "a GRASS update before any backward selected rows");
  void* m = resident(t.m);
  void* v = resident(t.v);
  float* absmax_m = t.q8 ? resident(t.absmax_m) : nullptr;
  float* absmax_v = t.q8 ? resident(t.absmax_v) : nullptr;
  if (t.adam_step == 0) {
    // The paper resets the moments with the selection: they described other rows. (8-bit: an
    // absmax of 0 decodes every code to 0, and the codes are zeroed too.) Here, at the first
    // update from it, so that only the update touches them (offload holds them for it alone).
    backend_->zero(m, size_t(moment_bytes(t)));
    backend_->zero(v, size_t(moment_bytes(t)));
    if (absmax_m) {
      backend_->zero(absmax_m, size_t(t.absmax_blocks) * sizeof(float));
      backend_->zero(absmax_v, size_t(t.absmax_blocks) * sizeof(float));
    }
  }
  t.adam_step++;
  const ParamTensor& p = model_.tensors()[size_t(t.tensor_index)];
  // pure bf16's stochastic rounding: one stream per (step, target)
  const uint64_t seed =
      derive_seed(derive_seed(cfg_.projection.seed ^ 0x5eed, uint64_t(step_)), t.tensor_index);
  AdamArgs args = adam_args(cfg_, clip, lr, cfg_.weight_decay, t.adam_step);
  if (t.anchor)  // the inner loop's step t.adam_step - 1: a refresh starts a new loop
    args = proximal_args(args, cfg_.proximal.lambda, lr, t.adam_step - 1, resident(t.anchor));
  const GrassSlices slices{t.sigma, t.update_scale, t.out, t.in, t.slices, t.rows};
  if (absmax_m) {
    const Quant8Moments q{.m = static_cast<uint8_t*>(m),
                          .v = static_cast<uint8_t*>(v),
                          .absmax_m = absmax_m,
                          .absmax_v = absmax_v,
                          .block = cfg_.state_block};
    backend_->grass_adam_update_q8(model_.weight_ref(p), gc, q,
                                   cfg_.state_blocking == StateBlocking::Feature, slices,
                                   cfg_.projection.scale, args, seed);
    return;
  }
  backend_->grass_adam_update(model_.weight_ref(p), gc, m, v, slices, cfg_.projection.scale, args,
                              seed);
}

json Grass::save_state() const {
  json targets = json::array();
  for (const Target& t : targets_) {
    json target = {{"tensor", model_.tensors()[size_t(t.tensor_index)].name},
                   {"adam_step", t.adam_step},
                   {"needs_selection", t.needs_selection}};
    if (t.slices < rank_) target["count"] = t.count;  // merged repeats: σ, ρ hold `slices`
    targets.push_back(target);
  }
  return targets;
}

void Grass::check_state(const json* saved, const StateReader& reader) const {
  Optimizer::check_state(saved, reader);
  std::vector<std::string> names;
  for (const Target& t : targets_) names.push_back(model_.tensors()[size_t(t.tensor_index)].name);
  reader.target_list(*saved, state_key(), names, "GRASS");
  for (size_t k = 0; k < targets_.size(); k++) {
    const std::string where = "grass_targets[" + std::to_string(k) + "].";
    reader.boolean((*saved)[k], "needs_selection", where);
    if (const json& target = (*saved)[k]; target.contains("count")) {
      const json& count = target["count"];
      int64_t draws = 0;
      bool valid = count.is_array() && !count.empty() && count.size() <= size_t(rank_);
      for (size_t j = 0; valid && j < count.size(); j++) {
        valid = count[j].is_number_unsigned() && count[j].get<uint64_t>() >= 1 &&
                count[j].get<uint64_t>() <= uint64_t(rank_);
        if (valid) draws += count[j].get<int64_t>();
      }
      if (!valid || draws != rank_)
        reader.fail(where + "count is not " + std::to_string(rank_) +
                    " draws over at most as many slices");
    }
  }
  // σ indexes rows or columns of a weight: a value out of range would address memory outside
  // it, so a checkpoint's σ is checked like any other untrusted index.
  for (size_t k = 0; k < targets_.size(); k++) {
    const Target& t = targets_[k];
    const std::span<const std::byte> bytes = reader.saved_bytes(t.sigma);
    const json& target = (*saved)[k];
    const int64_t r = target.contains("count") ? int64_t(target["count"].size())
                                               : int64_t(bytes.size() / sizeof(int32_t));
    const int64_t limit = t.selectable;
    for (int64_t i = 0; i < r; i++) {
      int32_t v;
      std::memcpy(&v, bytes.data() + i * sizeof(int32_t), sizeof v);
      if (v < 0 || v >= limit)
        reader.fail_buffer(t.sigma, "index " + std::to_string(v) + " at position " +
                                        std::to_string(i) + " lies outside [0, " +
                                        std::to_string(limit) + "); the checkpoint is corrupt");
    }
  }
}

void Grass::restore_state(const json& saved) {
  for (size_t k = 0; k < targets_.size(); k++) {
    Target& t = targets_[k];
    t.adam_step = saved[k]["adam_step"].get<int64_t>();
    t.needs_selection = saved[k]["needs_selection"].get<bool>();
    // Checkpoints without "count" (every selection before repeats were merged) list each draw
    // as its own slice: the same update, with repeats stored twice.
    SliceSelection s;
    s.count = saved[k].contains("count") ? saved[k]["count"].get<std::vector<int32_t>>()
                                         : std::vector<int32_t>(size_t(rank_), 1);
    s.sigma.resize(s.count.size());
    s.rho.resize(s.count.size());
    backend_->download(s.sigma.data(), t.sigma, s.sigma.size() * sizeof(int32_t));
    backend_->download(s.rho.data(), t.rho, s.rho.size() * sizeof(float));
    store_selection(t, s);
  }
}

}  // namespace grass
