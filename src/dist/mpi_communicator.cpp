// The MPI communicator (dist/communicator.h). Sums use a user-defined operation declared
// non-commutative, which makes MPI combine the ranks' data in rank order; MPI_Reduce to rank 0
// then MPI_Bcast gives every rank the same bits (an allreduce may combine in a different order on
// each rank, and replicas that differ in the last bit drift apart).
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>

#include "src/core/bf16.h"
#include "src/core/error.h"
#include "src/dist/communicator.h"
#include "src/dist/watchdog.h"

namespace grass {

namespace {

void check(int status, const char* call) {
  if (status == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(status, text, &length);
  throw InternalError(std::string(call) + " failed: " + std::string(text, size_t(length)));
}

// inout = in + inout, in rank order (in: the lower ranks' partial sum).
void sum_f32(void* in, void* inout, int* len, MPI_Datatype*) {
  const float* a = static_cast<const float*>(in);
  float* b = static_cast<float*>(inout);
  for (int i = 0; i < *len; i++) b[i] = a[i] + b[i];
}
void sum_f64(void* in, void* inout, int* len, MPI_Datatype*) {
  const double* a = static_cast<const double*>(in);
  double* b = static_cast<double*>(inout);
  for (int i = 0; i < *len; i++) b[i] = a[i] + b[i];
}
// bf16 gradients: each pair added in fp32 and rounded to nearest, as a bf16 accumulation is.
void sum_bf16(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; i++) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(int* argc, char*** argv) {
    const double timeout_s = Watchdog::timeout_from_environment();  // a bad value: before MPI starts
    int provided = 0;
    // Only the main thread calls MPI (the loader's prefetch thread never does).
    check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &world_), "MPI_Comm_size");
    // A failed call returns its code to check(), which reports it, instead of MPI's default of
    // ending the job with no word on where it happened.
    check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    MPI_Comm node;  // the ranks that share this node's memory: a rank's index there picks its GPU
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
          "MPI_Comm_split_type");
    check(MPI_Comm_rank(node, &local_rank_), "MPI_Comm_rank");
    MPI_Comm_free(&node);
    check(MPI_Op_create(sum_f32, /*commute=*/0, &ops_[0]), "MPI_Op_create");
    check(MPI_Op_create(sum_bf16, 0, &ops_[1]), "MPI_Op_create");
    check(MPI_Op_create(sum_f64, 0, &ops_[2]), "MPI_Op_create");
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    library_ = std::string(version, size_t(length));
    library_ = library_.substr(0, library_.find_first_of(",\n"));
    if (world_ > 1)
      watchdog_ = std::make_unique<Watchdog>(rank_, world_, timeout_s);
  }
  ~MpiCommunicator() override {
    watchdog_.reset();
    for (MPI_Op& op : ops_) MPI_Op_free(&op);
    MPI_Finalize();
  }

  std::string describe() const override {
    return "MPI (" + library_ + "), " + std::to_string(world_) + " rank" + (world_ > 1 ? "s" : "");
  }

  void all_reduce_sum(void* data, int64_t count, Element element) override {
    const int index = int(element);
    const MPI_Datatype type[] = {MPI_FLOAT, MPI_UINT16_T, MPI_DOUBLE};
    const size_t bytes[] = {4, 2, 8};
    bytes_reduced_ += count * int64_t(bytes[index]);
    if (world_ == 1) return;
    const WatchedWait wait(watchdog_.get(), "a sum over MPI");
    char* p = static_cast<char*>(data);
    for (int64_t done = 0; done < count;) {  // MPI counts are ints
      const int n = int(std::min<int64_t>(count - done, INT_MAX / 8));
      void* chunk = p + done * int64_t(bytes[index]);
      check(MPI_Reduce(rank_ == 0 ? MPI_IN_PLACE : chunk, rank_ == 0 ? chunk : nullptr, n,
                       type[index], ops_[index], 0, MPI_COMM_WORLD),
            "MPI_Reduce");
      check(MPI_Bcast(chunk, n, type[index], 0, MPI_COMM_WORLD), "MPI_Bcast");
      done += n;
    }
  }

  double sum(double value) override {
    all_reduce_sum(&value, 1, Element::F64);
    return value;
  }

  void broadcast(void* bytes, size_t n) override {
    const WatchedWait wait(watchdog_.get(), "a broadcast from rank 0 over MPI");
    check(MPI_Bcast(bytes, int(n), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
  }

  std::vector<uint64_t> all_gather(uint64_t value) override {
    std::vector<uint64_t> out(static_cast<size_t>(world_));
    const WatchedWait wait(watchdog_.get(), "an all-gather over MPI");
    check(MPI_Allgather(&value, 1, MPI_UINT64_T, out.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD),
          "MPI_Allgather");
    return out;
  }

  Watchdog* watchdog() override { return watchdog_.get(); }
  void end_job(int code) override { MPI_Abort(MPI_COMM_WORLD, code); }

 private:
  MPI_Op ops_[3] = {};  // sums of F32, BF16, F64, indexed by Element
  std::string library_;
  std::unique_ptr<Watchdog> watchdog_;  // with several ranks
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(int* argc, char*** argv) {
  return std::make_unique<MpiCommunicator>(argc, argv);
}

}  // namespace grass
