// The memory a run will take, stated before anything is allocated: the run's own allocations,
// made on a planning arena (train/training_state.h), summed by category.
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "kernels/storage.h"
#include "src/config/config.h"
#include "src/core/arena.h"

namespace grass {

struct MemoryPlan {
  // The device's (what memory_limit caps and the GPU reserves), by MemCategory
  std::array<int64_t, kMemCategories> bytes{};
  int64_t total = 0;
  int64_t buffers = 0;  // named allocations (a device reservation pads each to its alignment)
  // The host tier's (offload: pinned host memory on the GPU), by MemCategory
  std::array<int64_t, kMemCategories> host_bytes{};
  int64_t host_total = 0;
  // What offload copies each step, each way: host to device and back (a refresh step may fetch
  // less: moments it resets are not fetched).
  int64_t h2d_bytes_per_step = 0, d2h_bytes_per_step = 0;
  // Of those, offload.activations' (the layers' inputs: they grow with the tokens of a step), and
  // offload.layers' (the streamed layers fetched, of which in the forwards, and written back:
  // LayerStream::step_traffic)
  int64_t activation_bytes_per_step = 0;
  int64_t layer_fetch_bytes_per_step = 0, layer_forward_fetch_bytes_per_step = 0;
  int64_t layer_write_back_bytes_per_step = 0;
  // offload.activations disk: the file ring's size, and what it writes each step (and reads back)
  int64_t disk_bytes = 0, disk_bytes_per_step = 0;
  // What each rank of a data-parallel run sums with the others (docs/distributed.md): every step,
  // each dense gradient and each projected one, and the loss (fp64); at a refresh, also the fp32
  // full gradient of every target whose refresh reads one (GRASS's norm-based rules, GaLore's
  // SVD).
  int64_t step_sum_bytes = 0;
  int64_t refresh_sum_bytes = 0;
  double flops_per_token = 0;  // training FLOPs per token, as MFU counts them (training_state.h)
  double forward_flops_per_token = 0;  // the forward's share of them
  // what a checkpoint's backward computes again beside them (activation_checkpointing "layer":
  // every layer's forward; MFU does not count it, a step's time does)
  double recompute_flops_per_token = 0;
};

// eval_batch: the sequences an evaluation forward takes (resolve_eval_batch); 0, or at most
// micro_batch_size: the training model evaluates and nothing is added.
MemoryPlan plan_memory(const RunConfig& cfg, const Storage& storage, int eval_batch = 0);

// What a CUDA process holds on the device outside the plan: the context, cuBLAS's, cuDNN's and
// NCCL's own memory, kernels' local memory. Measured once: LLaMA-13B GRASS on an H200 held 29.40
// GiB on the device against a plan of 28.39 GiB (docs/gpu-status.md, 2026-11-26).
constexpr int64_t kCudaOutsidePlanBytes = int64_t(1.01 * double(int64_t(1) << 30));

// The largest micro_batch_size whose plan fits in `limit` bytes, the number of micro-batches per
// step kept, each planned with memory_limit `limit` (the head's chunk is the one it leaves room
// for); 0 when not even one sequence fits.
int largest_micro_batch(const RunConfig& cfg, const Storage& storage, int64_t limit);

// The sequences an evaluation forward takes: eval_batch_size, or for "auto" the most that memory
// allows, never more than the windows of eval_tokens (ceil(eval_tokens / seq_len)):
// - beside training (standalone false), the evaluation model comes on top of the training plan:
//   under a memory_limit, it takes what the plan leaves (less beyond_plan_bytes on the GPU);
//   without one, on the CPU, up to the training plan's activations and workspace or
//   kEvalBudgetBytes, whichever is more; on the GPU, without a memory_limit, nothing (the engine
//   does not know how much of the card is the run's), and with cuDNN's attention neither (its
//   graphs are built for micro_batch_size). A result of at most micro_batch_size means the
//   training model evaluates.
// - `grass eval` alone (standalone true): its forward-only model with its own weights takes up to
//   memory_limit (less beyond_plan_bytes on the GPU), or else what the training plan would take,
//   and kEvalBudgetBytes more.
// UserError for an explicit eval_batch_size that cannot run (above micro_batch_size with cuDNN's
// attention on the GPU).
// (64 MiB: at the quickstart's size a CPU evaluation is as fast from about 16 sequences on, which
// that holds; docs/memory.md)
constexpr int64_t kEvalBudgetBytes = int64_t(64) << 20;
int resolve_eval_batch(const RunConfig& cfg, const Storage& storage, int64_t eval_tokens,
                       bool standalone);
// The bytes of a forward-only model for `batch` sequences: with its own weights and scratch
// (`grass eval`), or as a view of a training model's weights.
int64_t eval_model_bytes(const RunConfig& cfg, const Storage& storage, int batch, bool own_weights);

// cfg.memory_limit against the plan: UserError when the plan is over it, with the breakdown and the
// largest micro-batch that would fit (and what activation checkpointing would allow).
void check_memory_limit(const RunConfig& cfg, const Storage& storage, const MemoryPlan& plan);

// The storage `grass mem` plans for: the run's on a machine with a usable GPU (the CPU backend's
// for device "cpu", and for an fp32 run with device "auto", which the CPU computes).
Storage planned_storage(const RunConfig& cfg);

// What bounds a step's time: its FLOPs at a sustained rate, and offload's copies over the host
// link, pass by pass: the forward's (the layer inputs out) and the backward's with the updates
// (the inputs back, the states both ways). PCIe is full duplex: with two copy queues (the
// engine's, Backend::copy_async, on a GPU with two copy engines: asyncEngineCount 2) a pass takes
// its busier direction's time; with one (a GPU with one copy engine) both directions in turn.
struct LinkModel {
  double link_gbps = 25;  // GB/s (10^9) each way, PCIe 4 x16's order
  double disk_gbps = 7;   // GB/s, an NVMe SSD's sequential order (the disk tier)
  int copy_queues = 2;    // 1 or 2
  double tflops = 0;      // sustained TFLOP/s; 0: unknown (no bound stated)
};
// The sustained rate a plan assumes when --tflops is not given: 40% of an H100 SXM's dense bf16
// peak (989 TFLOP/s; the 1B run measured 47% MFU, docs/gpu-status.md) for the GPU; unknown for
// the CPU.
double default_tflops(const Storage& storage);

// `grass mem`'s exit code when the run does not fit the memory_limit or host_memory_limit asked
// (0: it fits, or no limit was asked; 1: internal error; 2: user error).
constexpr int kExitDoesNotFit = 3;

// What a card must hold beyond the plan: on the CUDA backend, kCudaOutsidePlanBytes and the free
// memory the reservation leaves beside itself (kGpuHeadroomBytes); on the CPU, nothing.
int64_t beyond_plan_bytes(const Storage& storage);

// The card sizes `grass mem` names without a memory_limit: a card sold as N GB counted as N GiB,
// the total nvidia-smi shows for an A100 40GB (40,960 MiB).
constexpr int kCardGiB[] = {16, 24, 32, 40, 48, 80};

// The answer `grass mem` gives first: whether the run fits the memory_limit asked (or, without one
// on the GPU, which card sizes it fits), with the plan and what the card holds beyond it counted,
// the largest micro_batch_size that fits, and when it does not fit, what would, or the floor the
// weights set.
struct MemoryVerdict {
  bool limited = false;  // a memory_limit or host_memory_limit was asked
  bool fits = true;      // limited: the run fits every limit asked
  int64_t planned = 0, needed = 0;  // the plan's total; with beyond_plan_bytes
  int64_t card = 0;      // the limit the micro-batch is for: memory_limit, else the smallest card
                         // in kCardGiB that fits (the largest, when none does); 0 on the CPU
  int largest_micro_batch = 0;  // under `card`, beyond_plan_bytes counted
  std::string line;      // the first line
  std::string details;   // indented lines after it (the arithmetic, the card convention)
  int exit_code() const { return limited && !fits ? kExitDoesNotFit : 0; }
};
MemoryVerdict memory_verdict(const RunConfig& cfg, const Storage& storage);

// memory_verdict, format_memory_plans, memory_plan_json and choose_offload plan attention "auto"
// as run_resolution.h's planned_attention does: with cuDNN's workspace wherever "auto" may take
// cuDNN's kernels (the larger of the two), since without a GPU nothing says which it will take.
// plan_memory itself plans the kernels cfg names, "auto" as the engine's (what a backend not yet
// settled computes with).

// What `grass mem` prints: the verdict, offload "auto"'s choice (its line, when the run asked for
// "auto"), then the run's plan beside every other optimizer's on the same model, batch and
// storage, the activation modes, offload's traffic, and with cfg.ranks > 1 what each rank sums.
std::string format_memory_plans(const RunConfig& cfg, const Storage& storage,
                                const LinkModel& link = {}, const std::string& offload_auto = "");

// offload "auto": the placement the planner picks for cfg, in cfg.offload (automatic cleared),
// and why, in one line. Without a memory_limit nothing moves. Otherwise the placements that fit
// memory_limit on the device and host_memory_limit in the host tier, the one whose copies take
// the least time by `link`; when none fits, the one with the least on the device. Layer inputs
// move only under activation_checkpointing "layer"; to disk only when the host tier cannot take
// them.
struct OffloadChoice {
  RunConfig cfg;
  std::string why;
};
OffloadChoice choose_offload(const RunConfig& cfg, const Storage& storage,
                             const LinkModel& link = {});

// The run's plan as one JSON object (for scripts: scripts/experiments/memory_limit.sh): the
// categories in bytes, the total, the memory options in force, with a memory_limit whether the
// plan alone fits it and the largest micro-batch whose plan does (the cap `grass train` enforces),
// and the verdict (key "verdict": memory_verdict's fields and exit code).
// offload_auto: choose_offload's line, when the run asked for "auto" (key "offload_auto").
std::string memory_plan_json(const RunConfig& cfg, const Storage& storage,
                             const LinkModel& link = {}, const std::string& offload_auto = "");

}  // namespace grass
