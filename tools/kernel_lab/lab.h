// The kernel lab (build/kernel_bench, docs/kernel-lab.md): every op of the Backend interface
// (kernels/backend.h), forward and backward, timed on the CUDA backend at a model's shapes and
// checked against the CPU backend on a sample. This header is what the op files share: the
// model's shapes, backend buffers, random inputs, the error measure and its tolerances, the
// timer and the report.
//
// Each op is one function (model_ops.cpp, optimizer_ops.cpp) that makes fresh random inputs, runs
// the op once on the GPU with its outputs poisoned, runs the CPU reference on a sample, then times
// the GPU op and reports one row per timed call. A Backend signature that changes is a one-place
// edit there.
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "src/config/config.h"

namespace grass::lab {

// ---- the model --------------------------------------------------------------------------------

// One model's shapes at the lab's token batch.
struct Model {
  std::string name;    // "60m", "1b", "13b": configs/models/llama_<name>.json
  ModelConfig config;  // widths, heads, vocab, eps, theta (scaled down under --smoke)
  int B = 0, T = 0;    // the token batch: N = B·T rows
  int rank = 0;        // r of GRASS, GaLore and FLORA at this size

  int64_t N() const { return int64_t(B) * T; }
  int C() const { return config.hidden_size; }
  int F() const { return config.intermediate_size; }
  int V() const { return config.vocab_size; }
  int NH() const { return config.num_attention_heads; }
  int NKV() const { return config.num_key_value_heads; }
  int HD() const { return config.head_dim(); }
};

// A linear layer y[N, out] = x[N, in]·w[out, in]ᵀ and the layers of the model that have it.
struct LinearShape {
  int out = 0, in = 0;
  std::string layers;         // "q/k/v/o"
  bool forward_only = false;  // gate+up: one GEMM in the forward, two in the backward
};
// The distinct shapes of q, k, v, o, gate, up, down, then, for an ffn not a multiple of 8, gate,
// up and down padded as the GPU stores them (pad_ffn); with model_gemms also the forward's
// gate+up GEMM (out = 2F, and padded) and lm_head.
std::vector<LinearShape> linear_shapes(const Model& m, bool model_gemms);
// "N=4096 C=512": the shape column of the table
std::string dims(std::initializer_list<std::pair<const char*, int64_t>> named);

// ---- backend memory ---------------------------------------------------------------------------

// n elements of backend memory, `bytes` each (2: bf16, 4: fp32 or int32), freed on scope exit:
// every op allocates its own, so the 13B shapes are on the GPU one op at a time. Values go in and
// out as fp32 on the host, rounded to bf16 on the way in when the elements are bf16.
// The CPU backend's memory is host memory (backend.h), so the CPU reference runs on std::vectors.
class Buffer {
 public:
  Buffer(Backend& backend, int64_t n, int bytes);
  Buffer(Backend& backend, const std::vector<float>& values, int bytes);
  Buffer(Backend& backend, const std::vector<int32_t>& values);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* ptr() const { return ptr_; }
  size_t size_bytes() const { return size_t(n_) * size_t(bytes_); }
  float* f32() const { return static_cast<float*>(ptr_); }
  int32_t* i32() const { return static_cast<int32_t*>(ptr_); }
  void put(const std::vector<float>& values);
  std::vector<float> get() const;
  // Every byte 0xFF: NaN in fp32 and bf16, so an element the op leaves unwritten fails the check.
  void poison();

