// cuda_emu's NCCL (include/nccl.h) over MPI: every rank gathers every rank's buffer and sums them
// in rank order, adding in fp32 and rounding bf16 after each addition as a ring would.
// Connections take device memory as NCCL's do, and as lazily: from 2.22 NCCL allocates its channel
// buffers at the first collective unless NCCL_RUNTIME_CONNECT=0 (then in ncclCommInitRank). A
// program that reserves the device's memory between the two sees the allocation land after its
// reservation (the amount here is a stand-in, not NCCL's).
#include <nccl.h>
#ifdef GRASS_HAVE_MPI
#include <mpi.h>
#endif

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "src/core/bf16.h"
#include "streams.h"

struct ncclComm {
  int nranks = 0;
  int rank = 0;
  void* channels = nullptr;  // device memory of the connections, once connected
};

namespace {

constexpr size_t kChannelBytesPerPeer = size_t(4) << 20;  // NCCL_BUFFSIZE's default, one channel

ncclResult_t connect(ncclComm* comm) {
  if (comm->channels || comm->nranks < 2) return ncclSuccess;
  return cudaMalloc(&comm->channels, kChannelBytesPerPeer * size_t(comm->nranks - 1)) == cudaSuccess
             ? ncclSuccess
             : ncclUnhandledCudaError;
}

template <typename T>
void sum_in_rank_order(const std::vector<char>& all, void* out, size_t count, int nranks) {
  const T* parts = reinterpret_cast<const T*>(all.data());
  T* sum = static_cast<T*>(out);
  for (size_t i = 0; i < count; i++) {
    T s = parts[i];
    for (int r = 1; r < nranks; r++) s += parts[size_t(r) * count + i];
    sum[i] = s;
  }
}

void sum_bf16_in_rank_order(const std::vector<char>& all, void* out, size_t count, int nranks) {
  const uint16_t* parts = reinterpret_cast<const uint16_t*>(all.data());
  uint16_t* sum = static_cast<uint16_t*>(out);
  for (size_t i = 0; i < count; i++) {
    uint16_t s = parts[i];
    for (int r = 1; r < nranks; r++)
      s = grass::float_to_bf16(grass::bf16_to_float(s) + grass::bf16_to_float(parts[size_t(r) * count + i]));
    sum[i] = s;
  }
}

}  // namespace

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclInternalError: return "internal error (cuda_emu: MPI is not initialised)";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInProgress: return "operation in progress";
    case ncclUnhandledCudaError: return "unhandled cuda error (cuda_emu: the connections' memory)";
  }
  return "unknown error";
}

ncclResult_t ncclGetVersion(int* version) {
  *version = 22800;  // reported as the CUDA install's 2.28.0
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id->internal, 0, sizeof id->internal);
  std::strcpy(id->internal, "cuda_emu");
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  int initialised = 0, size = 1;
#ifdef GRASS_HAVE_MPI
  MPI_Initialized(&initialised);
#endif
  if (!initialised && nranks != 1) return ncclInternalError;  // one rank needs no MPI, as NCCL's
#ifdef GRASS_HAVE_MPI
  if (initialised) MPI_Comm_size(MPI_COMM_WORLD, &size);
#endif
  if (nranks != size || std::strcmp(id.internal, "cuda_emu") != 0) return ncclInvalidArgument;
  *comm = new ncclComm{nranks, rank};
  const char* lazy = std::getenv("NCCL_RUNTIME_CONNECT");
  if (lazy && std::strcmp(lazy, "0") == 0) return connect(*comm);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm->channels) cudaFree(comm->channels);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* state) {
  *state = ncclSuccess;  // every call has finished before it returned
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  cuda_emu::check_stream_device(stream, "ncclAllReduce");
  if (op != ncclSum) return ncclInvalidArgument;
  // The sum runs now, over MPI, which every rank calls in the same order: first its stream's
  // queued work (and whatever that waits on) runs, as the collective would wait for it.
  cuda_emu::drain_stream(stream);
  if (ncclResult_t e = connect(comm)) return e;
  const size_t element = datatype == ncclFloat64 ? 8 : datatype == ncclFloat32 ? 4 : 2;
  const size_t bytes = count * element;
  if (bytes > size_t(INT32_MAX)) return ncclInvalidArgument;  // the emulator runs small models
  if (comm->nranks == 1) {  // the sum of one rank's buffer: itself
    if (sendbuff != recvbuff) std::memcpy(recvbuff, sendbuff, bytes);
    return ncclSuccess;
  }
  std::vector<char> all(bytes * size_t(comm->nranks));
#ifdef GRASS_HAVE_MPI
  if (MPI_Allgather(sendbuff, int(bytes), MPI_BYTE, all.data(), int(bytes), MPI_BYTE,
                    MPI_COMM_WORLD) != MPI_SUCCESS)
    return ncclInternalError;
#else
  (void)sendbuff;
  return ncclInternalError;  // never reached: ncclCommInitRank needs MPI for more than one rank
#endif
  switch (datatype) {
    case ncclFloat32: sum_in_rank_order<float>(all, recvbuff, count, comm->nranks); break;
    case ncclFloat64: sum_in_rank_order<double>(all, recvbuff, count, comm->nranks); break;
    case ncclBfloat16: sum_bf16_in_rank_order(all, recvbuff, count, comm->nranks); break;
  }
  return ncclSuccess;
}
