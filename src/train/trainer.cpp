#include "src/train/trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "src/core/arena.h"
#include "src/core/error.h"
#include "src/core/format.h"
#include "src/core/trace.h"
#include "src/data/data_sets.h"
#include "src/data/loader.h"
#include "src/io/durable_file.h"
#include "src/io/out_dir_lock.h"
#include "src/optim/lowrank.h"
#include "src/optim/schedule.h"
#include "src/optim/state_slots.h"
#include "src/train/backend_choice.h"
#include "src/train/checkpointing.h"
#include "src/train/evaluator.h"
#include "src/train/hf_interop.h"
#include "src/train/memory_plan.h"
#include "src/train/metrics.h"
#include "src/train/out_dir.h"
#include "src/train/run_resolution.h"
#include "src/train/training_state.h"

namespace grass {

namespace {

const char* signal_name(int signal) {
  return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "";
}

// --overwrite moves out_dir aside, so a checkpoint to resume from must lie elsewhere.
void check_overwrite(const RunConfig& cfg, const std::string& resume) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(cfg.out_dir, ec) && !fs::is_directory(cfg.out_dir, ec))
    throw UserError(cfg.out_dir + ": out_dir is a file, not a directory; choose another out_dir");
  if (resume.empty()) return;
  const fs::path dir = fs::weakly_canonical(cfg.out_dir, ec), from = fs::weakly_canonical(resume, ec);
  if (std::mismatch(dir.begin(), dir.end(), from.begin(), from.end()).first == dir.end())
    throw UserError("--resume " + resume + " lies inside out_dir " + cfg.out_dir +
                    ", which --overwrite moves aside: resume without --overwrite, or from a "
                    "checkpoint elsewhere");
}

// A training run, opened: its inputs checked, its state built on the chosen backend, its starting
// point loaded (a checkpoint, pretrained weights or the seed) and, on rank 0, out_dir locked and
// its files begun. Members are made in the order they are declared and unmade in reverse.
class Run {
 public:
  Run(const RunConfig& cfg, const TrainOptions& options);

  void print_table() const;  // rank 0: the configuration, once, before the first step
  // One optimizer step and what it measured.
  StepMetrics step(int64_t step, double* seconds_so_far);
  void report_late_allocations(const Backend::DeviceMemory& device) const;
  bool log(const StepMetrics& m);  // the step line when it is due; true if it printed
  void maybe_evaluate(int64_t step, TrainResult& result);
  void maybe_checkpoint(int64_t step, bool logged, bool now = false);
  // Every rank's answer to "did a signal ask us to stop?", the same on all of them.
  bool stop_requested(int signal) const;
  // After the last step this call ran (`steps_done` in all): the weights kept where grass eval,
  // sample and export find them. Returns where.
  std::string save_final(int64_t steps_done, int stop_signal);
  void summarize(const TrainResult& result, double first_step_rate) const;

  RunConfig cfg;  // as given, with offload "auto" resolved (build_state)
  Communicator& comm;
  const bool leader;    // rank 0 prints, evaluates and writes out_dir
  const bool launched;  // under a launcher (mpirun), even with one rank
  int64_t start_step = 0;
  std::string resumed_from;  // the checkpoint's directory, "" for a fresh start
  std::string moved_to;      // --overwrite: where out_dir's earlier contents went; "" if nowhere
  std::string restart_note;  // check_out_dir's: this run starts again from step 0, and why

 private:
  void check_inputs();
  void build_state();
  void load_starting_point(const std::string& resume, bool overwrite);
  void open_out_dir();
  void print_model_lines() const;
  void print_optimizer_lines() const;
  void print_memory_lines() const;
  void print_run_lines() const;

  std::unique_ptr<TokenLoader> loader_;
  std::optional<Evaluator> evaluator_;  // rank 0 evaluates: the ranks hold the same weights
  std::string why_cpu_;
  std::string offload_why_;  // offload "auto" (or offload.layers "auto"): what it chose and why
  int copy_queues_ = 2;      // the planner's link model's: min(Backend::copy_engines(), 2)
  std::unique_ptr<Backend> backend_;
  AttentionInUse attention_;  // the kernels attention computes with (prepare_attention)
  // Under a launcher the gradients' sums go through the communicator that works on the
  // backend's memory: MPI's own on the CPU, NCCL's on the GPU (from one rank up).
  std::unique_ptr<Communicator> device_comm_;
  Communicator* grads_comm_ = nullptr;
  std::unique_ptr<Arena> arena_;
  TrainingState state_;
  std::optional<OutDirLock> lock_;  // rank 0 writes out_dir; the other ranks only read it
  int64_t checkpoint_metrics_rows_ = 0;
  Backend::DeviceMemory device_at_reservation_;  // the GPU's memory once the run's is reserved
  std::optional<MetricsWriter> metrics_;  // rank 0's
  double flops_per_token_ = 0;
  int eval_batch_ = 0;  // sequences an evaluation forward takes (resolve_eval_batch)
};

