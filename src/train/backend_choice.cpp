#include "src/train/backend_choice.h"

#include "src/core/error.h"
#include "src/model/llama.h"
#include "src/train/run_resolution.h"
#ifdef GRASS_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.h"
#endif

namespace grass {

std::unique_ptr<Backend> choose_backend(const RunConfig& cfg, std::string* why_cpu, int gpu_index) {
  std::string ignored;
  std::string& why = why_cpu ? *why_cpu : ignored;
  const std::string where = (cfg.source.empty() ? std::string("run config") : cfg.source) + ": ";
  if (cfg.device == DeviceChoice::Cpu) return make_cpu_backend(resolve(cfg, false).storage);
  const bool gpu_only =
      cfg.attention == AttentionChoice::Cudnn || cfg.attention == AttentionChoice::Mma;
#ifdef GRASS_HAVE_CUDA
  const cuda::DeviceProbe gpu = cuda::probe_device(gpu_index);
  const ResolvedRun run = resolve(cfg, gpu.usable);
  if (gpu.usable && run.storage.cuda)
    return make_cuda_backend(run.storage, gpu_index, run.attention.kernel,
                             run.attention.fall_back_to_grass);
  if (gpu_only)  // the CPU has its reference kernels only
    throw UserError(where + "attention: \"" + name_of(cfg.attention) + "\" needs the GPU, but " +
                    (gpu.usable ? "precision fp32 runs on the CPU" : gpu.description) +
                    "; use \"grass\"");
  if (gpu.usable) {  // auto with fp32: the CPU reference is the only fp32 backend
    why = "precision fp32 runs on the CPU backend only (GPU " + gpu.description + " unused)";
    return make_cpu_backend(run.storage);
  }
  if (cfg.device == DeviceChoice::Cuda)
    throw UserError(where + "device: \"cuda\" but " + gpu.description +
                    "; use \"auto\" or \"cpu\" to train on the CPU");
  why = gpu.description;
#else
  (void)gpu_index;
  why = "built without CUDA";
  if (gpu_only)
    throw UserError(where + "attention: \"" + name_of(cfg.attention) + "\" needs the GPU, and "
                    "this grass was built without CUDA; use \"grass\"");
  if (cfg.device == DeviceChoice::Cuda)
    throw UserError(where + "device: \"cuda\" but this grass was built without CUDA (no nvcc at "
                    "configure time); rebuild where CUDA is installed, or use \"auto\" or \"cpu\"");
#endif
  return make_cpu_backend(resolve(cfg, false).storage);
}

AttentionInUse prepare_attention(const RunConfig& cfg, Backend& backend) {
  const ModelConfig& m = cfg.model;
  const ProjectionConfig& g = cfg.optimizer.projection;
  backend.prepare_attention(
      cfg.micro_batch_size, cfg.seq_len, m.num_attention_heads, m.num_key_value_heads,
      m.head_dim(),
      qkv_gradients_packed(is_projected(cfg.optimizer.kind) ? g.targets
                                                            : std::vector<ProjectionTarget>{}));
  AttentionInUse in_use = backend.attention_in_use();
  if (in_use.why_not_cudnn.empty())  // "auto" that could not ask for cuDNN's: why
    in_use.why_not_cudnn = attention_request(cfg, backend.storage()).why_not_cudnn;
  return in_use;
}

RuntimeReport runtime_report() {
  RuntimeReport report;
#ifdef GRASS_HAVE_CUDA
  const cuda::DeviceProbe gpu = cuda::probe_device(0);
  report.gpu = gpu.usable ? "GPU 0: " + gpu.description : gpu.description;
#ifdef GRASS_HAVE_CUDNN
  try {
    cuda::make_cudnn_attention(nullptr);
    report.cudnn = "libcudnn.so.9 loads and creates a handle";
  } catch (const UserError& e) {
    report.cudnn = e.what();
  }
#endif
#endif
  return report;
}

}  // namespace grass
