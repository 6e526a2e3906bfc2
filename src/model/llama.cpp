#include "src/model/llama.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "src/core/bf16.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/core/trace.h"

namespace grass {

namespace {
// tensors_ index of layer l's tensor i (tensors_[0] is the embedding)
int layer_tensor_index(int l, int i) { return 1 + l * kTensorsPerLayer + i; }
int layer_tensor_index(int l, LayerTensor t) { return layer_tensor_index(l, int(t)); }

LayerTensor layer_tensor(ProjectionTarget target) {
  switch (target) {
    case ProjectionTarget::Q: return LayerTensor::Q;
    case ProjectionTarget::K: return LayerTensor::K;
    case ProjectionTarget::V: return LayerTensor::V;
    case ProjectionTarget::O: return LayerTensor::O;
    case ProjectionTarget::Gate: return LayerTensor::Gate;
    case ProjectionTarget::Up: return LayerTensor::Up;
    case ProjectionTarget::Down: return LayerTensor::Down;
  }
  throw InternalError("layer_tensor: unknown projection target");
}

// The tensors whose weight gradients alone read each input (SampledInputs::Input order)
struct InputReaders {
  LayerTensor tensor[3];
  int count;
};
constexpr InputReaders kInputReaders[SampledInputs::kInputs] = {
    {{LayerTensor::Q, LayerTensor::K, LayerTensor::V}, 3},                    // n1
    {{LayerTensor::Gate, LayerTensor::Up, LayerTensor::Count}, 2},            // n2
    {{LayerTensor::Down, LayerTensor::Count, LayerTensor::Count}, 1}};        // act

// The tensors the forward multiplies as one stacked matrix (adjacent in the weights): the first
// and how many
constexpr std::pair<LayerTensor, int> kStacks[] = {{LayerTensor::Q, 3}, {LayerTensor::Gate, 2}};
}  // namespace

std::array<bool, 3> inputs_kept_as_columns(const ModelConfig& cfg,
                                           const ModelMemoryOptions& memory) {
  std::array<bool, 3> kept{};
  const ColumnTargets& c = memory.columns;
  if (c.rank <= 0 || memory.checkpointing != Checkpointing::None || memory.sampled.on())
    return kept;
  const int64_t width[SampledInputs::kInputs] = {cfg.hidden_size, cfg.hidden_size,
                                                 cfg.intermediate_size};
  for (int i = 0; i < SampledInputs::kInputs; i++) {
    const InputReaders& readers = kInputReaders[i];
    bool all = true;
    for (int j = 0; j < readers.count; j++)
      all = all && std::any_of(c.targets.begin(), c.targets.end(), [&](ProjectionTarget t) {
              return layer_tensor(t) == readers.tensor[j];
            });
    kept[size_t(i)] = all && int64_t(readers.count) * c.rank < width[i];
  }
  return kept;
}

bool qkv_gradients_packed(const std::vector<ProjectionTarget>& projected) {
  return std::none_of(projected.begin(), projected.end(), [](ProjectionTarget t) {
    return t == ProjectionTarget::Q || t == ProjectionTarget::K || t == ProjectionTarget::V;
  });
}

std::vector<std::string> projection_tensor_names(int num_layers,
                                                 const std::vector<ProjectionTarget>& targets) {
  std::vector<std::string> names;
  for (int l = 0; l < num_layers; l++)
    for (const ProjectionTarget target : targets)
      names.push_back("model.layers." + std::to_string(l) + "." +
                      kLayerTensors[int(layer_tensor(target))].name);
  return names;
}

std::vector<int> streamed_layers_for(int layers, int count) {
  GRASS_CHECK(count >= 0 && count <= layers, "more streamed layers than layers");
  std::vector<int> out;
  for (int i = 0; i < count; i++) out.push_back(int((2 * int64_t(i) + 1) * layers / (2 * int64_t(count))));
  return out;
}

int ffn_stored_width(const ModelConfig& cfg, const ModelMemoryOptions& memory) {
  const int F = cfg.intermediate_size;
  return memory.pad_ffn ? (F + kFfnRowMultiple - 1) / kFfnRowMultiple * kFfnRowMultiple : F;
}

LlamaModel::LlamaModel(const ModelConfig& cfg, Arena& arena, int max_batch, int seq_len,
                       const std::vector<std::string>& projected, Backend& backend,
                       ModelMemoryOptions memory)
    : cfg_(cfg), max_B_(max_batch), T_(seq_len), memory_(memory), backend_(&backend) {
  build(arena, projected, nullptr);
}

namespace {
// A forward-only model's options beside a training model: its layout (padded ffn, streamed
// layers), attention kernels and disk_dir, and nothing else of its memory options.
ModelMemoryOptions forward_only_options(const ModelMemoryOptions& of) {
  ModelMemoryOptions memory;
  memory.pad_ffn = of.pad_ffn;
  memory.streamed_layers = of.streamed_layers;
  memory.layer_slots = of.layer_slots;
  memory.attention = of.attention;
  memory.forward_only = true;
  return memory;
}
}  // namespace

LlamaModel::LlamaModel(LlamaModel& weights_of, Arena& arena, int max_batch)
    : cfg_(weights_of.cfg_),
      max_B_(max_batch),
      T_(weights_of.T_),
      memory_(forward_only_options(weights_of.memory_)),
      backend_(weights_of.backend_) {
  build(arena, {}, &weights_of);
}

void LlamaModel::build(Arena& arena, const std::vector<std::string>& projected,
                       LlamaModel* weights_of) {
  const ModelConfig& cfg = cfg_;
  const ModelMemoryOptions& memory = memory_;
  Backend& backend = *backend_;
  const int max_batch = max_B_, seq_len = T_;
  const Storage& storage = backend.storage();
  const std::string prefix = memory.forward_only ? "eval." : "";
  const int64_t C = cfg.hidden_size, F = cfg.intermediate_size, V = cfg.vocab_size;
  F_ = ffn_stored_width(cfg, memory);
  const int64_t Fs = F_;
  const int64_t HD = cfg.head_dim(), QD = cfg.num_attention_heads * HD,
                KVD = cfg.num_key_value_heads * HD;
  const int L = cfg.num_hidden_layers;

  ParameterSet& ts = tensors_;
  off_embed_ = ts.num_stored();
  ts.add("model.embed_tokens.weight", {V, C}, false);
  const auto size_of = [&](Dim d, bool stored) -> int64_t {
    switch (d) {
      case Dim::C: return C;
      case Dim::QD: return QD;
      case Dim::KVD: return KVD;
      case Dim::F: return stored ? Fs : F;
      case Dim::None: break;
    }
    return 0;
  };
  const auto shape_of = [&](const LayerTensorSpec& t, bool stored) {
    std::vector<int64_t> shape = {size_of(t.rows, stored)};
    if (t.cols != Dim::None) shape.push_back(size_of(t.cols, stored));
    return shape;
  };
  for (int l = 0; l < L; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const LayerTensorSpec& t : kLayerTensors)
      ts.add(p + t.name, shape_of(t, false), t.is_norm, shape_of(t, true), l);
  }
  norm_index_ = int(ts.size());
  ts.add("model.norm.weight", {C}, true);
  lm_head_index_ = 0;  // tied: lm_head reads (and trains) the embedding table
  if (!cfg.tie_word_embeddings) {
    lm_head_index_ = int(ts.size());
    ts.add("lm_head.weight", {V, C}, false);
  }
  GRASS_CHECK(ts.num_params() == cfg.num_parameters(), "parameter layout disagrees with the config");
  for (int l = 0; l < L; l++) {  // the forward's q-k-v and gate-up GEMMs read them as one matrix
    const auto offset = [&](LayerTensor t) { return ts[size_t(layer_tensor_index(l, t))].offset; };
    GRASS_CHECK(offset(LayerTensor::K) == offset(LayerTensor::Q) + QD * C &&
                    offset(LayerTensor::V) == offset(LayerTensor::K) + KVD * C,
                "q_proj, k_proj and v_proj must be adjacent in the weights");
    GRASS_CHECK(offset(LayerTensor::Up) == offset(LayerTensor::Gate) + Fs * C,
                "gate_proj and up_proj must be adjacent in the weights");
  }
  ts.set_projected(projected);
  if (!memory.streamed_layers.empty()) ts.stream_layers(memory.streamed_layers);
  const int64_t num_stored = ts.num_stored(), num_dense_grads = ts.num_dense_grads();

