// grass sample <weights> [--prompt TEXT] [--tokens N] [--greedy | --temperature T --top-k K]
//              [--seed S] [--samples N] [--tokenizer FILE] [--config FILE] [--device D]
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "src/cli/commands.h"
#include "src/cli/options.h"
#include "src/config/config.h"
#include "src/config/json_check.h"
#include "src/core/arena.h"
#include "src/core/error.h"
#include "src/data/tokenizer.h"
#include "src/model/generate.h"
#include "src/model/llama.h"
#include "src/train/backend_choice.h"
#include "src/train/hf_interop.h"

namespace grass::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* kSampleUsage =
    "usage: grass sample <weights> [--prompt TEXT] [--tokens N] [--samples N] [--seed S]\n"
    "                    [--temperature T] [--top-k K] [--greedy] [--tokenizer FILE]\n"
    "                    [--config FILE] [--device auto|cpu|cuda]\n"
    "\n"
    "Continues a prompt with the model's own tokens and prints each sample: the prompt and its\n"
    "continuation, after one line naming the weights and settings. The same seed gives the same\n"
    "text on the same backend. Each token runs the forward over the whole context again (no KV\n"
    "cache); a context longer than max_position_embeddings slides (docs/sampling.md).\n"
    "\n"
    "<weights>: a run's out_dir (its newest checkpoint, else its final model <out_dir>/model), a\n"
    "checkpoint directory, a Hugging Face model directory or a .safetensors file.\n"
    "\n"
    "options:\n"
    "  --prompt <text>      the text to continue (default: none, from the BOS token alone);\n"
    "                       it is read after a BOS token, as grass prepare starts each document\n"
    "  --tokens <n>         new tokens per sample, at most (default 64); a sample ends early\n"
    "                       at the tokenizer's EOS token\n"
    "  --samples <n>        samples, generated together as one batch (default 1)\n"
    "  --seed <s>           the draws' seed (default 1)\n"
    "  --temperature <t>    divides the logits before the softmax (default 0.8; > 0)\n"
    "  --top-k <k>          draw among the k most likely tokens (default 200; 0: all of them)\n"
    "  --greedy             always the most likely token (no temperature, top-k or seed)\n"
    "  --tokenizer <file>   the SentencePiece model (default: the one stored with the weights,\n"
    "                       else the run config's data.tokenizer)\n"
    "  --config <file>      a run config or a Hugging Face LlamaConfig describing the model\n"
    "                       (default: the config.json beside the weights)\n"
    "  --device <d>         auto (the GPU when one is usable), cpu or cuda (default auto)\n"
    "  -h, --help           this help\n";

// What a config file says of the weights: the model, and the tokenizer a run config names.
struct SourceConfig {
  ModelConfig model;
  std::string tokenizer;  // data.tokenizer of a run config; "" when none
};

// A run config (with "model": an inline config, or a path resolved as grass train resolves it)
// or a Hugging Face LlamaConfig.
SourceConfig read_source_config(const std::string& path) {
  const json j = json_check::read_json_file(path);
  SourceConfig c;
  if (!j.is_object() || !j.contains("model")) {
    c.model = parse_model_config(j, path);
    return c;
  }
  c.model = j["model"].is_object() ? parse_model_config(j["model"], path + ": model")
                                   : load_run_config(path).model;
  const json::json_pointer tokenizer("/data/tokenizer");
  if (j.contains(tokenizer) && j[tokenizer].is_string()) c.tokenizer = j[tokenizer];
  return c;
}

// `text` as an integer in [min, max], or a UserError naming the option.
int parse_bounded(const std::string& name, const std::string& text, int min, int max) {
  const uint64_t n = parse_count(name, text, uint64_t(min));
  if (n > uint64_t(max)) throw UserError(name + " " + text + ": at most " + std::to_string(max));
  return int(n);
}

