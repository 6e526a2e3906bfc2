// The CUDA backend's communicator for data-parallel ranks (docs/distributed.md): sums of device
// buffers through NCCL on the backend's stream, so they queue behind the backward's kernels and
// ahead of the norms and updates without the host waiting; everything else (host values, σ
// checks, aborts) goes through the ranks' MPI communicator, which also carries NCCL's unique id
// from rank 0 to the others. Plain C++ with an opaque stream: the trainer's side includes it.
#pragma once
#include <memory>

#include "dist/communicator.h"

typedef struct CUstream_st* cudaStream_t;

namespace grass::cuda {

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& ranks, cudaStream_t stream);

}  // namespace grass::cuda
