// The pinned staging ring (kernels/cuda/staging.cuh): uploads that run ahead of the device, each
// region of the ring written again only after the transfer that read it. With deferred streams
// (the emulator's CUDA_EMU_STREAMS=deferred, ctest cuda_emu_deferred_streams) the transfers wait
// in their stream until something forces them, so the ring fills and the host must take its wait
// branch; a region rewritten before its transfer ran stops the emulator ("the host source of a
// cudaMemcpyAsync ... changed before the copy ran").
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/staging.cuh"
#include "src/core/arena.h"
#include "src/train/run_resolution.h"
#include "tests/gpu/gpu_test_util.h"

#if __has_include(<cuda_emu.h>)
#include <cuda_emu.h>
#define GRASS_TEST_CUDA_EMU 1
#endif

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

// The host tier (kernels/cuda/copy_stream.cuh's PinnedHost): a buffer over GRASS_PINNED_CHUNK
// (4 GiB by default; two pages here) is mapped pages pinned a chunk at a time, and a copy whose
// host side crosses the chunks' ends lands whole. The emulator stops a copy that runs past the end
// of its pinned region, as CUDA makes a copy async only within one; ctest's
// cuda_emu_pinned_chunks runs the offload tests with one-page chunks.
TEST_CASE("host tier: a buffer over a chunk is pinned a chunk at a time and copies cross them whole",
          "[gpu][offload]") {
  const size_t page = size_t(sysconf(_SC_PAGESIZE)), chunk = 2 * page;
  const char* given = std::getenv("GRASS_PINNED_CHUNK");  // ctest's cuda_emu_pinned_chunks sets it
  const std::string before = given ? given : "";
  ::setenv("GRASS_PINNED_CHUNK", std::to_string(chunk).c_str(), 1);
  const Storage storage = storage_for(PrecisionChoice::Bf16Mixed, true);
  std::unique_ptr<Backend> backend = make_cuda_backend(storage);
  if (given)
    ::setenv("GRASS_PINNED_CHUNK", before.c_str(), 1);
  else
    ::unsetenv("GRASS_PINNED_CHUNK");
  const void* held = nullptr;
  {
    Arena arena(false, *backend, &backend->host_tier());
    const size_t bytes = 5 * chunk + 123;  // 5 chunks of pages and a sixth of one page
    auto* host = static_cast<unsigned char*>(
        arena.alloc_bytes(MemCategory::Optimizer, "large", int64_t(bytes), MemPlace::Host));
    auto* small = static_cast<unsigned char*>(
        arena.alloc_bytes(MemCategory::Optimizer, "small", int64_t(page + 5), MemPlace::Host));
    REQUIRE(host);
    REQUIRE(small);
    held = host;
    CHECK(std::all_of(host, host + bytes, [](unsigned char b) { return b == 0; }));
#ifdef GRASS_TEST_CUDA_EMU
    for (size_t at = 0; at < bytes; at += page) {
      INFO("byte " << at);
      CHECK(cuda_emu::pinned_region_bytes(host + at) == (at < 5 * chunk ? chunk : page));
    }
    CHECK(cuda_emu::pinned_region_bytes(small) == page + 5);  // one cudaHostAlloc
#endif
    std::mt19937 rng(20261129);
    for (size_t i = 0; i < bytes; i++) host[i] = static_cast<unsigned char>(rng());
    const std::vector<unsigned char> sent(host, host + bytes);
    // up from the middle of chunk 0 to the middle of chunk 4, then back into chunks 1 to 5
    const size_t from = chunk / 2 + 7, n = 4 * chunk + 11, to = chunk + 3;
    auto* device = static_cast<unsigned char*>(
        arena.alloc_bytes(MemCategory::Workspace, "device", int64_t(n)));
    backend->copy_async(device, host + from, n, Backend::Copy::ToDevice);
    backend->order_copy_after(backend->mark_copies(Backend::Copy::ToDevice));
    backend->copy_async(host + to, device, n, Backend::Copy::ToHost);
    backend->synchronize();
    for (size_t i = 0; i < bytes; i++) {
      const unsigned char want = i >= to && i < to + n ? sent[from + (i - to)] : sent[i];
      if (host[i] != want) FAIL("byte " << i << ": " << int(host[i]) << ", want " << int(want));
    }
  }
#ifdef GRASS_TEST_CUDA_EMU
  CHECK(cuda_emu::pinned_region_bytes(held) == 0);  // unpinned with the arena
#else
  (void)held;
#endif
}