// The config.json that describes the weights at `source`: in its directory, or beside the file.
std::string config_beside(const std::string& source) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(source, ec) ? fs::path(source) : fs::path(source).parent_path();
  const fs::path config = (dir.empty() ? fs::path(".") : dir) / "config.json";
  return fs::is_regular_file(config, ec) ? config.string() : "";
}

}  // namespace

int cmd_sample(const Args& args) {
  std::string source, prompt, tokenizer_path, config_path, value;
  int tokens = 64, samples = 1, top_k = 200;
  uint64_t seed = 1;
  double temperature = 0.8;
  bool greedy = false, temperature_set = false, top_k_set = false;
  DeviceChoice device = DeviceChoice::Auto;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    if (is_help(a)) {
      std::fputs(kSampleUsage, stdout);
      return 0;
    } else if (take_option(args, i, "--prompt", value)) {
      prompt = value;
    } else if (take_option(args, i, "--tokens", value)) {
      tokens = parse_bounded("--tokens", value, 1, 1'000'000);
    } else if (take_option(args, i, "--samples", value)) {
      samples = parse_bounded("--samples", value, 1, 1024);
    } else if (take_option(args, i, "--seed", value)) {
      seed = parse_count("--seed", value, 0);
    } else if (take_option(args, i, "--temperature", value)) {
      temperature = parse_positive("--temperature", value);
      temperature_set = true;
    } else if (take_option(args, i, "--top-k", value)) {
      top_k = parse_bounded("--top-k", value, 0, 1 << 30);
      top_k_set = true;
    } else if (a == "--greedy") {
      greedy = true;
    } else if (take_option(args, i, "--tokenizer", value)) {
      tokenizer_path = value;
    } else if (take_option(args, i, "--config", value)) {
      config_path = value;
    } else if (take_option(args, i, "--device", value)) {
      const std::optional<DeviceChoice> d = choice_from_name<DeviceChoice>(value);
      if (!d)
        throw UserError("sample: --device " + value + ": expected one of " +
                        choice_list<DeviceChoice>());
      device = *d;
    } else if (a.rfind("-", 0) == 0) {
      throw UserError("sample: unknown option " + a + " (see grass sample --help)");
    } else if (source.empty()) {
      source = a;
    } else {
      throw UserError("sample: one source of weights expected, got a second: " + a);
    }
  }
  if (source.empty()) throw UserError("sample: missing <weights> (see grass sample --help)");
  if (greedy && (temperature_set || top_k_set))
    throw UserError(std::string("sample: --greedy takes the most likely token; it has no ") +
                    (temperature_set ? "--temperature" : "--top-k") + " (drop one of the two)");
  if (greedy && samples > 1)
    throw UserError("sample: --greedy with --samples " + std::to_string(samples) +
                    ": greedy decoding gives one text; drop --samples");
  std::error_code ec;
  if (!fs::exists(source, ec)) throw UserError(source + ": not found (see grass sample --help)");

  if (config_path.empty()) config_path = config_beside(source);
  if (config_path.empty())
    throw UserError(source + ": no config.json beside the weights to build the model from; pass "
                    "--config with a run config or a Hugging Face LlamaConfig");
  const SourceConfig config = read_source_config(config_path);
  const ModelConfig& mc = config.model;
  std::optional<Tokenizer> tokenizer;
  const auto use_tokenizer = [&](const std::string& path) {
    tokenizer.emplace(path);
    if (tokenizer->vocab_size() > uint32_t(mc.vocab_size))
      throw UserError(path + ": " + std::to_string(tokenizer->vocab_size()) +
                      " pieces, more than the model's vocab_size " +
                      std::to_string(mc.vocab_size) + " (" + config_path +
                      "): not this model's tokenizer; pass --tokenizer");
  };
  if (!tokenizer_path.empty()) use_tokenizer(tokenizer_path);  // checked before the weights

  // The model reads at most max_position_embeddings tokens: the prompt and all but the last new
  // token, or, when they are more, the window slides. The prompt's token count needs the
  // tokenizer, which may come with the weights, but the model's context is fixed when it is
  // built, before they are read: it is built for as many prompt tokens as the prompt's bytes
  // allow (a piece covers a byte at least) plus BOS and SentencePiece's leading "▁".
  const int context = int(std::min<int64_t>(mc.max_position_embeddings,
                                            int64_t(prompt.size()) + 2 + tokens - 1));
  RunConfig run;
  run.source = "sample";
  run.model = mc;
  run.device = device;
  run.seq_len = context;
  run.micro_batch_size = run.total_batch_size = samples;
  const std::unique_ptr<Backend> backend = choose_backend(run);
  Arena arena(false, *backend);
  ModelMemoryOptions forward_only;  // no gradients, optimizer copy or backward buffers
  forward_only.forward_only = true;
  LlamaModel model(mc, arena, samples, context, {}, *backend, forward_only);
  const LoadedWeights weights = load_model_weights(model, source);

  std::string tokenizer_from = tokenizer_path.empty() ? weights.tokenizer : tokenizer_path;
  if (tokenizer_from.empty() && !config.tokenizer.empty()) {
    if (!fs::exists(config.tokenizer, ec))
      throw UserError(config_path + ": data.tokenizer " + config.tokenizer +
                      ": not found, and the weights have no tokenizer.model; pass --tokenizer");
    tokenizer_from = config.tokenizer;
  }
  if (tokenizer_from.empty())
    throw UserError(source + ": no tokenizer.model with the weights and no data.tokenizer in " +
                    config_path + "; pass --tokenizer with the SentencePiece model of the run's "
                    "shards");
  if (!tokenizer) use_tokenizer(tokenizer_from);

  std::vector<int32_t> prompt_ids;
  if (tokenizer->bos_id() >= 0) prompt_ids.push_back(tokenizer->bos_id());
  for (int id : tokenizer->encode(prompt)) prompt_ids.push_back(id);
  if (prompt_ids.empty())
    throw UserError("sample: --prompt is empty and " + tokenizer_from +
                    " has no BOS token to start from; give a --prompt");

  SamplingSettings settings;
  settings.greedy = greedy;
  settings.temperature = temperature;
  settings.top_k = top_k;
  settings.seed = seed;
  GenerationLimits limits;
  limits.max_new_tokens = tokens;
  limits.stop_token = tokenizer->eos_id();
  limits.vocab = int(tokenizer->vocab_size());

  const bool slides = int64_t(prompt_ids.size()) + tokens - 1 > context;
  std::string how = greedy ? std::string("greedy")
                           : "temperature " + json_check::format_number(temperature) + ", top-k " +
                                 (top_k > 0 ? std::to_string(top_k) : std::string("all")) +
                                 ", seed " + std::to_string(seed);
  std::printf("sample | weights %s | tokenizer %s | %s | up to %d new tokens x %d sample%s | "
              "context %d tokens%s | %s\n",
              weights.description.c_str(), tokenizer_from.c_str(), how.c_str(), tokens, samples,
              samples > 1 ? "s" : "", context,
              slides ? (context == mc.max_position_embeddings
                            ? ", then slides (max_position_embeddings)"
                            : ", then slides")
                     : "",
              backend->describe().c_str());
  std::fflush(stdout);

  const std::vector<std::vector<int32_t>> made =
      generate(model, prompt_ids, samples, settings, limits);
  for (int b = 0; b < samples; b++) {
    const std::vector<int32_t>& tail = made[size_t(b)];
    const bool ended = !tail.empty() && tail.back() == limits.stop_token;
    std::vector<int> text(prompt_ids.begin(), prompt_ids.end());
    text.insert(text.end(), tail.begin(), tail.end());
    std::printf("--- sample %d: %zu new tokens%s ---\n%s\n", b + 1, tail.size(),
                ended ? ", ended by EOS" : "", tokenizer->decode(text).c_str());
  }
  return 0;
}

}  // namespace grass::cli