  // Element sizes are the backend's: fp32 on the CPU, bf16 activations and weights on the GPU.
  if (weights_of) {
    GRASS_CHECK(memory.forward_only && weights_of->num_stored_params() == num_stored &&
                    weights_of->F_ == F_,
                "a model sharing another's weights must be forward-only and of its layout");
    store_ = weights_of->store_.view_without_master();
  } else {
    store_ = WeightStore(ts, arena, backend, prefix, storage.master && !memory.forward_only,
                         memory.layer_slots);
  }
  if (memory.forward_only) {
    // no gradients
  } else if (!memory.fused_update) {
    grads_ = arena.alloc_bytes(MemCategory::Gradients, "gradients",
                               num_dense_grads * storage.grad_bytes);
  } else {
    // One dense gradient at a time (gate_proj's and up_proj's together when both are dense:
    // gate_up_backward); tied embeddings hold the table's from lm_head to embedding.
    int64_t largest = 0;
    for (const ParamTensor& t : tensors_)
      if (t.dense() && !(cfg.tie_word_embeddings && t.offset == off_embed_))
        largest = std::max(largest, t.numel);
    for (int l = 0; l < cfg.num_hidden_layers; l++)
      for (const auto& [first, count] : kStacks)
        if (stacked_dense(l, first, count)) {  // stacked_backward forms them at once
          int64_t numel = 0;
          for (int i = 0; i < count; i++) numel += tensors_[layer_tensor_index(l, first) + i].numel;
          largest = std::max(largest, numel);
        }
    grads_ = arena.alloc_bytes(MemCategory::Gradients, "gradient (one tensor at a time)",
                               largest * storage.grad_bytes);
    if (cfg.tie_word_embeddings && tensors_[0].dense())
      tied_grad_ = arena.alloc_bytes(MemCategory::Gradients, "gradient (tied embedding)",
                                     tensors_[0].numel * storage.grad_bytes);
  }

  const int64_t N = int64_t(max_batch) * seq_len, NH = cfg.num_attention_heads;
  allocate_activations(arena, N, int(NH));
  auto act = [&](const std::string& name, int64_t count) {
    return arena.alloc_bytes(MemCategory::Activations, prefix + name, count * storage.act_bytes);
  };
  auto act_f32 = [&](const std::string& name, int64_t count) {
    return arena.alloc<float>(MemCategory::Activations, prefix + name, count);
  };
  inputs_ = arena.alloc<int32_t>(MemCategory::Activations, prefix + "inputs", N);
  targets_ = arena.alloc<int32_t>(MemCategory::Activations, prefix + "targets", N);
  // forward-only: the residual stream's two buffers taken in turn, the last layer's output in
  // the one its input is not in
  x_out_ = memory.forward_only ? forward_stream_[L % 2] : act("x_out", N * C);
  rstdf_ = act_f32("rstd_final", N);
  nf_ = act("norm_final", N * C);
  if (memory.forward_only) {
    head_chunk_rows_ = std::min<int64_t>(N, std::max<int64_t>(1, kForwardHeadElements / V));
    logits_ = act("logits", head_rows(storage, head_chunk_rows_, int(V)) * V);
  } else {
    logits_ = act("logits", head_rows(storage, N, int(V), memory.head_chunk_rows) * V);
  }
  lse_ = act_f32("logsumexp", N);
  if (memory.forward_only)
    head_loss_sums_ = arena.alloc<double>(MemCategory::Activations, prefix + "loss sums (fp64)",
                                          (N + head_chunk_rows_ - 1) / head_chunk_rows_);
  else
    loss_sums_ = arena.alloc<double>(MemCategory::Activations, "loss sums (fp64)", kLossSlots);

