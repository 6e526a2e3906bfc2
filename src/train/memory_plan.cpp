#include "train/memory_plan.h"

#include <cstdio>

#include "train/training_state.h"

namespace grass {

MemoryPlan plan_memory(const RunConfig& cfg, const Storage& storage) {
  Arena planning(/*planning=*/true);
  const std::unique_ptr<Backend> sizes_only = make_planning_backend(storage);
  build_training_state(cfg, planning, *sizes_only);
  MemoryPlan plan;
  for (int c = 0; c < kMemCategories; c++) plan.bytes[c] = planning.bytes(MemCategory(c));
  plan.total = planning.total_bytes();
  plan.buffers = planning.num_blocks();
  return plan;
}

Storage planned_storage(const RunConfig& cfg) {
  return storage_for(cfg.precision, cfg.device != "cpu");
}

std::string format_memory_plans(const RunConfig& cfg, const Storage& storage) {
  RunConfig adamw_cfg = cfg;
  adamw_cfg.optimizer.name = "adamw";
  const MemoryPlan run = plan_memory(cfg, storage), adamw = plan_memory(adamw_cfg, storage);
  std::string label = cfg.optimizer.name;
  if (cfg.optimizer.name == "grass") label += " r=" + std::to_string(cfg.optimizer.grass.rank);

  char line[200];
  std::string out;
  const double params = double(cfg.model.num_parameters());
  std::snprintf(line, sizeof line, "model %.3f %s parameters, micro-batch %d x %d tokens\n",
                params >= 1e9 ? params / 1e9 : params / 1e6, params >= 1e9 ? "B" : "M",
                cfg.micro_batch_size, cfg.seq_len);
  out += line;
  out += std::string("storage ") + (storage.cuda ? "CUDA backend, " : "CPU backend, ") +
         storage.describe() + (storage.master ? "; the master copy counts as optimizer state" : "") +
         "\n";
  std::snprintf(line, sizeof line, "%-22s %14s %14s\n", "", label.c_str(), "adamw");
  out += line;
  const char* rows[kMemCategories] = {"weights", "gradients (dense)", "gradients (compressed)",
                                      "optimizer states", "activations", "workspace"};
  for (int c = 0; c < kMemCategories; c++) {
    std::snprintf(line, sizeof line, "%-22s %14s %14s\n", rows[c],
                  format_bytes(run.bytes[c]).c_str(), format_bytes(adamw.bytes[c]).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "%-22s %14s %14s\n", "total", format_bytes(run.total).c_str(),
                format_bytes(adamw.total).c_str());
  out += line;
  return out;
}

}  // namespace grass
