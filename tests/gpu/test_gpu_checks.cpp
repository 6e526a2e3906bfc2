// How the engine uses CUDA, rather than what its kernels compute:
//   - fp32 accumulation in every GEMM, split-K included: the cublasGemmEx fallback's math mode
//     forbids reduced-precision reductions, cuBLASLt's reduction-scheme mask keeps split-K
//     partials in fp32 (issue 14, item 2);
//   - the run's memory reservation is its last device allocation: a training step with a GRASS
//     refresh and fallback GEMMs allocates nothing after it (item 4);
//   - GRASS_CUDA_SYNC=1 names a faulting kernel's launcher at its launch (item 5).
// Parts need the emulator's records (tests/cuda_emu/include/cuda_emu.h, present only there); the
// rest runs on a GPU too.
#include <catch2/catch.hpp>

#include <cmath>
#include <csignal>
#include <functional>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/device.h"
#include "kernels/storage.h"
#include "src/config/config.h"
#include "src/core/arena.h"
#include "src/core/error.h"
#include "src/model/llama.h"
#include "src/train/memory_plan.h"
#include "src/train/run_resolution.h"
#include "src/train/training_state.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/named_choice.h"

#if __has_include(<cuda_emu.h>)
#include <cuda_emu.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cuda/quant8.cuh"  // its translation: load8, a header's vector loads
#define GRASS_TEST_CUDA_EMU 1
#endif

using namespace grass;
using namespace grass::gputest;
using bf16 = __nv_bfloat16;

namespace {

// Free device memory as the driver reports it.
size_t free_device_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return free_bytes;
}

// A one-layer GRASS model (every target refreshes at step 0: no stagger), with an ffn of 172:
// rows of gate/up/down start at 8-byte boundaries, which the emulator's cuBLASLt refuses (it
// offers nothing under 16 bytes), so those GEMMs take the cublasGemmEx fallback.
RunConfig small_grass_run() {
  RunConfig c;
  c.model.hidden_size = 64;
  c.model.intermediate_size = 172;
  c.model.num_attention_heads = 4;
  c.model.num_key_value_heads = 2;
  c.model.num_hidden_layers = 1;
  c.model.vocab_size = 96;
  c.model.max_position_embeddings = 32;
  c.model.rms_norm_eps = 1e-5;
  c.model.initializer_range = 0.02;
  c.micro_batch_size = 2;
  c.total_batch_size = 2;
  c.seq_len = 16;
  c.seed = 7;
  c.grad_clip = 1.0;
  c.optimizer.kind = test::named<OptimizerKind>("grass");
  c.optimizer.lr = 1e-3;
  c.optimizer.projection.rank = 4;
  c.optimizer.projection.update_interval = 5;
  c.optimizer.projection.refresh_stagger = false;  // the default, said: all refresh at step 0
  c.pad_ffn = Switch::Off;  // keeps the unaligned rows (a padded ffn would give cuBLASLt 176)
  c.optimizer.projection.selection = Selection::TopR;
  return c;
}

// GRASS_CUDA_SYNC's setting for one scope.
struct LaunchSync {
  explicit LaunchSync(bool on) { cuda::set_launch_sync(on); }
  ~LaunchSync() { cuda::set_launch_sync(false); }
};

}  // namespace