  auto wsp = [&](const std::string& name, int64_t count) {
    return arena.alloc_bytes(MemCategory::Workspace, prefix + name, count * storage.act_bytes);
  };
  WorkspaceShape shape{max_batch, seq_len, int(C), int(Fs), int(V), int(NH),
                       cfg.num_key_value_heads, int(HD), cfg.rope_theta, memory.attention};
  shape.forward_only = memory.forward_only;
  shape.head_chunk_rows = memory.head_chunk_rows;
  if (memory.forward_only) {
    if (weights_of)  // the training model's scratch serves the forward (see the constructor)
      GRASS_CHECK(weights_of->backend_scratch_ &&
                      scratch_covers(storage, weights_of->backend_scratch_->shape(), shape),
                  "a forward-only model's scratch must be its weights' model's");
    else
      backend_scratch_ = backend.plan_scratch(arena, shape);
    trace_names_.resize(size_t(L));
    for (int l = 0; l < L; l++) trace_names_[size_t(l)] = "eval layer " + std::to_string(l);
    return;
  }
  ws_.dres = wsp("dres", N * C);
  ws_.dnorm = wsp("dnorm", N * C);
  ws_.datt = wsp("datt", N * QD);
  ws_.dqkv = wsp("dqkv", N * (QD + 2 * KVD));
  ws_.dact = wsp("dact", N * Fs);
  ws_.dgu = wsp("dgate_up", N * 2 * Fs);
  shape.qkv_grads_packed = stacked_dense(0, LayerTensor::Q, 3);
  backend_scratch_ = backend.plan_scratch(arena, shape);
  for (const char* pass : {"forward", "backward"})
    for (int l = 0; l < L; l++) trace_names_.push_back("layer " + std::to_string(l) + " " + pass);
}

void LlamaModel::allocate_activations(Arena& arena, int64_t N, int NH) {
  const Storage& storage = backend_->storage();
  const int64_t C = cfg_.hidden_size, F = F_, HD = cfg_.head_dim();
  const int64_t QD = NH * HD, KVD = cfg_.num_key_value_heads * HD;
  const std::string prefix = memory_.forward_only ? "eval." : "";
  auto act = [&](const std::string& name, int64_t count) {
    return arena.alloc_bytes(MemCategory::Activations, prefix + name, count * storage.act_bytes);
  };
  auto act_f32 = [&](const std::string& name, int64_t count) {
    return arena.alloc<float>(MemCategory::Activations, prefix + name, count);
  };
  const int L = cfg_.num_hidden_layers;
  if (memory_.forward_only) {  // one layer's set for all, the residual stream in two buffers
    GRASS_CHECK(memory_.checkpointing == Checkpointing::None && !memory_.sampled.on() &&
                    memory_.x_in_offload == ActivationOffload::None,
                "a forward-only model keeps nothing for a backward");
    acts_.resize(L);
    void** x = forward_stream_;
    x[0] = act("x_even", N * C);
    x[1] = act("x_odd", N * C);
    LayerActs& a = acts_[0];
    a.rstd1 = act_f32("layer.rstd1", N);
    a.n1 = act("layer.n1", N * C);
    a.qkv = act("layer.qkv", N * (QD + 2 * KVD));
    a.saved = arena.alloc_bytes(MemCategory::Activations, prefix + "layer.attention_saved",
                                attention_saved_bytes(storage, max_B_, T_, NH));
    a.att = act("layer.att", N * QD);
    a.h = act("layer.h", N * C);
    a.rstd2 = act_f32("layer.rstd2", N);
    a.n2 = act("layer.n2", N * C);
    a.gu = act("layer.gate_up", N * 2 * F);
    a.act = act("layer.act", N * F);
    for (int l = 0; l < L; l++) {
      acts_[size_t(l)] = acts_[0];
      acts_[size_t(l)].x_in = x[l % 2];
    }
    return;
  }
  const bool per_layer = memory_.checkpointing == Checkpointing::Layer;
  // sampled: the full n1, n2 and act exist only in the forward (and an exact backward's
  // recompute); so does an input kept as selected columns
  const bool elementwise =
      memory_.checkpointing == Checkpointing::Elementwise || memory_.sampled.on();
  columns_inputs_ = inputs_kept_as_columns(cfg_, memory_);
  acts_.resize(L);
  if (memory_.x_in_offload != ActivationOffload::None) {
    GRASS_CHECK(per_layer, "offloaded layer inputs need checkpointing per layer");
    x_in_ring_ = std::make_unique<XInRing>(*backend_, arena, L, N * C * storage.act_bytes,
                                           memory_.x_in_offload, memory_.disk_dir);
  }
  for (int l = 0; l < L; l++) {
    LayerActs& a = acts_[l];
    const std::string p = "layer" + std::to_string(l) + ".";
    a.x_in = x_in_ring_ ? x_in_ring_->slot(l) : act(p + "x_in", N * C);
    if (per_layer && l > 0) {  // one set of the rest, recomputed per layer
      void* x_in = a.x_in;
      a = acts_[0];
      a.x_in = x_in;
      continue;
    }
    const std::string q = per_layer ? "layer." : p;  // the shared set's names
    // n1, n2 and act: the layer's own, or with elementwise recomputation one set for all layers
    auto recomputable = [&](void* LayerActs::*field, SampledInputs::Input input, int64_t count) {
      const bool shared = elementwise || columns_inputs_[input];
      a.*field = shared && l > 0 ? acts_[0].*field
                                 : act((shared ? "layer." : q) + SampledInputs::kInputNames[input], count);
    };
    a.rstd1 = act_f32(q + "rstd1", N);
    recomputable(&LayerActs::n1, SampledInputs::N1, N * C);
    a.qkv = act(q + "qkv", N * (QD + 2 * KVD));
    a.saved = arena.alloc_bytes(MemCategory::Activations, q + "attention_saved",
                                attention_saved_bytes(storage, max_B_, T_, NH));
    a.att = act(q + "att", N * QD);
    a.h = act(q + "h", N * C);
    a.rstd2 = act_f32(q + "rstd2", N);
    recomputable(&LayerActs::n2, SampledInputs::N2, N * C);
    a.gu = act(q + "gate_up", N * 2 * F);
    recomputable(&LayerActs::act, SampledInputs::Act, N * F);
  }
  // the selected columns of layers 0 .. L-2 (the last layer's inputs are still whole in the
  // shared buffers when the backward starts)
  if (std::any_of(columns_inputs_.begin(), columns_inputs_.end(), [](bool b) { return b; }))
    columns_.resize(size_t(std::max(L - 1, 0)));
  for (size_t l = 0; l < columns_.size(); l++)
    for (int i = 0; i < SampledInputs::kInputs; i++)
      for (int j = 0; columns_inputs_[size_t(i)] && j < kInputReaders[i].count; j++)
        columns_[l][size_t(i)].xs[j] =
            act("layer" + std::to_string(l) + "." + SampledInputs::kInputNames[i] + " columns of " +
                    kLayerTensors[int(kInputReaders[i].tensor[j])].name,
                N * memory_.columns.rank);
  if (!memory_.sampled.on()) return;
  GRASS_CHECK(memory_.checkpointing == Checkpointing::None,
              "sampled activations need checkpointing none");
  const int width[SampledInputs::kInputs] = {int(C), int(C), int(F)};
  // q's (q, k and v's when the three are dense: packed, qkv_backward), gate's and up's (2F when
  // both are dense: packed, gate_up_backward), down's
  int64_t widest_dy = std::max({QD, F, C});
  for (int l = 0; l < L; l++) {
    if (stacked_dense(l, LayerTensor::Q, 3)) widest_dy = std::max(widest_dy, QD + 2 * KVD);
    if (stacked_dense(l, LayerTensor::Gate, 2)) widest_dy = std::max(widest_dy, 2 * F);
  }
  sampled_ = std::make_unique<SampledInputs>(memory_.sampled, *backend_, arena, L - 1, N, width,
                                             int(widest_dy));
}

