// The run config's choices: one enum each, and one name table each giving the names run configs
// use. Parsing, printing, to_json and error messages ("unknown optimizer \"gras\" (supported:
// \"adamw\", \"grass\")") all read the same table.
#pragma once
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace grass {

enum class OptimizerKind { AdamW, Grass, GaLore, Flora };
// GRASS, GaLore and FLORA train their targets in a rank-r projection (ProjectionConfig).
inline bool is_projected(OptimizerKind kind) { return kind != OptimizerKind::AdamW; }
// GRASS's selection rules (docs/grass.md)
enum class Selection { TopR, Multinomial, MultinomialNR, Uniform, UniformNR };
enum class SelectDim { Auto, Rows, Cols };
// GaLore's refresh: "auto" (randomized on a GPU, exact on the CPU) | "exact" (LAPACK's SVD) |
// "randomized" (a range finder: GEMMs, QRs and a small eigenproblem, on the run's device).
enum class GaloreSvd { Auto, Exact, Randomized };
// How the randomized refresh solves its targets' k x k eigenproblems: "none" (one call for each,
// as the backward reaches the target) | "layer" (in a pass of its own over the first micro-batch
// before the step's backward, one batched call for each layer's targets).
enum class GaloreSvdBatch { None, Layer };
// optimizer.state_dtype, how the moments are stored: "auto" (the precision's: bf16 in pure bf16,
// else fp32) | "fp32" | "bf16" | "q8" (8-bit blockwise codes with an fp32 absmax per block,
// kernels/quant8.h).
enum class StateDtype { Auto, Fp32, Bf16, Q8 };
// optimizer.state_blocking, how q8 cuts a projected state into blocks (kernels/quant8.h):
// "flat" (bitsandbytes' runs of the flat array) | "feature" (down one input feature's entries).
enum class StateBlocking { Flat, Feature };

// The linear layers of a LLaMA layer that a projected optimizer can train.
enum class ProjectionTarget { Q, K, V, O, Gate, Up, Down };
// precision: "auto" (bf16-mixed on a GPU, fp32 on the CPU) | "fp32" | "bf16-mixed" | "bf16"; the
// backends see the resolved Precision (kernels/storage.h) only (train/run_resolution.h).
enum class PrecisionChoice { Auto, F32, Bf16Mixed, Bf16 };
// Where a run computes: "auto" (the GPU when one is usable) | "cpu" | "cuda".
enum class DeviceChoice { Auto, Cpu, Cuda };
// activation_checkpointing: keep every activation ("none"); recompute the outputs of the
// elementwise ops that only weight gradients read, the two norms' and SwiGLU's ("elementwise");
// or keep only each layer's input and recompute the rest of the layer ("layer").
enum class Checkpointing { None, Elementwise, Layer };
// activations.sample: keep the inputs that only weight gradients read exactly ("none") or as a
// sample of their token rows (model/row_sampling.h): column-row sampling ("crs"), its
// winner-take-all variant ("wta-crs") or RAD-style Bernoulli masks ("bernoulli").
enum class ActivationSample { None, Crs, WtaCrs, Bernoulli };
// offload.activations, where each layer's input waits for the backward under per-layer
// checkpointing: on the device ("none"), in the host tier ("host") or in a file ring in
// offload.disk_dir ("disk").
enum class ActivationOffload { None, Host, Disk };
// fused_update, pad_ffn: "auto" (decided by the backend and precision) | "on" | "off".
enum class Switch { Auto, On, Off };
// attention: cuDNN's fused flash attention where it works on the GPU, else the engine's own kernels
// ("auto"); the engine's own ("grass"); cuDNN's ("cudnn"); the engine's FA2-style kernels ("mma",
// GPU only; "auto" does not pick them until a GPU has measured them faster).
enum class AttentionChoice { Auto, Grass, Cudnn, Mma };
// schedule.name: warmup + cosine decay ("cosine") or a constant rate ("constant").
enum class ScheduleKind { Cosine, Constant };

template <typename E>
struct ChoiceName {
  E value;
  const char* name;
};

// The name table of enum E, one per enum above (choices.cpp).
template <typename E>
std::span<const ChoiceName<E>> choice_names();
template <>
std::span<const ChoiceName<OptimizerKind>> choice_names();
template <>
std::span<const ChoiceName<Selection>> choice_names();
template <>
std::span<const ChoiceName<SelectDim>> choice_names();
template <>
std::span<const ChoiceName<GaloreSvd>> choice_names();
template <>
std::span<const ChoiceName<GaloreSvdBatch>> choice_names();
template <>
std::span<const ChoiceName<StateDtype>> choice_names();
template <>
std::span<const ChoiceName<StateBlocking>> choice_names();
template <>
std::span<const ChoiceName<ProjectionTarget>> choice_names();
template <>
std::span<const ChoiceName<PrecisionChoice>> choice_names();
template <>
std::span<const ChoiceName<DeviceChoice>> choice_names();
template <>
std::span<const ChoiceName<Checkpointing>> choice_names();
template <>
std::span<const ChoiceName<ActivationSample>> choice_names();
template <>
std::span<const ChoiceName<ActivationOffload>> choice_names();
template <>
std::span<const ChoiceName<Switch>> choice_names();
template <>
std::span<const ChoiceName<AttentionChoice>> choice_names();
template <>
std::span<const ChoiceName<ScheduleKind>> choice_names();

template <typename E>
const char* name_of(E value) {
  for (const ChoiceName<E>& c : choice_names<E>())
    if (c.value == value) return c.name;
  return "?";
}

template <typename E>
std::optional<E> choice_from_name(std::string_view name) {
  for (const ChoiceName<E>& c : choice_names<E>())
    if (name == c.name) return c.value;
  return std::nullopt;
}

// "\"adamw\", \"grass\"": the table's names, for messages.
template <typename E>
std::string choice_list() {
  std::string text;
  for (const ChoiceName<E>& c : choice_names<E>())
    text += (text.empty() ? "\"" : ", \"") + std::string(c.name) + "\"";
  return text;
}

}  // namespace grass
