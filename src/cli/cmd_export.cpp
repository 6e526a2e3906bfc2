// grass export --checkpoint DIR --out HF_DIR [--dtype bf16|fp32] [--tokenizer MODEL]
#include <cstdio>

#include "src/cli/commands.h"
#include "src/cli/options.h"
#include "src/core/arena.h"
#include "src/core/error.h"
#include "src/core/format.h"
#include "src/train/hf_interop.h"

namespace grass::cli {

namespace {
const char* kExportUsage =
    "usage: grass export --checkpoint DIR --out HF_DIR [--dtype fp32|bf16] [--tokenizer MODEL]\n"
    "\n"
    "Writes a checkpoint or a run's final model as a Hugging Face model directory that\n"
    "transformers loads as\n"
    "LlamaForCausalLM: config.json (LlamaConfig), model.safetensors (HF tensor names,\n"
    "__metadata__ {\"format\": \"pt\"}) and, when the run had data.tokenizer, tokenizer.model and\n"
    "tokenizer_config.json. The checkpoint is verified (sizes and checksums) first.\n"
    "\n"
    "options:\n"
    "  --checkpoint DIR   a checkpoint (out_dir/checkpoints/step_XXXXXXXX), a run's final model\n"
    "                     (out_dir/model), or a run's out_dir: its newest complete checkpoint,\n"
    "                     else its final model\n"
    "  --out HF_DIR       the directory to write (created; files of an earlier export replaced)\n"
    "  --dtype fp32|bf16  weight dtype (default fp32, the training precision; bf16 rounds to\n"
    "                     nearest even)\n"
    "  --tokenizer MODEL  the SentencePiece model to include (default: the checkpoint's copy)\n"
    "  -h, --help         this help\n";
}  // namespace

int cmd_export(const Args& args) {
  std::string checkpoint_path, out, dtype = "fp32", tokenizer, value;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    if (is_help(a)) {
      std::fputs(kExportUsage, stdout);
      return 0;
    } else if (take_option(args, i, "--checkpoint", value)) {
      checkpoint_path = value;
    } else if (take_option(args, i, "--out", value)) {
      out = value;
    } else if (take_option(args, i, "--dtype", value)) {
      dtype = value;
    } else if (take_option(args, i, "--tokenizer", value)) {
      tokenizer = value;
    } else {
      throw UserError("export: unknown argument " + a + " (see grass export --help)");
    }
  }
  if (checkpoint_path.empty()) throw UserError("export: missing --checkpoint (see grass export --help)");
  if (out.empty()) throw UserError("export: missing --out (see grass export --help)");
  if (dtype != "fp32" && dtype != "bf16")
    throw UserError("export: --dtype " + dtype + ": expected fp32 or bf16");
  const ExportSource source = export_source(checkpoint_path);
  const ExportResult r = export_hf(source, out, dtype == "bf16", tokenizer);
  std::printf("exported %s: %.2f M parameters, %s, %s of weights -> %s\n",
              source.description.c_str(), double(r.parameters) / 1e6, dtype.c_str(),
              format_bytes(int64_t(r.weight_bytes)).c_str(), out.c_str());
  if (r.tokenizer.empty())
    std::printf("  no tokenizer: the run had no data.tokenizer; pass --tokenizer MODEL to include "
                "one\n");
  else
    std::printf("  tokenizer %s\n", r.tokenizer.c_str());
  return 0;
}

}  // namespace grass::cli
