#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include "core/arena.h"
#include "core/error.h"
#include "data/loader.h"
#include "core/trace.h"
#include "io/durable_file.h"
#include "optim/clip.h"
#include "optim/schedule.h"
#include "train/backend_choice.h"
#include "train/checkpointing.h"
#include "train/evaluator.h"
#include "train/hf_interop.h"
#include "train/memory_plan.h"
#include "train/metrics.h"
#include "train/training_state.h"

namespace grass {

namespace {

void print_run_table(const RunConfig& cfg, const Backend& backend, const std::string& why_cpu,
                     const Communicator& comm, const LlamaModel& model,
                     double flops_per_token, const TokenLoader& loader, const Arena& arena) {
  const ModelConfig& m = cfg.model;
  std::printf("grass train %s\n", cfg.source.c_str());
  std::printf("  device        %s%s\n", backend.describe().c_str(),
              why_cpu.empty() ? "" : ("; " + why_cpu).c_str());
  const std::string ffn_stored =
      model.ffn_stored() == m.intermediate_size
          ? ""
          : " (stored " + std::to_string(model.ffn_stored()) + " wide, zero-padded: pad_ffn)";
  std::printf("  model         %s: d %d, ffn %d%s, heads %d (kv %d), layers %d, vocab %d%s\n",
              cfg.model_path.empty() ? "inline" : cfg.model_path.c_str(), m.hidden_size,
              m.intermediate_size, ffn_stored.c_str(), m.num_attention_heads,
              m.num_key_value_heads, m.num_hidden_layers, m.vocab_size,
              m.tie_word_embeddings ? ", tied" : "");
  std::printf("  parameters    %.2f M\n", double(model.num_params()) / 1e6);
  if (comm.world() > 1)
    std::printf("  ranks         %s, data-parallel: each reads 1/%d of every step's batch, and "
                "the gradients are summed over them\n",
                comm.describe().c_str(), comm.world());
  std::printf("  data          %zu shard(s), %.2f M tokens\n", loader.shards().size(),
              double(loader.total_tokens()) / 1e6);
  std::printf("  batch         %d x %d micro-batches of %d x %d tokens = %lld tokens per step%s\n",
              cfg.grad_accum_steps(), cfg.micro_batch_size, cfg.micro_batch_size, cfg.seq_len,
              (long long)cfg.tokens_per_step(),
              comm.world() > 1
                  ? (" (" + std::to_string(cfg.micro_batches_per_rank()) + " per rank)").c_str()
                  : "");
  std::printf("  optimizer     %s lr %.1e betas (%.3g, %.3g) eps %.0e wd %.3g, clip %.3g\n",
              name_of(cfg.optimizer.kind), cfg.optimizer.lr, cfg.optimizer.beta1,
              cfg.optimizer.beta2, cfg.optimizer.eps, cfg.optimizer.weight_decay, cfg.grad_clip);
  if (is_projected(cfg.optimizer.kind)) {
    const ProjectionConfig& g = cfg.optimizer.projection;
    std::string targets;
    for (const ProjectionTarget t : g.targets) {
      if (!targets.empty()) targets += ',';
      targets += name_of(t);
    }
    const char* refresh = cfg.optimizer.kind == OptimizerKind::Grass    ? "selection"
                          : cfg.optimizer.kind == OptimizerKind::GaLore ? "SVD"
                                                                        : "resampling";
    std::printf("  %-13s rank %d, %s every %lld steps, scale %.3g", name_of(cfg.optimizer.kind),
                g.rank, refresh, (long long)g.update_interval, g.scale);
    if (cfg.optimizer.kind == OptimizerKind::Grass)
      std::printf(", %s, select_dim %s", name_of(g.selection), name_of(g.select_dim));
    std::printf(", targets %s (the rest: dense AdamW)\n", targets.c_str());
  }
  std::printf("  schedule      %s, warmup %lld, min_lr_ratio %.3g, %lld steps\n",
              cfg.schedule.name.c_str(), (long long)cfg.schedule.warmup_steps,
              cfg.schedule.min_lr_ratio, (long long)cfg.steps);
  std::printf("  precision     %s, seed %llu\n", backend.storage().describe(),
              (unsigned long long)cfg.seed);
  const ModelMemoryOptions& memory = model.memory_options();
  if (memory.attention == AttentionKernel::Cudnn)
    std::printf("  attention     cuDNN's fused flash attention (RoPE applied to copies of q, k)\n");
  std::printf("  activations   %s; updates %s\n",
              memory.checkpoint_layers ? "checkpointed per layer (recomputed in the backward)"
                                       : "kept for the backward",
              memory.fused_update ? "fused into the backward (per-tensor clipping)"
                                  : "after the backward (global-norm clipping)");
  if (cfg.memory_limit > 0)
    std::printf("  memory_limit  %s (the plan takes %s)\n", format_bytes(cfg.memory_limit).c_str(),
                format_bytes(arena.total_bytes()).c_str());
  std::printf("  FLOPs/token   %.4g (6 x matmul params + 12 x layers x d x seq_len%s)\n",
              flops_per_token,
              cfg.optimizer.kind == OptimizerKind::Grass    ? ", less 2mn - 2rn per GRASS target"
              : is_projected(cfg.optimizer.kind) ? ", less 2mn - 2r(m+n) per projected target"
                                                 : "");
  if (backend.peak_flops() > 0)
    std::printf("  MFU           achieved FLOP/s over %.0f TFLOP/s (the device's dense bf16 peak)\n",
                backend.peak_flops() / 1e12);
  std::printf("  memory\n%s", arena.report().c_str());
  std::printf("  out_dir       %s\n", cfg.out_dir.c_str());
  std::fflush(stdout);
}

}  // namespace

TrainResult train(const RunConfig& cfg, const TrainOptions& options) {
  Communicator& comm = options.comm ? *options.comm : single_process();
  const bool leader = comm.leader();
  const std::string source = cfg.source.empty() ? "" : cfg.source + ": ";
  GRASS_CHECK(cfg.ranks == comm.world(), "a run config checked for another number of ranks");
  // Everything that can fail on user input happens before out_dir is touched.
  TokenLoader loader(cfg.train_files, cfg.micro_batch_size, cfg.seq_len,
                     {.shuffle = cfg.shuffle, .seed = cfg.seed, .rank = comm.rank(),
                      .world = comm.world(), .prefetch = true});
  loader.check_vocab(cfg.model.vocab_size);
  if (!cfg.tokenizer.empty()) loader.stream().check_tokenizer(cfg.tokenizer);
  std::optional<Evaluator> evaluator;  // rank 0 evaluates: the ranks hold the same weights
  if (!cfg.val_files.empty() && leader) {
    evaluator.emplace(cfg.val_files, cfg.eval_tokens);
    evaluator->stream().check_vocab(cfg.model.vocab_size);
    if (!cfg.tokenizer.empty()) evaluator->stream().check_tokenizer(cfg.tokenizer);
  }

  std::string why_cpu;
  const std::unique_ptr<Backend> backend = choose_backend(cfg, &why_cpu, comm.local_rank());
  // Under a launcher the gradients' sums go through the communicator that works on the backend's
  // memory: MPI's own on the CPU, NCCL's on the GPU (from one rank up, so one GPU tries NCCL).
  const bool launched = &comm != &single_process();
  const std::unique_ptr<Communicator> device_comm =
      launched ? backend->communicator_for(comm) : nullptr;
  Communicator& grads_comm = device_comm ? *device_comm : comm;
  // GPU memory comes as one reservation of the planned size, cut into the named buffers.
  const MemoryPlan plan = plan_memory(cfg, backend->storage());
  check_memory_limit(cfg, backend->storage(), plan);
  backend->reserve(plan.total, plan.buffers);
  Arena arena(false, *backend);
  TrainingState state = build_training_state(cfg, arena, *backend, grads_comm);
  LlamaModel& model = *state.model;

  // The starting point: a checkpoint, pretrained weights, or the seed. out_dir is created and
  // locked first, so no other run writes checkpoints while they are read; its files are not
  // touched until the starting point has been read and checked.
  std::optional<OutDirLock> lock;  // rank 0 writes out_dir; the other ranks only read it
  if (leader) lock.emplace(cfg.out_dir);
  const std::string root = checkpoint_root(cfg);
  const std::optional<Checkpoint> resume = options.resume.empty()
                                               ? newest_valid_checkpoint(root, false)
                                               : newest_valid_checkpoint(options.resume, true);
  int64_t start_step = 0, checkpoint_metrics_rows = 0;
  if (resume) {
    // Skipped damaged checkpoints aside, a named older checkpoint must not sit below newer ones.
    for (const CheckpointEntry& e : list_checkpoints(root))
      if (!options.resume.empty() && e.step > resume->step())
        throw UserError(e.dir + ": a later checkpoint than " + resume->dir() + " (step " +
                        std::to_string(resume->step()) + "); resuming there would mix two " +
                        "histories in one out_dir: move the later checkpoints away or train " +
                        "into a new out_dir");
    const RestoredRun restored = restore_checkpoint(*resume, cfg, arena, state, loader);
    start_step = restored.step;
    checkpoint_metrics_rows = restored.metrics_rows;
  } else if (!cfg.init_from.empty()) {
    try {
      load_hf_model(model, cfg.init_from);
    } catch (const UserError& e) {
      throw UserError(source + "init_from: " + e.what());
    }
  } else {
    model.init_weights(cfg.seed);
  }
  std::optional<MetricsWriter> metrics;  // rank 0's
  const double flops_per_token = grass::flops_per_token(state);
  if (leader) {
    remove_checkpoint_leftovers(root);
    if (cfg.checkpoint_every > 0) {  // an unwritable place fails now, not after the first steps
      std::error_code ec;
      std::filesystem::create_directories(root, ec);
      if (ec) throw UserError(root + ": cannot create the checkpoint directory: " + ec.message());
    }
    write_file_durably(cfg.out_dir + "/config.json", to_json(cfg).dump(2) + "\n");
    // A resumed run continues metrics.jsonl after the checkpoint's step; a fresh one starts anew.
    const std::string metrics_path = cfg.out_dir + "/metrics.jsonl";
    const int64_t kept_rows = resume ? truncate_metrics_after(metrics_path, start_step) : 0;
    metrics.emplace(metrics_path, resume.has_value(), kept_rows);
    if (resume && kept_rows != checkpoint_metrics_rows)
      std::fprintf(stderr,
                   "warning: %s holds %lld rows up to step %lld where the checkpoint's run had "
                   "%lld (another out_dir, or an edited file); new rows are appended after them\n",
                   metrics_path.c_str(), (long long)kept_rows, (long long)start_step,
                   (long long)checkpoint_metrics_rows);
    print_run_table(cfg, *backend, why_cpu, grads_comm, model, flops_per_token, loader, arena);
    if (evaluator)
      std::printf("  eval          first %lld tokens of %s, %s\n", (long long)cfg.eval_tokens,
                  evaluator->stream().describe().c_str(),
                  cfg.eval_every > 0
                      ? ("every " + std::to_string(cfg.eval_every) + " steps and at the end").c_str()
                      : "after the last step");
    if (cfg.checkpoint_every > 0)
      std::printf("  checkpoints   every %lld steps and after the last, into %s; keep the last %lld%s\n",
                  (long long)cfg.checkpoint_every, root.c_str(), (long long)cfg.checkpoint_keep,
                  cfg.checkpoint_keep_every > 0
                      ? (" and every multiple of " + std::to_string(cfg.checkpoint_keep_every)).c_str()
                      : "");
    if (resume)
      std::printf("  resume        from %s (step %lld of %lld)\n", resume->dir().c_str(),
                  (long long)start_step, (long long)cfg.steps);
    else if (!cfg.init_from.empty())
      std::printf("  init          weights from %s\n", cfg.init_from.c_str());
    std::fflush(stdout);
  }

  TrainResult result;
  result.first_step = start_step;
  if (resume) result.resumed_from = resume->dir();
  if (start_step >= cfg.steps) {
    if (leader)
      std::printf("done: nothing to train, the checkpoint is at step %lld of %lld (raise steps to "
                "train further)\n",
                (long long)start_step, (long long)cfg.steps);
    return result;
  }
  std::vector<double> rates;
  double first_step_rate = 0;
  double seconds_so_far = 0;
  for (int64_t step = start_step; step < cfg.steps; step++) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t waits_before = backend->host_waits();
    const double lr = schedule_lr(cfg.schedule, cfg.optimizer.lr, step, cfg.steps);
    const TraceRange step_range("step");
    const StepOutcome outcome = train_step(state, cfg, step, lr, [&](int32_t* in, int32_t* tg) {
      loader.next_batch(in, tg);
    });
    const double loss = outcome.loss, gnorm = outcome.grad_norm;
    if (!std::isfinite(loss))
      throw UserError("step " + std::to_string(step + 1) + ": loss is " + std::to_string(loss) +
                      " (diverged): lower optimizer.lr or set grad_clip");
    backend->synchronize();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    StepMetrics m;
    m.step = step + 1;
    m.total_steps = cfg.steps;
    m.loss = loss;
    m.lr = lr;
    m.grad_norm = gnorm;
    m.step_ms = seconds * 1e3;
    m.tokens_per_s = double(cfg.tokens_per_step()) / seconds;
    m.gflops_per_s = m.tokens_per_s * flops_per_token / 1e9;
    if (backend->peak_flops() > 0) m.mfu = m.gflops_per_s * 1e9 / backend->peak_flops();
    const Backend::DeviceMemory device = backend->device_memory();
    m.mem_device_used_bytes = device.used;
    m.mem_device_bytes = device.total;
    if (backend->storage().cuda) m.host_waits = backend->host_waits() - waits_before;
    const int64_t comm_bytes = grads_comm.take_bytes_reduced();
    if (launched) m.comm_bytes = comm_bytes;
    m.tokens_seen = (step + 1) * cfg.tokens_per_step();
    m.mem_bytes = arena.peak_bytes();
    seconds_so_far += seconds;
    m.eta_s = seconds_so_far / double(step + 1 - start_step) * double(cfg.steps - step - 1);
    if (metrics) metrics->write(m);
    const bool log_now = (step + 1) % cfg.log_every == 0 || step == start_step || step + 1 == cfg.steps;
    if (log_now && leader) {
      std::printf("%s\n", format_step_line(m).c_str());
      std::fflush(stdout);
    }
    result.losses.push_back(loss);
    const bool eval_now = (cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0) ||
                          step + 1 == cfg.steps;
    if (evaluator && eval_now) {
      const EvalResult eval = evaluator->evaluate(model, cfg.micro_batch_size);
      const EvalMetrics e{step + 1, eval.loss, eval.perplexity, eval.tokens};
      metrics->write_eval(e);
      std::printf("%s\n", format_eval_line(e).c_str());
      std::fflush(stdout);
      result.final_eval = eval;
    }
    if (cfg.checkpoint_every > 0 &&
        ((step + 1) % cfg.checkpoint_every == 0 || step + 1 == cfg.steps)) {
      const auto c0 = std::chrono::steady_clock::now();
      std::vector<LoaderPosition> positions;  // every rank's, for a resume on as many ranks
      if (comm.world() > 1) {
        const LoaderPosition mine = loader.position();
        const std::vector<uint64_t> epochs = comm.all_gather(mine.epoch);
        const std::vector<uint64_t> indices = comm.all_gather(mine.index);
        for (size_t r = 0; r < epochs.size(); r++) positions.push_back({epochs[r], indices[r]});
      }
      if (leader) {
        const std::string dir =
            save_checkpoint(cfg, arena, state, loader, step + 1, metrics->rows(), positions);
        if (log_now || cfg.checkpoint_every >= cfg.log_every) {
          std::printf("checkpoint %s (%.2f s)\n", dir.c_str(),
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count());
          std::fflush(stdout);
        }
      }
    }
    if (step > start_step) rates.push_back(m.tokens_per_s);  // the first step warms caches and pages
    else first_step_rate = m.tokens_per_s;
  }
  if (!rates.empty()) {
    std::sort(rates.begin(), rates.end());
    result.tokens_per_second = rates[rates.size() / 2];
  }
  if (!leader) return result;
  // A median needs two timed steps; fewer, and the line says what the one figure is.
  const double rate = rates.empty() ? first_step_rate : result.tokens_per_second;
  const char* rate_label = rates.size() >= 2 ? "median " : "";
  const char* rate_note = rates.size() >= 2  ? ""
                          : rates.size() == 1 ? " (one step after the first)"
                                              : " (the only step, warm-up included)";
  char mfu[48] = "";
  if (backend->peak_flops() > 0)
    std::snprintf(mfu, sizeof mfu, ", MFU %.1f%%",
                  100 * rate * flops_per_token / backend->peak_flops());
  std::printf("done: %lld steps, loss %.4f -> %.4f, %s%.1f tok/s%s%s; metrics in %s/metrics.jsonl\n",
              (long long)(cfg.steps - start_step), result.losses.front(), result.losses.back(),
              rate_label, rate, rate_note, mfu, cfg.out_dir.c_str());
  return result;
}

}  // namespace grass
