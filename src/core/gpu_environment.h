// CUDA reads CUDA_MODULE_LOADING once, at the process's first CUDA call, which is not always the
// engine's: a CUDA-aware MPI (Open MPI with UCX) initialises CUDA inside MPI_Init. So main() asks
// before it starts MPI, and the device probe asks again for the programs that have no such main
// (tests, tools). Plain C++, no CUDA: a CPU-only build asks too, harmlessly.
#pragma once
#include <stdlib.h>

namespace grass {

// Eager module loading, unless the user chose a mode: every kernel's code (the engine's and
// cuBLAS's) goes on the device at start-up, before the run's one reservation. CUDA's default since
// 12.2 (lazy) would load each kernel at its first launch, after the reservation, so a run planned
// near the card's capacity could fail at step 0, or at the first launch of a rare kernel (FLORA's
// resampling) hours in. The price: cuBLAS's unused kernels' memory too (CUDA_MODULE_LOADING=LAZY
// trades it back).
inline void request_eager_module_loading() { setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0); }

}  // namespace grass
