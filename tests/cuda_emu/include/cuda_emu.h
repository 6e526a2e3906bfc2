// cuda_emu: what the emulator counts and records, for the GPU tests that check the engine's use of
// CUDA (tests/gpu/test_gpu_checks.cpp). Only the emulator has this header: a test includes it
// under __has_include(<cuda_emu.h>).
#pragma once
#include <cstdint>
#include <string>

#include "cuda_runtime.h"

namespace cuda_emu {

// Device allocations made so far: cudaMalloc calls, the resources cublasCreate and cublasLtCreate
// take, and each kernel's code loaded at its first launch under lazy module loading.
uint64_t device_allocations();
// The math mode (cublasMath_t) of the handle the last cublasGemmEx ran on; -1 before any.
int last_gemm_ex_math_mode();
// cublasGemmEx calls so far: the engine's GEMMs that cuBLASLt offered no kernel for.
uint64_t gemm_ex_calls();
// The next `count` cublasLtMatmul calls fail at launch with CUBLAS_STATUS_EXECUTION_FAILED,
// running nothing (a kernel the heuristic offered that then cannot run).
void fail_next_lt_matmuls(int count);
// From now on the cuBLASLt heuristic's first `count` results take C = D only
// (CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT 0), followed by one that takes both, within the
// results asked for; 0 (the default) offers one result that takes both.
void lt_in_place_only_algorithms(int count);
// The reduction-scheme mask of the last cuBLASLt heuristic query for an output (D) of type
// `output`; -1 before any.
int64_t last_reduction_scheme_mask(cudaDataType_t output);
// What the last kernel that failed while it ran reported ("kernel NAME: block (x,y,z): why"; ""
// before any), as printed on stderr.
std::string last_kernel_fault();
// cp.async's late copies (cuda_runtime.h) on or off for the kernels run from now on, whatever
// CUDA_EMU_CP_ASYNC says; returns the mode before.
bool set_cp_async_late(bool late);
// The bytes of the pinned region (a cudaHostAlloc's, or a cudaHostRegister's) that holds p; 0
// when none does.
size_t pinned_region_bytes(const void* p);
// The registers a thread of the kernel named `name` takes on sm_90 (as a launch or
// tools/ptxas_budget.json names it: namespace, template arguments and parameters ignored, the
// most over its instantiations); 0 for a kernel the budget does not list. A launch whose warps
// need more than a block's 65,536 registers fails with cudaErrorLaunchOutOfResources.
int kernel_registers(const std::string& name);
// Gives the kernel `name` (the tests' own kernels are not in the budget) `registers` a thread.
void set_kernel_registers(const std::string& name, int registers);
// The static shared memory of the kernel `name` on sm_90, from the same budget (0 where it lists
// none). A launch may add dynamic shared memory up to the kernel's
// cudaFuncAttributeMaxDynamicSharedMemorySize, which starts at 48 KiB less the static bytes, and
// never past 227 KiB with them; over it, the launch fails with cudaErrorInvalidValue.
int kernel_static_shared(const std::string& name);
void set_kernel_static_shared(const std::string& name, int bytes);
// The threads a block of the kernel `name` may have under its __launch_bounds__ (the budget's
// max_threads, the tightest over its instantiations; 0: no bound). A launch of more fails, here
// with cudaErrorLaunchOutOfResources (the code is the emulator's choice).
int kernel_max_threads(const std::string& name);
void set_kernel_max_threads(const std::string& name, int threads);

}  // namespace cuda_emu