// Everything that can fail on user input happens before out_dir is touched.
Run::Run(const RunConfig& c, const TrainOptions& options)
    : cfg(c),
      comm(options.comm ? *options.comm : single_process()),
      leader(comm.leader()),
      launched(&comm != &single_process()) {
  GRASS_CHECK(cfg.ranks == comm.world(), "a run config checked for another number of ranks");
  check_inputs();
  // out_dir is rank 0's alone (other ranks may not even see it): checking it there also keeps
  // the others from finding rank 0's fresh lock and files, which would be a race.
  if (options.overwrite)
    check_overwrite(cfg, options.resume);
  else if (leader)
    restart_note = check_out_dir(cfg, !options.resume.empty());
  build_state();
  if (leader && options.overwrite && out_dir_has_contents(cfg.out_dir))
    moved_to = move_out_dir_aside(cfg.out_dir);
  load_starting_point(options.resume, options.overwrite);
  flops_per_token_ = flops_per_token(state_);
  if (leader) open_out_dir();
}

void Run::check_inputs() {
  loader_ = std::make_unique<TokenLoader>(
      cfg.train_files, cfg.micro_batch_size, cfg.seq_len,
      LoaderOptions{.shuffle = cfg.shuffle, .seed = cfg.seed, .rank = comm.rank(),
                           .world = comm.world(), .prefetch = true});
  if (!cfg.val_files.empty() && leader) evaluator_.emplace(cfg.val_files, cfg.eval_tokens);
  for (const std::string& warning :
       check_run_data(cfg, &loader_->stream(), evaluator_ ? &evaluator_->stream() : nullptr))
    if (leader) std::fprintf(stderr, "warning: %s\n", warning.c_str());
}

// GPU memory comes as one reservation of the planned size, cut into the named buffers.
// The attention kernels are settled first (cuDNN's graphs built, or "auto" fallen back), so the
// plan and the model are those of the kernels the run computes with.
void Run::build_state() {
  backend_ = choose_backend(cfg, &why_cpu_, comm.local_rank());
  if (launched) device_comm_ = backend_->communicator_for(comm);
  grads_comm_ = device_comm_ ? device_comm_.get() : &comm;
  attention_ = prepare_attention(cfg, *backend_);
  RunConfig run = with_attention(cfg, attention_.kernel);  // cfg keeps attention as given
  // The engine's two queues; one copy engine (or none, copying between kernels) serves them in turn.
  copy_queues_ = std::clamp(backend_->copy_engines(), 1, 2);
  if (cfg.offload.automatic || cfg.offload.layers_auto) {
    OffloadChoice choice =
        choose_offload(run, backend_->storage(),
                       LinkModel{.copy_queues = copy_queues_,
                                 .tflops = default_tflops(backend_->storage())});
    cfg.offload = run.offload = choice.cfg.offload;
    offload_why_ = std::move(choice.why);
  }
  const Storage& storage = backend_->storage();
  if (!cfg.val_files.empty())  // every rank plans the same memory; rank 0 evaluates
    eval_batch_ = resolve_eval_batch(run, storage, cfg.eval_tokens, /*standalone=*/false);
  const MemoryPlan plan = plan_memory(run, storage, eval_batch_);
  if (cfg.memory_limit > 0 && plan.total > cfg.memory_limit &&
      plan_memory(run, storage).total <= cfg.memory_limit)
    throw UserError((cfg.source.empty() ? "" : cfg.source + ": ") + "eval_batch_size: " +
                    std::to_string(cfg.eval_batch_size) + " sequences take " +
                    format_bytes(plan.total - plan_memory(run, storage).total) +
                    ", which puts the run over its memory_limit of " +
                    format_bytes(cfg.memory_limit) + "; lower it, or leave it \"auto\"");
  check_memory_limit(run, storage, plan);
  const ModelConfig& m = cfg.model;
  const ProjectionConfig& g = cfg.optimizer.projection;
  if (cfg.optimizer.kind == OptimizerKind::GaLore &&
      galore_basis_method(g, backend_->storage()).randomized) {
    // every target's rows or columns, a padded ffn's included (up to 7 more)
    const int max_side = std::max(m.hidden_size, m.intermediate_size + 7);
    const int k = std::min(g.rank + g.svd_oversample, max_side);
    backend_->prepare_galore_basis(max_side, k);
    if (galore_refresh_pass(cfg.optimizer)) {  // one layer's targets a batch (GaLore's constructor)
      const int slots = int(g.targets.size());
      backend_->prepare_galore_batch(
          k, slots, galore_batch_layout(backend_->storage(), max_side, k, slots));
    }
  }
  backend_->reserve(plan.total, plan.buffers);
  device_at_reservation_ = backend_->device_memory();
  arena_ = std::make_unique<Arena>(false, *backend_, &backend_->host_tier());
  state_ = build_training_state(run, *arena_, *backend_, *grads_comm_, eval_batch_);
}

