#include "kernels/cuda/nccl_communicator.h"

#include <nccl.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "src/core/error.h"
#include "src/dist/watchdog.h"

namespace grass::cuda {

namespace {

void check_nccl(ncclResult_t status, const char* call) {
  if (status == ncclSuccess) return;
  throw InternalError(std::string(call) + " failed: " + ncclGetErrorString(status));
}

// The step's started sums go out in groups of at least this many bytes: one NCCL launch each,
// large enough to run near the link's bandwidth, small enough that the first ones start early in
// the backward. GRASS_BUCKET_MB, else 25 (PyTorch DDP's bucket_cap_mb); 0 sends each at once.
int64_t bucket_bytes_from_environment() {
  const char* text = std::getenv("GRASS_BUCKET_MB");
  if (!text || !*text) return int64_t(25) << 20;
  char* end = nullptr;
  const double mb = std::strtod(text, &end);
  if (*end != '\0' || !(mb >= 0))
    throw UserError(std::string("GRASS_BUCKET_MB: '") + text + "' is not a number of MiB >= 0");
  return int64_t(mb * (1 << 20));
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
    // NCCL from 2.22 connects lazily: each channel's buffers are allocated at the first collective
    // that uses it, after the run's one reservation, so a run planned near the card's capacity
    // would fail in step 0's first bucket. Connect at init instead, unless the user chose.
    setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
    check_nccl(ncclCommInitRank(&comm_, world_, id, rank_), "ncclCommInitRank");
    int version = 0;
    ncclGetVersion(&version);
    version_ = std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
               std::to_string(version % 100);
    bucket_limit_ = bucket_bytes_from_environment();
    GRASS_CUDA_CHECK(cudaGetDevice(&device_));
    GRASS_CUDA_CHECK(cudaStreamCreate(&sum_stream_));
    GRASS_CUDA_CHECK(cudaEventCreateWithFlags(&backward_done_, cudaEventDisableTiming));
    GRASS_CUDA_CHECK(cudaEventCreateWithFlags(&summed_, cudaEventDisableTiming));
    warm_up();
    if (Watchdog* dog = ranks.watchdog())
      dog->set_health_check([comm = comm_, device = device_]() -> std::string {
        cudaSetDevice(device);  // the watchdog's thread starts on device 0 (see wait_sums)
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return "";  // asked again in a second
        if (state == ncclSuccess || state == ncclInProgress) return "";
        return std::string("NCCL failed: ") + ncclGetErrorString(state);
      });
  }
  ~NcclCommunicator() override {
    end_watch();
    if (Watchdog* dog = ranks_.watchdog()) dog->set_health_check({});  // returns once it is not running
    ncclCommDestroy(comm_);
    cudaEventDestroy(summed_);
    cudaEventDestroy(backward_done_);
    cudaStreamDestroy(sum_stream_);
  }

  std::string describe() const override {
    return ranks_.describe() + ", gradients through NCCL " + version_;
  }

  // NCCL reduces each element in one fixed order per run configuration and hands every rank the
  // same result (its ring and tree both end by broadcasting the reduced chunk). Every NCCL call
  // goes on the sum stream, in the order asked for: two streams of one communicator could run its
  // collectives in different orders on different ranks, and hang. Here the backend's stream waits
  // for this sum (and any started before it) before its next kernel.
  void all_reduce_sum(void* data, int64_t count, Element element) override {
    start_sum(data, count, element);
    wait_sums();
  }

  void start_sum(void* data, int64_t count, Element element) override {
    bytes_reduced_ += count * kBytes[int(element)];
    bucket_.push_back({data, count, element});
    bucket_bytes_ += count * kBytes[int(element)];
    if (bucket_bytes_ >= bucket_limit_) flush();
  }

