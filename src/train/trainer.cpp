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
#include "optim/clip.h"
#include "optim/schedule.h"
#include "core/trace.h"
#include "train/backend_choice.h"
#include "train/evaluator.h"
#include "train/memory_plan.h"
#include "train/metrics.h"
#include "train/training_state.h"

namespace grass {

namespace {

void print_run_table(const RunConfig& cfg, const Backend& backend, const LlamaModel& model,
                     double flops_per_token, const TokenLoader& loader, const Arena& arena) {
  const ModelConfig& m = cfg.model;
  std::printf("grass train %s\n", cfg.source.c_str());
  std::printf("  device        %s\n", backend.describe().c_str());
  std::printf("  model         %s: d %d, ffn %d, heads %d (kv %d), layers %d, vocab %d%s\n",
              cfg.model_path.empty() ? "inline" : cfg.model_path.c_str(), m.hidden_size,
              m.intermediate_size, m.num_attention_heads, m.num_key_value_heads,
              m.num_hidden_layers, m.vocab_size, m.tie_word_embeddings ? ", tied" : "");
  std::printf("  parameters    %.2f M\n", double(model.num_params()) / 1e6);
  std::printf("  data          %zu shard(s), %.2f M tokens\n", loader.shards().size(),
              double(loader.total_tokens()) / 1e6);
  std::printf("  batch         %d x %d micro-batches of %d x %d tokens = %lld tokens per step\n",
              cfg.grad_accum_steps(), cfg.micro_batch_size, cfg.micro_batch_size, cfg.seq_len,
              (long long)cfg.tokens_per_step());
  std::printf("  optimizer     %s lr %.1e betas (%.3g, %.3g) eps %.0e wd %.3g, clip %.3g\n",
              cfg.optimizer.name.c_str(), cfg.optimizer.lr, cfg.optimizer.beta1,
              cfg.optimizer.beta2, cfg.optimizer.eps, cfg.optimizer.weight_decay, cfg.grad_clip);
  if (cfg.optimizer.name == "grass") {
    const GrassConfig& g = cfg.optimizer.grass;
    std::string targets;
    for (const std::string& t : g.targets) targets += (targets.empty() ? "" : ",") + t;
    std::printf("  grass         rank %d, refresh every %lld steps, scale %.3g, %s, select_dim %s, "
                "targets %s (the rest: dense AdamW)\n",
                g.rank, (long long)g.update_interval, g.scale, g.selection.c_str(),
                g.select_dim.c_str(), targets.c_str());
  }
  std::printf("  schedule      %s, warmup %lld, min_lr_ratio %.3g, %lld steps\n",
              cfg.schedule.name.c_str(), (long long)cfg.schedule.warmup_steps,
              cfg.schedule.min_lr_ratio, (long long)cfg.steps);
  std::printf("  precision     %s, seed %llu\n", backend.storage().describe(),
              (unsigned long long)cfg.seed);
  std::printf("  FLOPs/token   %.4g (6 x matmul params + 12 x layers x d x seq_len%s)\n",
              flops_per_token,
              cfg.optimizer.name == "grass" ? ", less 2mn - 2rn per GRASS target" : "");
  if (backend.peak_flops() > 0)
    std::printf("  MFU           achieved FLOP/s over %.0f TFLOP/s (the device's dense bf16 peak)\n",
                backend.peak_flops() / 1e12);
  std::printf("  memory\n%s", arena.report().c_str());
  std::printf("  out_dir       %s\n", cfg.out_dir.c_str());
  std::fflush(stdout);
}

}  // namespace

TrainResult train(const RunConfig& cfg) {
  // Everything that can fail on user input happens before out_dir is touched.
  TokenLoader loader(cfg.train_files, cfg.micro_batch_size, cfg.seq_len,
                     {.shuffle = cfg.shuffle, .seed = cfg.seed, .prefetch = true});
  loader.check_vocab(cfg.model.vocab_size);
  if (!cfg.tokenizer.empty()) loader.stream().check_tokenizer(cfg.tokenizer);
  std::optional<Evaluator> evaluator;
  if (!cfg.val_files.empty()) {
    evaluator.emplace(cfg.val_files, cfg.eval_tokens);
    evaluator->stream().check_vocab(cfg.model.vocab_size);
    if (!cfg.tokenizer.empty()) evaluator->stream().check_tokenizer(cfg.tokenizer);
  }

  const std::unique_ptr<Backend> backend = choose_backend(cfg);
  // GPU memory comes as one reservation of the planned size, cut into the named buffers.
  const MemoryPlan plan = plan_memory(cfg, backend->storage());
  backend->reserve(plan.total, plan.buffers);
  Arena arena(false, *backend);
  TrainingState state = build_training_state(cfg, arena, *backend);
  LlamaModel& model = *state.model;
  AdamW& optimizer = *state.adamw;
  GrassOptimizer* grass = state.grass.get();
  model.init_weights(cfg.seed);

  const int64_t N = int64_t(cfg.micro_batch_size) * cfg.seq_len;
  std::vector<int32_t> inputs(N), targets(N);

  std::error_code ec;
  std::filesystem::create_directories(cfg.out_dir, ec);
  if (ec) throw UserError(cfg.out_dir + ": cannot create out_dir: " + ec.message());
  {
    const std::string path = cfg.out_dir + "/config.json";
    std::ofstream out(path);
    out << to_json(cfg).dump(2) << '\n';
    if (!out) throw UserError(path + ": cannot write");
  }
  MetricsWriter metrics(cfg.out_dir + "/metrics.jsonl");
  // FLOPs actually done: a GRASS target's weight gradient costs 2rn, not 2mn
  const double flops_per_token =
      model.flops_per_token() - (grass ? grass->flops_saved_per_token() : 0.0);
  print_run_table(cfg, *backend, model, flops_per_token, loader, arena);
  if (evaluator) {
    std::printf("  eval          first %lld tokens of %s, %s\n", (long long)cfg.eval_tokens,
                evaluator->stream().describe().c_str(),
                cfg.eval_every > 0
                    ? ("every " + std::to_string(cfg.eval_every) + " steps and at the end").c_str()
                    : "after the last step");
    std::fflush(stdout);
  }

  TrainResult result;
  std::vector<double> rates;
  double seconds_so_far = 0;
  const int accum = cfg.grad_accum_steps();
  for (int64_t step = 0; step < cfg.steps; step++) {
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = schedule_lr(cfg.schedule, cfg.optimizer.lr, step, cfg.steps);
    const TraceRange step_range("step");
    model.zero_grads();
    if (grass) grass->begin_step(step);
    double loss = 0;
    for (int micro = 0; micro < accum; micro++) {
      loader.next_batch(inputs.data(), targets.data());
      loss += model.forward(inputs.data(), targets.data(), cfg.micro_batch_size) / accum;
      model.backward(1.0 / accum);  // the step's loss is the mean over its micro-batches
    }
    if (!std::isfinite(loss))
      throw UserError("step " + std::to_string(step + 1) + ": loss is " + std::to_string(loss) +
                      " (diverged): lower optimizer.lr or set grad_clip");
    // one global norm over the dense and the compressed gradients
    const double gnorm =
        std::sqrt(model.backend().sum_squares(model.grads_buffer(), model.num_dense_grads()) +
                  (grass ? grass->grad_sum_squares() : 0.0));
    const double clip = clip_coefficient(gnorm, cfg.grad_clip);
    {
      const TraceRange range("optimizer");
      if (grass) grass->step(model, clip, lr);
      optimizer.step(model, clip, lr, step + 1);
    }
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
    m.mem_device_bytes = backend->device_memory_bytes();
    m.tokens_seen = (step + 1) * cfg.tokens_per_step();
    m.mem_bytes = arena.peak_bytes();
    seconds_so_far += seconds;
    m.eta_s = seconds_so_far / double(step + 1) * double(cfg.steps - step - 1);
    metrics.write(m);
    if ((step + 1) % cfg.log_every == 0 || step == 0 || step + 1 == cfg.steps) {
      std::printf("%s\n", format_step_line(m).c_str());
      std::fflush(stdout);
    }
    result.losses.push_back(loss);
    const bool eval_now = (cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0) ||
                          step + 1 == cfg.steps;
    if (evaluator && eval_now) {
      const EvalResult eval = evaluator->evaluate(model, cfg.micro_batch_size);
      const EvalMetrics e{step + 1, eval.loss, eval.perplexity, eval.tokens};
      metrics.write_eval(e);
      std::printf("%s\n", format_eval_line(e).c_str());
      std::fflush(stdout);
      result.final_eval = eval;
    }
    if (step > 0) rates.push_back(m.tokens_per_s);  // the first step warms caches and pages
  }
  if (!rates.empty()) {
    std::sort(rates.begin(), rates.end());
    result.tokens_per_second = rates[rates.size() / 2];
  }
  char mfu[48] = "";
  if (backend->peak_flops() > 0)
    std::snprintf(mfu, sizeof mfu, ", MFU %.1f%%",
                  100 * result.tokens_per_second * flops_per_token / backend->peak_flops());
  std::printf("done: %lld steps, loss %.4f -> %.4f, median %.1f tok/s%s; metrics in %s/metrics.jsonl\n",
              (long long)cfg.steps, result.losses.front(), result.losses.back(),
              result.tokens_per_second, mfu, cfg.out_dir.c_str());
  return result;
}

}  // namespace grass