void LlamaModel::begin_sampled_step(uint64_t seed, int64_t step, int rank, bool exact) {
  if (sampled_) sampled_->begin_step(seed, step, rank, exact);
}

void LlamaModel::begin_columns_pass(bool training) {
  columns_pass_ = training && sink_ && !columns_.empty();
  for (auto& layer : columns_)
    for (KeptColumns& k : layer) k.kept = false;
}

void LlamaModel::keep_columns(int l, SampledInputs::Input input, const void* x, int64_t N,
                              int width) {
  KeptColumns& k = columns_[size_t(l)][input];
  const InputReaders& readers = kInputReaders[input];
  SelectedColumns selected[3];
  k.kept = true;
  for (int j = 0; j < readers.count; j++)
    k.kept = k.kept && sink_->selected_columns(layer_tensor_index(l, readers.tensor[j]),
                                               &selected[j]);
  if (!k.kept) return;  // a reader refreshes this step: the backward recomputes x
  for (int j = 0; j < readers.count; j++)
    backend_->grass_gather_columns(k.xs[j], x, selected[j].sigma, selected[j].rho, N, width,
                                   selected[j].count);
}

const void* LlamaModel::kept_columns(int l, SampledInputs::Input input, LayerTensor reader) const {
  if (size_t(l) >= columns_.size() || !columns_[size_t(l)][input].kept) return nullptr;
  const InputReaders& readers = kInputReaders[input];
  for (int j = 0; j < readers.count; j++)
    if (readers.tensor[j] == reader) return columns_[size_t(l)][input].xs[j];
  throw InternalError("kept_columns: not a reader of the input");
}

namespace {
void* at(void* base, int64_t elements, int bytes) {
  return base ? static_cast<char*>(base) + elements * bytes : nullptr;
}
}  // namespace

void* LlamaModel::grad(const ParamTensor& t) {
  if (!t.dense()) return nullptr;
  if (!memory_.fused_update) return at(grads_, t.grad_offset, storage().grad_bytes);
  return tied_grad_ && t.offset == off_embed_ ? tied_grad_ : grads_;
}

LlamaModel::LayerWeights LlamaModel::layer_weights(int l) {
  void* p[kTensorsPerLayer];
  for (int i = 0; i < kTensorsPerLayer; i++) p[i] = weight(tensors_[layer_tensor_index(l, i)]);
  return {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8]};
}

void LlamaModel::linear_backward(void* dx, bool accumulate_dx, int l, LayerTensor t, const void* w,
                                 const void* dy, const void* x, int64_t N, int in, int out,
                                 const SampledInputs::Kept* kept, const void* xs) {
  const int index = layer_tensor_index(l, t);
  GRASS_CHECK(!kept || !xs, "a weight gradient from sampled rows and from kept columns at once");
  if (kept) {  // dx from every row, then the weight gradient from the kept rows alone
    backend_->linear_backward(dx, nullptr, dy, nullptr, w, N, in, out, accumulate_dx);
    backend_->gather_rows(sampled_->dy_rows(), dy, kept->rows, nullptr, kept->k, out);
    dx = nullptr, dy = sampled_->dy_rows(), x = kept->x, N = kept->k;
  }
  if (tensors_[index].dense()) {
    backend_->linear_backward(dx, begin_gradient(index), dy, x, w, N, in, out, accumulate_dx);
    end_gradient(index);
    return;
  }
  if (dx)  // dx only
    backend_->linear_backward(dx, nullptr, dy, xs ? nullptr : x, w, N, in, out, accumulate_dx);
  GRASS_CHECK(sink_, "a projected tensor needs a GradientSink");
  sink_->projected(index, dy, xs ? xs : x, N, xs != nullptr);
}

void LlamaModel::gate_up_backward(int l, const LayerWeights& w, const LayerActs& a, int64_t N,
                                  const SampledInputs::Kept* kept) {
  Backend& be = *backend_;
  const int C = cfg_.hidden_size, F = F_;
  const int bytes = storage().act_bytes;
  if (stacked_projected(l, LayerTensor::Gate, 2, kept)) {
    // dgate|dup packed as for dense tensors: dx from the stacked weights, then both gradients
    // from the packed dy at once
    be.swiglu_backward(ws_.dgu, at(ws_.dgu, F, bytes), ws_.dact, a.gu, N, F, 2 * int64_t(F));
    be.linear_backward(ws_.dnorm, nullptr, ws_.dgu, nullptr, w.wgate, N, C, 2 * F, false);
    const void* xs[2] = {kept_columns(l, SampledInputs::N2, LayerTensor::Gate),
                         kept_columns(l, SampledInputs::N2, LayerTensor::Up)};
    const void* x[2] = {xs[0] ? xs[0] : a.n2, xs[1] ? xs[1] : a.n2};
    sink_->projected_stack(layer_tensor_index(l, LayerTensor::Gate), 2, ws_.dgu, x, N,
                           xs[0] != nullptr);
    return;
  }
  if (!stacked_dense(l, LayerTensor::Gate, 2)) {
    // A projected tensor's optimizer reads its dy whole: dgate and dup as two [N, F] buffers,
    // each tensor's own backward
    void* dgate = ws_.dgu;
    void* dup = at(ws_.dgu, N * F, bytes);
    be.swiglu_backward(dgate, dup, ws_.dact, a.gu, N, F, F);
    linear_backward(ws_.dnorm, false, l, LayerTensor::Gate, w.wgate, dgate, a.n2, N, C, F, kept,
                    kept_columns(l, SampledInputs::N2, LayerTensor::Gate));
    linear_backward(ws_.dnorm, true, l, LayerTensor::Up, w.wup, dup, a.n2, N, C, F, kept,
                    kept_columns(l, SampledInputs::N2, LayerTensor::Up));
    return;
  }
  // Both dense: dgate|dup packed as gu [N, 2F], for the stacked weights [2F, C] (as in the forward)
  be.swiglu_backward(ws_.dgu, at(ws_.dgu, F, bytes), ws_.dact, a.gu, N, F, 2 * int64_t(F));
  stacked_backward(ws_.dnorm, l, LayerTensor::Gate, 2, w.wgate, ws_.dgu, a.n2, N, C, 2 * F, kept);
}

