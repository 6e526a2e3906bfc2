#include "src/train/run_resolution.h"

#include <array>
#include <string>

#include "kernels/backend.h"
#include "src/config/json_check.h"
#include "src/core/error.h"
#include "src/core/format.h"
#include "src/train/memory_plan.h"

namespace grass {

namespace {

// The file a run's error line names.
std::string source_of(const RunConfig& cfg) {
  return cfg.source.empty() ? std::string("run config") : cfg.source;
}

// fp32 and bf16 moments are the precisions' own (bf16 in pure bf16, else fp32); asking for the
// other is refused rather than ignored.
void check_state_dtype(const RunConfig& cfg, const Storage& storage) {
  const StateDtype dtype = cfg.optimizer.state_dtype;
  if (dtype == StateDtype::Auto || dtype == StateDtype::Q8) return;
  const StateDtype own = storage.pure_bf16() ? StateDtype::Bf16 : StateDtype::Fp32;
  if (dtype == own) return;
  throw UserError(source_of(cfg) +
                  ": optimizer.state_dtype \"" + name_of(dtype) + "\": a " +
                  (storage.pure_bf16() ? "bf16" : storage.master ? "bf16-mixed" : "fp32") +
                  " run keeps " + name_of(own) + " moments; use \"auto\", \"" + name_of(own) +
                  "\" or \"q8\" (other pairings are not built)");
}

// precision "auto" is bf16-mixed on a GPU: its master copy does not stream.
void check_streamed_layers(const RunConfig& cfg, const Storage& storage) {
  if ((cfg.offload.layers == 0 && !cfg.offload.layers_auto) || !storage.master) return;
  throw UserError(source_of(cfg) +
                  ": offload.layers: precision \"auto\" is bf16-mixed on the GPU, whose fp32 "
                  "master copy does not stream yet; set precision \"bf16\" (pure bf16, the 13B "
                  "mode)");
}

// "on" promises a saving: refused where no input is kept as columns.
void check_selected_columns(const RunConfig& cfg, const ModelMemoryOptions& memory) {
  if (cfg.activations.selected_columns != Switch::On) return;
  const std::array<bool, 3> kept = inputs_kept_as_columns(cfg.model, memory);
  if (kept[0] || kept[1] || kept[2]) return;
  throw UserError(source_of(cfg) +
                  ": activations.selected_columns \"on\": no layer input of this run is read "
                  "only by GRASS targets that select columns, fewer together than its width (it "
                  "needs optimizer \"grass\", activation_checkpointing \"none\", no sampling, "
                  "and gate+up, q+k+v or down among the targets with select_dim \"cols\", or "
                  "\"auto\" where the input side is the smaller)");
}

// The GPU's kernels take fewer shapes than the CPU's (its attention's head dims, its RMSNorm
// backward's widest row): refused before anything is written, not at the first step.
void check_gpu_shapes(const RunConfig& cfg, const Storage& storage) {
  if (!storage.cuda) return;
  const ModelConfig& m = cfg.model;
  const auto where = [&](const std::string& key) {
    return cfg.model_path.empty() ? source_of(cfg) + ": model." + key
                                  : cfg.model_path + ": " + key;
  };
  const std::string or_cpu = ", or run on the CPU (device \"cpu\")";
  if (!cuda_attention_takes_head_dim(m.head_dim()))
    throw UserError(where("num_attention_heads") +
                    ": head_dim = hidden_size / num_attention_heads = " +
                    std::to_string(m.hidden_size) + " / " + std::to_string(m.num_attention_heads) +
                    " = " + std::to_string(m.head_dim()) +
                    "; the CUDA backend's attention takes a multiple of 8 from 8 to " +
                    std::to_string(kCudaMaxHeadDim) +
                    " (the CPU backend any even one): change the heads" + or_cpu);
  if (m.hidden_size > kCudaMaxHiddenSize)
    throw UserError(where("hidden_size") + ": " + std::to_string(m.hidden_size) +
                    " is wider than the " + std::to_string(kCudaMaxHiddenSize) +
                    " the CUDA backend's RMSNorm backward takes (a row's partials in 48 KiB of "
                    "shared memory): use a narrower model" + or_cpu);
}

}  // namespace

ResolvedRun resolve(const RunConfig& cfg, bool gpu_usable) {
  const bool cuda = cfg.device == DeviceChoice::Cuda ||
                    (cfg.device == DeviceChoice::Auto && gpu_usable &&
                     cfg.precision != PrecisionChoice::F32);
  const Storage storage = storage_for(cfg.precision, cuda);
  check_state_dtype(cfg, storage);
  check_streamed_layers(cfg, storage);
  check_gpu_shapes(cfg, storage);
  const ModelMemoryOptions memory = model_memory_options(cfg, storage);
  check_selected_columns(cfg, memory);
  return {storage, memory, attention_request(cfg, storage)};
}

Storage storage_for(PrecisionChoice precision, bool cuda) {
  switch (precision) {
    case PrecisionChoice::F32: return make_storage(Precision::F32, cuda);
    case PrecisionChoice::Bf16Mixed: return make_storage(Precision::Bf16Mixed, cuda);
    case PrecisionChoice::Bf16: return make_storage(Precision::Bf16, cuda);
    case PrecisionChoice::Auto: break;
  }
  return make_storage(cuda ? Precision::Bf16Mixed : Precision::F32, cuda);
}

ModelMemoryOptions model_memory_options(const RunConfig& cfg, const Storage& storage) {
  ModelMemoryOptions options;
  options.checkpointing = cfg.activation_checkpointing;
  options.sampled = cfg.activations;
  options.fused_update = cfg.fused_update == Switch::On ||
                         (cfg.fused_update == Switch::Auto && cfg.micro_batches_per_rank() == 1 &&
                          // streamed layers: updated in the backward that brought them, not
                          // fetched again for a pass of their own
                          (storage.pure_bf16() || cfg.offload.layers > 0 || cfg.offload.layers_auto));
  options.streamed_layers = streamed_layers_for(cfg.model.num_hidden_layers, cfg.offload.layers);
  options.layer_slots = cfg.offload.layer_slots;
  options.pad_ffn = cfg.pad_ffn == Switch::On || (cfg.pad_ffn == Switch::Auto && storage.cuda);
  options.attention = !storage.cuda                           ? AttentionKernel::Grass
                      : cfg.attention == AttentionChoice::Cudnn ? AttentionKernel::Cudnn
                      : cfg.attention == AttentionChoice::Mma   ? AttentionKernel::Mma
                                                                : AttentionKernel::Grass;
  options.head_chunk_rows = planned_head_chunk_rows(cfg, storage);
  options.x_in_offload = cfg.offload.activations;
  options.disk_dir = cfg.offload.disk_dir.empty() ? cfg.out_dir : cfg.offload.disk_dir;
  const ProjectionConfig& g = cfg.optimizer.projection;
  if (cfg.optimizer.kind == OptimizerKind::Grass &&
      cfg.activations.selected_columns != Switch::Off) {
    options.columns.rank = g.rank;
    for (const ProjectionTarget target : g.targets) {
      const auto [out, in] = cfg.model.linear_shape(target);
      if (!projects_rows(OptimizerKind::Grass, g, out, in))
        options.columns.targets.push_back(target);
    }
  }
  return options;
}

namespace {
AttentionChoice choice_of(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::Cudnn: return AttentionChoice::Cudnn;
    case AttentionKernel::Mma: return AttentionChoice::Mma;
    default: return AttentionChoice::Grass;
  }
}
}  // namespace

