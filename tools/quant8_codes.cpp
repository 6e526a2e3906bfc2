// The engine's 8-bit blockwise codes of a file of fp32 values (kernels/quant8.h), and one 8-bit
// AdamW step (ops::adamw_update_q8), for checks against other implementations
// (tools/peers/bitsandbytes_check.py).
//
// Usage: quant8_codes INPUT.f32 OUTPUT_PREFIX [--block 256] [--unsigned]
//   writes OUTPUT_PREFIX.codes (one byte per value) and OUTPUT_PREFIX.absmax (fp32 per block),
//   with the signed dynamic map, or the unsigned one with --unsigned.
// Usage: quant8_codes --adam-step DIR --lr X --beta1 X --beta2 X --eps X --weight-decay X
//                     --step T [--block 256]
//   reads DIR/p.f32, DIR/g.f32 and the moments DIR/m.codes, m.absmax, v.codes, v.absmax (signed
//   map for m, unsigned for v), takes one step with the CPU backend's 8-bit AdamW, and writes
//   them back in place.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "kernels/quant8.h"
#include "src/core/error.h"

namespace {

template <typename T>
std::vector<T> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw grass::UserError(path + ": cannot open");
  const std::streamsize bytes = in.tellg();
  if (bytes % std::streamsize(sizeof(T)) != 0)
    throw grass::UserError(path + ": not a whole number of " + std::to_string(sizeof(T)) + "-byte values");
  std::vector<T> out(size_t(bytes) / sizeof(T));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(out.data()), bytes);
  return out;
}

template <typename T>
void write_file(const std::string& path, const std::vector<T>& v) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(T)));
}

int adam_step(int argc, char** argv) {
  if (argc < 3) throw grass::UserError("usage: quant8_codes --adam-step DIR --lr X ... (see the file's head)");
  const std::string dir = std::string(argv[2]) + "/";
  grass::AdamArgs a;
  int block = 256;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const double value = std::stod(argv[i + 1]);
    if (key == "--lr") a.lr = value;
    else if (key == "--beta1") a.beta1 = value;
    else if (key == "--beta2") a.beta2 = value;
    else if (key == "--eps") a.eps = value;
    else if (key == "--weight-decay") a.weight_decay = value;
    else if (key == "--step") a.step = int64_t(value);
    else if (key == "--block") block = int(value);
    else throw grass::UserError("unknown option " + key);
  }
  std::vector<float> p = read_file<float>(dir + "p.f32"), g = read_file<float>(dir + "g.f32"),
                     am = read_file<float>(dir + "m.absmax"), av = read_file<float>(dir + "v.absmax");
  std::vector<uint8_t> m = read_file<uint8_t>(dir + "m.codes"), v = read_file<uint8_t>(dir + "v.codes");
  const int64_t n = int64_t(p.size()), blocks = (n + block - 1) / block;
  if (g.size() != p.size() || m.size() != p.size() || v.size() != p.size() ||
      int64_t(am.size()) != blocks || int64_t(av.size()) != blocks)
    throw grass::UserError(dir + ": p, g, the codes and the absmax (one per block of " +
                           std::to_string(block) + ") disagree in size");
  grass::ops::adamw_update_q8(p.data(), g.data(),
                              {.m = m.data(), .v = v.data(), .absmax_m = am.data(),
                               .absmax_v = av.data(), .block = block},
                              n, a);
  write_file(dir + "p.f32", p);
  write_file(dir + "m.codes", m);
  write_file(dir + "v.codes", v);
  write_file(dir + "m.absmax", am);
  write_file(dir + "v.absmax", av);
  return 0;
}

int run(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--adam-step") return adam_step(argc, argv);
  if (argc < 3) throw grass::UserError("usage: quant8_codes INPUT.f32 OUTPUT_PREFIX [--block 256] [--unsigned]");
  int block = 256;
  bool is_signed = true;
  for (int i = 3; i < argc; i++) {
    const std::string arg = argv[i];
    if (arg == "--block" && i + 1 < argc) block = std::stoi(argv[++i]);
    else if (arg == "--unsigned") is_signed = false;
    else throw grass::UserError("unknown option " + arg);
  }
  if (block < 1) throw grass::UserError("--block must be positive");
  const std::vector<float> x = read_file<float>(argv[1]);
  const int64_t n = int64_t(x.size());
  std::vector<uint8_t> codes(x.size());
  std::vector<float> absmax(size_t((n + block - 1) / block));
  grass::ops::quantize_blockwise(grass::quant8_map(is_signed), x.data(), n, block, codes.data(),
                                 absmax.data());
  const std::string prefix = argv[2];
  write_file(prefix + ".codes", codes);
  write_file(prefix + ".absmax", absmax);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