TEST_CASE("checks: the cublasGemmEx fallback forbids reduced-precision split-K reductions",
          "[gpu][checks]") {
  // The handle every Context gets (the backend's, the tests')
  cublasHandle_t handle = cuda::create_gemm_fallback_handle();
  cublasMath_t mode = CUBLAS_DEFAULT_MATH;
  REQUIRE(cublasGetMathMode(handle, &mode) == CUBLAS_STATUS_SUCCESS);
  cublasDestroy(handle);
  CHECK((mode & CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) != 0);
#ifdef GRASS_TEST_CUDA_EMU
  // ... and the mode a bf16-output GEMM of the backend's actually ran with: rows of 7 bf16 are
  // 2-byte aligned, so cuBLASLt offers no kernel and cublasGemmEx runs it.
  const Storage storage = storage_for(PrecisionChoice::Bf16Mixed, true);
  const std::unique_ptr<Backend> backend = make_cuda_backend(storage);
  Arena arena(false, *backend);
  const std::unique_ptr<ScratchLease> scratch = backend->plan_scratch(arena, WorkspaceShape{});
  const int N = 5, in = 7, out = 3;
  DeviceBuffer<bf16> x(N * in), w(out * in), y(N * out);
  x.upload(to_bf16(randn(x.n)));
  w.upload(to_bf16(randn(w.n)));
  backend->linear_forward(y.ptr, x.ptr, w.ptr, N, in, out);
  backend->synchronize();
  const int ran_with = cuda_emu::last_gemm_ex_math_mode();
  REQUIRE(ran_with >= 0);
  CHECK((ran_with & CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) != 0);
#endif
}

#ifdef GRASS_TEST_CUDA_EMU
TEST_CASE("checks: cuBLASLt may split K only with fp32 partials reduced in order",
          "[gpu][checks]") {
  TestContext tc;
  // Aligned shapes (cuBLASLt runs them), unlike any other test's, so each asks the heuristic.
  const int N = 48, in = 80, out = 56;
  DeviceBuffer<bf16> x(N * in), w(out * in), y(N * out), dy(N * out);
  DeviceBuffer<float> dw(out * in);
  x.upload(to_bf16(randn(x.n)));
  w.upload(to_bf16(randn(w.n)));
  dy.upload(to_bf16(randn(dy.n)));
  dw.upload(std::vector<float>(dw.n, 0.0f));
  cuda::linear_forward(tc.ctx, y.ptr, x.ptr, w.ptr, N, in, out);                         // bf16 out
  cuda::linear_backward_dw(tc.ctx, dw.ptr, cuda::GradType::F32, dy.ptr, x.ptr, N, in, out);  // fp32
  check(cudaDeviceSynchronize(), "gemm");
  // bf16 output: partials in fp32 (COMPUTE_TYPE) only, never in bf16 (OUTPUT_TYPE), never added
  // into the output in a varying order (INPLACE). Kernels without split-K pass any mask.
  CHECK(cuda_emu::last_reduction_scheme_mask(CUDA_R_16BF) ==
        int64_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));
  // fp32 output: the output type is the compute type; only INPLACE is out.
  CHECK(cuda_emu::last_reduction_scheme_mask(CUDA_R_32F) ==
        int64_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE));
}
#endif

TEST_CASE("checks: after the reservation, a training step allocates no device memory the plan "
          "did not leave room for", "[gpu][checks]") {
  // As the trainer runs: the backend (stream, cuBLAS handles, kernels loaded), the plan's one
  // reservation, the training state cut from it; then a step with every GRASS target refreshing
  // (full-gradient rows, slice norms) and GEMMs on the cublasGemmEx fallback.
  const RunConfig cfg = small_grass_run();
  const Storage storage = storage_for(PrecisionChoice::Bf16Mixed, true);
  const std::unique_ptr<Backend> backend = make_cuda_backend(storage);
  const MemoryPlan plan = plan_memory(cfg, storage);
  backend->reserve(plan.total, plan.buffers);
  Arena arena(false, *backend);
  TrainingState state = build_training_state(cfg, arena, *backend);
  state.model->init_weights(cfg.seed);
  backend->synchronize();

  const Backend::DeviceMemory before = backend->device_memory();
#ifdef GRASS_TEST_CUDA_EMU
  const uint64_t allocations_before = cuda_emu::device_allocations();
#endif
  const int64_t n = int64_t(cfg.micro_batch_size) * cfg.seq_len;
  const StepOutcome outcome =
      train_step(state, cfg, 0, cfg.optimizer.lr, [&](int32_t* inputs, int32_t* targets) {
        for (int64_t i = 0; i < n; i++) {
          inputs[i] = int32_t((i * 37 + 5) % cfg.model.vocab_size);
          targets[i] = int32_t((i * 11 + 3) % cfg.model.vocab_size);
        }
      });
  backend->synchronize();
  CHECK(std::isfinite(outcome.loss));
  // The driver's figure: on a GPU this sees lazily loaded kernels, cuBLAS's pools and kernels'
  // local memory as well. An H200 (CUDA 13.0, driver 580) grew by 54 MiB here, as in every
  // training run, before the backend took the local memory pool up front (kernels/cuda/device.h,
  // never run on a GPU: the printed figures say whether the pool was the cause); the headroom the
  // reservation leaves is the claim.
  const Backend::DeviceMemory after = backend->device_memory();
  WARN("after the reservation the step allocated " << (after.used - before.used) / 1024
                                                   << " KiB; per-thread stack limit "
                                                   << before.stack_per_thread << " -> "
                                                   << after.stack_per_thread
                                                   << " bytes; local memory pool taken before it "
                                                   << before.local_pool_taken / 1024 << " KiB");
  CHECK(after.used - before.used <= kGpuHeadroomBytes);
#ifdef GRASS_TEST_CUDA_EMU
  CHECK(after.used == before.used);  // the emulator allocates only what the code asks for
  // Every allocation, also one freed again before the step ended.
  CHECK(cuda_emu::device_allocations() == allocations_before);
  CHECK(cuda_emu::last_gemm_ex_math_mode() >= 0);  // the fallback ran
#endif
}