AttentionRequest attention_request(const RunConfig& cfg, const Storage& storage) {
  AttentionRequest request;
  request.kernel = model_memory_options(cfg, storage).attention;
  if (cfg.attention != AttentionChoice::Auto || !storage.cuda) return request;
  if (!cfg.val_files.empty() && cfg.eval_batch_size > cfg.micro_batch_size) {
    request.why_not_cudnn = "eval_batch_size " + std::to_string(cfg.eval_batch_size) +
                            " is above micro_batch_size " + std::to_string(cfg.micro_batch_size) +
                            ", and cuDNN's graphs are built for the micro-batch";
    return request;
  }
  request.kernel = AttentionKernel::Cudnn;
  request.fall_back_to_grass = true;
  return request;
}

AttentionChoice planned_attention(const RunConfig& cfg, const Storage& storage) {
  if (cfg.attention != AttentionChoice::Auto) return cfg.attention;
  return attention_request(cfg, storage).fall_back_to_grass ? AttentionChoice::Cudnn
                                                            : AttentionChoice::Grass;
}

RunConfig with_attention(const RunConfig& cfg, AttentionKernel kernel) {
  RunConfig out = cfg;
  out.attention = choice_of(kernel);
  return out;
}

const char* name_of(AttentionKernel kernel) { return name_of(choice_of(kernel)); }

