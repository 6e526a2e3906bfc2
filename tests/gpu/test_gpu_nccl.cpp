// The NCCL communicator (kernels/cuda/nccl_communicator.cu) on one GPU without MPI: the lent GPU
// machine has no OpenMPI, so this is where the real NCCL path (its init and warm-up, the sum
// stream, the bucketed groups, the waits between the streams) runs there. A sum over one rank is
// the buffer itself, bit for bit. On the emulator too, also with deferred streams, where the sums
// must wait for the upload queued before them on the backend's stream.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cuda/nccl_communicator.h"
#include "tests/gpu/gpu_test_util.h"

using namespace grass;

TEST_CASE("nccl: one rank without MPI sums fp32, bf16 and fp64 buffers to themselves", "[gpu]") {
  cudaStream_t stream = nullptr;
  gputest::check(cudaStreamCreate(&stream), "cudaStreamCreate");
  {
    const std::unique_ptr<Communicator> comm = cuda::make_nccl_communicator(single_process(), stream);
    CHECK_THAT(comm->describe(), Catch::Contains("gradients through NCCL"));
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::vector<float> f32(3001);
    std::vector<uint16_t> b16(5003);
    std::vector<double> f64(7);
    for (float& x : f32) x = normal(rng);
    for (uint16_t& x : b16) x = uint16_t(rng() & 0x7F7F);  // finite bf16 bit patterns
    for (double& x : f64) x = double(normal(rng)) * 1e3;
    gputest::DeviceBuffer<float> d32(f32.size());
    gputest::DeviceBuffer<uint16_t> d16(b16.size());
    gputest::DeviceBuffer<double> d64(f64.size());
    // queued on the backend's stream: the sums run after it, through the sum stream's wait
    gputest::check(cudaMemcpyAsync(d32.ptr, f32.data(), f32.size() * 4, cudaMemcpyHostToDevice, stream), "upload");
    gputest::check(cudaMemcpyAsync(d16.ptr, b16.data(), b16.size() * 2, cudaMemcpyHostToDevice, stream), "upload");
    gputest::check(cudaMemcpyAsync(d64.ptr, f64.data(), f64.size() * 8, cudaMemcpyHostToDevice, stream), "upload");
    comm->start_sum(d32.ptr, int64_t(f32.size()), Element::F32);
    comm->start_sum(d16.ptr, int64_t(b16.size()), Element::BF16);
    comm->wait_sums();
    comm->all_reduce_sum(d64.ptr, int64_t(f64.size()), Element::F64);
    gputest::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    CHECK(d32.download() == f32);
    CHECK(d16.download() == b16);
    CHECK(d64.download() == f64);
    CHECK(comm->take_bytes_reduced() == int64_t(f32.size() * 4 + b16.size() * 2 + f64.size() * 8));
  }
  gputest::check(cudaStreamDestroy(stream), "cudaStreamDestroy");
}
