// GaLore's refresh started from the previous projection against a fresh start, on a run's real
// gradients (issue 46, item 3: "a warm start ..., judged by principal angles on saved gradients
// before it becomes a default"). The saved gradients are a run's checkpoints, one per refresh:
// at each, one backward of the run's model on its data hands every target's dy and x here, and
// the full gradient G = Σ dyᵀ·x of each q, k, v, o, gate, up and down is projected by
//   exact      galore_basis in fp64 (LAPACK's SVD): U, the reference
//   random qN  galore_basis_randomized in fp32 from a fresh test matrix, N power iterations
//   warm qN    the same from [the previous warm qN projection | Gaussian columns], N power
//              iterations (the first checkpoint starts fresh, at N = 2)
//   stale      the previous checkpoint's exact U, unchanged: how far the subspace moved
// and each P is scored against U and the rank-r optimum:
//   energy    ‖Pᵀ·A‖²_F / ‖Uᵀ·A‖²_F, the share of the optimal projected gradient P keeps (A = G
//             or Gᵀ, the projected side first), what GaLore's step sees
//   cos²      ‖Uᵀ·P‖²_F / r, the mean squared cosine of the principal angles between P and U
// printed as the mean over layers for each checkpoint after the first and target kind, then over
// all, beside the optimum's share of ‖A‖²_F. The method's GEMM and QR counts are in docs/lowrank.md ("Warm start").
//
// Usage: galore_warm_start RUN.json --weights A --weights B ... [--rank R] [--oversample 8]
//                          [--batches 1] [--set key=value ...]
// Each --weights (a checkpoint's directory or its model.safetensors, an exported directory) is
// one refresh, in order. The run's model, micro_batch_size and seq_len, on the CPU in fp32; checkpoint i reads
// the `batches` micro-batches after checkpoint i-1's in the run's first training shard, so each
// refresh sees fresh tokens, as a run's would.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kernels/lowrank_ops.h"
#include "kernels/ops.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/data/shard.h"
#include "src/model/llama.h"
#include "src/train/hf_interop.h"

namespace {

using namespace grass;

// The full gradient of each target, summed over the micro-batches of one checkpoint.
class FullGradients final : public GradientSink {
 public:
  explicit FullGradients(const LlamaModel& model) : model_(model) {}
  std::map<int, std::vector<float>> grads;  // by tensor index

  void projected(int tensor, const void* dy, const void* x, int64_t N, bool x_selected) override {
    GRASS_CHECK(!x_selected, "the warm-start tool reads whole inputs");
    const ParamTensor& t = model_.tensors()[size_t(tensor)];
    std::vector<float>& g = grads[tensor];
    g.resize(size_t(t.shape[0] * t.shape[1]), 0.0f);
    ops::linear_backward<float>(nullptr, g.data(), static_cast<const float*>(dy),
                                static_cast<const float*>(x), nullptr, N, int(t.shape[1]),
                                int(t.shape[0]), false);
  }
  void dense_ready(int, void*) override {}

 private:
  const LlamaModel& model_;
};

// A = G (rows) or Gᵀ as a row-major double matrix [side, other]
std::vector<double> projected_side_first(const std::vector<float>& G, int out, int in, bool rows) {
  std::vector<double> A(G.size());
  for (int i = 0; i < out; i++)
    for (int j = 0; j < in; j++)
      A[rows ? size_t(i) * in + j : size_t(j) * out + i] = G[size_t(i) * in + j];
  return A;
}

// ‖Pᵀ·A‖²_F for P[side, r] and A[side, other]
template <typename T>
double projected_energy(const std::vector<T>& P, const std::vector<double>& A, int side, int other,
                        int r) {
  double total = 0;
  std::vector<double> row(static_cast<size_t>(other));
  for (int c = 0; c < r; c++) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int i = 0; i < side; i++) {
      const double p = double(P[size_t(i) * r + c]);
      const double* a = A.data() + size_t(i) * other;
      for (int j = 0; j < other; j++) row[size_t(j)] += p * a[j];
    }
    for (const double v : row) total += v * v;
  }
  return total;
}

// ‖Uᵀ·P‖²_F / r
template <typename T>
double mean_cos_sq(const std::vector<double>& U, const std::vector<T>& P, int side, int r) {
  double total = 0;
  for (int a = 0; a < r; a++)
    for (int b = 0; b < r; b++) {
      double dot = 0;
      for (int i = 0; i < side; i++) dot += U[size_t(i) * r + a] * double(P[size_t(i) * r + b]);
      total += dot * dot;
    }
  return total / r;
}