TEST_CASE("checks: a reservation that leaves less than the stated headroom free stops with one line",
          "[gpu][checks]") {
  // kGpuHeadroomBytes (kernels/backend.h) stays free beside the reservation for what allocates
  // after it; a plan that would eat into it is refused before anything is allocated.
  const Storage storage = storage_for(PrecisionChoice::Bf16Mixed, true);
  const std::unique_ptr<Backend> backend = make_cuda_backend(storage);
  const int64_t total = int64_t(free_device_bytes()) - kGpuHeadroomBytes / 2;
  std::string message = "(no error)";
  try {
    backend->reserve(total, 1);
  } catch (const UserError& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("left free beside it (kGpuHeadroomBytes"));
  CHECK_THAT(message, Catch::Contains("are free on"));
}

// The engine times its copies and GaLore's refresh phases with event pairs (copy_stream.cu,
// galore_basis.cu). CUDA gives a time only between two recorded events made with timing; the
// emulator holds kernels/cuda to the same rule.
TEST_CASE("checks: an event pair gives a time only when both were recorded and made with timing",
          "[gpu][checks]") {
  cudaEvent_t start, end, untimed;
  REQUIRE(cudaEventCreateWithFlags(&start, cudaEventDefault) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&end, cudaEventDefault) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming) == cudaSuccess);
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, start, end) == cudaErrorInvalidResourceHandle);  // unrecorded
  (void)cudaGetLastError();
  for (const cudaEvent_t e : {start, untimed, end}) REQUIRE(cudaEventRecord(e, nullptr) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(cudaEventElapsedTime(&ms, start, untimed) == cudaErrorInvalidResourceHandle);
  CHECK(cudaEventElapsedTime(&ms, untimed, end) == cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
  CHECK(ms == -1);
  REQUIRE(cudaEventElapsedTime(&ms, start, end) == cudaSuccess);
  CHECK(ms >= 0);
  for (const cudaEvent_t e : {start, end, untimed}) CHECK(cudaEventDestroy(e) == cudaSuccess);
}

#ifdef GRASS_TEST_CUDA_EMU
namespace {
// Runs `use` in a forked child, after `make` made its objects on device 1, on a fresh thread
// (which starts on device 0); returns what the child wrote to stderr if it ended by SIGABRT,
// else a line saying how it ended.
std::string abort_message_of(const std::function<void()>& use) {
  int out[2];
  REQUIRE(pipe(out) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // Catch's own SIGABRT handler would report the abort as this test's failure
    std::signal(SIGABRT, SIG_DFL);
    dup2(out[1], 2);
    close(out[0]);
    std::thread helper(use);
    helper.join();
    _exit(0);
  }
  close(out[1]);
  std::string text;
  char chunk[512];
  for (ssize_t n; (n = read(out[0], chunk, sizeof chunk)) > 0;) text.append(chunk, size_t(n));
  close(out[0]);
  int status = 0;
  waitpid(child, &status, 0);
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT) return text;
  return "(the child did not abort: status " + std::to_string(status) + ")";
}
// A kernel launch as the emulator's translation of write_one<<<1, 1, 0, stream>>>(out) makes it.
void write_one(cudaStream_t stream, int* out) {
  cuda_emu::launch("write_one", nullptr, {dim3(1), dim3(1), 0, stream}, [out] { *out = 1; });
}
}  // namespace

