// grass: the command line. Each subcommand lives in src/cli/cmd_<name>.cpp; every user error ends
// as one "error: ..." line on stderr and exit code 2, an internal error as exit code 1. Under
// mpirun each rank's line names the rank, and the first error ends every rank of the job.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/blas_kernels.h"
#include "src/cli/build_info.h"
#include "src/cli/commands.h"
#include "src/core/error.h"
#include "src/core/gpu_environment.h"
#include "src/train/backend_choice.h"

namespace {

constexpr int kExitUserError = 2;

grass::Communicator* launched_ranks = nullptr;  // set by main() when a launcher started us

struct Command {
  const char* name;
  const char* synopsis;  // shown in `grass --help`
  int (*run)(const grass::cli::Args&);
};

const Command kCommands[] = {
    {"train", "train <run.json> [--resume DIR] [--overwrite] [--set key=value ...]   train (resumes from out_dir's checkpoints)",
     grass::cli::cmd_train},
    {"mem", "mem <run.json> [--memory-limit SIZE] [--set key=value ...]   will it fit: the memory a run will take, by category",
     grass::cli::cmd_mem},
    {"eval", "eval <run.json> [--weights PATH] [--tokens N] [--json]   validation perplexity",
     grass::cli::cmd_eval},
    {"export", "export --checkpoint DIR --out HF_DIR [--dtype fp32|bf16]   a checkpoint as a Hugging Face model",
     grass::cli::cmd_export},
    {"sample", "sample <weights> [--prompt TEXT] [--tokens N] [--greedy]   text the model writes (from a run, checkpoint or HF dir)",
     grass::cli::cmd_sample},
    {"prepare", "prepare --input <files> --tokenizer <model> --out <dir>   tokenize text into shards",
     grass::cli::cmd_prepare},
    {"tokenizer", "tokenizer train|encode|info ...   make a SentencePiece tokenizer, or use one",
     grass::cli::cmd_tokenizer},
};

void print_usage(FILE* out) {
  std::fputs("grass: LLaMA pretraining with GRASS sparse gradients\n\n"
             "usage: grass <command> [options]\n\ncommands:\n",
             out);
  for (const Command& c : kCommands) std::fprintf(out, "  %s\n", c.synopsis);
  std::fputs("\noptions:\n"
             "  -h, --help      this help; `grass <command> --help` for a command's own\n"
             "  --version       the commit, the build's options, and the GPU and cuDNN found\n\n"
             "Run configs live in configs/runs/, model configs (Hugging Face LlamaConfig JSON) in\n"
             "configs/models/; docs/configs.md lists every key.\n",
             out);
}

// The commit and the build's options, then what this machine offers them.
void print_version() {
  const grass::cli::BuildInfo& build = grass::cli::build_info();
  std::printf("grass %s (%s build, %s)\n", build.commit, build.build_type, build.compiler);
  const std::string cuda = build.cuda;
  std::printf("  CUDA backend     %s\n",
              cuda.empty() ? "not built (no nvcc at configure time): the CPU backend only"
                           : ("built with " + cuda + " for sm " + build.cuda_archs).c_str());
  const grass::RuntimeReport runtime = grass::runtime_report();
  if (!runtime.gpu.empty()) std::printf("                   %s\n", runtime.gpu.c_str());
  const std::string cudnn = build.cudnn;
  if (!cuda.empty())
    std::printf("  cuDNN attention  %s\n",
                cudnn.empty() ? "not built (no cudnn.h at configure time)"
                              : ("built (cudnn.h from " + cudnn + "); at run time: " +
                                 runtime.cudnn).c_str());
  const std::string mpi = build.mpi;
  std::printf("  MPI              %s\n",
              mpi.empty() ? "not built: one process only" : ("built with " + mpi).c_str());
}

}  // namespace

namespace grass::cli {
bool is_help(const std::string& arg) { return arg == "-h" || arg == "--help"; }
Communicator& communicator() { return launched_ranks ? *launched_ranks : single_process(); }
}  // namespace grass::cli

namespace {
// One line on stderr; under several ranks it names the rank and ends the whole job.
int fail(const char* kind, const char* what, int code) {
  std::fflush(stdout);
  grass::Communicator& ranks = grass::cli::communicator();
  if (ranks.world() == 1) {
    std::fprintf(stderr, "%s: %s\n", kind, what);
    return code;
  }
  std::fprintf(stderr, "%s (rank %d of %d): %s\n", kind, ranks.rank(), ranks.world(), what);
  std::fflush(stderr);
  ranks.abort(code);
}
}  // namespace

int main(int argc, char** argv) {
  grass::reload_with_supported_openblas_kernels(argv);  // before anything: it may exec again
  grass::request_eager_module_loading();  // before MPI, which may start CUDA
  std::unique_ptr<grass::Communicator> launched;
  try {
    launched = grass::launch_communicator(&argc, &argv);
  } catch (const grass::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitUserError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: starting MPI: %s\n", e.what());
    return 1;
  }
  launched_ranks = launched.get();
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.empty()) {
      print_usage(stderr);
      return kExitUserError;
    }
    if (grass::cli::is_help(args[0])) {
      print_usage(stdout);
      return 0;
    }
    if (args[0] == "--version") {
      print_version();
      return 0;
    }
    const std::string name = args[0];
    args.erase(args.begin());
    for (const Command& c : kCommands)
      if (name == c.name) return c.run(args);
    throw grass::UserError("unknown command \"" + name + "\" (see grass --help)");
  } catch (const grass::UserError& e) {
    return fail("error", e.what(), kExitUserError);
  } catch (const std::exception& e) {
    return fail("internal error", e.what(), 1);
  }
}