// out_dir is created and locked first, so no other run writes checkpoints while they are read;
// its files are not touched until the starting point has been read and checked.
void Run::load_starting_point(const std::string& resume, bool overwrite) {
  if (leader) lock_.emplace(cfg.out_dir);
  const std::string root = checkpoint_root(cfg);
  const std::optional<Checkpoint> checkpoint =
      !resume.empty() ? newest_valid_checkpoint(resume, true)
      : overwrite     ? std::nullopt  // out_dir was moved aside (on rank 0): a fresh start
                      : newest_valid_checkpoint(root, false);
  if (checkpoint) {
    // Skipped damaged checkpoints aside, a named older checkpoint must not sit below newer ones.
    for (const CheckpointEntry& e : list_checkpoints(root))
      if (!resume.empty() && e.step > checkpoint->step())
        throw UserError(e.dir + ": a later checkpoint than " + checkpoint->dir() + " (step " +
                        std::to_string(checkpoint->step()) + "); resuming there would mix two " +
                        "histories in one out_dir: move the later checkpoints away or train " +
                        "into a new out_dir");
    const VerifiedCheckpoint verified =
        verify_checkpoint(*checkpoint, cfg, *arena_, state_, *loader_);
    if (verified.step >= cfg.steps)
      throw UserError(resume.empty() ? finished_run_error(cfg, verified.step)
                                     : checkpoint->dir() + ": the run is finished there (step " +
                                           std::to_string(verified.step) + " of steps " +
                                           std::to_string(cfg.steps) +
                                           "); raise steps to train further");
    const RestoredRun restored = apply_checkpoint(verified, state_, *loader_);
    start_step = restored.step;
    checkpoint_metrics_rows_ = restored.metrics_rows;
    resumed_from = checkpoint->dir();
  } else if (!cfg.init_from.empty()) {
    try {
      load_hf_model(*state_.model, cfg.init_from);
    } catch (const UserError& e) {
      throw UserError((cfg.source.empty() ? "" : cfg.source + ": ") + "init_from: " + e.what());
    }
  } else {
    state_.model->init_weights(cfg.seed);
  }
}

// A resumed run continues metrics.jsonl after the checkpoint's step; a fresh one starts anew.
void Run::open_out_dir() {
  const std::string root = checkpoint_root(cfg);
  remove_checkpoint_leftovers(root);
  std::error_code ec;
  std::filesystem::remove_all(cfg.out_dir + "/.model.tmp", ec);  // an interrupted save_final
  if (cfg.checkpoint_every > 0) {  // an unwritable place fails now, not after the first steps
    std::filesystem::create_directories(root, ec);
    if (ec) throw UserError(root + ": cannot create the checkpoint directory: " + ec.message());
  }
  write_file_durably(cfg.out_dir + "/config.json", to_json(cfg).dump(2) + "\n");
  const std::string metrics_path = cfg.out_dir + "/metrics.jsonl";
  const bool resumed = !resumed_from.empty();
  const int64_t kept_rows = resumed ? truncate_metrics_after(metrics_path, start_step) : 0;
  metrics_.emplace(metrics_path, resumed, kept_rows);
  if (resumed && kept_rows != checkpoint_metrics_rows_)
    std::fprintf(stderr,
                 "warning: %s holds %lld rows up to step %lld where the checkpoint's run had "
                 "%lld (another out_dir, or an edited file); new rows are appended after them\n",
                 metrics_path.c_str(), (long long)kept_rows, (long long)start_step,
                 (long long)checkpoint_metrics_rows_);
}