// Issue 25, B4's class: a helper thread that never called cudaSetDevice works on device 0. The
// emulator keeps a current device per thread and tags events, streams and allocations with theirs.
TEST_CASE("checks: the emulator stops a use of another device's stream, event or memory",
          "[gpu][checks]") {
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
  int* memory = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaMalloc(&memory, sizeof(int)) == cudaSuccess);
  const std::string expected = "of device 1 from a thread whose current device is 0";
  CHECK_THAT(abort_message_of([&] { write_one(stream, memory); }),
             Catch::Contains("write_one on a stream " + expected));
  CHECK_THAT(abort_message_of([&] { cudaEventQuery(event); }),
             Catch::Contains("cudaEventQuery on an event " + expected));
  CHECK_THAT(abort_message_of([&] { cudaMemsetAsync(memory, 0, sizeof(int)); }),
             Catch::Contains("cudaMemset on memory " + expected));
  // and with the device made current there, the same calls are fine
  CHECK_THAT(abort_message_of([&] {
               cudaSetDevice(1);
               write_one(stream, memory);
               cudaEventQuery(event);
               cudaMemsetAsync(memory, 0, sizeof(int));
             }),
             Catch::Contains("did not abort: status 0"));
  cudaFree(memory);
  cudaEventDestroy(event);
  cudaStreamDestroy(stream);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}

// A launch whose warps need more registers than a block may hold fails on the GPU
// (cudaErrorLaunchOutOfResources), which the emulator, running g++'s code, cannot see by itself: it
// takes each kernel's sm_90 count from tools/ptxas_budget.json. A thread's count is rounded up to a
// multiple of 8 and the threads to whole warps; each case below is refused or not by one of those.
TEST_CASE("checks: the emulator refuses a launch over a block's 65,536 registers, as a GPU does",
          "[gpu][checks]") {
  // the budget is read, by the names launches use (a template's parameters, not its arguments)
  CHECK(cuda_emu::kernel_registers("rmsnorm_forward_warp_kernel<kPacks, kResidual>") > 64);
  CHECK(cuda_emu::kernel_registers("void grass::cuda::attention_dkdv_mma_kernel<128>(long)") ==
        cuda_emu::kernel_registers("attention_dkdv_mma_kernel<HD>"));
  CHECK(cuda_emu::kernel_registers("not_a_kernel_of_the_budget") == 0);
  const struct {
    int registers, threads;
    bool refused;
  } cases[] = {
      {128, 512, false},  // 128 x 512 = 65,536: the whole file
      {128, 544, true},
      {145, 448, true},   // 152 x 448 = 68,096 (145 x 448 = 64,960 would fit)
      {144, 448, false},  // 144 x 448 = 64,512
      {144, 449, true},   // 144 x 480 = 69,120 (144 x 449 = 64,656 would fit)
  };
  for (const auto& c : cases) {
    INFO(c.registers << " registers x " << c.threads << " threads");
    cuda_emu::set_kernel_registers("register_probe_kernel", c.registers);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    cuda_emu::launch("register_probe_kernel", nullptr,
                     cuda_emu::LaunchDims(dim3(1), dim3(unsigned(c.threads))), [] {});
    CHECK(cudaGetLastError() == (c.refused ? cudaErrorLaunchOutOfResources : cudaSuccess));
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
  }
}

