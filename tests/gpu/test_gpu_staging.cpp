// The pinned staging ring (kernels/cuda/staging.cuh): uploads that run ahead of the device, each
// region of the ring written again only after the transfer that read it. With deferred streams
// (the emulator's CUDA_EMU_STREAMS=deferred, ctest cuda_emu_deferred_streams) the transfers wait
// in their stream until something forces them, so the ring fills and the host must take its wait
// branch; a region rewritten before its transfer ran stops the emulator ("the host source of a
// cudaMemcpyAsync ... changed before the copy ran").
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/staging.cuh"
#include "tests/gpu/gpu_test_util.h"

using namespace grass;
using gputest::DeviceBuffer;

TEST_CASE("staging: uploads that run a ring ahead of the device arrive intact", "[gpu]") {
  constexpr size_t kRing = 4096, kChunk = 1500, kUploads = 24;  // two chunks fit: it wraps often
  cuda::StagingRing ring(kRing);
  cudaStream_t stream = nullptr;
  gputest::check(cudaStreamCreate(&stream), "cudaStreamCreate");
  std::vector<std::unique_ptr<DeviceBuffer<unsigned char>>> targets;
  std::vector<std::vector<unsigned char>> sent;
  int64_t waits = 0;
  std::vector<unsigned char> host(kChunk);
  for (size_t u = 0; u < kUploads; u++) {
    for (size_t i = 0; i < kChunk; i++) host[i] = static_cast<unsigned char>(u * 31 + i * 7 + 1);
    targets.push_back(std::make_unique<DeviceBuffer<unsigned char>>(kChunk));
    REQUIRE(ring.upload(targets.back()->ptr, host.data(), kChunk, stream, &waits));
    sent.push_back(host);
    std::memset(host.data(), 0xAB, kChunk);  // the caller's buffer is free at once
  }
  gputest::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  for (size_t u = 0; u < kUploads; u++) {
    INFO("upload " << u);
    CHECK(targets[u]->download() == sent[u]);
  }
  CHECK_FALSE(ring.upload(targets[0]->ptr, host.data(), kRing + 1, stream, &waits));  // too big
  const char* streams = std::getenv("CUDA_EMU_STREAMS");
  if (streams && std::string(streams).rfind("deferred", 0) == 0)
    CHECK(waits > 0);  // the device fell a ring behind, and the host waited for it
  gputest::check(cudaStreamDestroy(stream), "cudaStreamDestroy");
}