void Run::print_table() const {
  std::printf("grass train %s\n", cfg.source.c_str());
  print_model_lines();
  print_optimizer_lines();
  print_memory_lines();
  print_run_lines();
  std::fflush(stdout);
}

void Run::print_model_lines() const {
  const ModelConfig& m = cfg.model;
  const LlamaModel& model = *state_.model;
  std::printf("  device        %s%s\n", backend_->describe().c_str(),
              why_cpu_.empty() ? "" : ("; " + why_cpu_).c_str());
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
  const Communicator& ranks = *grads_comm_;
  if (ranks.world() > 1)
    std::printf("  ranks         %s, data-parallel: each reads 1/%d of every step's batch, and "
                "the gradients are summed over them\n",
                ranks.describe().c_str(), ranks.world());
  std::printf("  data          %zu shard(s), %.2f M tokens\n", loader_->shards().size(),
              double(loader_->total_tokens()) / 1e6);
  const int accum = cfg.grad_accum_steps();
  std::printf("  batch         %d micro-batch%s of %d x %d tokens = %lld tokens per step%s\n", accum,
              accum == 1 ? "" : "es", cfg.micro_batch_size, cfg.seq_len,
              (long long)cfg.tokens_per_step(),
              ranks.world() > 1
                  ? (" (" + std::to_string(cfg.micro_batches_per_rank()) + " per rank)").c_str()
                  : "");
}

void Run::print_optimizer_lines() const {
  std::printf("  optimizer     %s lr %.1e betas (%.3g, %.3g) eps %.0e wd %.3g, clip %.3g\n",
              name_of(cfg.optimizer.kind), cfg.optimizer.lr, cfg.optimizer.beta1,
              cfg.optimizer.beta2, cfg.optimizer.eps, cfg.optimizer.weight_decay, cfg.grad_clip);
  std::printf("  states        %s\n", state_format(cfg.optimizer, backend_->storage()).c_str());
  for (const auto& o : state_.optimizers->all())
    if (const std::string line = o->describe(); !line.empty())
      std::printf("  %-13s %s\n", o->name(), line.c_str());
  // GaLore's refresh takes the SVD of the first micro-batch's gradient (summed over the ranks),
  // whose rank is at most its token count: past it, singular vectors are arbitrary. (GRASS ranks
  // the slices by their norms, which stay meaningful.)
  const int64_t refresh_tokens =
      int64_t(cfg.micro_batch_size) * cfg.seq_len * grads_comm_->world();
  if (cfg.optimizer.kind == OptimizerKind::GaLore && refresh_tokens < cfg.optimizer.projection.rank)
    std::fprintf(stderr,
                 "warning: GaLore's refresh takes the SVD of one micro-batch's gradient: %lld "
                 "tokens (micro_batch_size x seq_len x ranks), fewer than optimizer.rank %d, so "
                 "%lld of each projection's singular vectors are arbitrary; raise "
                 "micro_batch_size or lower the rank\n",
                 (long long)refresh_tokens, cfg.optimizer.projection.rank,
                 (long long)(cfg.optimizer.projection.rank - refresh_tokens));
  std::printf("  schedule      %s, warmup %lld, min_lr_ratio %.3g, %lld steps\n",
              name_of(cfg.schedule.kind), (long long)cfg.schedule.warmup_steps,
              cfg.schedule.min_lr_ratio, (long long)cfg.steps);
  std::printf("  precision     %s, seed %llu\n", backend_->storage().describe(),
              (unsigned long long)cfg.seed);
}

