// The kernel lab's shared parts (lab.h): shapes, buffers, random inputs, errors, the timer, the
// report.
#include "src/core/format.h"
#include "tools/kernel_lab/lab.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "src/core/bf16.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/model/llama.h"

namespace grass::lab {

namespace {
// A CSV field as RFC 4180 writes it: quoted, its quotes doubled, where it holds a comma or a
// quote (a shape such as "n=4194304 (C x C), blocks of 256").
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int kSampleRows = 8;  // rows the CPU reference computes where a whole output is too slow
constexpr double kSmallRow = 0.1;  // max_row_error: rows under this times the typical one
// The L2 flush before each timed call: larger than any current GPU's L2 (H100 and H200 50 MiB,
// B200 126 MiB), so every call reads its inputs from memory, not from the cache the previous call
// left warm. --smoke's timings mean nothing: a token flush there.
constexpr int64_t kFlushBytes = int64_t(256) << 20, kSmokeFlushBytes = 4096;

// Peak memory bandwidth by device name, in bytes/s (the vendors' data sheets); 0: unknown, and the
// % of peak of memory-bound ops is then n/a. The bf16 FLOP/s peaks are Backend::peak_flops()'s.
//   H200 4.8 TB/s; H100 SXM (HBM3) 3.35 TB/s; H100 PCIe 2.0 TB/s; A100 2.0 TB/s (80 GB SXM:
//   2.04 TB/s; the 40 GB card's 1.56 TB/s is counted as 2.0 here).
double peak_bandwidth(const std::string& device) {
  const auto has = [&](const char* s) { return device.find(s) != std::string::npos; };
  if (has("H200")) return 4.8e12;
  if (has("H100")) return has("PCIe") ? 2.0e12 : 3.35e12;
  if (has("A100")) return 2.0e12;
  return 0;
}

WorkspaceShape workspace_shape(const Model& m, AttentionKernel attention) {
  return {m.B, m.T, m.C(), m.F(), m.V(), m.NH(), m.NKV(), m.HD(), m.config.rope_theta, attention};
}

// 2-byte elements are bf16, 4-byte ones fp32
void check_float_bytes(int bytes) {
  GRASS_CHECK(bytes == 2 || bytes == 4, "a buffer of " + std::to_string(bytes) + "-byte elements");
}

}  // namespace

// ---- shapes -----------------------------------------------------------------------------------

std::vector<LinearShape> linear_shapes(const Model& m, bool model_gemms) {
  std::vector<LinearShape> shapes;
  auto add = [&](int out, int in, const std::string& layer, bool forward_only = false) {
    for (LinearShape& s : shapes)
      if (s.out == out && s.in == in) {
        s.layers += "/" + layer;
        s.forward_only = s.forward_only && forward_only;
        return;
      }
    shapes.push_back({out, in, layer, forward_only});
  };
  for (const ProjectionTarget t : {ProjectionTarget::Q, ProjectionTarget::K, ProjectionTarget::V,
                                   ProjectionTarget::O, ProjectionTarget::Gate,
                                   ProjectionTarget::Up, ProjectionTarget::Down}) {
    const auto [out, in] = m.config.linear_shape(t);
    add(out, in, name_of(t));
  }
  // The engine's GPU runs store an ffn that is not a multiple of 8 padded (pad_ffn): time the
  // stored shapes beside Hugging Face's, so the table shows what the padding buys.
  const int F = m.F();
  const int padded = (F + kFfnRowMultiple - 1) / kFfnRowMultiple * kFfnRowMultiple;
  if (F != padded) {
    add(padded, m.C(), "gate(padded)");
    add(padded, m.C(), "up(padded)");
    add(m.C(), padded, "down(padded)");
  }
  if (model_gemms) {  // q_proj, k_proj and v_proj stacked, and gate_proj and up_proj (the forward's
                      // one GEMM each, and the backward's when the stack's gradients are dense:
                      // LlamaModel::stacked_backward; its dx GEMM alone when GRASS forms them
                      // together: bench_grass's stack rows); the head
    const int qkv = m.config.linear_shape(ProjectionTarget::Q).first +
                    2 * m.config.linear_shape(ProjectionTarget::K).first;
    add(qkv, m.C(), "q+k+v");
    add(2 * F, m.C(), "gate+up");
    if (F != padded) add(2 * padded, m.C(), "gate+up(padded)");
    add(m.V(), m.C(), "lm_head");
  }
  return shapes;
}

std::string dims(std::initializer_list<std::pair<const char*, int64_t>> named) {
  std::string text;
  for (const auto& [name, value] : named) {
    if (!text.empty()) text += ' ';
    text += std::string(name) + "=" + std::to_string(value);
  }
  return text;
}

// ---- backend memory ---------------------------------------------------------------------------

Buffer::Buffer(Backend& backend, int64_t n, int bytes) : backend_(&backend), n_(n), bytes_(bytes) {
  const size_t size = size_t(std::max<int64_t>(n, 1)) * size_t(bytes);
  ptr_ = backend.allocate_zeroed(size);
  if (!ptr_)
    throw UserError("out of " + std::string(backend.memory_name()) + " allocating " +
                    format_bytes(int64_t(size)));
}

Buffer::Buffer(Backend& backend, const std::vector<float>& values, int bytes)
    : Buffer(backend, int64_t(values.size()), bytes) {
  put(values);
}

Buffer::Buffer(Backend& backend, const std::vector<int32_t>& values)
    : Buffer(backend, int64_t(values.size()), 4) {
  backend.upload(ptr_, values.data(), values.size() * sizeof(int32_t));
}

Buffer::~Buffer() { backend_->deallocate(ptr_); }

void Buffer::put(const std::vector<float>& values) {
  check_float_bytes(bytes_);
  GRASS_CHECK(int64_t(values.size()) == n_, "Buffer::put: wrong size");
  if (bytes_ == 4) return backend_->upload(ptr_, values.data(), values.size() * sizeof(float));
  std::vector<uint16_t> bf16(values.size());
  for (size_t i = 0; i < values.size(); i++) bf16[i] = float_to_bf16(values[i]);
  backend_->upload(ptr_, bf16.data(), bf16.size() * sizeof(uint16_t));
}

std::vector<float> Buffer::get() const {
  check_float_bytes(bytes_);
  std::vector<float> values(static_cast<size_t>(n_));
  if (bytes_ == 4) {
    backend_->download(values.data(), ptr_, values.size() * sizeof(float));
    return values;
  }
  std::vector<uint16_t> bf16(values.size());
  backend_->download(bf16.data(), ptr_, bf16.size() * sizeof(uint16_t));
  for (size_t i = 0; i < values.size(); i++) values[i] = bf16_to_float(bf16[i]);
  return values;
}

void Buffer::poison() {
  const std::vector<uint8_t> ones(size_t(n_) * size_t(bytes_), 0xFF);
  backend_->upload(ptr_, ones.data(), ones.size());
}

Workspace::Workspace(Lab& lab, const Model& m) : gpu_arena_(false, lab.gpu), cpu_arena_(false, lab.cpu) {
  const WorkspaceShape shape = workspace_shape(m, lab.options.attention);
  gpu_scratch_ = lab.gpu.plan_scratch(gpu_arena_, shape);
  WorkspaceShape one_batch = shape;
  one_batch.B = 1;
  one_batch.attention = AttentionKernel::Grass;  // the CPU's reference
  cpu_scratch_ = lab.cpu.plan_scratch(cpu_arena_, one_batch);
}

// ---- checks -----------------------------------------------------------------------------------

double max_row_error(const std::vector<float>& got, const std::vector<float>& want, int64_t width,
                     const std::vector<int64_t>& rows) {
  GRASS_CHECK(int64_t(want.size()) == int64_t(rows.size()) * width, "max_row_error: want's size");
  if (std::isnan(nonfinite(got))) return kNaN;
  std::vector<double> diff(rows.size()), norm(rows.size());  // squared, per row
  double typical = 0;                                         // Σ over rows of ‖want_row‖²
  for (size_t r = 0; r < rows.size(); r++) {
    GRASS_CHECK((rows[r] + 1) * width <= int64_t(got.size()), "max_row_error: row out of got");
    const float* g = got.data() + rows[r] * width;
    const float* w = want.data() + int64_t(r) * width;
    for (int64_t c = 0; c < width; c++) {
      diff[r] += (double(g[c]) - w[c]) * (double(g[c]) - w[c]);
      norm[r] += double(w[c]) * w[c];
    }
    typical += norm[r];
  }
  typical = std::sqrt(typical / double(std::max<size_t>(rows.size(), 1)));
  double worst_row = 0;
  for (size_t r = 0; r < rows.size(); r++) {
    const double scale = std::max(std::sqrt(norm[r]), kSmallRow * typical);
    const double e = diff[r] == 0 ? 0 : scale == 0 ? INFINITY : std::sqrt(diff[r]) / scale;
    if (std::isnan(e)) return kNaN;  // a non-finite reference
    worst_row = std::max(worst_row, e);
  }
  return worst_row;
}

double max_row_error(const std::vector<float>& got, const std::vector<float>& want,
                     int64_t width) {
  return max_row_error(got, want, width, row_range(0, int64_t(got.size()) / width));
}

double nonfinite(const std::vector<float>& got) {
  for (const float x : got)
    if (!std::isfinite(x)) return kNaN;
  return 0;
}

double scalar_error(double got, double want) {
  if (!std::isfinite(got)) return kNaN;
  return got == want ? 0 : std::fabs(got - want) / std::fabs(want);
}

double worst(std::initializer_list<double> errors) {
  double w = 0;
  for (const double e : errors) {
    if (std::isnan(e)) return kNaN;
    w = std::max(w, e);
  }
  return w;
}

std::vector<float> rows_of(const std::vector<float>& m, int64_t width,
                           const std::vector<int64_t>& rows) {
  std::vector<float> out;
  out.reserve(rows.size() * size_t(width));
  for (const int64_t r : rows)
    out.insert(out.end(), m.begin() + r * width, m.begin() + (r + 1) * width);
  return out;
}

std::vector<float> cols_of(const std::vector<float>& m, int64_t width,
                           const std::vector<int64_t>& cols) {
  const int64_t rows = int64_t(m.size()) / width;
  std::vector<float> out(size_t(rows) * cols.size());
  for (int64_t r = 0; r < rows; r++)
    for (size_t j = 0; j < cols.size(); j++)
      out[size_t(r) * cols.size() + j] = m[r * width + cols[j]];
  return out;
}

std::vector<int64_t> row_range(int64_t first, int64_t count) {
  std::vector<int64_t> rows(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; i++) rows[size_t(i)] = first + i;
  return rows;
}

int64_t weight_update_bytes(const Storage& s) {
  return s.master ? 4 + 4 + s.weight_bytes : 2 * s.weight_bytes;
}

// ---- the lab ----------------------------------------------------------------------------------

Lab::Lab(Backend& gpu_backend, Backend& cpu_backend, const Options& opts)
    : gpu(gpu_backend),
      cpu(cpu_backend),
      options(opts),
      peak_bytes_per_s_(peak_bandwidth(gpu_backend.describe())),
      flush_(gpu_backend, opts.smoke ? kSmokeFlushBytes : kFlushBytes, 1) {
  // What the timer adds to every figure: the smallest op there is (one 4-byte memset), timed the
  // same way.
  timer_floor_ms_ = time_ms([&] { gpu.zero(flush_.ptr(), 4); });
  if (!options.csv.empty()) {
    csv_ = std::fopen(options.csv.c_str(), "w");
    if (!csv_) throw UserError("cannot write " + options.csv);
    std::fprintf(csv_, "op,model,shape,ms,rate,unit,peak_percent,max_rel_err,tol,ok,derived\n");
  }
}

Lab::~Lab() {
  if (csv_) std::fclose(csv_);
}

std::vector<float> Lab::uniform(int64_t n, double lo, double hi, int bytes) {
  check_float_bytes(bytes);
  const uint64_t stream = derive_seed(options.seed, stream_++);
  std::vector<float> values(static_cast<size_t>(n));
#pragma omp parallel for
  for (int64_t i = 0; i < n; i++) {
    const float x = float(lo + (hi - lo) * uniform_open01(stream, uint64_t(i)));
    values[size_t(i)] = bytes == 2 ? bf16_to_float(float_to_bf16(x)) : x;
  }
  return values;
}

std::vector<int32_t> Lab::integers(int64_t n, int bound, bool sorted) {
  const uint64_t stream = derive_seed(options.seed, stream_++);
  std::vector<int32_t> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++)
    values[size_t(i)] = int32_t(splitmix64(stream ^ splitmix64(uint64_t(i))) % uint64_t(bound));
  if (sorted) std::sort(values.begin(), values.end());
  return values;
}

