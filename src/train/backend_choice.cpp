#include "train/backend_choice.h"

#include <omp.h>

#include "core/error.h"
#ifdef GRASS_HAVE_CUDA
#include "cuda/device.h"
#endif

namespace grass {

BackendChoice choose_backend(const RunConfig& cfg) {
  const std::string where = (cfg.source.empty() ? std::string("run config") : cfg.source) + ": device: ";
  if (cfg.device == "cuda")
    throw UserError(where + "\"cuda\": the CUDA kernels are built but the model does not run on "
                    "them yet; use \"cpu\" or \"auto\" (docs/gpu-status.md)");
  BackendChoice choice;
  choice.storage = storage_for(cfg.precision, /*cuda=*/false);
  choice.description = "cpu, " + std::to_string(omp_get_max_threads()) + " threads (" +
                       choice.storage.describe() + ", OpenMP + OpenBLAS)";
  if (cfg.device == "cpu") return choice;
#ifdef GRASS_HAVE_CUDA
  const cuda::DeviceProbe gpu = cuda::probe_device();
  choice.description += gpu.usable ? "; GPU " + gpu.description +
                                         " found, but the model does not run on CUDA yet"
                                   : "; " + gpu.description;
#else
  choice.description += "; built without CUDA";
#endif
  return choice;
}

}  // namespace grass