void Run::print_memory_lines() const {
  const ModelMemoryOptions& memory = state_.model->memory_options();
  if (backend_->storage().cuda)  // the CPU computes with its reference
    std::printf("  attention     %s\n  head          %s\n",
                describe_attention(cfg.attention, attention_).c_str(),
                describe_head(cfg, backend_->storage(), memory).c_str());
  std::printf("  activations   %s; updates %s\n",
              activations_kept(cfg.model, memory).c_str(),
              memory.fused_update ? "fused into the backward (per-tensor clipping)"
                                  : "after the backward (global-norm clipping)");
  if (cfg.memory_limit > 0)
    std::printf("  memory_limit  %s (the plan takes %s on the device)\n",
                format_bytes(cfg.memory_limit).c_str(), format_bytes(arena_->total_bytes()).c_str());
  if (!offload_why_.empty()) std::printf("  %s\n", offload_why_.c_str());
  if (const XInRing* ring = state_.model->x_in_ring(); ring && ring->layers_out() == 0)
    std::printf("  offload       layer inputs: none leave the device (the ring's %d slots hold "
                "every layer's)\n", XInRing::kSlots);
  else if (ring)
    std::printf("  offload       layer inputs 0..%d, %s in %s, through a ring of %d device slots: "
                "all of them each way a micro-batch%s\n",
                ring->layers_out() - 1,
                format_bytes(ring->link_bytes_per_pass()).c_str(),
                ring->where() == ActivationOffload::Host
                    ? backend_->host_tier().memory_name()
                    : ("a file in " + state_.model->memory_options().disk_dir).c_str(),
                XInRing::kSlots,
                ring->where() == ActivationOffload::Host ? ""
                : ring->direct_io() ? " (O_DIRECT, through a bounce buffer in the host tier)"
                                    : " (buffered: the file system refuses O_DIRECT)");
  if (const StateSlots* slots = state_.step->state_slots())
    std::printf("  offload       optimizer states, %s in %s, through two device slots of %s: "
                "all of them each way a step\n",
                format_bytes(arena_->bytes(MemPlace::Host, MemCategory::Optimizer)).c_str(),
                backend_->host_tier().memory_name(), format_bytes(slots->slot_bytes()).c_str());
  if (const LayerStream* stream = state_.model->weight_store().stream()) {
    std::string layers;
    for (const int l : stream->layers()) layers += (layers.empty() ? "" : ", ") + std::to_string(l);
    const LayerStream::StepTraffic traffic =
        stream->step_traffic(cfg.micro_batches_per_rank(), memory.fused_update);
    std::printf("  offload       layers %s: their matrices, %s in %s, through %d device slot%s: "
                "%s fetched and %s written back a step%s\n",
                layers.c_str(),
                format_bytes(arena_->bytes(MemPlace::Host, MemCategory::Weights)).c_str(),
                backend_->host_tier().memory_name(), stream->slots(), stream->slots() == 1 ? "" : "s",
                format_bytes(traffic.fetched()).c_str(), format_bytes(traffic.written_back).c_str(),
                memory.fused_update
                    ? ""
                    : (" (each of the " + std::to_string(cfg.micro_batches_per_rank()) +
                       " micro-batches fetches them for its passes, then the updates' pass)")
                          .c_str());
  }
  if (cfg.offload.any() || !offload_why_.empty()) {
    const int engines = backend_->copy_engines();
    const std::string has =
        backend_->storage().cuda ? "the GPU has " + std::to_string(engines) + " copy engine" +
                                       (engines == 1 ? "" : "s") + " (asyncEngineCount)"
                                 : "the CPU backend has " + std::to_string(engines) +
                                       " copy threads";
    std::printf("  offload       copies %s: %s\n",
                copy_queues_ == 1 ? "one way at a time" : "both ways at once", has.c_str());
  }
  std::string savings;
  for (const auto& o : state_.optimizers->all()) savings += o->flops_note();
  std::printf("  FLOPs/token   %.4g (6 x matmul params + 12 x layers x d x seq_len%s)\n",
              flops_per_token_, savings.c_str());
  if (backend_->peak_flops() > 0)
    std::printf("  MFU           achieved FLOP/s over %.0f TFLOP/s (the device's dense bf16 peak)\n",
                backend_->peak_flops() / 1e12);
  std::printf("  memory\n%s", arena_->report().c_str());
  std::printf("  out_dir       %s%s\n", cfg.out_dir.c_str(),
              moved_to.empty() ? ""
                               : (" (its earlier contents moved to " + moved_to + ": --overwrite)").c_str());
}