  void wait_sums() override {
    flush();
    if (!summing_) return;
    summing_ = false;
    // What the backend's stream queues next (the norms, the updates) waits for the last bucket.
    // The event is this thread's, made, re-recorded and destroyed here; the watchdog only queries
    // it, and the previous wait is ended before the event is recorded again.
    end_watch();
    GRASS_CUDA_CHECK(cudaEventRecord(summed_, sum_stream_));
    GRASS_CUDA_CHECK(cudaStreamWaitEvent(stream_, summed_, 0));
    // And the watchdog's deadline on them: NCCL waits on the device, where the host does not see
    // it (the host blocks later, at its next wait for the GPU). The query runs on the watchdog's
    // thread, which starts on device 0: without this rank's device made current there, each rank
    // would open a context on GPU 0 and query its event from the wrong device (issue 25, B4).
    if (Watchdog* dog = ranks_.watchdog())
      watch_ = dog->begin("a sum of gradients over NCCL", [summed = summed_, device = device_] {
        cudaSetDevice(device);
        return cudaEventQuery(summed) != cudaErrorNotReady;
      });
  }

  double sum(double value) override {
    bytes_reduced_ += sizeof value;
    return ranks_.sum(value);
  }
  void broadcast(void* bytes, size_t n) override { ranks_.broadcast(bytes, n); }
  std::vector<uint64_t> all_gather(uint64_t value) override { return ranks_.all_gather(value); }
  Watchdog* watchdog() override { return ranks_.watchdog(); }

 protected:
  void end_job(int code) override {
    ncclCommAbort(comm_);  // a rank blocked in a collective with this one returns instead of hanging
    ranks_.abort(code);
  }

 private:
  static constexpr ncclDataType_t kType[] = {ncclFloat32, ncclBfloat16, ncclFloat64};
  static constexpr int64_t kBytes[] = {4, 2, 8};
  struct Sum {
    void* data;
    int64_t count;
    Element element;
  };

  // The bucket's sums, one NCCL group, on the sum stream once the backward's kernels queued so
  // far (which formed these gradients) are done.
  void flush() {
    if (bucket_.empty()) return;
    GRASS_CUDA_CHECK(cudaEventRecord(backward_done_, stream_));
    GRASS_CUDA_CHECK(cudaStreamWaitEvent(sum_stream_, backward_done_, 0));
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (const Sum& s : bucket_)
      check_nccl(ncclAllReduce(s.data, s.data, size_t(s.count), kType[int(s.element)], ncclSum,
                               comm_, sum_stream_),
                 "ncclAllReduce");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    bucket_.clear();
    bucket_bytes_ = 0;
    summing_ = true;
  }

  // One sum of each element type the run sums, waited for, before the reservation (the backend is
  // made before it): whatever NCCL still allocates at a first collective (a user's
  // NCCL_RUNTIME_CONNECT=1, per-type setup) is allocated now.
  void warm_up() {
    void* scratch = nullptr;
    GRASS_CUDA_CHECK(cudaMalloc(&scratch, 64));
    GRASS_CUDA_CHECK(cudaMemsetAsync(scratch, 0, 64, sum_stream_));
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (ncclDataType_t type : kType)
      check_nccl(ncclAllReduce(scratch, scratch, 4, type, ncclSum, comm_, sum_stream_), "ncclAllReduce");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    GRASS_CUDA_CHECK(cudaStreamSynchronize(sum_stream_));
    GRASS_CUDA_CHECK(cudaFree(scratch));
  }

  // The watchdog no longer queries summed_ once this returns.
  void end_watch() {
    if (!watch_) return;
    ranks_.watchdog()->end(*watch_);
    watch_.reset();
  }

  Communicator& ranks_;
  cudaStream_t stream_;                // the backend's: the backward, norms and updates
  cudaStream_t sum_stream_ = nullptr;  // every NCCL call, beside the backward
  cudaEvent_t backward_done_ = nullptr;
  cudaEvent_t summed_ = nullptr;  // the last bucket's end, on the sum stream
  std::optional<uint64_t> watch_;  // the watchdog's wait on summed_, while registered
  int device_ = 0;  // this rank's GPU, current on the thread that made the communicator
  ncclComm_t comm_ = nullptr;
  std::vector<Sum> bucket_;
  int64_t bucket_bytes_ = 0;
  int64_t bucket_limit_ = 0;
  bool summing_ = false;  // sums queued on the sum stream since the last wait_sums()
  std::string version_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& ranks, cudaStream_t stream) {
  return std::make_unique<NcclCommunicator>(ranks, stream);
}

}  // namespace grass::cuda
