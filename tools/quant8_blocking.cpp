// Which block layout keeps a projected optimizer's 8-bit moments closest to its fp32 ones (issue
// 27, item 3; kernels/quant8.h): reads a checkpoint of a GRASS run with fp32 states and, for
// every target, quantizes its real m and v with flat blocks (bitsandbytes') and per-feature
// blocks, then prints, summed over the targets of each kind: the relative L2 error of m, of v and
// of the Adam direction m / (sqrt(v) + eps), and the fraction of nonzero v at the map's smallest
// positive code (where the zero-point guard holds it). The engine's own quantizer does the work.
//
// Usage: quant8_blocking CHECKPOINT_DIR [--block 256] [--eps 1e-8]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/quant8.h"
#include "src/config/config.h"
#include "src/core/error.h"
#include "src/io/safetensors.h"
#include "src/io/untrusted_json.h"

namespace {

using namespace grass;

struct Sums {  // squared errors and squared norms, summed over targets
  double m_err = 0, m_norm = 0, v_err = 0, v_norm = 0, d_err = 0, d_norm = 0;
  int64_t v_nonzero = 0, v_smallest = 0;
  void add(const std::vector<float>& m, const std::vector<float>& v, const std::vector<float>& mq,
           const std::vector<float>& vq, const std::vector<uint8_t>& v_codes, double eps) {
    for (size_t i = 0; i < m.size(); i++) {
      m_err += std::pow(double(mq[i]) - m[i], 2);
      m_norm += double(m[i]) * m[i];
      v_err += std::pow(double(vq[i]) - v[i], 2);
      v_norm += double(v[i]) * v[i];
      const double d = m[i] / (std::sqrt(double(v[i])) + eps);
      const double dq = mq[i] / (std::sqrt(double(vq[i])) + eps);
      d_err += (dq - d) * (dq - d);
      d_norm += d * d;
      if (v[i] > 0) {
        v_nonzero++;
        v_smallest += v_codes[i] == 1;  // the unsigned map: code 0 is 0, code 1 its smallest value
      }
    }
  }
};

// The part of a target's name that says its kind: "model.layers.3.mlp.up_proj.weight" -> up_proj.
std::string kind_of(const std::string& name) {
  const size_t end = name.rfind(".weight");
  const size_t start = name.rfind('.', end - 1);
  return name.substr(start + 1, end - start - 1);
}

std::vector<float> floats_of(const TensorEntry& e) {
  std::vector<float> out(e.bytes.size() / sizeof(float));
  std::memcpy(out.data(), e.bytes.data(), out.size() * sizeof(float));
  return out;
}

int run(int argc, char** argv) {
  if (argc < 2) throw UserError("usage: quant8_blocking CHECKPOINT_DIR [--block 256] [--eps 1e-8]");
  const std::string dir = argv[1];
  int block = 256;
  double eps = 1e-8;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--block") block = std::stoi(argv[i + 1]);
    else if (std::string(argv[i]) == "--eps") eps = std::stod(argv[i + 1]);
    else throw UserError(std::string("unknown option ") + argv[i]);
  }
  const RunConfig cfg = parse_run_config(read_untrusted_json_file(dir + "/config.json", size_t(1) << 24), dir + "/config.json");
  if (cfg.optimizer.kind != OptimizerKind::Grass || cfg.optimizer.state_dtype == StateDtype::Q8)
    throw UserError(dir + ": not a GRASS run with unquantized states");
  const SafetensorsFile weights(dir + "/model.safetensors"), state(dir + "/state.safetensors");
  const int r = cfg.optimizer.projection.rank;
  std::map<std::string, Sums> flat, feature;
  const std::string suffix = ".grass.m";
  for (const std::string& name : state.names()) {
    if (!name.ends_with(suffix)) continue;
    const std::string tensor = name.substr(0, name.size() - suffix.size());
    const std::vector<int64_t>& shape = weights.get(tensor).shape;
    const bool rows = projects_rows(OptimizerKind::Grass, cfg.optimizer.projection, shape[0], shape[1]);
    const std::vector<float> m = floats_of(state.get(name)), v = floats_of(state.get(tensor + ".grass.v"));
    if (int64_t(m.size()) != int64_t(r) * (rows ? shape[1] : shape[0]))
      throw UserError(name + ": not r x in or out x r (merged repeated draws are not read here)");
    for (const bool by_feature : {false, true}) {
      const Quant8Layout layout =
          projected_quant8_layout(int(shape[0]), int(shape[1]), r, rows, block, by_feature);
      std::vector<uint8_t> mc(m.size()), vc(v.size());
      std::vector<float> am(size_t(layout.blocks())), av(size_t(layout.blocks())), mq(m.size()),
          vq(v.size());
      ops::quantize_layout(quant8_map(true), m.data(), layout, mc.data(), am.data());
      ops::quantize_layout(quant8_map(false), v.data(), layout, vc.data(), av.data());
      ops::dequantize_layout(quant8_map(true), mc.data(), am.data(), layout, mq.data());
      ops::dequantize_layout(quant8_map(false), vc.data(), av.data(), layout, vq.data());
      for (const std::string& key : {kind_of(tensor), std::string("all")})
        (by_feature ? feature : flat)[key].add(m, v, mq, vq, vc, eps);
    }
  }
  if (flat.empty()) throw UserError(dir + "/state.safetensors: no GRASS moments");
  std::printf("%s: blocks of %d, rank %d; relative L2 error (flat / per feature)\n", dir.c_str(), block, r);
  std::printf("| targets | m | v | m / (sqrt(v) + eps) | v at the smallest code |\n|---|---|---|---|---|\n");
  for (const auto& [key, a] : flat) {
    const Sums& b = feature.at(key);
    std::printf("| %s | %.4f / %.4f | %.4f / %.4f | %.4f / %.4f | %.2e / %.2e |\n", key.c_str(),
                std::sqrt(a.m_err / a.m_norm), std::sqrt(b.m_err / b.m_norm),
                std::sqrt(a.v_err / a.v_norm), std::sqrt(b.v_err / b.v_norm),
                std::sqrt(a.d_err / a.d_norm), std::sqrt(b.d_err / b.d_norm),
                double(a.v_smallest) / double(a.v_nonzero), double(b.v_smallest) / double(b.v_nonzero));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
