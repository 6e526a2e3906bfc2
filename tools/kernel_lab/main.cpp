// kernel_bench, the kernel lab (docs/kernel-lab.md): every op of the Backend interface, forward and
// backward, timed on the CUDA backend at the shapes of LLaMA 60M, 1B and 13B and checked against
// the CPU backend on a sample. One row per op and shape on stdout; progress on stderr.
//   build/kernel_bench [--model 60m,1b,13b] [--ops linear,head,...] [--batch 16] [--seq 256]
//                      [--repeat 20] [--precision bf16-mixed|bf16] [--smoke] [--csv FILE]
//                      [--seed S] [--configs DIR] [--attention grass|cudnn|mma]
//                      [--state-dtype auto|q8] [--state-block 256]
// Exit status: 0 every check within its tolerance; 1 a check failed, or an error; 2 a bad flag;
// 77 no usable GPU (ctest: skipped). kernel_bench_emu is the same program on the CUDA emulator.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>

#include "kernels/cpu/blas_kernels.h"
#include "src/core/error.h"
#include "src/train/run_resolution.h"
#include "tools/kernel_lab/lab.h"

using namespace grass;
using namespace grass::lab;

namespace {

// The rank r of GRASS, GaLore and FLORA per model: the project's runs at these sizes.
constexpr std::pair<const char*, int> kRanks[] = {{"60m", 128}, {"1b", 512}, {"13b", 256}};

const char* kUsage =
    "usage: kernel_bench [--model 60m,1b,13b] [--ops NAME,...] [--batch B] [--seq T] [--repeat N]\n"
    "                    [--precision bf16-mixed|bf16] [--smoke] [--csv FILE] [--seed S]\n"
    "                    [--configs DIR] [--attention grass|cudnn|mma] [--state-dtype auto|q8]\n"
    "                    [--state-block B]\n"
    "ops: linear rmsnorm attention swiglu residual embedding head adamw sum_squares grass "
    "lowrank\n";

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> items;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) items.push_back(item);
  return items;
}

int positive(const std::string& flag, const std::string& value) {
  size_t used = 0;
  int n = 0;
  try {
    n = std::stoi(value, &used);
  } catch (const std::exception&) {
  }
  if (used != value.size() || n < 1)
    throw UserError(flag + " expects a positive integer, got \"" + value + "\"");
  return n;
}

// --smoke's model: the same model made small enough for the CUDA emulator, keeping what the
// kernels branch on: the head dim (the attention kernel's tiles), the ratio of query to kv heads,
// and widths that are not multiples of 8 where the model has them (1B's ffn 5461 becomes 341).
// Two query heads, hidden 2·HD, ffn width and rank scaled as hidden is, vocab / 64.
Model scaled_down(Model m) {
  ModelConfig& c = m.config;
  const int HD = m.HD();
  const double factor = 2.0 * HD / c.hidden_size;
  c.num_key_value_heads = std::max(1, 2 * c.num_key_value_heads / c.num_attention_heads);
  c.num_attention_heads = 2;
  c.hidden_size = 2 * HD;
  c.intermediate_size = int(c.intermediate_size * factor);
  c.vocab_size /= 64;
  m.rank = std::max(4, int(m.rank * factor));
  return m;
}

Model load_model(const std::string& name, const Options& o) {
  Model m;
  m.name = name;
  m.config = load_model_config(o.configs + "/llama_" + name + ".json");
  m.B = o.B;
  m.T = o.T;
  for (const auto& [model, rank] : kRanks)
    if (name == model) m.rank = rank;
  return o.smoke ? scaled_down(m) : m;
}

