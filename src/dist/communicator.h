// The ranks of a data-parallel run and the collectives its step needs (docs/distributed.md).
// One process per rank, started by `mpirun -np N grass train ...` (or by srun through OpenMPI's
// PMIx): every rank holds the whole model and optimizer state, reads its own slice of each global
// batch, and the step sums the ranks' gradients before clipping and updating, so every rank
// makes the same update. Without a launcher, grass is one process and nothing is exchanged.
//
// all_reduce_sum works on the backend's memory: the MPI communicator sums host buffers (the CPU
// backend's), to rank 0 in rank order and back out, so every rank holds the same bits and a rerun
// repeats them; the CUDA backend's communicator (Backend::communicator_for) sums device buffers
// through NCCL on the backend's stream.
// start_sum/wait_sums are the step's sums of its gradients, started as each gradient completes in
// the last backward: the MPI communicator queues them and sums them in wait_sums(), in the order
// started (a CPU backend may still round the gradients when the backward ends); NCCL's sums them
// on a communication stream in buckets, under the rest of the backward.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace grass {

class Watchdog;  // dist/watchdog.h

enum class Element { F32, BF16, F64 };

class Communicator {
 public:
  virtual ~Communicator() = default;
  int rank() const { return rank_; }
  int world() const { return world_; }
  int local_rank() const { return local_rank_; }  // among the ranks on this node: its GPU
  bool leader() const { return rank_ == 0; }  // the rank that writes files and prints
  virtual std::string describe() const = 0;   // "MPI (OpenMPI 4.1.4), 2 ranks"

  // data[0, count) (the backend's memory) summed over the ranks, in place on every rank.
  virtual void all_reduce_sum(void* data, int64_t count, Element element) = 0;
  // Starts summing data[0, count) (the backend's memory) over the ranks in place; the sum may run
  // after this returns, so the data stays untouched until wait_sums().
  virtual void start_sum(void* data, int64_t count, Element element);
  // Every started sum is complete for whatever the backend runs next.
  virtual void wait_sums();
  // A host value summed over the ranks.
  virtual double sum(double value) = 0;
  // bytes[0, n) of rank 0's, on every rank.
  virtual void broadcast(void* bytes, size_t n) = 0;
  // Every rank's value, in rank order, on every rank.
  virtual std::vector<uint64_t> all_gather(uint64_t value) = 0;
  // UserError on every rank unless all ranks passed the same value; `what` says what it is,
  // and the message names the first rank that differs from rank 0.
  void check_same(uint64_t value, const std::string& what);
  // Bytes this rank contributed to sums since the last call (the step log's "comm").
  int64_t take_bytes_reduced();
  // The deadline on this rank's waits for the others (dist/watchdog.h); null with one process.
  virtual Watchdog* watchdog() { return nullptr; }
  // Ends the whole job (every rank) with this exit code; this rank has said why.
  [[noreturn]] void abort(int code);

 protected:
  virtual void end_job(int code) = 0;  // asks the launcher to end the other ranks
  int rank_ = 0;
  int world_ = 1;
  int local_rank_ = 0;
  int64_t bytes_reduced_ = 0;

 private:
  struct Sum {
    void* data;
    int64_t count;
    Element element;
  };
  std::vector<Sum> started_;  // the default start_sum's queue
};

// One process, world 1: every collective is the identity.
Communicator& single_process();

// MPI when a launcher started this process (OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_RANK in the
// environment), initialised here and finalised when the object is destroyed; null otherwise
// (then single_process() is the run's communicator). UserError under a launcher in a build
// without MPI.
std::unique_ptr<Communicator> launch_communicator(int* argc, char*** argv);

}  // namespace grass