void LlamaModel::qkv_backward(int l, const LayerWeights& w, const LayerActs& a, int B,
                              const SampledInputs::Kept* kept) {
  const int C = cfg_.hidden_size, T = T_, HD = cfg_.head_dim();
  const int NH = cfg_.num_attention_heads, NKV = cfg_.num_key_value_heads;
  const int64_t N = int64_t(B) * T, QD = int64_t(NH) * HD, KVD = int64_t(NKV) * HD;
  const int bytes = storage().act_bytes;
  // All dense, or all projected and formed together: dq|dk|dv packed as qkv, for the stacked
  // weights [QD + 2 KVD, C]. Otherwise three buffers: a projected tensor's optimizer reads its dy
  // whole.
  const bool dense = stacked_dense(l, LayerTensor::Q, 3);
  const bool stacked = stacked_projected(l, LayerTensor::Q, 3, kept);
  const QkvRows<void*> d =
      dense || stacked ? packed_qkv(ws_.dqkv, NH, NKV, HD, bytes)
                       : separate_qkv(ws_.dqkv, at(ws_.dqkv, N * QD, bytes),
                                      at(ws_.dqkv, N * (QD + KVD), bytes), NH, NKV, HD);
  backend_->attention_backward(d, ws_.datt, a.att, a.saved, read_only(qkv_rows(a)), B, T, NH,
                               NKV, HD, cfg_.rope_theta);
  if (dense) {
    stacked_backward(ws_.dnorm, l, LayerTensor::Q, 3, w.wq, ws_.dqkv, a.n1, N, C,
                     int(QD + 2 * KVD), kept);
    return;
  }
  if (stacked) {
    backend_->linear_backward(ws_.dnorm, nullptr, ws_.dqkv, nullptr, w.wq, N, C,
                              int(QD + 2 * KVD), false);
    const void* xs[3] = {kept_columns(l, SampledInputs::N1, LayerTensor::Q),
                         kept_columns(l, SampledInputs::N1, LayerTensor::K),
                         kept_columns(l, SampledInputs::N1, LayerTensor::V)};
    const void* x[3];
    for (int t = 0; t < 3; t++) x[t] = xs[t] ? xs[t] : a.n1;
    sink_->projected_stack(layer_tensor_index(l, LayerTensor::Q), 3, ws_.dqkv, x, N,
                           xs[0] != nullptr);
    return;
  }
  linear_backward(ws_.dnorm, false, l, LayerTensor::Q, w.wq, d.q, a.n1, N, C, int(QD), kept,
                  kept_columns(l, SampledInputs::N1, LayerTensor::Q));
  linear_backward(ws_.dnorm, true, l, LayerTensor::K, w.wk, d.k, a.n1, N, C, int(KVD), kept,
                  kept_columns(l, SampledInputs::N1, LayerTensor::K));
  linear_backward(ws_.dnorm, true, l, LayerTensor::V, w.wv, d.v, a.n1, N, C, int(KVD), kept,
                  kept_columns(l, SampledInputs::N1, LayerTensor::V));
}

bool LlamaModel::stacked_dense(int l, LayerTensor first, int count) const {
  for (int i = 0; i < count; i++)
    if (!tensors_[layer_tensor_index(l, first) + i].dense()) return false;
  return true;
}

bool LlamaModel::stacked_projected(int l, LayerTensor first, int count,
                                   const SampledInputs::Kept* kept) const {
  const int index = layer_tensor_index(l, first);
  for (int i = 0; i < count; i++)
    if (tensors_[index + i].dense()) return false;
  return !kept && sink_ && sink_->stacks(index, count);
}

std::vector<LlamaModel::TensorStack> LlamaModel::projected_stacks() const {
  std::vector<TensorStack> stacks;
  for (int l = 0; l < cfg_.num_hidden_layers; l++)
    for (const auto& [first, count] : kStacks) {
      const int index = layer_tensor_index(l, first);
      bool projected = true;
      for (int i = 0; i < count; i++) projected = projected && !tensors_[index + i].dense();
      if (projected) stacks.push_back({index, count});
    }
  return stacks;
}

void LlamaModel::stacked_backward(void* dx, int l, LayerTensor first, int count, const void* w,
                                  const void* dy, const void* x, int64_t N, int in, int out,
                                  const SampledInputs::Kept* kept) {
  Backend& be = *backend_;
  const int index = layer_tensor_index(l, first), grad_bytes = storage().grad_bytes;
  void* g = grad(tensors_[index]);
  // each tensor's gradient, at the end of the one before it (in the gradient buffer, or in the
  // fused one, sized for the stack)
  GRASS_CHECK(count <= 3, "stacked_backward: at most q, k and v");
  void* tensor_grads[3] = {};
  int64_t numel = 0;
  for (int i = 0; i < count; i++) {
    tensor_grads[i] = at(g, numel, grad_bytes);
    numel += tensors_[index + i].numel;
    GRASS_CHECK(memory_.fused_update || tensor_grads[i] == grad(tensors_[index + i]),
                "stacked_backward: the gradients are not adjacent");
  }
  if (memory_.fused_update) be.zero(g, size_t(numel) * grad_bytes);
  if (kept) {  // dx from every row, the weight gradients from the kept rows (linear_backward's way)
    be.linear_backward(dx, nullptr, dy, nullptr, w, N, in, out, false);
    be.gather_rows(sampled_->dy_rows(), dy, kept->rows, nullptr, kept->k, out);
    be.linear_backward(nullptr, g, sampled_->dy_rows(), kept->x, w, kept->k, in, out, false);
  } else {
    be.linear_backward(dx, g, dy, x, w, N, in, out, false);
  }
  for (int i = 0; i < count; i++) end_gradient(index + i, tensor_grads[i]);
}

QkvRows<void*> LlamaModel::qkv_rows(const LayerActs& a) const {
  return packed_qkv(a.qkv, cfg_.num_attention_heads, cfg_.num_key_value_heads, cfg_.head_dim(),
                    storage().act_bytes);
}

