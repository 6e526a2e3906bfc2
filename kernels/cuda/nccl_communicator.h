// The CUDA backend's communicator for data-parallel ranks (docs/distributed.md): sums of device
// buffers through NCCL on a stream of their own, each after the backward's kernels that formed
// its gradients and before the norms and updates, without the host waiting; the step's started
// sums go in buckets, under the rest of the backward. Everything else (host values, σ
// checks, aborts) goes through the ranks' MPI communicator, which also carries NCCL's unique id
// from rank 0 to the others. Plain C++ with an opaque stream: the trainer's side includes it.
#pragma once
#include <memory>

#include "src/dist/communicator.h"

typedef struct CUstream_st* cudaStream_t;

namespace grass::cuda {

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& ranks, cudaStream_t stream);

}  // namespace grass::cuda