std::string cudnn_version_name(int64_t version) {
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

std::string describe_attention(AttentionChoice asked, const AttentionInUse& in_use) {
  const bool automatic = asked == AttentionChoice::Auto;
  if (in_use.kernel == AttentionKernel::Cudnn)
    return "cuDNN " + cudnn_version_name(in_use.cudnn_version) +
           "'s fused flash attention (RoPE applied to q, k in place)" +
           (automatic ? ", taken by \"auto\"" : "");
  if (in_use.kernel == AttentionKernel::Mma)
    return "the engine's FA2-style kernels (mma.sync; RoPE applied to q, k in place)";
  if (automatic && !in_use.why_not_cudnn.empty())
    return "the engine's kernels (\"auto\" did not take cuDNN's: " + in_use.why_not_cudnn + ")";
  return "the engine's kernels";
}

int64_t planned_head_chunk_rows(const RunConfig& cfg, const Storage& storage) {
  if (!storage.cuda) return 0;
  const int V = cfg.model.vocab_size;
  const int64_t N = int64_t(cfg.micro_batch_size) * cfg.seq_len, large = large_head_chunk_rows(V);
  // Where the larger chunk holds no more rows, the plans are the same: no need to make one.
  if (cfg.memory_limit <= 0 || head_rows(storage, N, V, large) == head_rows(storage, N, V))
    return large;
  RunConfig unlimited = cfg;  // planned with the larger chunk
  unlimited.memory_limit = 0;
  // Only where a card of memory_limit would hold it: the chooser of offload "auto" and grass mem's
  // verdict plan against that room, so the chunk never takes what they kept for the card.
  return plan_memory(unlimited, storage).total <= cfg.memory_limit - beyond_plan_bytes(storage)
             ? large
             : 0;
}

std::string describe_head(const RunConfig& cfg, const Storage& storage,
                          const ModelMemoryOptions& memory) {
  const int V = cfg.model.vocab_size;
  const int64_t N = int64_t(cfg.micro_batch_size) * cfg.seq_len;
  const int64_t rows = head_rows(storage, N, V, memory.head_chunk_rows);
  const std::string logits = format_bytes(rows * V * storage.act_bytes);
  if (rows == N) return "logits of the whole micro-batch at once (" + logits + ")";
  std::string out = "logits " + std::to_string(rows) + " rows at a time (" + logits + ")";
  const int64_t large = head_rows(storage, N, V, large_head_chunk_rows(V));
  if (large > rows)  // the run took the smaller chunk: memory_limit has no room for the larger
    out += "; " + std::to_string(large) + " would not fit memory_limit less the " +
           format_bytes(beyond_plan_bytes(storage)) + " a card holds beyond the plan";
  return out;
}

std::string activations_kept(const ModelConfig& model, const ModelMemoryOptions& memory) {
  if (memory.sampled.on())
    return "kept for the backward, the inputs only weight gradients read as " +
           json_check::format_number(memory.sampled.keep * 100) + "% of their token rows (" +
           name_of(memory.sampled.sample) + ", exact at refresh steps)";
  const std::array<bool, 3> columns = inputs_kept_as_columns(model, memory);
  if (columns[0] || columns[1] || columns[2]) {
    std::string inputs;
    const char* names[3] = {"n1 (q, k, v)", "n2 (gate, up)", "act (down)"};
    for (int i = 0; i < 3; i++)
      if (columns[size_t(i)]) inputs += (inputs.empty() ? "" : ", ") + std::string(names[i]);
    return "kept for the backward; " + inputs + " as the GRASS targets' selected columns " +
           "(exact; whole at their refresh steps)";
  }
  switch (memory.checkpointing) {
    case Checkpointing::None: return "kept for the backward";
    case Checkpointing::Elementwise:
      return "kept for the backward, except the norms' and SwiGLU's outputs (recomputed)";
    case Checkpointing::Layer: return "checkpointed per layer (recomputed in the backward)";
  }
  return "";
}

}  // namespace grass
