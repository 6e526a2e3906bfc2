#include "src/train/metrics.h"

#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "src/core/error.h"
#include "src/core/format.h"

namespace grass {

namespace {
std::string human_rate(double per_s) {  // 158.9k, 1.23M
  char buf[32];
  if (per_s >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", per_s / 1e6);
  else if (per_s >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", per_s / 1e3);
  else std::snprintf(buf, sizeof buf, "%.1f", per_s);
  return buf;
}
std::string human_count(double n) {  // 812, 32.8k, 1.0M
  char buf[32];
  if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.1fM", n / 1e6);
  else if (n >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}
}  // namespace

std::string format_step_line(const StepMetrics& m) {
  char flops[64], mfu[32], buf[320];
  if (m.gflops_per_s >= 1e3) std::snprintf(flops, sizeof flops, "%.1f TFLOP/s", m.gflops_per_s / 1e3);
  else std::snprintf(flops, sizeof flops, "%.1f GFLOP/s", m.gflops_per_s);
  if (m.mfu >= 0) std::snprintf(mfu, sizeof mfu, " | MFU %.1f%%", 100 * m.mfu);
  else if (m.mem_device_bytes > 0) std::snprintf(mfu, sizeof mfu, " | MFU n/a");  // unknown GPU
  else mfu[0] = '\0';  // the CPU: no agreed peak
  std::string mem = format_bytes(m.mem_bytes);
  if (m.mem_device_bytes > 0) {  // the arena, then the device as its driver sees it
    const double GiB = 1024.0 * 1024 * 1024;
    char dev[96];
    std::snprintf(dev, sizeof dev, "%.2f GiB (device %.2f/%.2f GiB)", double(m.mem_bytes) / GiB,
                  double(m.mem_device_used_bytes) / GiB, double(m.mem_device_bytes) / GiB);
    mem = dev;
  }
  std::snprintf(buf, sizeof buf,
                "step %lld/%lld | loss %.4f | lr %.1e | gnorm %.2f | %.0f ms | %s tok/s | %s%s | "
                "mem %s",
                (long long)m.step, (long long)m.total_steps, m.loss, m.lr, m.grad_norm, m.step_ms,
                human_rate(m.tokens_per_s).c_str(), flops, mfu, mem.c_str());
  std::string line = buf;
  if (m.mem_host_bytes > 0) line += " + host " + format_bytes(m.mem_host_bytes);
  if (m.copy_bytes >= 0) {
    char rate[48] = "";
    if (m.copy_gbps > 0) std::snprintf(rate, sizeof rate, " at %.1f GB/s", m.copy_gbps);
    line += " | copy " + format_bytes(m.copy_bytes) + rate;
  }
  if (m.comm_bytes >= 0) line += " | comm " + format_bytes(m.comm_bytes);
  if (m.step < m.total_steps) line += " | eta " + human_duration(m.eta_s);
  return line;
}

std::string format_eval_line(const EvalMetrics& e) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "eval step %lld | val loss %.4f | ppl %.2f | %s tokens",
                (long long)e.step, e.loss, e.perplexity, human_count(double(e.tokens)).c_str());
  return buf;
}

MetricsWriter::MetricsWriter(const std::string& path, bool append, int64_t rows)
    : path_(path), out_(path, append ? std::ios::app : std::ios::trunc), rows_(append ? rows : 0) {
  if (!out_) throw UserError(path + ": cannot open for writing");
}

int64_t truncate_metrics_after(const std::string& path, int64_t step) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot open for reading");
  uint64_t keep_bytes = 0;
  int64_t rows = 0;
  std::string line;
  // A row is kept when it is a whole line (a kill can cut the last one short) holding a JSON
  // object whose "step" is at most `step`; everything from the first other line on goes.
  while (std::getline(in, line)) {
    if (in.eof()) break;  // no newline after it: a partial row
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object() || !row.contains("step") || !row["step"].is_number_integer() ||
        row["step"].get<int64_t>() > step)
      break;
    keep_bytes += line.size() + 1;
    rows++;
  }
  in.close();
  std::filesystem::resize_file(path, keep_bytes, ec);
  if (ec) throw UserError(path + ": cannot truncate: " + ec.message());
  return rows;
}

void MetricsWriter::write(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},           {"loss", m.loss},
                      {"lr", m.lr},               {"grad_norm", m.grad_norm},
                      {"clip_coef", m.clip_coef},
                      {"step_ms", m.step_ms},     {"tokens_per_s", m.tokens_per_s},
                      {"gflops_per_s", m.gflops_per_s}, {"tokens", m.tokens_seen},
                      {"mem_bytes", m.mem_bytes}};
  if (m.mfu >= 0) j["mfu"] = m.mfu;
  if (m.mem_device_bytes > 0) {
    j["mem_device_used_bytes"] = m.mem_device_used_bytes;
    j["mem_device_bytes"] = m.mem_device_bytes;
  }
  if (m.host_waits >= 0) j["host_waits"] = m.host_waits;
  if (m.comm_bytes >= 0) j["comm_bytes"] = m.comm_bytes;
  if (m.mem_host_bytes > 0) j["mem_host_bytes"] = m.mem_host_bytes;
  if (m.copy_bytes >= 0) {
    j["copy_bytes"] = m.copy_bytes;
    j["copy_gbps"] = m.copy_gbps;
  }
  if (!m.attention.empty()) j["attention"] = m.attention;
  if (m.cudnn_version > 0) j["cudnn_version"] = m.cudnn_version;
  out_ << j.dump() << '\n';
  out_.flush();
  if (!out_) throw UserError(path_ + ": write failed (disk full?)");
  rows_++;
}

void MetricsWriter::write_eval(const EvalMetrics& e) {
  const nlohmann::json j = {{"step", e.step},
                            {"eval", true},
                            {"val_loss", e.loss},
                            {"val_perplexity", e.perplexity},
                            {"val_tokens", e.tokens}};
  out_ << j.dump() << '\n';
  out_.flush();
  if (!out_) throw UserError(path_ + ": write failed (disk full?)");
  rows_++;
}

}  // namespace grass
