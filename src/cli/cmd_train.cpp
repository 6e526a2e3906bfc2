// grass train <run.json> [--resume PATH] [--set key=value ...]
#include <cstdio>

#include "src/cli/commands.h"
#include "src/cli/options.h"
#include "src/config/config.h"
#include "src/core/error.h"
#include "src/train/trainer.h"

namespace grass::cli {

namespace {
const char* kTrainUsage =
    "usage: grass train <run.json> [--resume PATH] [--overwrite] [--memory-limit SIZE]\n"
    "                   [--set key=value ...]\n"
    "\n"
    "Trains the model the run config names and writes <out_dir>/config.json (the full config,\n"
    "defaults filled in) and <out_dir>/metrics.jsonl (one JSON object per step). One log line per\n"
    "log_every steps goes to stdout. With checkpoint_every > 0, checkpoints go to\n"
    "<out_dir>/checkpoints/step_XXXXXXXX, the last one after the last step; without, the trained\n"
    "model goes to <out_dir>/model (a Hugging Face directory). Ctrl-C (SIGINT) or SIGTERM stops\n"
    "after the step in flight and saves the same way (exit code 130 or 143); a second one ends\n"
    "the process at once.\n"
    "\n"
    "out_dir must be absent or empty, or hold this run (the same config, up to the keys that\n"
    "change no result) with checkpoints: then the run resumes from the newest complete one\n"
    "(damaged ones are skipped with a warning) and continues exactly as if it had never stopped;\n"
    "raising steps extends it. Anything else there (an export, another run, a finished run, a\n"
    "run without checkpoints) is refused before anything is written.\n"
    "\n"
    "options:\n"
    "  --resume PATH     resume from this checkpoint directory (or the newest in a run's out_dir),\n"
    "                    also with a changed config (each key that changes results is warned of)\n"
    "  --overwrite       move a non-empty out_dir aside to <out_dir>.old-N first, then start afresh\n"
    "  --memory-limit SIZE\n"
    "                    cap the run's memory (\"40GiB\" emulates a 40 GB card on a larger one):\n"
    "                    a run whose plan is over it stops before training, with the breakdown\n"
    "                    and the largest micro_batch_size that fits (as the key memory_limit)\n"
    "  --set key=value   override a config key; dotted keys reach nested ones, the value is\n"
    "                    parsed as JSON when it is valid JSON, else taken as a string:\n"
    "                      --set steps=50 --set optimizer.lr=3e-4 --set out_dir=runs/try\n"
    "  -h, --help        this help\n";
}  // namespace

int cmd_train(const Args& args) {
  std::string run_path, value;
  TrainOptions options;
  std::vector<std::string> overrides;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    if (is_help(a)) {
      std::fputs(kTrainUsage, stdout);
      return 0;
    } else if (a == "--set") {
      if (i + 1 >= args.size()) throw UserError("--set needs key=value");
      overrides.push_back(args[++i]);
    } else if (a.rfind("--set=", 0) == 0) {
      overrides.push_back(a.substr(6));
    } else if (take_option(args, i, "--memory-limit", value)) {
      overrides.push_back("memory_limit=" + value);
    } else if (a == "--overwrite") {
      options.overwrite = true;
    } else if (take_option(args, i, "--resume", value)) {
      if (value.empty()) throw UserError("--resume needs a checkpoint directory");
      options.resume = value;
    } else if (a.rfind("-", 0) == 0) {
      throw UserError("train: unknown option " + a + " (see grass train --help)");
    } else if (run_path.empty()) {
      run_path = a;
    } else {
      throw UserError("train: one run config expected, got a second: " + a);
    }
  }
  if (run_path.empty()) throw UserError("train: missing <run.json> (see grass train --help)");
  options.comm = &communicator();
  const TrainResult result =
      train(load_run_config(run_path, overrides, options.comm->world()), options);
  return result.stop_signal ? 128 + result.stop_signal : 0;  // as a shell reports a signal
}

}  // namespace grass::cli
