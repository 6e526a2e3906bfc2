#include "src/dist/communicator.h"

#include <cstdlib>
#include <string>

#include "src/core/error.h"

namespace grass {

void Communicator::check_same(uint64_t value, const std::string& what) {
  const std::vector<uint64_t> values = all_gather(value);
  for (int r = 1; r < world_; r++)
    if (values[size_t(r)] != values[0])
      throw UserError(what + " differs between rank 0 and rank " + std::to_string(r) + " (of " +
                      std::to_string(world_) + "): the ranks would train different models");
}

void Communicator::start_sum(void* data, int64_t count, Element element) {
  started_.push_back({data, count, element});
}

void Communicator::wait_sums() {
  for (const Sum& s : started_) all_reduce_sum(s.data, s.count, s.element);
  started_.clear();
}

void Communicator::abort(int code) {
  end_job(code);
  std::_Exit(code);
}

int64_t Communicator::take_bytes_reduced() {
  const int64_t bytes = bytes_reduced_;
  bytes_reduced_ = 0;
  return bytes;
}

namespace {

class SingleProcess final : public Communicator {
 public:
  std::string describe() const override { return "one process"; }
  void all_reduce_sum(void*, int64_t, Element) override {}
  double sum(double value) override { return value; }
  void broadcast(void*, size_t) override {}
  std::vector<uint64_t> all_gather(uint64_t value) override { return {value}; }
  void end_job(int) override {}
};

}  // namespace

Communicator& single_process() {
  static SingleProcess one;
  return one;
}

#ifdef GRASS_HAVE_MPI
// mpi_communicator.cpp
std::unique_ptr<Communicator> make_mpi_communicator(int* argc, char*** argv);
#endif

std::unique_ptr<Communicator> launch_communicator(int* argc, char*** argv) {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(var)) {
#ifdef GRASS_HAVE_MPI
      return make_mpi_communicator(argc, argv);
#else
      (void)argc, (void)argv;
      throw UserError(std::string("started by a launcher (") + var + " is set), but this grass "
                      "was built without MPI: install libopenmpi-dev and rebuild");
#endif
    }
  return nullptr;
}

}  // namespace grass
