// The MPI communicator on its own, under `mpirun -np N` (tests/data_parallel.sh runs it): sums of
// fp32, bf16 and fp64 data hold the right values and the same bits on every rank, a sum longer
// than one MPI message is summed whole, and check_same() refuses values that differ, naming the
// first rank that does. Exit 0 when all hold; each failure is one line naming the rank.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "src/core/bf16.h"
#include "src/core/error.h"
#include "src/dist/communicator.h"
#include "src/io/hash.h"

using namespace grass;

namespace {

int failures = 0;
Communicator* ranks = nullptr;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "FAIL (rank %d of %d): %s\n", ranks->rank(), ranks->world(), what.c_str());
  failures++;
}

// The bits of `data` on every rank equal rank 0's.
void expect_same_bits(const void* data, size_t bytes, const std::string& what) {
  try {
    ranks->check_same(fnv1a64(data, bytes), what);
  } catch (const UserError& e) {
    expect(false, e.what());
  }
}

// Rank r's element i: distinct per rank and element, never zero.
double value(int r, int64_t i) { return (r + 1) * 0.37 + double(i % 1000) * 1e-3 + 0.011; }
double expected(int world, int64_t i) {
  double sum = 0;
  for (int r = 0; r < world; r++) sum += value(r, i);
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  const auto launched = launch_communicator(&argc, &argv);
  if (!launched) {
    std::fprintf(stderr, "dist_selftest: run it under mpirun -np N\n");
    return 2;
  }
  ranks = launched.get();
  const int rank = ranks->rank(), world = ranks->world();
  const int64_t n = 1000;

  std::vector<float> f32(static_cast<size_t>(n));
  std::vector<uint16_t> bf16(static_cast<size_t>(n));
  std::vector<double> f64(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) {
    f32[size_t(i)] = float(value(rank, i));
    bf16[size_t(i)] = float_to_bf16(float(value(rank, i)));
    f64[size_t(i)] = value(rank, i);
  }
  ranks->all_reduce_sum(f32.data(), n, Element::F32);
  ranks->all_reduce_sum(bf16.data(), n, Element::BF16);
  ranks->all_reduce_sum(f64.data(), n, Element::F64);
  for (int64_t i = 0; i < n; i++) {
    const double want = expected(world, i);
    expect(std::fabs(f32[size_t(i)] - want) <= 1e-6 * want, "fp32 sum of element " + std::to_string(i));
    expect(std::fabs(bf16_to_float(bf16[size_t(i)]) - want) <= 1e-2 * want,
           "bf16 sum of element " + std::to_string(i));
    expect(std::fabs(f64[size_t(i)] - want) <= 1e-12 * want, "fp64 sum of element " + std::to_string(i));
  }
  expect_same_bits(f32.data(), f32.size() * 4, "the fp32 sum");
  expect_same_bits(bf16.data(), bf16.size() * 2, "the bf16 sum");
  expect_same_bits(f64.data(), f64.size() * 8, "the fp64 sum");
  expect(ranks->take_bytes_reduced() == n * (4 + 2 + 8), "the bytes counted");

  // A sum longer than one MPI message (their counts are ints): 300 M bf16 elements, 600 MB.
  const int64_t big = int64_t(300) << 20;
  std::vector<uint16_t> large(size_t(big), float_to_bf16(1.0f));
  ranks->all_reduce_sum(large.data(), big, Element::BF16);
  expect(bf16_to_float(large.front()) == float(world) && bf16_to_float(large.back()) == float(world),
         "a sum of 300 M elements");

  if (world > 1) {
    bool refused = false;
    try {
      ranks->check_same(rank == 1 ? 7 : 3, "the test value");
    } catch (const UserError& e) {
      refused = std::string(e.what()).find("the test value differs between rank 0 and rank 1") !=
                std::string::npos;
    }
    expect(refused, "check_same() does not refuse a value that differs on rank 1");
  }
  if (failures == 0 && ranks->leader())
    std::printf("dist_selftest: %d ranks (%s): sums and checks hold\n", world,
                ranks->describe().c_str());
  return failures == 0 ? 0 : 1;
}
