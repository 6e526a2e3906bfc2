// LLaMA, written out by hand: the forward keeps what the backward needs, the backward walks the
// layers in reverse and accumulates every parameter gradient. Every op goes through the Backend
// (kernels/backend.h), so the same code runs on the CPU reference and on the GPU; buffers are
// the backend's memory, typed by role (act, weight, grad) as backend.h describes.
//
// Shapes: B micro-batch, T seq_len, N = B*T tokens, C hidden, F ffn, V vocab,
//         NH query heads, NKV kv heads, HD head dim.
#pragma once
#include <array>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/storage.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/model/gradient_sink.h"
#include "src/model/parameter_set.h"
#include "src/model/sampled_inputs.h"
#include "src/model/weight_store.h"
#include "src/model/x_in_ring.h"

namespace grass {

// GRASS targets trained by columns (select_dim resolved to `cols`) at rank r: between refreshes
// their weight gradients read r columns of their input, x[:, σ]·ρ, and nothing else of it.
struct ColumnTargets {
  int rank = 0;
  std::vector<ProjectionTarget> targets;
};

// How the model holds its memory (all but `sampled` change memory and time, never the numbers
// computed).
struct ModelMemoryOptions {
  // What the backward recomputes instead of keeping from the forward. Elementwise: the layer's
  // two RMSNorm outputs and its SwiGLU product (n1, n2, act: 2C + F of a token's 8C + 3F kept
  // values with MHA), which only weight gradients read; each is made again by the forward's own
  // op from what the layer keeps (x_in, h, gate_up) just before it is read, into one buffer
  // that all layers share. Layer: all but each layer's input, the layer's forward run again,
  // one layer at a time. Neither changes a number computed.
  Checkpointing checkpointing = Checkpointing::None;
  // No gradient buffer for the whole model: each dense gradient is formed in a buffer the size of
  // the largest dense tensor and handed to the GradientSink (one backward per optimizer step).
  bool fused_update = false;
  // Store the ffn width padded to a multiple of kFfnRowMultiple: gate_proj and up_proj get zero
  // rows, down_proj and the MLP activations a row pitch of the padded width, so every MLP GEMM
  // sees 16-byte-aligned bf16 rows (an ffn of 5461, LLaMA-1B's, has 2-byte-aligned rows, which
  // keep cuBLAS off its fastest kernels). The pad stays zero and changes no number computed.
  bool pad_ffn = false;
  // Which kernels the GPU computes attention with (they size the backend's scratch).
  AttentionKernel attention = AttentionKernel::Grass;
  // The GPU head's chunk, rows of logits at a time (kernels/backend.h: head_rows; 0: 64 MiB of
  // them). It sizes the logits buffer; a run takes large_head_chunk_rows where its plan has room
  // (train/run_resolution.h). Changes the order the lm_head gradient is summed in; the CPU
  // computes the head in one chunk whatever it says.
  int64_t head_chunk_rows = 0;
  // With checkpointing None: n1, n2 and act kept as sampled token rows, shared in the forward as
  // with Elementwise (model/sampled_inputs.h). Changes the weight gradients of the steps that
  // draw (begin_sampled_step) to unbiased estimates; nothing else.
  SampledActivations sampled = {};
  // With checkpointing None and nothing sampled: an input that only these targets read (n1: q,
  // k, v; n2: gate, up; act: down: inputs_kept_as_columns) is kept for layers 0 .. L-2 as each
  // reader's selected columns, N x r, instead of N x width, and exists in full only in one
  // buffer the layers share. A pass that needs it whole (a refresh of one of its readers, or a
  // forward() then backward()) recomputes it there, as elementwise does. The same numbers.
  ColumnTargets columns = {};
  // With checkpointing Layer: where each layer's input waits for the backward (offload
  // .activations: model/x_in_ring.h), and the directory of the disk tier's file.
  ActivationOffload x_in_offload = ActivationOffload::None;
  std::string disk_dir;
  // offload.layers: these layers' matrices (ascending; not their norm gains) live in the host
  // tier and pass through layer_slots device slots (model/layer_stream.h). Needs fused updates
  // (each layer is updated while it is on the device) and no master copy. The same numbers.
  std::vector<int> streamed_layers;
  int layer_slots = LayerStream::kDefaultSlots;
  // Evaluation only: forward() and nothing else. No gradients, master copy or backward
  // workspace; one layer's activations shared by all layers (the residual stream in two buffers
  // taken in turn), and the head in chunks of rows (kForwardHeadElements logits at a time). Its
  // buffers are named "eval.*". The numbers are the training model's, to the rounding of a
  // different batch (another GEMM shape, the loss summed per chunk).
  bool forward_only = false;
};
// A forward-only model's head computes at most this many logits at a time.
constexpr int64_t kForwardHeadElements = int64_t(4) << 20;
constexpr int kFfnRowMultiple = 8;
// Which of a layer's inputs (SampledInputs::Input order: n1, n2, act) `memory` keeps as their
// readers' selected columns: each whose readers are all memory.columns targets and whose r
// columns together are fewer than its width, with checkpointing None and nothing sampled.
std::array<bool, 3> inputs_kept_as_columns(const ModelConfig& cfg,
                                           const ModelMemoryOptions& memory);
// Whether q_proj, k_proj and v_proj keep dense gradients when `projected` are the projection
// targets: then the backward forms dq, dk, dv packed, as one buffer (what the cuDNN attention's
// graphs are built for: Backend::prepare_attention).
bool qkv_gradients_packed(const std::vector<ProjectionTarget>& projected);
// `count` of a model's `layers` layers to stream, spread evenly: layer ⌊(2i + 1)·layers / (2·count)⌋
// for i < count (13B's 10 of 40: 2, 6, ..., 38), so the resident layers between two streamed
// ones hide each fetch.
std::vector<int> streamed_layers_for(int layers, int count);
// The ffn width a model with these options stores (cfg.intermediate_size, padded with pad_ffn).
int ffn_stored_width(const ModelConfig& cfg, const ModelMemoryOptions& memory);

// The model's parameters, in Hugging Face's names and the order of the flat weight buffer (C
// hidden_size, V vocab_size, NH·HD and NKV·HD the query and key/value widths, F intermediate_size;
// a linear layer's weight is [out, in], y = x·wᵀ):
//   model.embed_tokens.weight                 [V, C]
//   model.layers.{l}.<kLayerTensors[i]>       for l < num_hidden_layers, i in LayerTensor order
//   model.norm.weight                         [C]
//   lm_head.weight                            [V, C]   (absent with tie_word_embeddings: the
//                                                       head reads the embedding table)
// With pad_ffn the stored F is ffn_stored_width(); the pad is zero (model/parameter_set.h).
enum class LayerTensor { AttnNorm, Q, K, V, O, MlpNorm, Gate, Up, Down, Count };
// A layer tensor's dimensions, by name.
enum class Dim { None, C, QD, KVD, F };
struct LayerTensorSpec {
  LayerTensor id;
  const char* name;  // after "model.layers.{l}."
  Dim rows, cols;    // [rows, cols]; a norm's gain is [rows]
  bool is_norm;      // RMSNorm gains: no weight decay
};
inline constexpr LayerTensorSpec kLayerTensors[] = {
    {LayerTensor::AttnNorm, "input_layernorm.weight", Dim::C, Dim::None, true},          // [C]
    {LayerTensor::Q, "self_attn.q_proj.weight", Dim::QD, Dim::C, false},                 // [NH·HD, C]
    {LayerTensor::K, "self_attn.k_proj.weight", Dim::KVD, Dim::C, false},                // [NKV·HD, C]
    {LayerTensor::V, "self_attn.v_proj.weight", Dim::KVD, Dim::C, false},                // [NKV·HD, C]
    {LayerTensor::O, "self_attn.o_proj.weight", Dim::C, Dim::QD, false},                 // [C, NH·HD]
    {LayerTensor::MlpNorm, "post_attention_layernorm.weight", Dim::C, Dim::None, true},  // [C]
    {LayerTensor::Gate, "mlp.gate_proj.weight", Dim::F, Dim::C, false},                  // [F, C]
    {LayerTensor::Up, "mlp.up_proj.weight", Dim::F, Dim::C, false},  // [F, C], right after gate
    {LayerTensor::Down, "mlp.down_proj.weight", Dim::C, Dim::F, false},                  // [C, F]
};
constexpr int kTensorsPerLayer = int(LayerTensor::Count);
static_assert(std::size(kLayerTensors) == size_t(kTensorsPerLayer), "one entry per LayerTensor");
static_assert([] {
  for (int i = 0; i < kTensorsPerLayer; i++)
    if (int(kLayerTensors[i].id) != i) return false;
  return true;
}(), "kLayerTensors is indexed by LayerTensor");

// The HF tensor names of the projection targets in every layer.
std::vector<std::string> projection_tensor_names(int num_layers,
                                                 const std::vector<ProjectionTarget>& targets);

class LlamaModel {
 public:
  // Allocates weights and gradients, and activations for micro-batches of up to max_batch x seq_len.
  // Tensors named in `projected` get no dense gradient: backward() hands their dy and x to the
  // gradient sink instead. The backend's storage sizes every buffer and says what is bf16
  // (kernels/storage.h); with a master copy, master() holds the fp32 weights the optimizers update
  // and the weights their bf16 rounding, which the forward reads. The arena must hand out the
  // backend's memory.
  LlamaModel(const ModelConfig& cfg, Arena& arena, int max_batch, int seq_len,
             const std::vector<std::string>& projected = {},
             Backend& backend = default_cpu_backend(), ModelMemoryOptions memory = {});
  // A forward-only model (ModelMemoryOptions::forward_only) for micro-batches of up to max_batch
  // that computes with `weights_of`'s weights, on its backend (nothing is copied; it sees every
  // update): evaluation at a batch of its own beside a training model. It holds no scratch of
  // its own: the training model's serves it (same seq_len, attention kernels, RoPE), so
  // `weights_of` must outlive it.
  LlamaModel(LlamaModel& weights_of, Arena& arena, int max_batch);
  // Where the backward hands projected tensors' dy and x and, with fused updates, each dense
  // gradient as it completes (model/gradient_sink.h).
  void set_gradient_sink(GradientSink* sink) { sink_ = sink; }
  GradientSink* gradient_sink() const { return sink_; }
  // The projected tensors the backward can hand the sink together (GradientSink::stacks): per
  // layer, q, k and v when all three are projected, and gate and up when both are.
  struct TensorStack {
    int first, count;  // tensors first .. first + count - 1
  };
  std::vector<TensorStack> projected_stacks() const;
  const ModelMemoryOptions& memory_options() const { return memory_; }