 private:
  Backend* backend_;
  void* ptr_ = nullptr;
  int64_t n_;
  int bytes_;
};

// ---- checks -----------------------------------------------------------------------------------

// The error of an output: the largest relative error of one row, ‖got_row - want_row‖₂ /
// ‖want_row‖₂, over the checked rows; NaN when got holds a non-finite value anywhere (the poison
// of an unwritten element, or a real NaN). Row-wise so that one bad row cannot hide among good
// ones; not element-wise, where values near zero make any rounding look large. A reference row
// under a tenth of the typical row (the rms of the checked rows' norms) is measured against that
// tenth instead: the change of a weight an update must leave alone is zero.
//   got: the whole output [*, width];  want: the reference for `rows` of it, in that order
double max_row_error(const std::vector<float>& got, const std::vector<float>& want, int64_t width,
                     const std::vector<int64_t>& rows);
// ... for every row of got
double max_row_error(const std::vector<float>& got, const std::vector<float>& want, int64_t width);
// 0 when every element of got is finite, NaN otherwise: the poison check where only part of an
// output is compared
double nonfinite(const std::vector<float>& got);
// |got - want| / |want| of a scalar (NaN when got is not finite)
double scalar_error(double got, double want);
// The largest of several errors; NaN when one is.
double worst(std::initializer_list<double> errors);

// Rows `rows` of a row-major matrix [*, width]; columns `cols` of it ([rows, cols.size()]).
std::vector<float> rows_of(const std::vector<float>& m, int64_t width,
                           const std::vector<int64_t>& rows);
std::vector<float> cols_of(const std::vector<float>& m, int64_t width,
                           const std::vector<int64_t>& cols);
// first, first + 1, ..., first + count - 1
std::vector<int64_t> row_range(int64_t first, int64_t count);

// Tolerances on max_row_error, and why. The GPU and the CPU start from the same bf16 values; the
// CPU keeps activations in fp32 where the GPU stores bf16.
// A bf16 store of an fp32 result is off by at most 2^-9 relative per element; 1e-2 leaves room for
// sums in another order and for intermediates the GPU keeps in bf16 where the CPU keeps fp32
// (attention's probabilities and output, the head's logits, the GRASS and low-rank scratch).
constexpr double kTolBf16 = 1e-2;
// A copy (the embedding's rows): the same bits or it is wrong.
constexpr double kTolExact = 0;
// The loss: a sum of N logsumexps (~ ln V each) over bf16 logits on the GPU, fp32 on the CPU.
constexpr double kTolLoss = 1e-3;
// An fp32 reduction (Σx²) in a different order: ~1e-7 of the sum.
constexpr double kTolReduce = 1e-5;
// An optimizer step's change of the weights and the moments in fp32 (bf16-mixed): the same formula
// in fp32 on both sides; FMA contraction and sqrt/division order move the last bits, and the decay
// and the step can nearly cancel in a few elements.
constexpr double kTolUpdateF32 = 1e-4;
// ... in pure bf16: each store rounds stochastically, from the same streams on both sides
// (rounding_stream_seed), but of fp32 values whose last bits differ (above), so an element whose
// value lies near its draw's threshold may land on the other bf16 neighbour: one spacing in ~100
// or more of the change (optimizer_ops.cpp: adam_args); the moments' own rounding is ~2^-9 of
// them.
constexpr double kTolUpdateBf16 = 2e-2;
// GaLore's and FLORA's step: the GPU back-projects through bf16 copies of P and of the Adam
// direction (kernels/cuda/lowrank.cu), one bf16 rounding of each factor of the change (~2^-9
// each); in pure bf16 also the stochastic rounding above.
constexpr double kTolLowRankUpdate = 2e-2;

// ---- the lab ----------------------------------------------------------------------------------

struct Options {
  std::vector<std::string> models{"60m", "1b", "13b"};
  std::vector<std::string> ops;  // empty: every op
  int B = 16, T = 256;
  int repeat = 20, warmup = 2;
  PrecisionChoice precision = PrecisionChoice::Bf16Mixed;
  AttentionKernel attention = AttentionKernel::Grass;  // the GPU's attention rows
  // The optimizers' moments: the precision's (fp32 or bf16), or 8-bit (q8: the adamw, grass and
  // lowrank rows time the *_q8 steps, projected states blocked per feature) in blocks of
  // state_block.
  bool q8 = false;
  int state_block = 256;
  bool smoke = false;
  std::string csv;  // empty: none
  uint64_t seed = 0;
  std::string configs;  // the directory of llama_<name>.json
};

// One timed call of one op: a row of the table.
struct Row {
  std::string op, shape;
  double ms = 0;
  double flops = 0;  // work per call for GEMM-like ops (rate in TFLOP/s), else 0
  double bytes = 0;  // memory traffic per call for memory-bound ops (rate in GB/s), else 0
  double err = 0;    // max_row_error against the CPU reference (NaN: non-finite output)
  double tol = 0;
  bool derived = false;  // its time is the difference of two timed rows, not timed on its own
};

class Lab;

// The backends' scratch at a model's shapes (Backend::plan_scratch), in use while it lives. The
// CPU's serves its reference attention, which runs on one batch element.
class Workspace {
 public:
  Workspace(Lab& lab, const Model& m);

