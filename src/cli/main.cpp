// grass: the command line. Subcommands parse their own arguments; every user error ends as one
// "error: ..." line on stderr and exit code 2, an internal error as exit code 1.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/error.h"
#include "train/trainer.h"

namespace {

constexpr int kExitUserError = 2;

const char* kUsage =
    "grass: LLaMA pretraining with GRASS sparse gradients\n"
    "\n"
    "usage: grass <command> [options]\n"
    "\n"
    "commands:\n"
    "  train <run.json> [--set key=value ...]   train a model from a run config\n"
    "\n"
    "options:\n"
    "  -h, --help      this help; `grass <command> --help` for a command's own\n"
    "\n"
    "Run configs live in configs/runs/, model configs (Hugging Face LlamaConfig JSON) in\n"
    "configs/models/; docs/configs.md lists every key.\n";

const char* kTrainUsage =
    "usage: grass train <run.json> [--set key=value ...]\n"
    "\n"
    "Trains the model the run config names and writes <out_dir>/config.json (the full config,\n"
    "defaults filled in) and <out_dir>/metrics.jsonl (one JSON object per step). One log line per\n"
    "log_every steps goes to stdout.\n"
    "\n"
    "options:\n"
    "  --set key=value   override a config key; dotted keys reach nested ones, the value is\n"
    "                    parsed as JSON when it is valid JSON, else taken as a string:\n"
    "                      --set steps=50 --set optimizer.lr=3e-4 --set out_dir=runs/try\n"
    "  -h, --help        this help\n";

bool is_help(const std::string& a) { return a == "-h" || a == "--help"; }

int cmd_train(const std::vector<std::string>& args) {
  std::string run_path;
  std::vector<std::string> overrides;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    if (is_help(a)) {
      std::fputs(kTrainUsage, stdout);
      return 0;
    } else if (a == "--set") {
      if (i + 1 >= args.size()) throw grass::UserError("--set needs key=value");
      overrides.push_back(args[++i]);
    } else if (a.rfind("--set=", 0) == 0) {
      overrides.push_back(a.substr(6));
    } else if (a.rfind("-", 0) == 0) {
      throw grass::UserError("train: unknown option " + a + " (see grass train --help)");
    } else if (run_path.empty()) {
      run_path = a;
    } else {
      throw grass::UserError("train: one run config expected, got a second: " + a);
    }
  }
  if (run_path.empty()) throw grass::UserError("train: missing <run.json> (see grass train --help)");
  const grass::RunConfig cfg = grass::load_run_config(run_path, overrides);
  grass::train(cfg);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.empty()) {
      std::fputs(kUsage, stderr);
      return kExitUserError;
    }
    if (is_help(args[0])) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    const std::string command = args[0];
    args.erase(args.begin());
    if (command == "train") return cmd_train(args);
    throw grass::UserError("unknown command \"" + command + "\" (see grass --help)");
  } catch (const grass::UserError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitUserError;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 1;
  }
}