std::vector<int64_t> Lab::sample_rows(int64_t n) const {
  if (n <= kSampleRows) return row_range(0, n);
  std::vector<int64_t> rows(kSampleRows);
  for (int i = 0; i < kSampleRows; i++) rows[size_t(i)] = int64_t(i) * (n - 1) / (kSampleRows - 1);
  return rows;
}

double Lab::time_ms(const std::function<void()>& op) {
  for (int i = 0; i < options.warmup; i++) op();
  std::vector<double> ms;
  for (int i = 0; i < options.repeat; i++) {
    gpu.zero(flush_.ptr(), flush_.size_bytes());
    gpu.synchronize();
    const auto start = std::chrono::steady_clock::now();
    op();
    gpu.synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::nth_element(ms.begin(), ms.begin() + ptrdiff_t(ms.size() / 2), ms.end());
  return ms[ms.size() / 2];
}

void Lab::print_header() const {
  // the mma backward's path: forced by GRASS_MMA_BACKWARD (the backend reads it), else per shape
  const char* path = std::getenv("GRASS_MMA_BACKWARD");
  const std::string mma = std::string("the engine's FA2-style kernels (RoPE on copies; backward ") +
                          (path ? std::string("path ") + path + ", GRASS_MMA_BACKWARD"
                                : std::string("path A where it takes the shape, else B")) +
                          ")";
  std::printf("kernel_bench: %s; attention: %s\n", gpu.describe().c_str(),
              options.attention == AttentionKernel::Cudnn ? "cuDNN's fused flash attention (RoPE on copies)"
              : options.attention == AttentionKernel::Mma ? mma.c_str()
                                                          : "the engine's kernels (RoPE in their loads)");
  std::printf("batch %d x %d tokens; median of %d calls after %d warm-ups, L2 flushed before each; "
              "timer floor %.4f ms; seed %llu\n",
              options.B, options.T, options.repeat, options.warmup, timer_floor_ms_,
              static_cast<unsigned long long>(options.seed));
  const auto peak = [](double value, double unit, const char* name) {
    return value > 0 ? std::to_string(int64_t(value / unit)) + " " + name : std::string("n/a");
  };
  std::printf("peak: %s bf16 dense, %s memory; CPU reference: %s\n",
              peak(gpu.peak_flops(), 1e12, "TFLOP/s").c_str(),
              peak(peak_bytes_per_s_, 1e9, "GB/s").c_str(), cpu.describe().c_str());
  if (options.q8)
    std::printf("optimizer moments: 8-bit in blocks of %d (projected states per feature)\n",
                options.state_block);
  std::printf("(op*: derived, the difference of the two rows above it, not timed on its own)\n");
  std::printf("%-26s %-5s %-46s %10s %10s %-7s %6s %9s %8s %s\n", "op", "model", "shape", "ms",
              "rate", "unit", "%peak", "max_err", "tol", "ok");
}

void Lab::report(const Model& m, const Row& row) {
  const double per_s = row.ms > 0 ? 1e3 / row.ms : kNaN;  // a derived time may come out <= 0
  const bool flops = row.flops > 0;
  const double rate = flops ? row.flops * per_s / 1e12 : row.bytes * per_s / 1e9;
  const double peak = flops ? gpu.peak_flops() : peak_bytes_per_s_;
  const double percent = peak > 0 ? 100 * (flops ? row.flops : row.bytes) * per_s / peak : kNaN;
  const bool ok = row.err <= row.tol;  // NaN is not
  if (!ok) failures_++;
  const std::string op = row.op + (row.derived ? "*" : "");
  char percent_text[16] = "n/a";
  if (!std::isnan(percent)) std::snprintf(percent_text, sizeof percent_text, "%.1f", percent);
  const char* unit = flops ? "TFLOP/s" : "GB/s";
  std::printf("%-26s %-5s %-46s %10.4f %10.3f %-7s %6s %9.2e %8.1e %s\n", op.c_str(),
              m.name.c_str(), row.shape.c_str(), row.ms, rate, unit, percent_text, row.err, row.tol,
              ok ? "ok" : "FAIL");
  std::fflush(stdout);
  if (csv_)
    std::fprintf(csv_, "%s,%s,%s,%.6f,%.6f,%s,%s,%.3e,%.1e,%d,%d\n", row.op.c_str(),
                 m.name.c_str(), csv_field(row.shape).c_str(), row.ms, rate, unit, percent_text,
                 row.err, row.tol, ok, row.derived);
}

}  // namespace grass::lab
