#include "src/train/run_resolution.h"

namespace grass {

ResolvedRun resolve(const RunConfig& cfg, bool gpu_usable) {
  const bool cuda = cfg.device == DeviceChoice::Cuda ||
                    (cfg.device == DeviceChoice::Auto && gpu_usable &&
                     cfg.precision != PrecisionChoice::F32);
  const Storage storage = storage_for(cfg.precision, cuda);
  return {storage, model_memory_options(cfg, storage)};
}

Storage storage_for(PrecisionChoice precision, bool cuda) {
  switch (precision) {
    case PrecisionChoice::F32: return make_storage(Precision::F32, cuda);
    case PrecisionChoice::Bf16Mixed: return make_storage(Precision::Bf16Mixed, cuda);
    case PrecisionChoice::Bf16: return make_storage(Precision::Bf16, cuda);
    case PrecisionChoice::Auto: break;
  }
  return make_storage(cuda ? Precision::Bf16Mixed : Precision::F32, cuda);
}

ModelMemoryOptions model_memory_options(const RunConfig& cfg, const Storage& storage) {
  ModelMemoryOptions options;
  options.checkpoint_layers = cfg.activation_checkpointing == Checkpointing::Layer;
  options.fused_update = cfg.fused_update == Switch::On ||
                         (cfg.fused_update == Switch::Auto && storage.pure_bf16() &&
                          cfg.micro_batches_per_rank() == 1);
  options.pad_ffn = cfg.pad_ffn == Switch::On || (cfg.pad_ffn == Switch::Auto && storage.cuda);
  options.attention = cfg.attention == AttentionChoice::Cudnn && storage.cuda
                          ? AttentionKernel::Cudnn
                          : AttentionKernel::Grass;
  return options;
}

}  // namespace grass
