#include "train/training_state.h"

namespace grass {

TrainingState build_training_state(const RunConfig& cfg, Arena& arena, Backend& backend) {
  TrainingState s;
  const bool use_grass = cfg.optimizer.name == "grass";
  const std::vector<std::string> compressed =
      use_grass ? grass_target_tensor_names(cfg.model.num_hidden_layers, cfg.optimizer.grass.targets)
                : std::vector<std::string>{};
  s.model = std::make_unique<LlamaModel>(cfg.model, arena, cfg.micro_batch_size, cfg.seq_len,
                                         compressed, backend);
  s.adamw = std::make_unique<AdamW>(cfg.optimizer, *s.model, arena, cfg.seed);
  if (use_grass) {
    s.grass = std::make_unique<GrassOptimizer>(
        cfg.optimizer, *s.model, int64_t(cfg.micro_batch_size) * cfg.seq_len, arena);
    s.model->set_compressed_sink(s.grass.get());
  }
  return s;
}

}  // namespace grass
