// The engine's 8-bit blockwise codes of a file of fp32 values (kernels/quant8.h), for checks
// against other implementations (tools/peers/bitsandbytes_check.py).
//
// Usage: quant8_codes INPUT.f32 OUTPUT_PREFIX [--block 256] [--unsigned]
//   writes OUTPUT_PREFIX.codes (one byte per value) and OUTPUT_PREFIX.absmax (fp32 per block),
//   with the signed dynamic map, or the unsigned one with --unsigned.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/quant8.h"
#include "src/core/error.h"

namespace {

int run(int argc, char** argv) {
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
  std::ifstream in(argv[1], std::ios::binary | std::ios::ate);
  if (!in) throw grass::UserError(std::string(argv[1]) + ": cannot open");
  const std::streamsize bytes = in.tellg();
  if (bytes % 4 != 0) throw grass::UserError(std::string(argv[1]) + ": not a whole number of fp32 values");
  std::vector<float> x(size_t(bytes / 4));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(x.data()), bytes);
  const int64_t n = int64_t(x.size());
  std::vector<uint8_t> codes(x.size());
  std::vector<float> absmax(size_t((n + block - 1) / block));
  grass::ops::quantize_blockwise(grass::quant8_map(is_signed), x.data(), n, block, codes.data(),
                                 absmax.data());
  const std::string prefix = argv[2];
  std::ofstream(prefix + ".codes", std::ios::binary)
      .write(reinterpret_cast<const char*>(codes.data()), std::streamsize(codes.size()));
  std::ofstream(prefix + ".absmax", std::ios::binary)
      .write(reinterpret_cast<const char*>(absmax.data()), std::streamsize(absmax.size() * 4));
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