  const ModelConfig& config() const { return cfg_; }
  const ParameterSet& tensors() const { return tensors_; }
  const ParamTensor& tensor(const std::string& name) const { return tensors_[tensors_.index_of(name)]; }
  int64_t num_params() const { return tensors_.num_params(); }  // as Hugging Face counts them
  int64_t num_stored_params() const { return tensors_.num_stored(); }  // elements of weights()
  int ffn_stored() const { return F_; }  // the ffn width as stored (padded with pad_ffn)
  int64_t num_dense_grads() const { return tensors_.num_dense_grads(); }  // elements of grads()
  Backend& backend() const { return *backend_; }
  const Storage& storage() const { return backend_->storage(); }
  // Every access to the weights goes through the store (model/weight_store.h), by tensor.
  WeightStore& weight_store() { return store_; }
  const WeightStore& weight_store() const { return store_; }
  // The backend's buffers: the resident weights [num_stored_params] (weight-typed) and the fp32
  // master copy (or null), which tests read whole; dense gradients [num_dense_grads] (grad-typed;
  // with fused updates, only the one being formed).
  void* weights() { return store_.resident(); }
  float* master() { return store_.master(); }
  void* grads_buffer() { return grads_; }
  void* grad(const ParamTensor& t);  // null for a projected tensor; fused: the shared buffer
  void* weight(const ParamTensor& t) { return store_.weight(t); }
  // What an optimizer update of t writes: its weights and, with a master copy, its fp32 master.
  WeightRef weight_ref(const ParamTensor& t) { return store_.ref(t); }
  int seq_len() const { return T_; }
  int max_batch() const { return max_B_; }