void* LlamaModel::begin_gradient(int index) {
  const ParamTensor& t = tensors_[index];
  void* g = grad(t);
  // the tied table's gradient is zeroed once per backward: it gathers lm_head's and the embedding's
  if (memory_.fused_update && g != tied_grad_)
    backend_->zero(g, size_t(t.numel) * storage().grad_bytes);
  return g;
}

void LlamaModel::end_gradient(int index) { end_gradient(index, grad(tensors_[index])); }

void LlamaModel::end_gradient(int index, void* g) {
  const ParamTensor& t = tensors_[index];
  if (!memory_.fused_update) {  // the whole buffer is stored after the backward
    if (sink_) sink_->dense_ready(index, g);
    return;
  }
  GRASS_CHECK(sink_, "fused updates need a GradientSink");
  backend_->store_gradients(g, t.numel);
  sink_->dense_ready(index, g);
}

void LlamaModel::init_weights(uint64_t seed) {
  std::vector<float> host;
  for (size_t i = 0; i < tensors_.size(); i++) {
    const ParamTensor& t = tensors_[i];
    host.resize(size_t(t.hf_numel));
    if (t.is_norm) {
      std::fill(host.begin(), host.end(), 1.0f);
    } else {
      const uint64_t stream = derive_seed(seed, i);
      const double stddev = cfg_.initializer_range;
#pragma omp parallel for
      for (int64_t j = 0; j < t.hf_numel; j++) host[j] = float(stddev * normal(stream, uint64_t(j)));
    }
    write_tensor(t, host.data());
  }
}

void LlamaModel::zero_grads() {
  if (memory_.fused_update) return;  // each gradient's buffer is zeroed as it is formed
  backend_->zero(grads_, size_t(num_dense_grads()) * storage().grad_bytes);
}

double LlamaModel::flops_per_token() const {
  // Matmul weights: everything but the norms, and the embedding table unless it is also lm_head.
  int64_t matmul_params = 0;
  for (const auto& t : tensors_)
    if (!t.is_norm && (t.offset != off_embed_ || cfg_.tie_word_embeddings))
      matmul_params += t.hf_numel;
  const double attention = 12.0 * cfg_.num_hidden_layers * cfg_.hidden_size * T_;
  return 6.0 * double(matmul_params) + attention;
}

void LlamaModel::layer_forward(int l, int B, bool to_output) {
  Backend& be = *backend_;
  const int T = T_, C = cfg_.hidden_size, F = F_;
  const int NH = cfg_.num_attention_heads, NKV = cfg_.num_key_value_heads, HD = cfg_.head_dim();
  const int64_t N = int64_t(B) * T;
  const double eps = cfg_.rms_norm_eps, theta = cfg_.rope_theta;
  const LayerWeights w = layer_weights(l);
  LayerActs& a = acts_[l];
  // attention block: h = x + o_proj(attn(rope(q), rope(k), v)) on n1 = rmsnorm(x). The forward
  // made n1 with x; a checkpoint's recomputation starts from the stored x alone.
  if (!to_output) be.rmsnorm_forward(a.n1, a.rstd1, a.x_in, w.attn_norm, N, C, eps);
  // q_proj, k_proj and v_proj as one GEMM: their weights are adjacent, one [QD + 2 KVD, C] matrix
  be.linear_forward(a.qkv, a.n1, w.wq, N, C, (NH + 2 * NKV) * HD);
  // a sampled pass keeps rows of each input before the next layer overwrites the shared buffer,
  // a training pass the selected columns of those kept so
  const bool keep = sampled_pass_ && l < cfg_.num_hidden_layers - 1;
  const bool keep_cols = columns_pass_ && size_t(l) < columns_.size();
  if (keep) sampled_->keep(l, SampledInputs::N1, a.n1, N);
  if (keep_cols && columns_inputs_[SampledInputs::N1])
    keep_columns(l, SampledInputs::N1, a.n1, N, C);
  be.attention_forward(a.att, a.saved, qkv_rows(a), B, T, NH, NKV, HD, theta);  // RoPE inside
  // h = x + o_proj(att): the residual add in the GEMM (on the GPU its epilogue)
  be.linear_residual_forward(a.h, a.att, w.wo, a.x_in, N, NH * HD, C);
  if (x_in_ring_ && to_output)  // the forward's last read of x_in
    x_in_ring_->after_forward(l, N * C * storage().act_bytes);
  // MLP block: x_next = h + down(silu(gate(n2)) * up(n2)) on n2 = rmsnorm(h) (the previous
  // layer's draw from the shared n2 done first: it runs beside the compute)
  if (sampled_pass_) sampled_->before_write(SampledInputs::N2);
  be.rmsnorm_forward(a.n2, a.rstd2, a.h, w.mlp_norm, N, C, eps);
  // gate_proj and up_proj as one GEMM: their weights are adjacent, one [2F, C] matrix
  be.linear_forward(a.gu, a.n2, w.wgate, N, C, 2 * F);
  if (keep) sampled_->keep(l, SampledInputs::N2, a.n2, N);
  if (keep_cols && columns_inputs_[SampledInputs::N2])
    keep_columns(l, SampledInputs::N2, a.n2, N, C);
  if (sampled_pass_) sampled_->before_write(SampledInputs::Act);
  be.swiglu_forward(a.act, a.gu, N, F);
  if (keep) sampled_->keep(l, SampledInputs::Act, a.act, N);
  if (keep_cols && columns_inputs_[SampledInputs::Act])
    keep_columns(l, SampledInputs::Act, a.act, N, F);
  if (!to_output) return;
  // x_next = h + down(act), and its norm: the next layer's n1, or after the last layer the final
  // norm
  if (x_in_ring_ && l + 1 < cfg_.num_hidden_layers) x_in_ring_->before_write(l + 1);
  const StreamNorm next = stream_norm(l + 1);
  be.linear_residual_forward(next.x, a.act, w.wdown, a.h, N, F, C);
  if (sampled_pass_) sampled_->before_write(SampledInputs::N1);  // next.out: the shared n1
  be.rmsnorm_forward(next.out, next.rstd, next.x, next.w, N, C, eps);
}

LlamaModel::StreamNorm LlamaModel::stream_norm(int l) {
  if (l == cfg_.num_hidden_layers)
    return {x_out_, nf_, rstdf_, weight(tensors_[size_t(norm_index_)])};
  // the gain alone: it stays resident when layer l streams, which is not acquired yet
  return {acts_[l].x_in, acts_[l].n1, acts_[l].rstd1,
          weight(tensors_[size_t(layer_tensor_index(l, LayerTensor::AttnNorm))])};
}

