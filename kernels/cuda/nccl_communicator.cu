#include "cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "core/error.h"

namespace grass::cuda {

namespace {

void check_nccl(ncclResult_t status, const char* call) {
  if (status == ncclSuccess) return;
  throw InternalError(std::string(call) + " failed: " + ncclGetErrorString(status));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& ranks, cudaStream_t stream) : ranks_(ranks), stream_(stream) {
    rank_ = ranks.rank();
    world_ = ranks.world();
    local_rank_ = ranks.local_rank();
    ncclUniqueId id{};
    if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    ranks.broadcast(&id, sizeof id);
    check_nccl(ncclCommInitRank(&comm_, world_, id, rank_), "ncclCommInitRank");
    int version = 0;
    ncclGetVersion(&version);
    version_ = std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
               std::to_string(version % 100);
  }
  ~NcclCommunicator() override { ncclCommDestroy(comm_); }

  std::string describe() const override {
    return ranks_.describe() + ", gradients through NCCL " + version_;
  }

  // NCCL reduces each element in one fixed order per run configuration and hands every rank the
  // same result (its ring and tree both end by broadcasting the reduced chunk).
  void all_reduce_sum(void* data, int64_t count, Element element) override {
    const ncclDataType_t type[] = {ncclFloat32, ncclBfloat16, ncclFloat64};
    const int64_t bytes[] = {4, 2, 8};
    bytes_reduced_ += count * bytes[int(element)];
    check_nccl(ncclAllReduce(data, data, size_t(count), type[int(element)], ncclSum, comm_, stream_),
               "ncclAllReduce");
  }
  double sum(double value) override {
    bytes_reduced_ += sizeof value;
    return ranks_.sum(value);
  }
  void broadcast(void* bytes, size_t n) override { ranks_.broadcast(bytes, n); }
  std::vector<uint64_t> all_gather(uint64_t value) override { return ranks_.all_gather(value); }

 protected:
  void end_job(int code) override {
    ncclCommAbort(comm_);  // a rank blocked in a collective with this one returns instead of hanging
    ranks_.abort(code);
  }

 private:
  Communicator& ranks_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
  std::string version_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& ranks, cudaStream_t stream) {
  return std::make_unique<NcclCommunicator>(ranks, stream);
}

}  // namespace grass::cuda