  // HF-style initialisation: normal(0, initializer_range) for embeddings and projections, norm
  // gains 1. Each tensor draws its own counter-based stream, so the result is reproducible.
  void init_weights(uint64_t seed);
  // Writes tensor t's weights from fp32 values on the host in Hugging Face's layout (hf_numel
  // of them), and the master copy, if any.
  void write_tensor(const ParamTensor& t, const float* host) { store_.write_hf(t, host); }
  // The weights the forward reads, in Hugging Face's layout.
  std::vector<float> read_tensor(const ParamTensor& t) const { return store_.read_hf(t); }
  void zero_grads();

  // inputs, targets: [B, T] (a negative target is ignored). Queues the forward and keeps the
  // activations for backward(); the host does not wait for the device. The mean cross-entropy
  // over the valid targets comes from take_losses(). logits() is valid until backward().
  void forward_async(const int32_t* inputs, const int32_t* targets, int B);
  // The mean losses of the forwards since the last call, in order: one wait for all of them.
  std::vector<double> take_losses();
  // Forgets the last forward's loss (a refresh pass's: train_step), without reading it.
  void discard_last_loss();
  // forward_async() and its loss (nothing else may be queued): for evaluation and tests.
  double forward(const int32_t* inputs, const int32_t* targets, int B);
  // The logits of `rows` (b·T + t) of the last forward, fp32 on the host, rows.size() x V: each
  // row's final-norm output through lm_head by the head's GEMM, in the head's storage. For
  // sampling (model/generate.h), since the GPU's head keeps no logits past its loss. It
  // overwrites the logits buffer, so backward() then needs a new forward().
  std::vector<float> head_logits(const std::vector<int64_t>& rows);
  // Adds d(loss_scale * mean loss)/dθ to the gradients, for the batch of the last forward().
  void backward(double loss_scale);
  // Training's micro-batch: forward_async() then backward(loss_scale), with the head's forward
  // and backward in one pass (Backend::head_forward_backward: the GPU computes the logits once).
  // The same numbers as the two calls.
  void forward_backward(const int32_t* inputs, const int32_t* targets, int B, double loss_scale);
  int64_t valid_targets() const { return valid_; }
  // offload.activations' ring of layer inputs, or null.
  const XInRing* x_in_ring() const { return x_in_ring_.get(); }
  // Sampled activations (ModelMemoryOptions::sampled; nothing without them): the draws of the
  // training micro-batches of `step` on this rank, or none when `exact` (a refresh step). Before
  // each step's first forward_backward; forward() and backward() never draw.
  void begin_sampled_step(uint64_t seed, int64_t step, int rank, bool exact);