struct Method {
  std::string name;
  int power_iters;  // -1: the stale exact U
  bool warm;
};

struct Score {
  double energy = 0, cos_sq = 0, worst_energy = 1;
  int n = 0;
  void add(double e, double c) {
    energy += e, cos_sq += c, n++;
    worst_energy = std::min(worst_energy, e);
  }
};

std::string kind_of(const std::string& name) {  // "model.layers.3.mlp.up_proj.weight": "up_proj"
  const size_t end = name.rfind(".weight"), start = name.rfind('.', end - 1) + 1;
  return name.substr(start, end - start);
}

int run(int argc, char** argv) {
  if (argc < 2)
    throw UserError("usage: galore_warm_start RUN.json --weights A --weights B ... [--rank R] "
                    "[--oversample 8] [--batches 1] [--set key=value ...]");
  std::vector<std::string> weights, overrides = {"precision=fp32", "device=cpu"};
  int rank = 0, oversample = 8, batches = 1;
  for (int i = 2; i < argc; i++) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw UserError(a + ": needs a value");
    const std::string v = argv[++i];
    // a checkpoint's directory holds the run's config.json, not the model's: read its weights file
    if (a == "--weights")
      weights.push_back(std::filesystem::exists(v + "/state.json") ? v + "/model.safetensors" : v);
    else if (a == "--rank") rank = std::stoi(v);
    else if (a == "--oversample") oversample = std::stoi(v);
    else if (a == "--batches") batches = std::stoi(v);
    else if (a == "--set") overrides.push_back(v);
    else throw UserError("unknown option " + a);
  }
  if (weights.size() < 2) throw UserError("--weights: at least two checkpoints, one per refresh");
  const RunConfig cfg = load_run_config(argv[1], overrides);
  if (rank == 0) rank = cfg.optimizer.projection.rank;
  const std::vector<ProjectionTarget> kinds = {
      ProjectionTarget::Q,    ProjectionTarget::K,  ProjectionTarget::V,   ProjectionTarget::O,
      ProjectionTarget::Gate, ProjectionTarget::Up, ProjectionTarget::Down};
  Arena arena;
  LlamaModel model(cfg.model, arena, cfg.micro_batch_size, cfg.seq_len,
                   projection_tensor_names(cfg.model.num_hidden_layers, kinds));
  const std::vector<Method> methods = {{"random q0", 0, false}, {"random q1", 1, false},
                                       {"random q2", 2, false}, {"warm q1", 1, true},
                                       {"warm q2", 2, true},    {"stale", -1, false}};
  std::map<int, std::vector<double>> previous_exact;               // by tensor
  std::map<std::pair<int, size_t>, std::vector<float>> warm_chain;  // (tensor, method)
  std::map<std::string, std::map<std::string, Score>> by_kind;     // kind -> method -> score
  std::map<std::string, Score> overall;
  std::map<std::string, Score> optimum_share;  // kind -> ‖Uᵀ·A‖²_F / ‖A‖²_F
  const ShardReader shard(cfg.train_files.at(0));
  const int64_t N = int64_t(cfg.micro_batch_size) * cfg.seq_len;
  std::vector<uint32_t> tokens(size_t(N) + 1);
  std::vector<int32_t> inputs(static_cast<size_t>(N)), targets(static_cast<size_t>(N));
  std::printf("rank %d, %d extra columns, %d micro-batch(es) of %lld tokens a checkpoint; "
              "energy: share of the rank-%d optimum, cos2: mean over the principal angles\n",
              rank, oversample, batches, (long long)N, rank);
  std::printf("%-13s %-9s", "checkpoint", "kind");
  for (const Method& m : methods) std::printf(" %18s", m.name.c_str());
  std::printf("\n%-23s", "");
  for (size_t i = 0; i < methods.size(); i++) std::printf(" %9s%9s", "energy", "cos2");
  std::printf("\n");
  for (size_t c = 0; c < weights.size(); c++) {
    load_hf_model(model, weights[c]);
    FullGradients sink(model);
    model.set_gradient_sink(&sink);
    for (int b = 0; b < batches; b++) {
      const uint64_t window = (uint64_t(c) * uint64_t(batches) + uint64_t(b)) * uint64_t(N);
      shard.read(window, uint64_t(N) + 1, tokens.data());
      for (int64_t i = 0; i < N; i++)
        inputs[size_t(i)] = int32_t(tokens[size_t(i)]),
        targets[size_t(i)] = int32_t(tokens[size_t(i) + 1]);
      model.forward(inputs.data(), targets.data(), cfg.micro_batch_size);
      model.backward(1.0);
    }
    model.set_gradient_sink(nullptr);
    std::map<std::string, std::map<std::string, Score>> here;
    for (const auto& [tensor, G] : sink.grads) {
      const ParamTensor& t = model.tensors()[size_t(tensor)];
      const int out = int(t.shape[0]), in = int(t.shape[1]);
      const bool rows = projects_rows(OptimizerKind::GaLore, cfg.optimizer.projection, out, in);
      const int side = rows ? out : in, other = rows ? in : out;
      const std::vector<double> A = projected_side_first(G, out, in, rows);
      std::vector<double> Gd(G.begin(), G.end()), U(size_t(side) * rank);
      ops::galore_basis(U.data(), Gd.data(), out, in, rank, rows);
      const double best = projected_energy(U, A, side, other, rank);
      double total = 0;
      for (const double a : A) total += a * a;
      optimum_share[kind_of(t.name)].add(best / total, 0);
      for (size_t mi = 0; mi < methods.size(); mi++) {
        const Method& m = methods[mi];
        const uint64_t seed = derive_seed(derive_seed(0x6a10, c), uint64_t(tensor));
        std::vector<float> P(size_t(side) * rank);
        if (m.power_iters < 0) {
          if (c == 0) continue;
          const std::vector<double>& prev = previous_exact.at(tensor);
          std::copy(prev.begin(), prev.end(), P.begin());
        } else if (m.warm) {
          std::vector<float>& chain = warm_chain[{tensor, mi}];
          if (c == 0) {  // no previous projection: a fresh start, as a run's first refresh
            ops::galore_basis_randomized(P.data(), G.data(), out, in, rank, rows, seed, 2,
                                         oversample);
          } else {
            P = chain;
            ops::galore_basis_randomized(P.data(), G.data(), out, in, rank, rows, seed,
                                         m.power_iters, oversample, /*warm_start=*/true);
          }
          chain = P;
        } else {
          ops::galore_basis_randomized(P.data(), G.data(), out, in, rank, rows, seed,
                                       m.power_iters, oversample);
        }
        if (c == 0) continue;  // the first checkpoint only starts the chains
        const double e = projected_energy(P, A, side, other, rank) / best;
        const double cs = mean_cos_sq(U, P, side, rank);
        here[kind_of(t.name)][m.name].add(e, cs);
        by_kind[kind_of(t.name)][m.name].add(e, cs);
        overall[m.name].add(e, cs);
      }
      previous_exact[tensor] = U;
    }
    if (c == 0) continue;
    // a checkpoint's directory name ("step_00000200"), or the file's
    std::string path = weights[c];
    const std::string file = "/model.safetensors";
    if (path.size() > file.size() && path.compare(path.size() - file.size(), file.size(), file) == 0)
      path.resize(path.size() - file.size());
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    const std::string label = path.substr(path.find_last_of('/') + 1);
    for (const auto& [kind, scores] : here) {
      std::printf("%-13s %-9s", label.c_str(), kind.c_str());
      for (const Method& m : methods) {
        const Score& s = scores.at(m.name);
        std::printf(" %9.4f%9.4f", s.energy / s.n, s.cos_sq / s.n);
      }
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  std::printf("\nmean over checkpoints 2..%zu and layers; the rank-%d optimum's share of the "
              "gradient's energy in brackets:\n", weights.size(), rank);
  for (const auto& [kind, scores] : by_kind) {
    const Score& share = optimum_share.at(kind);
    std::printf("%-14s (%6.4f)", kind.c_str(), share.energy / share.n);
    for (const Method& m : methods) {
      const Score& s = scores.at(m.name);
      std::printf(" %9.4f%9.4f", s.energy / s.n, s.cos_sq / s.n);
    }
    std::printf("\n");
  }
  std::printf("%-23s", "all");
  for (const Method& m : methods) {
    const Score& s = overall.at(m.name);
    std::printf(" %9.4f%9.4f", s.energy / s.n, s.cos_sq / s.n);
  }
  std::printf("\n%-23s", "worst energy, any target");
  for (const Method& m : methods) std::printf(" %9.4f%9s", overall.at(m.name).worst_energy, "");
  std::printf("\n");
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