double LlamaModel::forward(const int32_t* inputs, const int32_t* targets, int B) {
  if (memory_.forward_only) {
    begin_columns_pass(false);
    forward_to_head(inputs, targets, B);
    return forward_only_head(int64_t(B) * T_);
  }
  GRASS_CHECK(loss_valid_.empty() && losses_ready_.empty(),
              "forward() with other forwards' losses still to take");
  forward_async(inputs, targets, B);
  return take_losses().back();
}

double LlamaModel::forward_only_head(int64_t N) {
  const TraceRange range("head");
  const int C = cfg_.hidden_size, V = cfg_.vocab_size;
  const int bytes = storage().act_bytes;
  const int64_t chunks = (N + head_chunk_rows_ - 1) / head_chunk_rows_;
  for (int64_t c = 0; c < chunks; c++) {
    const int64_t r0 = c * head_chunk_rows_, rows = std::min(head_chunk_rows_, N - r0);
    backend_->head_forward(logits_, lse_ + r0, head_loss_sums_ + c, at(nf_, r0 * C, bytes),
                           lm_head_weights(), targets_ + r0, rows, C, V);
  }
  std::vector<double> sums(static_cast<size_t>(chunks));
  backend_->download(sums.data(), head_loss_sums_, sums.size() * sizeof(double));
  double sum = 0;
  for (const double s : sums) sum += s;
  return valid_ > 0 ? sum / double(valid_) : 0.0;
}

std::vector<float> LlamaModel::head_logits(const std::vector<int64_t>& rows) {
  GRASS_CHECK(B_ > 0, "head_logits() without a forward()");
  const int C = cfg_.hidden_size, V = cfg_.vocab_size;
  const int bytes = storage().act_bytes;
  std::vector<float> out(rows.size() * size_t(V));
  std::vector<uint16_t> bf16(bytes == 2 ? size_t(V) : 0);
  for (size_t i = 0; i < rows.size(); i++) {
    GRASS_CHECK(rows[i] >= 0 && rows[i] < int64_t(B_) * T_, "head_logits: row out of range");
    backend_->linear_forward(logits_, at(nf_, rows[i] * C, bytes), lm_head_weights(), 1, C, V);
    float* row = out.data() + i * size_t(V);
    if (bytes == 2) {
      backend_->download(bf16.data(), logits_, size_t(V) * 2);
      std::transform(bf16.begin(), bf16.end(), row, bf16_to_float);
    } else {
      backend_->download(row, logits_, size_t(V) * sizeof(float));
    }
  }
  B_ = 0;  // the logits buffer no longer holds the forward's logits (the CPU's backward reads them)
  return out;
}

void LlamaModel::read_losses() {
  std::vector<double> sums(loss_valid_.size());
  backend_->download(sums.data(), loss_sums_, sums.size() * sizeof(double));
  if (x_in_ring_) x_in_ring_->throw_if_failed();  // the losses came from the inputs it read
  for (size_t i = 0; i < sums.size(); i++)
    losses_ready_.push_back(loss_valid_[i] > 0 ? sums[i] / double(loss_valid_[i]) : 0.0);
  loss_valid_.clear();
}

void LlamaModel::discard_last_loss() {
  // a forward's slot is always unread: next_loss_sum reads the others when every slot is taken
  GRASS_CHECK(!loss_valid_.empty(), "discard_last_loss: no forward's loss to discard");
  loss_valid_.pop_back();
}

std::vector<double> LlamaModel::take_losses() {
  if (!loss_valid_.empty()) read_losses();
  return std::exchange(losses_ready_, {});
}

void LlamaModel::forward_async(const int32_t* inputs, const int32_t* targets, int B) {
  GRASS_CHECK(!memory_.forward_only, "a forward-only model computes through forward()");
  sampled_pass_ = false;
  begin_columns_pass(false);
  forward_to_head(inputs, targets, B);
  const TraceRange range("head");
  backend_->head_forward(logits_, lse_, next_loss_sum(), nf_, lm_head_weights(), targets_,
                         int64_t(B) * T_, cfg_.hidden_size, cfg_.vocab_size);
}

void LlamaModel::forward_backward(const int32_t* inputs, const int32_t* targets, int B,
                                  double loss_scale) {
  GRASS_CHECK(!memory_.forward_only, "a forward-only model has no backward");
  sampled_pass_ = sampled_ && sampled_->begin_pass();
  begin_columns_pass(true);
  forward_to_head(inputs, targets, B);
  const int64_t N = int64_t(B) * T_;
  const int C = cfg_.hidden_size, V = cfg_.vocab_size;
  if (valid_ == 0) {  // every target ignored: the loss is a constant, nothing to backpropagate
    backend_->head_forward(logits_, lse_, next_loss_sum(), nf_, lm_head_weights(), targets_, N, C, V);
    B_ = 0;
    return;
  }
  const TraceRange range("head");
  const int lm_head = begin_head_gradient();
  backend_->head_forward_backward(ws_.dnorm, begin_gradient(lm_head), logits_, lse_,
                                  next_loss_sum(), nf_, lm_head_weights(), targets_, N, C, V,
                                  loss_scale / double(valid_));
  backward_from_head(lm_head);
}

double* LlamaModel::next_loss_sum() {
  if (loss_valid_.size() == size_t(kLossSlots)) read_losses();  // every slot taken
  loss_valid_.push_back(valid_);
  return loss_sums_ + (loss_valid_.size() - 1);
}

void* LlamaModel::lm_head_weights() { return weight(tensors_[size_t(lm_head_index_)]); }

void LlamaModel::forward_to_head(const int32_t* inputs, const int32_t* targets, int B) {
  GRASS_CHECK(B >= 1 && B <= max_B_, "micro-batch larger than the activations allocated");
  const TraceRange range("forward");
  B_ = B;
  Backend& be = *backend_;
  const int T = T_, C = cfg_.hidden_size;
  const int64_t N = int64_t(B) * T;
  host_inputs_.assign(inputs, inputs + N);
  valid_ = std::count_if(targets, targets + N, [](int32_t t) { return t >= 0; });
  be.upload_async(inputs_, inputs, size_t(N) * sizeof(int32_t));
  be.upload_async(targets_, targets, size_t(N) * sizeof(int32_t));

  // The embedding enters the residual stream and is normalised here; every later norm of the
  // stream is made with the residual add before it (layer_forward).
  const StreamNorm first = stream_norm(0);
  if (x_in_ring_) x_in_ring_->before_write(0);
  be.embedding_forward(first.x, inputs_, weight(tensors_[0]), N, C);
  be.rmsnorm_forward(first.out, first.rstd, first.x, first.w, N, C, cfg_.rms_norm_eps);
  LayerStream* stream = store_.stream();
  for (int l = 0; l < cfg_.num_hidden_layers; l++) {
    const TraceRange layer_range(trace_names_[size_t(l)].c_str());
    const bool streamed = stream && stream->streams(l);
    if (streamed) stream->acquire(l, LayerStream::Direction::Forward);
    layer_forward(l, B, true);
    if (streamed) stream->release(l, false);
  }
}