  // FLOPs of one forward+backward per token, counted as the engine does them: 6 per weight
  // element of every matmul, plus attention's 2·(2·T·C) per layer forward, times 3.
  double flops_per_token() const;

 private:
  friend struct ModelInternals;  // tests/test_util.h: the buffers tests read on the CPU backend
  struct LayerWeights {  // where the compute reads layer l's tensors (WeightStore::weight)
    void *attn_norm, *wq, *wk, *wv, *wo, *mlp_norm, *wgate, *wup, *wdown;
  };
  struct LayerActs {  // act-typed unless said otherwise
    void* x_in;      // [N, C] residual stream entering the layer
    float* rstd1;    // [N] fp32
    void* n1;        // [N, C] input_layernorm output
    void* qkv;       // [N, NH*HD + 2*NKV*HD] q, k and v of each row (one GEMM of the stacked
                     // weights), before RoPE (the attention op applies it)
    void* saved;     // what attention keeps for its backward (attention_saved_bytes)
    void* att;       // [N, NH*HD] attention output, input of o_proj
    void* h;         // [N, C] residual stream after attention
    float* rstd2;    // [N] fp32
    void* n2;        // [N, C] post_attention_layernorm output
    void* gu;        // [N, 2F] gate_proj then up_proj outputs of each row (one GEMM of the
                     // stacked weights; F as stored: ffn_stored())
    void* act;       // [N, F] silu(gate) * up, input of down_proj
  };
  // The one place the forward and backward get a layer's weights.
  LayerWeights layer_weights(int l);
  // The forward up to the final norm's output nf_ (valid_ counted, tokens sent).
  void forward_to_head(const int32_t* inputs, const int32_t* targets, int B);
  void* lm_head_weights();
  // The slot the next head writes its loss sum to (valid_ recorded with it).
  double* next_loss_sum();
  // Before the head's backward: the tied table's gradient zeroed; returns lm_head's index.
  int begin_head_gradient();
  // After it (ws_.dnorm = d loss / d nf, lm_head's gradient formed): the rest of the backward.
  void backward_from_head(int lm_head);
  // The constructors' work: weights_of null, the model's own weights.
  void build(Arena& arena, const std::vector<std::string>& projected, LlamaModel* weights_of);
  void allocate_activations(Arena& arena, int64_t N, int NH);
  // A forward-only model's head: logits in chunks of head rows, each chunk's loss summed into its
  // own fp64 (head_loss_sums_), the chunks added on the host in order. Returns the mean.
  double forward_only_head(int64_t N);
  // Layer l's forward from acts_[l].x_in and its norm n1, to the next layer's x_in and n1 (or
  // x_out_ and nf_). `to_output` false is the recomputation of activation checkpointing: it makes
  // n1 from x_in and stops after what the backward reads (down_proj and the residual are not
  // needed).
  void layer_forward(int l, int B, bool to_output);
  // The residual stream entering layer l (l = num_hidden_layers: leaving the last layer) and the
  // RMSNorm that reads it, layer l's input_layernorm or the final norm.
  struct StreamNorm {
    void* x;        // [N, C]
    void* out;      // [N, C]
    float* rstd;    // [N] fp32
    const void* w;  // [C]
  };
  StreamNorm stream_norm(int l);
  // dx (overwritten, or accumulated) and the weight gradient of layer l's tensor t, y = x·wᵀ
  // With `kept` (a sampled pass), dx from every row and the weight gradient estimated from the
  // kept rows of x.
  // With `xs` (the columns the forward kept of x: keep_columns), a projected tensor's gradient
  // reads xs instead of x.
  void linear_backward(void* dx, bool accumulate_dx, int l, LayerTensor t, const void* w,
                       const void* dy, const void* x, int64_t N, int in, int out,
                       const SampledInputs::Kept* kept = nullptr, const void* xs = nullptr);
  // Layer l's input `input` (x [N, width]) kept as its readers' selected columns, when every
  // reader's are fixed this step (GradientSink::selected_columns); otherwise nothing is kept and
  // the backward recomputes the input.
  void keep_columns(int l, SampledInputs::Input input, const void* x, int64_t N, int width);
  // A forward begins: a training one keeps selected columns; none are kept from before.
  void begin_columns_pass(bool training);
  // The columns of x kept for layer l's `reader` this pass, or null (it reads x whole).
  const void* kept_columns(int l, SampledInputs::Input input, LayerTensor reader) const;
  // Where tensors_[index]'s gradient is to be formed (fused: the shared buffer, zeroed), and the
  // signal that it is complete (fused: rounded to its storage and handed to the sink's
  // dense_ready).
  void* begin_gradient(int index);
  void end_gradient(int index);
  void end_gradient(int index, void* g);  // the gradient formed at g (fused: not at the buffer's start)
  // gate_proj's and up_proj's backward from d(act) in ws_.dact: dx into ws_.dnorm, their weight
  // gradients (or their projected optimizers' accumulation; with `kept`, a sampled pass's).
  void gate_up_backward(int l, const LayerWeights& w, const LayerActs& a, int64_t N,
                        const SampledInputs::Kept* kept);
  // attention's backward from d(att) in ws_.datt, then q_proj's, k_proj's and v_proj's: dx into
  // ws_.dnorm, their weight gradients as gate_up_backward's.
  void qkv_backward(int l, const LayerWeights& w, const LayerActs& a, int B,
                    const SampledInputs::Kept* kept);
  // Whether layer l's `count` tensors from `first` all have dense gradients; then their backward
  // is one stacked_backward.
  bool stacked_dense(int l, LayerTensor first, int count) const;
  // Whether they are all projected and the sink forms their gradients together this pass (not
  // in a sampled pass, `kept`): then their dy is packed as the dense tensors' is, dx is one GEMM
  // with their stacked weights, and the sink gets projected_stack().
  bool stacked_projected(int l, LayerTensor first, int count,
                         const SampledInputs::Kept* kept) const;
  // The weight gradients of `count` adjacent dense tensors from `first` as one [Σ out, in] matrix
  // w, and dx (overwritten) from dy [N, Σ out], packed as the forward's one GEMM wrote y: one dx
  // GEMM and one weight-gradient GEMM into gradients that lie next to each other (with `kept`, the
  // weight gradients from the kept rows alone).
  void stacked_backward(void* dx, int l, LayerTensor first, int count, const void* w,
                        const void* dy, const void* x, int64_t N, int in, int out,
                        const SampledInputs::Kept* kept);
  // a.qkv as attention's q, k and v
  QkvRows<void*> qkv_rows(const LayerActs& a) const;