 private:
  Arena gpu_arena_, cpu_arena_;
  std::unique_ptr<ScratchLease> gpu_scratch_, cpu_scratch_;
};

class Lab {
 public:
  Lab(Backend& gpu, Backend& cpu, const Options& options);
  ~Lab();
  Lab(const Lab&) = delete;
  Lab& operator=(const Lab&) = delete;

  Backend& gpu;  // the CUDA backend: timed
  Backend& cpu;  // the CPU backend of the same precision: the reference
  const Options& options;

  // Fresh random values uniform in (lo, hi), never the same twice in a run, as elements of `bytes`
  // bytes hold them (bf16-rounded when 2): the GPU and the CPU start from the same numbers.
  std::vector<float> uniform(int64_t n, double lo, double hi, int bytes);
  // n integers uniform in [0, bound); sorted: indices drawn with replacement, as GRASS's
  // multinomial draws slices.
  std::vector<int32_t> integers(int64_t n, int bound, bool sorted = false);
  // The rows the CPU reference computes when a whole output is too slow for it: a few, evenly
  // spread over [0, n), the first and the last included (all of them when n is small).
  std::vector<int64_t> sample_rows(int64_t n) const;

  // The median time of `op` over options.repeat calls, in ms, after options.warmup calls. Each
  // call starts with the GPU idle and its L2 cache flushed (a write over a buffer larger than the
  // L2), and is timed by the host between two synchronize() calls: one launch and one wait are in
  // every figure (the header's timer floor).
  double time_ms(const std::function<void()>& op);

  // Prints the row (stdout, and the CSV file), and counts it failed when err is not ≤ tol.
  void report(const Model& m, const Row& row);
  int failures() const { return failures_; }

  void print_header() const;

 private:
  double peak_bytes_per_s_;  // 0: unknown
  Buffer flush_;             // written over before every timed call
  double timer_floor_ms_ = 0;
  uint64_t stream_ = 0;  // random draws so far
  std::FILE* csv_ = nullptr;
  int failures_ = 0;
};

// The bytes an optimizer step moves per weight element it updates: bf16-mixed reads and writes the
// fp32 master and writes the bf16 weight; pure bf16 reads and writes the bf16 weight.
int64_t weight_update_bytes(const Storage& s);

// ---- the ops ----------------------------------------------------------------------------------
// Each reports its rows; `name` is what --ops selects.
struct Op {
  const char* name;
  void (*run)(Lab& lab, const Model& m);
};
void bench_linear(Lab& lab, const Model& m);
void bench_rmsnorm(Lab& lab, const Model& m);
void bench_attention(Lab& lab, const Model& m);
void bench_swiglu(Lab& lab, const Model& m);
void bench_residual(Lab& lab, const Model& m);
void bench_embedding(Lab& lab, const Model& m);
void bench_head(Lab& lab, const Model& m);
void bench_adamw(Lab& lab, const Model& m);
void bench_sum_squares(Lab& lab, const Model& m);
void bench_grass(Lab& lab, const Model& m);
void bench_lowrank(Lab& lab, const Model& m);
inline constexpr Op kOps[] = {
    {"linear", bench_linear},       {"rmsnorm", bench_rmsnorm},
    {"attention", bench_attention},
    {"swiglu", bench_swiglu},       {"residual", bench_residual},
    {"embedding", bench_embedding}, {"head", bench_head},
    {"adamw", bench_adamw},         {"sum_squares", bench_sum_squares},
    {"grass", bench_grass},         {"lowrank", bench_lowrank}};

}  // namespace grass::lab