void LlamaModel::backward(double loss_scale) {
  GRASS_CHECK(!memory_.forward_only, "a forward-only model has no backward");
  GRASS_CHECK(B_ > 0, "backward() without a forward()");
  if (valid_ == 0) return;  // every target ignored: the loss is a constant
  const TraceRange range("head backward");
  const int lm_head = begin_head_gradient();
  backend_->head_backward(ws_.dnorm, begin_gradient(lm_head), logits_, lse_, nf_,
                          lm_head_weights(), targets_, int64_t(B_) * T_, cfg_.hidden_size,
                          cfg_.vocab_size, loss_scale / double(valid_));
  backward_from_head(lm_head);
}

int LlamaModel::begin_head_gradient() {
  const int embed = 0;
  if (tied_grad_) backend_->zero(tied_grad_, size_t(tensors_[embed].numel) * storage().grad_bytes);
  return cfg_.tie_word_embeddings ? embed : int(tensors_.size()) - 1;
}

void LlamaModel::backward_from_head(int lm_head) {
  const TraceRange range("backward");
  Backend& be = *backend_;
  const int B = B_, T = T_, C = cfg_.hidden_size, F = F_;
  const int NH = cfg_.num_attention_heads, HD = cfg_.head_dim();
  const int64_t N = int64_t(B) * T;
  const double eps = cfg_.rms_norm_eps;
  const int L = cfg_.num_hidden_layers;
  // the final norm into the residual stream
  const int embed = 0, final_norm = int(tensors_.size()) - (cfg_.tie_word_embeddings ? 1 : 2);
  if (lm_head != embed) end_gradient(lm_head);  // a tied table waits for the embedding's part
  be.zero(ws_.dres, size_t(N) * C * storage().act_bytes);
  be.rmsnorm_backward(ws_.dres, begin_gradient(final_norm), ws_.dnorm, x_out_,
                      weight(tensors_[size_t(norm_index_)]), rstdf_, N, C);
  end_gradient(final_norm);

  LayerStream* stream = store_.stream();
  for (int l = L - 1; l >= 0; l--) {
    const TraceRange layer_range(trace_names_[size_t(L + l)].c_str());
    // a streamed layer is on the device from its recomputation to its last update
    const bool streamed = stream && stream->streams(l);
    if (streamed) stream->acquire(l, LayerStream::Direction::Backward);
    // The shared activations hold the last layer's after the forward; the others' are
    // recomputed: per layer from the layer's input, elementwise each just before it is read.
    const bool recompute = l < L - 1;
    if (x_in_ring_) x_in_ring_->before_backward(l, N * C * storage().act_bytes);
    if (memory_.checkpointing == Checkpointing::Layer && recompute) layer_forward(l, B, false);
    // A sampled pass reads the kept rows; otherwise shared inputs are recomputed (elementwise).
    const bool sampled = sampled_pass_ && recompute;
    const bool elementwise = (memory_.checkpointing == Checkpointing::Elementwise || sampled_) &&
                             recompute && !sampled;
    auto kept = [&](SampledInputs::Input input) {
      return sampled ? &sampled_->kept(l, input) : nullptr;
    };
    // an input in a shared buffer is made again unless its readers have its kept columns
    auto recomputed = [&](SampledInputs::Input input) {
      return elementwise || (recompute && columns_inputs_[input] &&
                             !(size_t(l) < columns_.size() && columns_[size_t(l)][input].kept));
    };
    const LayerWeights w = layer_weights(l);
    const LayerActs& a = acts_[l];
    // MLP block; dres holds d(x_next) and becomes d(h)
    if (recomputed(SampledInputs::Act)) be.swiglu_forward(a.act, a.gu, N, F);
    linear_backward(ws_.dact, false, l, LayerTensor::Down, w.wdown, ws_.dres, a.act, N, F, C,
                    kept(SampledInputs::Act),
                    kept_columns(l, SampledInputs::Act, LayerTensor::Down));
    if (recomputed(SampledInputs::N2))
      be.rmsnorm_forward(a.n2, a.rstd2, a.h, w.mlp_norm, N, C, eps);
    gate_up_backward(l, w, a, N, kept(SampledInputs::N2));
    be.rmsnorm_backward(ws_.dres, begin_gradient(layer_tensor_index(l, LayerTensor::MlpNorm)), ws_.dnorm, a.h,
                        w.mlp_norm, a.rstd2, N, C);
    end_gradient(layer_tensor_index(l, LayerTensor::MlpNorm));
    // attention block; dres becomes d(x_in)
    linear_backward(ws_.datt, false, l, LayerTensor::O, w.wo, ws_.dres, a.att, N, NH * HD, C);
    if (recomputed(SampledInputs::N1))
      be.rmsnorm_forward(a.n1, a.rstd1, a.x_in, w.attn_norm, N, C, eps);
    qkv_backward(l, w, a, B, kept(SampledInputs::N1));
    be.rmsnorm_backward(ws_.dres, begin_gradient(layer_tensor_index(l, LayerTensor::AttnNorm)), ws_.dnorm,
                        a.x_in, w.attn_norm, a.rstd1, N, C);
    end_gradient(layer_tensor_index(l, LayerTensor::AttnNorm));
    // fused: every update of its matrices is queued, and it goes back; deferred: it is unchanged
    if (streamed) stream->release(l, memory_.fused_update);
  }
  be.embedding_backward(begin_gradient(embed), ws_.dres, inputs_, host_inputs_.data(), N, C);
  end_gradient(embed);
  if (!memory_.fused_update) be.store_gradients(grads_, num_dense_grads());
  B_ = 0;  // on the CPU the logits now hold their gradient: a second backward() needs a forward()
  sampled_pass_ = false;
}

}  // namespace grass
