// Column-row sampling against its winner-take-all variant on a model's real (dy, x) pairs (issue
// 28, item 3): one backward of a run's model on its data, every q, k, v, gate, up and down layer
// handing its dy [N, out] and x [N, in] here; for each, at k = round(keep·N) rows, the exact
// variance E‖Ŝ − S‖²_F of crs and of wta-crs (src/model/row_sampling.h's formulas) with the
// engine's weights p_i ∝ ‖x_i‖ and with the ideal p_i ∝ ‖x_i‖‖dy_i‖ (which the forward cannot
// know), and WTA-CRS's claim: its variance is at most crs's wherever it keeps winners, that is
// where P_C > |C|/k. Prints one row per layer kind and weighting, relative to ‖S‖²_F.
//
// Usage: sampling_variance RUN.json [--weights HF_DIR|FILE.safetensors] [--keep 0.3]
//                          [--batches 2] [--set key=value ...]
// The run's model, micro_batch_size and seq_len, on the CPU in fp32; --weights loads trained
// weights (grass export), else the run's initialisation. Batches are consecutive windows of the
// run's first training shard.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/core/error.h"
#include "src/data/shard.h"
#include "src/model/llama.h"
#include "src/model/row_sampling.h"
#include "src/train/hf_interop.h"

namespace {

using namespace grass;

struct Tally {  // per layer kind and weighting
  int pairs = 0, with_winners = 0, wta_no_worse = 0;
  double crs = 0, wta = 0;  // summed relative variances
};

// ‖Σ_{i in rows} dy_i x_iᵀ‖²_F
double sum_norm_sq(const float* dy, const float* x, const std::vector<int32_t>& rows, int in, int out) {
  std::vector<float> dy_r, x_r;
  for (const int32_t i : rows) {
    dy_r.insert(dy_r.end(), dy + int64_t(i) * out, dy + int64_t(i + 1) * out);
    x_r.insert(x_r.end(), x + int64_t(i) * in, x + int64_t(i + 1) * in);
  }
  std::vector<float> S(size_t(out) * in, 0.0f);
  if (!rows.empty())
    ops::linear_backward<float>(nullptr, S.data(), dy_r.data(), x_r.data(), nullptr,
                                int64_t(rows.size()), in, out, false);
  double total = 0;
  for (const float s : S) total += double(s) * s;
  return total;
}

class VarianceSink final : public GradientSink {
 public:
  VarianceSink(const LlamaModel& model, double keep) : model_(model), keep_(keep) {}
  std::map<std::string, Tally> tallies;  // "q_proj, p ~ |x|"
  int batch = 0;

  void projected(int tensor, const void* dy_v, const void* x_v, int64_t N,
                 bool x_selected) override {
    GRASS_CHECK(!x_selected, "the variance tool reads whole inputs");
    const ParamTensor& t = model_.tensors()[size_t(tensor)];
    const int out = int(t.shape[0]), in = int(t.shape[1]);
    const float* dy = static_cast<const float*>(dy_v);
    const float* x = static_cast<const float*>(x_v);
    const size_t rows = static_cast<size_t>(N);
    std::vector<double> x_norm(rows), dy_norm(rows), z_sq(rows);
    for (int64_t i = 0; i < N; i++) {
      double a = 0, b = 0;
      for (int c = 0; c < in; c++) a += double(x[i * in + c]) * x[i * in + c];
      for (int c = 0; c < out; c++) b += double(dy[i * out + c]) * dy[i * out + c];
      x_norm[size_t(i)] = std::sqrt(a), dy_norm[size_t(i)] = std::sqrt(b), z_sq[size_t(i)] = a * b;
    }
    std::vector<int32_t> all(rows);
    for (int64_t i = 0; i < N; i++) all[size_t(i)] = int32_t(i);
    const double S_sq = sum_norm_sq(dy, x, all, in, out);
    const int k = int(std::max<int64_t>(1, std::llround(keep_ * double(N))));
    const size_t end = t.name.rfind(".weight"), start = t.name.rfind('.', end - 1) + 1;
    const std::string kind = t.name.substr(start, end - start);  // "up_proj"
    for (const bool ideal : {false, true}) {
      std::vector<double> w(rows);
      for (size_t i = 0; i < w.size(); i++) w[i] = x_norm[i] * (ideal ? dy_norm[i] : 1.0);
      const RowSample crs = sample_rows(RowSampler::Crs, w, k, 1);
      const RowSample wta = sample_rows(RowSampler::WtaCrs, w, k, 1);
      const double var_crs = sampling_variance(RowSampler::Crs, w, k, z_sq, S_sq, crs);
      // R: the rows wta-crs samples (all but its winners)
      std::vector<bool> winner(rows, false);
      for (int j = 0; j < wta.winners; j++) winner[size_t(wta.rows[size_t(j)])] = true;
      std::vector<int32_t> rest;
      for (int64_t i = 0; i < N; i++)
        if (!winner[size_t(i)]) rest.push_back(int32_t(i));
      const double var_wta = sampling_variance(RowSampler::WtaCrs, w, k, z_sq,
                                               sum_norm_sq(dy, x, rest, in, out), wta);
      Tally& tally = tallies[kind + (ideal ? ", p ~ |x||dy|" : ", p ~ |x|")];
      tally.pairs++;
      tally.crs += var_crs / S_sq;
      tally.wta += var_wta / S_sq;
      if (wta.winners > 0) {
        tally.with_winners++;
        tally.wta_no_worse += var_wta <= var_crs * (1 + 1e-9);
      }
    }
  }
  void dense_ready(int, void*) override {}