// __launch_bounds__(N) is nvcc's: g++ drops it, and a GPU refuses a block of more than N threads.
// The emulator takes each kernel's bound from the budget (the PTX's .maxntid).
TEST_CASE("checks: the emulator refuses a block over a kernel's launch bound", "[gpu][checks]") {
  CHECK(cuda_emu::kernel_max_threads("adamw_q8_kernel<S>") == 256);  // kQuant8Threads, bound
  CHECK(cuda_emu::kernel_max_threads("adamw_mixed_kernel") == 0);     // no bound
  cuda_emu::set_kernel_max_threads("bound_probe_kernel", 256);
  for (const unsigned threads : {256u, 257u}) {
    INFO(threads << " threads");
    REQUIRE(cudaGetLastError() == cudaSuccess);
    cuda_emu::launch("bound_probe_kernel", nullptr, cuda_emu::LaunchDims(dim3(1), dim3(threads)),
                     [] {});
    CHECK(cudaGetLastError() == (threads > 256 ? cudaErrorLaunchOutOfResources : cudaSuccess));
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
  }
}

// A kernel's static shared memory (ptxas', from tools/ptxas_budget.json) and a launch's dynamic
// shared memory share one budget: 48 KiB without cudaFuncSetAttribute, the attribute's value with
// it, and never past 227 KiB together (sm_90). Each case below is refused or not by one byte.
void shared_probe_kernel() {}
TEST_CASE("checks: the emulator counts a kernel's static shared memory beside a launch's dynamic",
          "[gpu][checks]") {
  CHECK(cuda_emu::kernel_static_shared("void grass::cuda::adamw_q8_kernel<float>(long)") > 0);
  CHECK(cuda_emu::kernel_static_shared("not_a_kernel_of_the_budget") == 0);
  const void* kernel = reinterpret_cast<const void*>(&shared_probe_kernel);
  cuda_emu::set_kernel_static_shared("shared_probe_kernel", 16 << 10);
  const auto launch = [&](size_t dynamic) {
    REQUIRE(cudaGetLastError() == cudaSuccess);
    cuda_emu::launch("shared_probe_kernel", kernel,
                     cuda_emu::LaunchDims(dim3(1), dim3(32), dynamic), [] {});
    const cudaError_t err = cudaGetLastError();
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    return err;
  };
  CHECK(launch(32 << 10) == cudaSuccess);  // 16 + 32 KiB: the 48 a launch may take unasked
  CHECK(launch((32 << 10) + 1) == cudaErrorInvalidValue);
  REQUIRE(cudaFuncSetAttribute(shared_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               100 << 10) == cudaSuccess);
  CHECK(launch(100 << 10) == cudaSuccess);
  CHECK(launch((100 << 10) + 1) == cudaErrorInvalidValue);
  REQUIRE(cudaFuncSetAttribute(shared_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               220 << 10) == cudaSuccess);
  CHECK(launch(232448 - (16 << 10)) == cudaSuccess);  // 227 KiB with the static 16
  CHECK(launch(232448 - (16 << 10) + 1) == cudaErrorInvalidValue);
}