void Run::print_run_lines() const {
  if (evaluator_)
    std::printf("  eval          first %lld tokens of %s, %s, %d sequence%s a forward%s\n",
                (long long)cfg.eval_tokens, evaluator_->stream().describe().c_str(),
                cfg.eval_every > 0
                    ? ("every " + std::to_string(cfg.eval_every) + " steps and at the end").c_str()
                    : "after the last step",
                eval_batch_, eval_batch_ == 1 ? "" : "s",
                state_.eval_model ? " (a forward-only model on the same weights)" : "");
  if (cfg.checkpoint_every > 0)
    std::printf("  checkpoints   every %lld steps and after the last, into %s; keep the last %lld%s\n",
                (long long)cfg.checkpoint_every, checkpoint_root(cfg).c_str(),
                (long long)cfg.checkpoint_keep,
                cfg.checkpoint_keep_every > 0
                    ? (" and every multiple of " + std::to_string(cfg.checkpoint_keep_every)).c_str()
                    : "");
  if (!resumed_from.empty())
    std::printf("  resume        from %s (step %lld of %lld)\n", resumed_from.c_str(),
                (long long)start_step, (long long)cfg.steps);
  else if (!restart_note.empty())
    std::printf("  resume        %s\n", restart_note.c_str());
  else if (!cfg.init_from.empty())
    std::printf("  init          weights from %s\n", cfg.init_from.c_str());
}

StepMetrics Run::step(int64_t step, double* seconds_so_far) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t waits_before = backend_->host_waits();
  const Backend::CopyTotals copies_before = backend_->copy_totals();
  const double lr = schedule_lr(cfg.schedule, cfg.optimizer.lr, step, cfg.steps);
  const TraceRange step_range("step");
  const StepOutcome outcome = train_step(state_, cfg, step, lr, [&](int32_t* in, int32_t* tg) {
    loader_->next_batch(in, tg);
  });
  if (!std::isfinite(outcome.loss))
    throw UserError("step " + std::to_string(step + 1) + ": loss is " +
                    std::to_string(outcome.loss) +
                    " (diverged): lower optimizer.lr or set grad_clip");
  backend_->synchronize();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  StepMetrics m;
  m.step = step + 1;
  m.total_steps = cfg.steps;
  m.loss = outcome.loss;
  m.lr = lr;
  m.grad_norm = outcome.grad_norm;
  m.clip_coef = outcome.clip_coef;
  m.step_ms = seconds * 1e3;
  m.tokens_per_s = double(cfg.tokens_per_step()) / seconds;
  m.gflops_per_s = m.tokens_per_s * flops_per_token_ / 1e9;
  if (backend_->peak_flops() > 0) m.mfu = m.gflops_per_s * 1e9 / backend_->peak_flops();
  const Backend::DeviceMemory device = backend_->device_memory();
  m.mem_device_used_bytes = device.used;
  if (step == start_step && backend_->storage().cuda) report_late_allocations(device);
  m.mem_device_bytes = device.total;
  if (backend_->storage().cuda) m.host_waits = backend_->host_waits() - waits_before;
  const int64_t comm_bytes = grads_comm_->take_bytes_reduced();
  if (launched) m.comm_bytes = comm_bytes;
  m.tokens_seen = (step + 1) * cfg.tokens_per_step();
  m.mem_bytes = arena_->peak_bytes();
  m.mem_host_bytes = arena_->total_bytes(MemPlace::Host);
  if (cfg.offload.any()) {  // the copies this step's end waited for (the GPU's: timed by events)
    const Backend::CopyTotals copies = backend_->copy_totals();
    m.copy_bytes = copies.bytes - copies_before.bytes;
    const double busy = copies.seconds - copies_before.seconds;
    m.copy_gbps = busy > 0 ? double(m.copy_bytes) / busy / 1e9 : 0;
  }
  m.attention = name_of(attention_.kernel);
  m.cudnn_version = attention_.cudnn_version;
  *seconds_so_far += seconds;
  m.eta_s = *seconds_so_far / double(step + 1 - start_step) * double(cfg.steps - step - 1);
  return m;
}

