// LLaMA, written out by hand: the forward keeps what the backward needs, the backward walks the
// layers in reverse and accumulates every parameter gradient. fp32 on the CPU reference backend.
//
// Shapes: B micro-batch, T seq_len, N = B*T tokens, C hidden, F ffn, V vocab,
//         NH query heads, NKV kv heads, HD head dim.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/arena.h"
#include "model/storage.h"

namespace grass {

// One named parameter tensor inside the flat parameter buffer (and, at the same offset, inside
// the gradient and optimizer buffers). Names are Hugging Face's, so weights load and export as is.
struct ParamTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;       // in elements, into params()
  int64_t numel = 0;
  bool is_norm = false;     // RMSNorm gains: no weight decay
  int64_t grad_offset = 0;  // into grads(); -1 for a compressed (GRASS) tensor, which has none
  bool dense() const { return grad_offset >= 0; }
};

// Receives the weight gradient of the linear layers that have no dense gradient (GRASS targets):
// the upstream gradient and the layer input, from which it forms what it needs.
class CompressedGradSink {
 public:
  virtual ~CompressedGradSink() = default;
  // dy[N, out], x[N, in] of tensors()[tensor_index], a weight [out, in]
  virtual void accumulate(int tensor_index, const float* dy, const float* x, int64_t N) = 0;
};

// The HF tensor names of the GRASS targets ("q", "k", "v", "o", "gate", "up", "down") in every
// layer.
std::vector<std::string> grass_target_tensor_names(int num_layers,
                                                   const std::vector<std::string>& targets);

class LlamaModel {
 public:
  // Allocates weights and gradients, and activations for micro-batches of up to max_batch x seq_len.
  // Tensors named in `compressed` get no dense gradient: backward() hands their dy and x to the
  // sink set with set_compressed_sink() instead. `storage` sizes every buffer and says what is
  // bf16 (model/storage.h); with a master copy, master() holds the fp32 weights the optimizers
  // update and params() their bf16 rounding, which the forward reads.
  LlamaModel(const ModelConfig& cfg, Arena& arena, int max_batch, int seq_len,
             const std::vector<std::string>& compressed = {}, const Storage& storage = {});
  void set_compressed_sink(CompressedGradSink* sink) { sink_ = sink; }

  const ModelConfig& config() const { return cfg_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  const ParamTensor& tensor(const std::string& name) const;
  int64_t num_params() const { return num_params_; }
  int64_t num_dense_grads() const { return num_dense_grads_; }  // elements of grads()
  const Storage& storage() const { return storage_; }
  float* params() { return params_; }
  float* master() { return master_; }  // [num_params] fp32, or null without a master copy
  float* grads() { return grads_; }
  float* grad(const ParamTensor& t) { return t.dense() ? grads_ + t.grad_offset : nullptr; }
  int seq_len() const { return T_; }

  // HF-style initialisation: normal(0, initializer_range) for embeddings and projections, norm
  // gains 1. Each tensor draws its own counter-based stream, so the result is reproducible.
  void init_weights(uint64_t seed);
  // After the weights were written in fp32 (init, import, an optimizer step): the master copy,
  // if any, takes params() as they are, and params() is rounded to what the storage keeps.
  void weights_written();
  // params()[begin, begin + n) = the storage's rounding of master()[begin, begin + n) (mixed
  // precision), after an optimizer updated the master copy there.
  void round_params_from_master(int64_t begin, int64_t n);
  void zero_grads();

  // inputs, targets: [B, T] (a negative target is ignored). Returns the mean cross-entropy over
  // the valid targets; keeps the activations for backward(). logits() is valid until backward().
  double forward(const int32_t* inputs, const int32_t* targets, int B);
  // Adds d(loss_scale * mean loss)/dθ to grads(), for the batch of the last forward().
  void backward(double loss_scale);
  const float* logits() const { return logits_; }  // [B, T, V]
  int64_t valid_targets() const { return valid_; }

  // FLOPs of one forward+backward per token, counted as the engine does them: 6 per weight
  // element of every matmul, plus attention's 2·(2·T·C) per layer forward, times 3.
  double flops_per_token() const;

 private:
  struct LayerWeights {  // views into the flat parameter (or gradient) buffer
    float *attn_norm, *wq, *wk, *wv, *wo, *mlp_norm, *wgate, *wup, *wdown;
  };
  struct LayerActs {
    float* x_in;     // [N, C] residual stream entering the layer
    float* rstd1;    // [N]
    float* n1;       // [N, C] input_layernorm output
    float* q;        // [N, NH*HD] after RoPE
    float* k;        // [N, NKV*HD] after RoPE
    float* v;        // [N, NKV*HD]
    float* probs;    // [B, NH, T, T]
    float* att;      // [N, NH*HD] attention output, input of o_proj
    float* h;        // [N, C] residual stream after attention
    float* rstd2;    // [N]
    float* n2;       // [N, C] post_attention_layernorm output
    float* gate;     // [N, F]
    float* up;       // [N, F]
    float* act;      // [N, F] silu(gate) * up, input of down_proj
  };
  LayerWeights layer_view(float* base, int l) const;
  LayerWeights layer_grads(int l);  // null for compressed tensors
  void add_tensor(const std::string& name, std::vector<int64_t> shape, bool is_norm);
  // dx (overwritten, or accumulated) and the weight gradient of layer l's i-th tensor, y = x·wᵀ
  void linear_backward(float* dx, bool accumulate_dx, int l, int i, const float* w, float* dw,
                       const float* dy, const float* x, int64_t N, int in, int out);

  ModelConfig cfg_;
  int max_B_, T_;
  int B_ = 0;  // batch of the last forward
  std::vector<ParamTensor> tensors_;
  int64_t num_params_ = 0;
  int64_t num_dense_grads_ = 0;
  CompressedGradSink* sink_ = nullptr;
  Storage storage_;
  float* params_ = nullptr;
  float* master_ = nullptr;
  float* grads_ = nullptr;
  // offsets of the tensors that are not per layer
  int64_t off_embed_ = 0, off_norm_ = 0, off_lm_head_ = 0;
  std::vector<int64_t> off_layer_;  // offset of each layer's first tensor

  std::vector<LayerActs> acts_;
  int32_t* inputs_ = nullptr;   // [N]
  int32_t* targets_ = nullptr;  // [N]
  float* x_out_ = nullptr;      // [N, C] residual stream after the last layer
  float* rstdf_ = nullptr;      // [N]
  float* nf_ = nullptr;         // [N, C] final norm output
  float* logits_ = nullptr;     // [N, V]; holds dlogits after backward()
  float* lse_ = nullptr;        // [N]
  int64_t valid_ = 0;

  struct Workspace {  // backward scratch, reused by every layer
    float *proj;      // [N, C] o_proj / down_proj output before the residual add
    float *dres;      // [N, C] gradient of the residual stream
    float *dnorm;     // [N, C] gradient of a norm's output
    float *datt;      // [N, NH*HD]
    float *dq, *dk, *dv;
    float *scores;    // [B, NH, T, T]
    float *dact, *dgate, *dup;  // [N, F]
  } ws_{};
};

}  // namespace grass
