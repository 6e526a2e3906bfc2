// grass eval <run.json> [--weights model.safetensors] [--tokens N] [--set key=value ...]
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "src/cli/commands.h"
#include "src/cli/options.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/core/error.h"
#include "src/data/data_sets.h"
#include "src/io/safetensors.h"
#include "src/model/hf_weights.h"
#include "src/model/llama.h"
#include "src/train/backend_choice.h"
#include "src/train/checkpointing.h"
#include "src/train/evaluator.h"
#include "src/train/hf_interop.h"
#include "src/train/memory_plan.h"

namespace grass::cli {

namespace {
const char* kEvalUsage =
    "usage: grass eval <run.json> [--weights PATH] [--tokens N] [--json] [--set key=value ...]\n"
    "\n"
    "Validation loss and perplexity of the run's model on its validation data (data.val): the\n"
    "mean token cross-entropy over the first N target tokens of the validation stream, in order,\n"
    "and perplexity = exp(mean). Windows of seq_len + 1 tokens at stride seq_len, eval_batch_size\n"
    "of them per forward pass (\"auto\": as many as the memory the run would train in allows).\n"
    "Prints one line on stdout.\n"
    "\n"
    "options:\n"
    "  --weights <path>  Hugging Face safetensors weights (model.embed_tokens.weight, ...): a\n"
    "                    .safetensors file, a Hugging Face model directory (single or sharded),\n"
    "                    a checkpoint directory, or a run's out_dir (its newest checkpoint);\n"
    "                    without it, the run's initial weights (seeded by the run's seed)\n"
    "  --tokens <n>      target tokens to evaluate (default: the run's eval_tokens)\n"
    "  --set key=value   override a run config key, as for grass train\n"
    "  --json            print the result as one JSON object (full precision) instead\n"
    "  -h, --help        this help\n";
}  // namespace

int cmd_eval(const Args& args) {
  std::string run_path, weights, tokens_text, value;
  std::vector<std::string> overrides;
  bool as_json = false;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    if (is_help(a)) {
      std::fputs(kEvalUsage, stdout);
      return 0;
    } else if (take_option(args, i, "--weights", value)) {
      weights = value;
    } else if (take_option(args, i, "--tokens", value)) {
      tokens_text = value;
    } else if (take_option(args, i, "--set", value)) {
      overrides.push_back(value);
    } else if (a == "--json") {
      as_json = true;
    } else if (a.rfind("-", 0) == 0) {
      throw UserError("eval: unknown option " + a + " (see grass eval --help)");
    } else if (run_path.empty()) {
      run_path = a;
    } else {
      throw UserError("eval: one run config expected, got a second: " + a);
    }
  }
  if (run_path.empty()) throw UserError("eval: missing <run.json> (see grass eval --help)");
  const RunConfig cfg = load_run_config(run_path, overrides);
  if (cfg.val_files.empty())
    throw UserError(run_path + ": data.val: grass eval needs validation token shards; add "
                    "data.val to the run config or --set data.val=<shards>");
  const int64_t tokens =
      tokens_text.empty() ? cfg.eval_tokens : int64_t(parse_count("--tokens", tokens_text, 1));

  const Evaluator evaluator(cfg.val_files, tokens);
  for (const std::string& warning : check_run_data(cfg, nullptr, &evaluator.stream()))
    std::fprintf(stderr, "warning: %s\n", warning.c_str());
  const std::unique_ptr<Backend> backend = choose_backend(cfg);
  const int batch = resolve_eval_batch(cfg, backend->storage(), tokens, /*standalone=*/true);
  Arena arena(false, *backend);
  ModelMemoryOptions forward_only;
  forward_only.forward_only = true;
  LlamaModel model(cfg.model, arena, batch, cfg.seq_len, {}, *backend, forward_only);
  std::string weights_name;
  if (weights.empty()) {
    model.init_weights(cfg.seed);
    weights_name = "untrained: seeded initial weights (seed " + std::to_string(cfg.seed) + ")";
  } else {
    weights_name = load_model_weights(model, weights).description;
  }
  const EvalResult result = evaluator.evaluate(model, batch);
  if (as_json) {
    const nlohmann::json j = {{"run", run_path},         {"weights", weights_name},
                              {"val_loss", result.loss}, {"val_perplexity", result.perplexity},
                              {"val_tokens", result.tokens}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("eval %s | weights %s | val loss %.4f | ppl %.2f | %lld tokens\n", run_path.c_str(),
              weights_name.c_str(), result.loss, result.perplexity, (long long)result.tokens);
  return 0;
}

}  // namespace grass::cli