// Every device allocation belongs before the reservation (kernels/backend.h, kGpuHeadroomBytes);
// the first step is where a late one shows: a lazy NCCL connection, a cuDNN plan built at first
// use, kernels loaded lazily, local memory for a kernel with a larger stack than the pool the
// backend took up front. Each rank says so for itself: a note within the headroom (an H200
// measured 54 MiB before the pool was taken up front, docs/gpu-status.md), a warning past it.
void Run::report_late_allocations(const Backend::DeviceMemory& device) const {
  const int64_t grown = device.used - device_at_reservation_.used;
  if (grown <= 0) return;
  const std::string rank = launched ? " (rank " + std::to_string(comm.rank()) + " of " +
                                          std::to_string(comm.world()) + ")"
                                    : "";
  const bool over = grown > kGpuHeadroomBytes;
  std::string stack;
  if (device.stack_per_thread != device_at_reservation_.stack_per_thread)
    stack = "; the per-thread stack limit rose from " +
            std::to_string(device_at_reservation_.stack_per_thread) + " to " +
            std::to_string(device.stack_per_thread) + " bytes";
  if (device_at_reservation_.local_pool_taken > 0)
    stack += "; " + format_bytes(device_at_reservation_.local_pool_taken) +
             " were taken for kernels' local memory before the reservation";
  std::fprintf(stderr,
               "%s%s: the GPU memory in use grew by %s during the first step, after the run's "
               "reservation, %s the %s it leaves free (a lazy NCCL connection, a cuDNN plan, "
               "lazily loaded kernels, kernels' local memory, or another process on this GPU)%s\n",
               over ? "warning" : "note", rank.c_str(), format_bytes(grown).c_str(),
               over ? "more than" : "within", format_bytes(kGpuHeadroomBytes).c_str(),
               stack.c_str());
}

bool Run::log(const StepMetrics& m) {
  if (metrics_) metrics_->write(m);
  const int64_t step = m.step - 1;
  const bool due = m.step % cfg.log_every == 0 || step == start_step || m.step == cfg.steps;
  if (!due || !leader) return due;
  std::printf("%s\n", format_step_line(m).c_str());
  std::fflush(stdout);
  return due;
}

void Run::maybe_evaluate(int64_t step, TrainResult& result) {
  const bool due = (cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0) || step + 1 == cfg.steps;
  if (!evaluator_ || !due) return;
  LlamaModel& model = state_.eval_model ? *state_.eval_model : *state_.model;
  const EvalResult eval = evaluator_->evaluate(model, std::min(eval_batch_, model.max_batch()));
  const EvalMetrics e{step + 1, eval.loss, eval.perplexity, eval.tokens};
  metrics_->write_eval(e);
  std::printf("%s\n", format_eval_line(e).c_str());
  std::fflush(stdout);
  result.final_eval = eval;
}

// Every rank's loader position goes into the checkpoint, for a resume on as many ranks.
void Run::maybe_checkpoint(int64_t step, bool logged, bool now) {
  if (cfg.checkpoint_every <= 0 ||
      (!now && (step + 1) % cfg.checkpoint_every != 0 && step + 1 != cfg.steps))
    return;
  const auto c0 = std::chrono::steady_clock::now();
  std::vector<LoaderPosition> positions;
  if (comm.world() > 1) {
    const LoaderPosition mine = loader_->position();
    const std::vector<uint64_t> epochs = comm.all_gather(mine.epoch);
    const std::vector<uint64_t> indices = comm.all_gather(mine.index);
    for (size_t r = 0; r < epochs.size(); r++) positions.push_back({epochs[r], indices[r]});
  }
  if (!leader) return;
  const std::string dir =
      save_checkpoint(cfg, *arena_, state_, *loader_, step + 1, metrics_->rows(), positions);
  if (logged || cfg.checkpoint_every >= cfg.log_every) {
    std::printf("checkpoint %s (%.2f s)\n", dir.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count());
    std::fflush(stdout);
  }
}

bool Run::stop_requested(int signal) const {
  if (comm.world() == 1) return signal != 0;
  const std::vector<uint64_t> all = comm.all_gather(uint64_t(signal != 0));
  return std::any_of(all.begin(), all.end(), [](uint64_t s) { return s != 0; });
}

std::string Run::save_final(int64_t steps_done, int stop_signal) {
  const bool checkpointed = cfg.checkpoint_every > 0 &&
                            (steps_done % cfg.checkpoint_every == 0 || steps_done == cfg.steps);
  if (cfg.checkpoint_every > 0 && !checkpointed && steps_done > start_step)
    maybe_checkpoint(steps_done - 1, true, /*now=*/true);  // a stop between checkpoints
  if (!leader) return "";
  if (cfg.checkpoint_every > 0)
    return checkpoint_root(cfg) + "/" + checkpoint_dir_name(steps_done);
  return save_final_model(*state_.model, cfg, steps_done, signal_name(stop_signal));
}