  ModelConfig cfg_;
  int max_B_, T_;
  int F_;  // ffn width as stored
  int B_ = 0;  // batch of the last forward
  ParameterSet tensors_;
  GradientSink* sink_ = nullptr;
  ModelMemoryOptions memory_;
  Backend* backend_;
  WeightStore store_;
  void* grads_ = nullptr;
  void* tied_grad_ = nullptr;  // fused with tied embeddings: the table's gradient [V, C], held
                               // from the lm_head's backward to the embedding's
  int64_t off_embed_ = 0;  // the embedding table's offset
  int norm_index_ = 0, lm_head_index_ = 0;  // the final norm's and lm_head's tensors (tied: the
                                            // embedding's)

  // Checkpointing per layer: every layer has its own x_in and shares the rest with the others;
  // elementwise and sampled: the layers share n1, n2 and act.
  std::vector<LayerActs> acts_;
  std::unique_ptr<XInRing> x_in_ring_;  // offload.activations: the layers' x_in; null: none
  std::unique_ptr<SampledInputs> sampled_;  // the kept rows of layers 0 .. L-2; null: none
  bool sampled_pass_ = false;               // the last forward drew rows: its backward uses them
  // Selected columns (ModelMemoryOptions::columns): which inputs are kept so, and per layer
  // 0 .. L-2 and input, each reader's xs [N, r] (readers in LayerTensor order) and whether this
  // pass's forward kept them.
  struct KeptColumns {
    void* xs[3] = {};
    bool kept = false;
  };
  std::array<bool, 3> columns_inputs_ = {};
  std::vector<std::array<KeptColumns, 3>> columns_;
  bool columns_pass_ = false;  // a training forward: it keeps columns for its backward
  int32_t* inputs_ = nullptr;   // [N] backend memory
  int32_t* targets_ = nullptr;  // [N] backend memory
  std::vector<int32_t> host_inputs_;  // the same on the host
  void* x_out_ = nullptr;       // [N, C] residual stream after the last layer
  float* rstdf_ = nullptr;      // [N]
  void* nf_ = nullptr;          // [N, C] final norm output
  void* logits_ = nullptr;      // [head_rows, V]; on the CPU, dlogits after backward()
  float* lse_ = nullptr;        // [N]
  void* forward_stream_[2] = {};    // forward-only: the residual stream, layer l's input in [l % 2]
  int64_t head_chunk_rows_ = 0;     // forward-only: rows of logits_ and of each head call
  double* head_loss_sums_ = nullptr;  // forward-only: one fp64 per chunk of head rows
  int64_t valid_ = 0;           // valid targets of the last forward
  // The summed loss of each queued forward (backend memory, fp64 [kLossSlots]) and, on the host,
  // its valid targets; full slots are read into losses_ready_ (means) when more are needed.
  static constexpr int kLossSlots = 64;
  double* loss_sums_ = nullptr;
  std::vector<int64_t> loss_valid_;
  std::vector<double> losses_ready_;
  void read_losses();

  struct Workspace {  // backward scratch, reused by every layer (act-typed)
    void *dres;       // [N, C] gradient of the residual stream
    void *dnorm;      // [N, C] gradient of a norm's output
    void *datt;       // [N, NH*HD]
    void *dqkv;       // [N, NH*HD + 2*NKV*HD] dq, dk and dv: three buffers, or packed as qkv
                      // (qkv_backward)
    void *dact;  // [N, F]
    void *dgu;   // [N, 2F] dgate and dup: two [N, F] halves, or packed as gu (gate_up_backward)
  } ws_{};
  // The backend's own scratch for this model's shapes, in use while the model lives.
  std::unique_ptr<ScratchLease> backend_scratch_;
  std::vector<std::string> trace_names_;  // NVTX: "layer 3 forward", then the backward ones
};

}  // namespace grass