// A GPU loads and stores a T only at a multiple of T's alignment, else the kernel fails with
// "misaligned address"; x86 loads it anyway (or, for some 16-byte loads, faults as if the address
// were illegal). So the emulator checks every pointer a kernel casts (translate.cmake turns
// reinterpret_cast into cuda_emu::device_cast), in the kernels' sources and in their headers.
TEST_CASE("checks: the emulator stops a kernel's misaligned vector access as a GPU does",
          "[gpu][checks]") {
  DeviceBuffer<float> in(64), out(64);
  in.upload(randn(in.n));
  const char* base = reinterpret_cast<const char*>(in.ptr);  // cudaMalloc's: 256-byte aligned
  float* sink = out.ptr;
  const struct {
    int bytes;  // of the access: float4, uint64_t, __nv_bfloat162
    size_t offset;
    bool misaligned;
  } cases[] = {{16, 16, false}, {16, 8, true}, {8, 8, false},
               {8, 4, true},    {4, 4, false}, {4, 2, true}};
  for (const auto& c : cases) {
    INFO("a " << c.bytes << "-byte load " << c.offset << " bytes into an allocation");
    cuda_emu::launch("misaligned_probe_kernel", nullptr,
                     cuda_emu::LaunchDims(dim3(1), dim3(32)), [c, base, sink] {
      const char* p = base + c.offset;
      float x = 0;
      if (c.bytes == 16) x = cuda_emu::device_cast<const float4*>(p)->y;
      if (c.bytes == 8) x = float(*cuda_emu::device_cast<const uint64_t*>(p) & 0xFF);
      if (c.bytes == 4) x = __bfloat162float(cuda_emu::device_cast<const __nv_bfloat162*>(p)->x);
      sink[threadIdx.x] = x;
    });
    CHECK(cudaGetLastError() == cudaSuccess);  // the launch itself is fine
    CHECK(cudaDeviceSynchronize() == (c.misaligned ? cudaErrorMisalignedAddress : cudaSuccess));
    if (c.misaligned) {
      const std::string fault = cuda_emu::last_kernel_fault();  // the first thread to run
      CHECK_THAT(fault, Catch::Contains("misaligned_probe_kernel: block (0,0,0): misaligned "
                                        "address: thread ("));
      CHECK_THAT(fault, Catch::Contains(") made a pointer to " + std::to_string(c.bytes) +
                                        "-byte elements"));
    }
  }
  // A header's device code is checked too: quant8.cuh's load8 reads 8 floats as two float4.
  for (const size_t offset : {size_t(0), size_t(4)}) {
    INFO("load8 " << offset << " bytes into an allocation");
    cuda_emu::launch("load8_probe_kernel", nullptr, cuda_emu::LaunchDims(dim3(1), dim3(32)),
                     [offset, base, sink] {
      float x[8];
      cuda::load8(reinterpret_cast<const float*>(base + offset), x);
      sink[threadIdx.x] = x[1];
    });
    CHECK(cudaDeviceSynchronize() == (offset ? cudaErrorMisalignedAddress : cudaSuccess));
  }
  // Outside a kernel a cast checks nothing: a launcher may form a pointer it never reads.
  CHECK(cuda_emu::device_cast<const float4*>(base + 4) != nullptr);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

// On a GPU an illegal address is sticky (the context is lost), so this runs on the emulator only,
// whose fault is reported once, like a GPU's, at the next synchronising call.
TEST_CASE("checks: GRASS_CUDA_SYNC=1 names a faulting kernel's launcher at its launch",
          "[gpu][checks]") {
  TestContext tc;
  // A table of 16 x 64 bf16 is 2048 bytes: row 16 starts exactly at the guard page after it.
  const int V = 16, C = 64, N = 2;
  DeviceBuffer<bf16> table(V * C), out(N * C);
  DeviceBuffer<int32_t> tokens(N);
  table.upload(to_bf16(randn(table.n)));
  tokens.upload({3, V});  // the second is out of range: the kernel reads past the table
  {
    // Without the mode: the launch check passes, and the fault waits for whatever synchronises
    // next (in the engine, an upload or a download, far from this kernel).
    const LaunchSync sync(false);
    cuda::embedding_forward(tc.ctx, out.ptr, tokens.ptr, table.ptr, N, C);
    CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
  }
  {
    const LaunchSync sync(true);
    std::string message;
    try {
      cuda::embedding_forward(tc.ctx, out.ptr, tokens.ptr, table.ptr, N, C);
    } catch (const InternalError& e) {
      message = e.what();
    }
    INFO(message);
    CHECK(message.find("a kernel launched by embedding_forward failed") != std::string::npos);
    CHECK(message.find("kernels/cuda/embedding.cu:") != std::string::npos);
    CHECK(message.find("illegal memory access") != std::string::npos);
  }
  CHECK(cudaDeviceSynchronize() == cudaSuccess);  // reported once
}
#endif