// A median needs two timed steps (the first warms caches and pages); fewer, and the line says
// what the one figure is.
void Run::summarize(const TrainResult& result, double first_step_rate) const {
  const int64_t steps = int64_t(result.losses.size());
  const int64_t timed = steps - 1;
  const double rate = timed == 0 ? first_step_rate : result.tokens_per_second;
  const char* rate_label = timed >= 2 ? "median " : "";
  const char* rate_note = timed >= 2  ? ""
                          : timed == 1 ? " (one step after the first)"
                                       : " (the only step, warm-up included)";
  char mfu[48] = "";
  if (backend_->peak_flops() > 0)
    std::snprintf(mfu, sizeof mfu, ", MFU %.1f%%",
                  100 * rate * flops_per_token_ / backend_->peak_flops());
  char clipped[64] = "";
  if (cfg.grad_clip > 0)
    std::snprintf(clipped, sizeof clipped, ", clipped %lld (%.0f%%)",
                  (long long)result.clipped_steps, 100.0 * double(result.clipped_steps) / double(steps));
  std::printf("done: %lld steps%s, loss %.4f -> %.4f, %s%.1f tok/s%s%s; metrics in %s/metrics.jsonl\n",
              (long long)steps, clipped, result.losses.front(), result.losses.back(), rate_label, rate,
              rate_note, mfu, cfg.out_dir.c_str());
}

// SIGINT and SIGTERM while training: the first asks the loop to stop after the step in flight and
// save the model; a second ends the process at once, as the signal would have.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction action = {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &previous_[0]);
    sigaction(SIGTERM, &action, &previous_[1]);
  }
  ~StopSignals() {
    sigaction(SIGINT, &previous_[0], nullptr);
    sigaction(SIGTERM, &previous_[1], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  static int received() { return received_.load(); }

 private:
  static void on_signal(int signal) {
    int none = 0;
    if (received_.compare_exchange_strong(none, signal)) return;
    std::signal(signal, SIG_DFL);  // the second one: as if nobody had caught it
    std::raise(signal);
  }
  static inline std::atomic<int> received_{0};
  struct sigaction previous_[2] = {};
};
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler sets it");

}  // namespace

TrainResult train(const RunConfig& cfg, const TrainOptions& options) {
  Run run(cfg, options);
  if (run.leader) run.print_table();
  TrainResult result;
  result.first_step = run.start_step;
  result.resumed_from = run.resumed_from;
  std::vector<double> rates;  // tokens/s of the steps after the first
  double first_step_rate = 0, seconds_so_far = 0;
  const StopSignals signals;
  int64_t steps_done = run.start_step;
  for (int64_t step = run.start_step; step < cfg.steps; step++) {
    const StepMetrics m = run.step(step, &seconds_so_far);
    const bool logged = run.log(m);
    result.losses.push_back(m.loss);
    result.clipped_steps += m.clip_coef < 1.0;
    run.maybe_evaluate(step, result);
    run.maybe_checkpoint(step, logged);
    if (step > run.start_step) rates.push_back(m.tokens_per_s);
    else first_step_rate = m.tokens_per_s;
    steps_done = step + 1;
    if (step + 1 < cfg.steps && run.stop_requested(StopSignals::received())) {
      result.stop_signal = StopSignals::received() ? StopSignals::received() : SIGTERM;
      break;
    }
  }
  if (!rates.empty()) {
    std::sort(rates.begin(), rates.end());
    result.tokens_per_second = rates[rates.size() / 2];
  }
  if (run.leader) run.summarize(result, first_step_rate);
  result.saved = run.save_final(steps_done, result.stop_signal);
  if (run.leader) {
    if (result.stop_signal)
      std::printf("stopped by %s after step %lld of %lld: %s %s; %s\n",
                  signal_name(result.stop_signal), (long long)steps_done, (long long)cfg.steps,
                  cfg.checkpoint_every > 0 ? "checkpoint" : "model saved to",
                  result.saved.c_str(),
                  cfg.checkpoint_every > 0
                      ? "run the same command again to resume"
                      : "without checkpoints the run cannot be resumed (checkpoint_every)");
    else
      std::printf("model %s (grass eval --weights, grass sample and grass export read it from "
                  "%s)\n", result.saved.c_str(), cfg.out_dir.c_str());
    std::fflush(stdout);
  }
  return result;
}

}  // namespace grass
