// The step log: one human line on stdout and one JSON object per step in <out_dir>/metrics.jsonl.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>

namespace grass {

struct StepMetrics {
  int64_t step = 0;         // 1-based
  int64_t total_steps = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;     // before clipping
  double clip_coef = 1;     // the smallest clipping coefficient applied; 1: nothing clipped
  double step_ms = 0;
  double tokens_per_s = 0;
  double gflops_per_s = 0;  // achieved, from the model's FLOPs per token
  double mfu = -1;          // achieved / the device's dense bf16 peak; < 0: unknown (n/a)
  int64_t tokens_seen = 0;  // cumulative
  int64_t mem_bytes = 0;    // arena peak
  int64_t mem_device_used_bytes = 0;  // the device's memory in use (cudaMemGetInfo); 0 on the CPU
  int64_t mem_device_bytes = 0;       // the device's memory; 0 on the CPU
  int64_t host_waits = -1;  // times the host waited for the device this step; < 0: on the CPU
  int64_t comm_bytes = -1;  // bytes this rank put into sums over the ranks; < 0: not launched
                            // by mpirun
  int64_t mem_host_bytes = 0;  // the arena's host tier (offload); 0: none
  int64_t copy_bytes = -1;  // offload's copies this step, both ways; < 0: no offload
  double copy_gbps = 0;     // their bytes over the time the copy queue spent on them (GB/s)
  double eta_s = 0;         // time left at the mean step time so far (step line only)
  // The attention kernels the step computed with ("grass": the engine's, "cudnn"; "": not given)
  // and, for cuDNN's, its cudnnGetVersion(): another kernel or version computes other bits.
  std::string attention;
  int64_t cudnn_version = 0;
};

// "step 120/10000 | loss 4.8123 | lr 6.0e-04 | gnorm 0.91 | 412 ms | 158.9k tok/s |
//  412.3 TFLOP/s | MFU 41.7% | mem 31.4/79.1 GiB | eta 1h07m"; with several ranks, the bytes
// each summed over them ("comm 6.8 MiB") before the eta; with offload, the host tier after mem
// ("+ host 443.1 MiB") and the step's copies with their rate ("copy 886.2 MiB at 9.8 GB/s")
std::string format_step_line(const StepMetrics& m);

// One validation evaluation (train/evaluator.h), after `step` optimizer steps.
struct EvalMetrics {
  int64_t step = 0;
  double loss = 0;        // mean token cross-entropy over `tokens` validation targets
  double perplexity = 0;  // exp(loss)
  int64_t tokens = 0;
};

// "eval step 200 | val loss 3.1234 | ppl 22.75 | 1.0M tokens"
std::string format_eval_line(const EvalMetrics& e);

class MetricsWriter {
 public:
  // A fresh run truncates (a fresh run starts a fresh log); a resumed one appends after the rows
  // truncate_metrics_after() kept, `rows` of them.
  explicit MetricsWriter(const std::string& path, bool append = false, int64_t rows = 0);
  void write(const StepMetrics& m);                  // one line, flushed
  void write_eval(const EvalMetrics& e);             // one line marked "eval": true, flushed
  int64_t rows() const { return rows_; }             // lines in the file

 private:
  std::string path_;
  std::ofstream out_;
  int64_t rows_ = 0;
};

// For a run resumed after `step` steps: cuts metrics.jsonl after its last row of a step <= step,
// dropping rows of later steps (written before the crash, and about to be written again) and a
// partial last line. Returns the rows kept; 0 when the file does not exist. UserError naming the
// file if it cannot be read or cut.
int64_t truncate_metrics_after(const std::string& path, int64_t step);

}  // namespace grass