 private:
  const LlamaModel& model_;
  double keep_;
};

int run(int argc, char** argv) {
  if (argc < 2) throw UserError("usage: sampling_variance RUN.json [--weights PATH] [--keep 0.3] [--batches 2] [--set key=value ...]");
  std::string weights;
  double keep = 0.3;
  int batches = 2;
  std::vector<std::string> overrides = {"precision=fp32", "device=cpu"};
  for (int i = 2; i < argc; i++) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw UserError(a + ": needs a value");
    const std::string v = argv[++i];
    if (a == "--weights") weights = v;
    else if (a == "--keep") keep = std::stod(v);
    else if (a == "--batches") batches = std::stoi(v);
    else if (a == "--set") overrides.push_back(v);
    else throw UserError("unknown option " + a);
  }
  const RunConfig cfg = load_run_config(argv[1], overrides);
  std::vector<ProjectionTarget> kinds = {ProjectionTarget::Q,    ProjectionTarget::K,
                                         ProjectionTarget::V,    ProjectionTarget::Gate,
                                         ProjectionTarget::Up,   ProjectionTarget::Down};
  Arena arena;
  LlamaModel model(cfg.model, arena, cfg.micro_batch_size, cfg.seq_len,
                   projection_tensor_names(cfg.model.num_hidden_layers, kinds));
  if (weights.empty()) model.init_weights(cfg.seed);
  else load_hf_model(model, weights);
  VarianceSink sink(model, keep);
  model.set_gradient_sink(&sink);
  const ShardReader shard(cfg.train_files.at(0));
  const int64_t N = int64_t(cfg.micro_batch_size) * cfg.seq_len;
  std::vector<uint32_t> tokens(size_t(N) + 1);
  std::vector<int32_t> inputs(static_cast<size_t>(N)), targets(static_cast<size_t>(N));
  for (int b = 0; b < batches; b++) {
    shard.read(uint64_t(b) * uint64_t(N), uint64_t(N) + 1, tokens.data());
    for (int64_t i = 0; i < N; i++) inputs[size_t(i)] = int32_t(tokens[size_t(i)]), targets[size_t(i)] = int32_t(tokens[size_t(i) + 1]);
    const double loss = model.forward(inputs.data(), targets.data(), cfg.micro_batch_size);
    model.backward(1.0);
    std::printf("batch %d: loss %.4f\n", b, loss);
  }
  std::printf("%d layers x %d batches of %lld tokens, k = round(%.2f N); E|S^ - S|^2 / |S|^2, mean over layers:\n",
              cfg.model.num_hidden_layers, batches, (long long)N, keep);
  std::printf("%-26s %6s %14s %20s %10s %10s\n", "layer kind, weights", "pairs", "wta winners",
              "wta <= crs there", "crs", "wta-crs");
  for (const auto& [name, t] : sink.tallies)
    std::printf("%-26s %6d %14d %20d %10.4f %10.4f\n", name.c_str(), t.pairs, t.with_winners,
                t.wta_no_worse, t.crs / t.pairs, t.wta / t.pairs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const grass::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