// The flags; UserError on a bad one.
Options parse(int argc, char** argv) {
  Options o;
  o.configs = KERNEL_LAB_CONFIGS;
  o.seed = std::random_device{}();
  std::optional<int> batch, seq, repeat;
  for (int i = 1; i < argc; i++) {
    const std::string flag = argv[i];
    if (flag == "--smoke") {
      o.smoke = true;
      continue;
    }
    if (i + 1 >= argc) throw UserError(flag + ": unknown flag or missing value");
    const std::string value = argv[++i];
    if (flag == "--model") {
      o.models = split(value);
    } else if (flag == "--ops") {
      o.ops = split(value);
    } else if (flag == "--batch") {
      batch = positive(flag, value);
    } else if (flag == "--seq") {
      seq = positive(flag, value);
    } else if (flag == "--repeat") {
      repeat = positive(flag, value);
    } else if (flag == "--precision") {
      const std::optional<PrecisionChoice> p = choice_from_name<PrecisionChoice>(value);
      if (p != PrecisionChoice::Bf16Mixed && p != PrecisionChoice::Bf16)
        throw UserError("--precision expects bf16-mixed or bf16 (the GPU's precisions), got \"" +
                        value + "\"");
      o.precision = *p;
    } else if (flag == "--attention") {
      if (value != "grass" && value != "cudnn" && value != "mma")
        throw UserError("--attention expects grass, cudnn or mma, got \"" + value + "\"");
      o.attention = value == "cudnn" ? AttentionKernel::Cudnn
                    : value == "mma" ? AttentionKernel::Mma
                                     : AttentionKernel::Grass;
    } else if (flag == "--state-dtype") {
      if (value != "auto" && value != "q8")
        throw UserError("--state-dtype expects auto (the precision's moments) or q8, got \"" +
                        value + "\"");
      o.q8 = value == "q8";
    } else if (flag == "--state-block") {
      o.state_block = positive(flag, value);
      if (o.state_block < 64 || o.state_block > 4096 || (o.state_block & (o.state_block - 1)) != 0)
        throw UserError("--state-block expects a power of two from 64 to 4096 (optimizer."
                        "state_block's range), got " + value);
    } else if (flag == "--csv") {
      o.csv = value;
    } else if (flag == "--seed") {
      o.seed = std::stoull(value);
    } else if (flag == "--configs") {
      o.configs = value;
    } else {
      throw UserError(flag + ": unknown flag");
    }
  }
  if (o.state_block != 256 && !o.q8) throw UserError("--state-block needs --state-dtype q8");
  for (const std::string& name : o.models)
    if (std::none_of(std::begin(kRanks), std::end(kRanks),
                     [&](const auto& known) { return name == known.first; }))
      throw UserError("--model " + name + ": expected 60m, 1b or 13b");
  for (const std::string& name : o.ops)
    if (std::none_of(std::begin(kOps), std::end(kOps),
                     [&](const Op& op) { return name == op.name; }))
      throw UserError("--ops " + name + ": no such op");
  // --smoke: a batch the emulator runs in seconds (T off the attention kernel's 64-row tiles), one
  // timed call; flags given explicitly still win.
  o.B = batch.value_or(o.smoke ? 2 : o.B);
  o.T = seq.value_or(o.smoke ? 100 : o.T);
  o.repeat = repeat.value_or(o.smoke ? 1 : o.repeat);
  if (o.smoke) o.warmup = 0;
  return o;
}

bool selected(const Options& o, const Op& op) {
  return o.ops.empty() || std::find(o.ops.begin(), o.ops.end(), op.name) != o.ops.end();
}

}  // namespace

int main(int argc, char** argv) {
  grass::reload_with_supported_openblas_kernels(argv);  // the CPU reference's kernels, as grass's
  Options options;
  try {
    options = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_bench: %s\n%s", e.what(), kUsage);
    return 2;
  }
  std::unique_ptr<Backend> gpu;
  try {
    gpu = make_cuda_backend(storage_for(options.precision, /*cuda=*/true), 0, options.attention);
  } catch (const UserError& e) {
    std::printf("kernel_bench: %s: nothing to time\n", e.what());
    return 77;
  }
  try {
    const std::unique_ptr<Backend> cpu = make_cpu_backend(storage_for(options.precision, false));
    Lab lab(*gpu, *cpu, options);
    lab.print_header();
    for (const std::string& name : options.models) {
      const Model m = load_model(name, options);
      const Workspace workspace(lab, m);
      for (const Op& op : kOps) {
        if (!selected(options, op)) continue;
        std::fprintf(stderr, "kernel_bench: %s %s\n", m.name.c_str(), op.name);
        op.run(lab, m);
      }
    }
    if (lab.failures() > 0) {
      std::printf("kernel_bench: %d checks FAILED\n", lab.failures());
      return 1;
    }
    std::printf("kernel_bench: every check within its tolerance\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_bench: error: %s\n", e.what());
    return 1;
  }
}
