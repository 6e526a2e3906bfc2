// grass mem <run.json> [--memory-limit SIZE] [--set key=value ...]: the verdict first, then the plan
#include <cstdio>
#include <optional>
#include <string>

#include "src/cli/commands.h"
#include "src/cli/options.h"
#include "src/config/config.h"
#include "src/core/error.h"
#include "src/train/memory_plan.h"

namespace grass::cli {

namespace {
const char* kMemUsage =
    "usage: grass mem <run.json> [--device cpu|cuda] [--memory-limit SIZE] [--ranks N] [--json]\n"
    "                 [--link-gbps GB/s] [--copy-queues 1|2] [--tflops T] [--set key=value ...]\n"
    "\n"
    "Says first whether the run fits: its first line is the verdict. With a memory_limit\n"
    "(--memory-limit or the run's key): fits or does not fit it, the largest micro_batch_size\n"
    "that fits, and when the run does not fit, what would (a smaller micro-batch, more activation\n"
    "checkpointing, offload \"auto\"), or the floor: the weights alone. Without one, on the GPU:\n"
    "which card sizes it fits (16, 24, 32, 40, 48, 80 GB; a card sold as N GB is counted as\n"
    "N GiB, the total nvidia-smi shows for an A100 40GB, 40,960 MiB; some show less). A GPU plan\n"
    "counts what a card holds beyond it: 1.01 GiB the CUDA context and libraries take outside\n"
    "the plan (measured on an H200) and the 256 MiB the reservation leaves free.\n"
    "\n"
    "Then the memory the run will take, by category (weights, dense and compressed gradients,\n"
    "optimizer states, activations, workspace), beside the other optimizers on the same model and\n"
    "batch. Nothing is allocated: the run's own allocations are made on a planning arena, so the\n"
    "figures are exactly what `grass train` holds, for any model size. The plan is for the backend\n"
    "the run would take on a machine with a GPU: the GPU (bf16 storage as the run's precision\n"
    "says), or the CPU for device \"cpu\" and for precision fp32 with device \"auto\".\n"
    "\n"
    "  --device cpu|cuda     plan for this backend instead of the run's\n"
    "  --memory-limit SIZE   as the run key memory_limit (\"40GiB\", \"32GiB\", \"40GB\"): the memory\n"
    "                        of the card the verdict is for\n"
    "  --ranks N             plan one rank of `mpirun -np N grass train`: each rank holds the\n"
    "                        same memory, and takes total_batch_size / (micro_batch_size x N)\n"
    "                        micro-batches a step; adds the bytes each rank sums (docs/distributed.md)\n"
    "  --host-memory-limit SIZE  as the run key host_memory_limit: caps the host tier (offload)\n"
    "  --link-gbps GB/s      the host link offload copies over, each way (default 25, PCIe 4 x16)\n"
    "  --copy-queues 1|2     the GPU's copy engines (asyncEngineCount): 2 (default) moves both\n"
    "                        ways at once, each pass taking its busier way's time; 1 in turn\n"
    "  --disk-gbps GB/s      the disk the layer inputs go to with offload.activations \"disk\"\n"
    "                        (default 7, an NVMe SSD)\n"
    "  --tflops T            the sustained rate a step computes at, for the step-time bound\n"
    "                        with offload (default: 40% of an H100's 989 on the GPU; none on\n"
    "                        the CPU)\n"
    "  --json                one JSON object (the run's plan in bytes, the verdict under \"verdict\")\n"
    "                        instead of the text\n"
    "  --set key=value       override a run config key, as for grass train\n"
    "\n"
    "Exit status: 0 the run fits (or no limit was asked), 3 it does not fit memory_limit or\n"
    "host_memory_limit, 2 a user error (one line on stderr), 1 an internal error.\n";
}  // namespace

int cmd_mem(const Args& args) {
  std::string run_path, value;
  std::optional<DeviceChoice> device;  // --device; else the run's
  bool json = false;
  int ranks = 1, copy_queues = 2;
  std::optional<double> link_gbps, disk_gbps, tflops;
  std::vector<std::string> overrides;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    if (is_help(a)) {
      std::fputs(kMemUsage, stdout);
      return 0;
    } else if (a == "--set") {
      if (i + 1 >= args.size()) throw UserError("--set needs key=value");
      overrides.push_back(args[++i]);
    } else if (a == "--json") {
      json = true;
    } else if (take_option(args, i, "--memory-limit", value)) {
      overrides.push_back("memory_limit=" + value);
    } else if (take_option(args, i, "--host-memory-limit", value)) {
      overrides.push_back("host_memory_limit=" + value);
    } else if (take_option(args, i, "--disk-gbps", value)) {
      disk_gbps = parse_positive("--disk-gbps", value);
    } else if (take_option(args, i, "--link-gbps", value)) {
      link_gbps = parse_positive("--link-gbps", value);
    } else if (take_option(args, i, "--copy-queues", value)) {
      if (value != "1" && value != "2")
        throw UserError("mem: --copy-queues " + value + ": expected 1 or 2 (the GPU's copy "
                        "engines: nvidia-smi -q's asyncEngineCount, or deviceQuery's)");
      copy_queues = value == "1" ? 1 : 2;
    } else if (take_option(args, i, "--tflops", value)) {
      tflops = parse_positive("--tflops", value);
    } else if (take_option(args, i, "--ranks", value)) {
      const uint64_t n = parse_count("--ranks", value, 1);
      if (n > (1u << 20)) throw UserError("--ranks " + value + ": more ranks than grass plans for");
      ranks = int(n);
    } else if (a == "--device") {
      if (i + 1 >= args.size()) throw UserError("--device needs cpu or cuda");
      const std::string name = args[++i];
      device = choice_from_name<DeviceChoice>(name);
      if (!device || *device == DeviceChoice::Auto)
        throw UserError("mem: --device " + name + ": expected cpu or cuda");
    } else if (a.rfind("-", 0) == 0) {
      throw UserError("mem: unknown option " + a + " (see grass mem --help)");
    } else if (run_path.empty()) {
      run_path = a;
    } else {
      throw UserError("mem: one run config expected, got a second: " + a);
    }
  }
  if (run_path.empty()) throw UserError("mem: missing <run.json> (see grass mem --help)");
  RunConfig cfg = load_run_config(run_path, overrides, ranks);
  if (device) cfg.device = *device;
  const Storage storage = planned_storage(cfg);
  LinkModel link;
  link.link_gbps = link_gbps.value_or(link.link_gbps);
  link.disk_gbps = disk_gbps.value_or(link.disk_gbps);
  link.copy_queues = copy_queues;
  link.tflops = tflops.value_or(default_tflops(storage));
  std::string why;  // offload "auto" or offload.layers "auto": the placement chosen, and why
  if (cfg.offload.automatic || cfg.offload.layers_auto) {
    OffloadChoice choice = choose_offload(cfg, storage, link);
    cfg = std::move(choice.cfg);
    why = std::move(choice.why);
  }
  if (json) std::fputs(memory_plan_json(cfg, storage, link, why).c_str(), stdout);
  else std::fputs(format_memory_plans(cfg, storage, link, why).c_str(), stdout);
  return memory_verdict(cfg, storage).exit_code();
}

}  // namespace grass::cli
