#!/usr/bin/env python3
"""Every op has one file per backend under the same name: kernels/cpu/<op>.cpp, the reference, and
kernels/cuda/<op>.cu, its kernels (docs/architecture.md, "Adding an op"), so a reader finds an op's
two sides without a map. The backends' own machinery has no twin; it is listed below, the one place
that says which files those are.

Exits 1 naming each file of kernels/cpu or kernels/cuda that is neither an op file with its twin
nor listed, and each listed file that no longer exists. Standard library only; ctest runs it as
`kernel_twins`.
Usage: tools/kernel_twins.py [REPO_ROOT]
"""
import os
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))

# The files of each backend that hold no op of kernels/ops.h, and why.
INFRASTRUCTURE = {
    "cpu": {
        "cpu_backend.cpp": "CpuBackend: calls the ops, rounds what the GPU stores in bf16",
        "blas.h": "one name for sgemm and dgemm, which the ops share",
        "blas_kernels.cpp": "which OpenBLAS kernels run, and the reload with supported ones",
        "blas_kernels.h": "which OpenBLAS kernels run, and the reload with supported ones",
        "quant8_step.h": "the 8-bit optimizer steps' dequantize-step-requantize loop",
        "parallel.h": "the work below which an op's loop runs on one thread",
        "copy_queue.cpp": "the copy thread behind copy_async (offload), and its lazy test mode",
        "copy_queue.h": "the copy thread behind copy_async (offload), and its lazy test mode",
    },
    "cuda": {
        "cuda_backend.cu": "CudaBackend: memory, workspace, and the calls into the kernels",
        "cuda_ops.h": "the declarations of every kernel (the CPU's are kernels/ops.h)",
        "common.cu": "checked calls and launches",
        "common.cuh": "what every .cu shares: checks, bf16 packs, block sums, rounding",
        "copy_stream.cu": "the copy stream behind copy_async (offload) and pinned host memory",
        "copy_stream.cuh": "the copy stream behind copy_async (offload) and pinned host memory",
        "device.cu": "the device probe, the launch checks' debugging mode, the local memory pool",
        "device.h": "the device probe, the launch checks' debugging mode, the local memory pool",
        "staging.cu": "the pinned staging ring of host-to-device copies",
        "staging.cuh": "the pinned staging ring of host-to-device copies",
        "nccl_communicator.cu": "the data-parallel sums over NCCL",
        "nccl_communicator.h": "the data-parallel sums over NCCL",
        "gemm.cu": "the cuBLASLt GEMM every product goes through (the CPU's is BLAS)",
        "gemm.cuh": "the cuBLASLt GEMM every product goes through",
        "quant8.cuh": "the 8-bit optimizer steps' dequantize-step-requantize block",
        "mma_ptx.cuh": "sm_80's mma.sync, ldmatrix and cp.async as inline PTX (the emulator's model)",
        "attention_mma.cu": "attention's second GPU implementation (attention: \"mma\"), beside "
                            "attention.cu until a GPU measures which is faster; its reference is "
                            "cpu/attention.cpp",
    },
}
OP_EXTENSION = {"cpu": ".cpp", "cuda": ".cu"}


def main():
    problems = []
    ops = {}
    for side in ("cpu", "cuda"):
        folder = os.path.join(root, "kernels", side)
        names = set(os.listdir(folder))
        for name in sorted(set(INFRASTRUCTURE[side]) - names):
            problems.append(f"kernels/{side}/{name} is listed as infrastructure in "
                            f"tools/kernel_twins.py but does not exist")
        ops[side] = set()
        for name in sorted(names - set(INFRASTRUCTURE[side])):
            stem, extension = os.path.splitext(name)
            if extension == OP_EXTENSION[side]:
                ops[side].add(stem)
            else:
                problems.append(f"kernels/{side}/{name} is not an op file ({OP_EXTENSION[side]}) "
                                f"and not listed as infrastructure in tools/kernel_twins.py")
    for side, other in (("cpu", "cuda"), ("cuda", "cpu")):
        for stem in sorted(ops[side] - ops[other]):
            problems.append(f"kernels/{side}/{stem}{OP_EXTENSION[side]} has no twin "
                            f"kernels/{other}/{stem}{OP_EXTENSION[other]}")
    for stem in sorted(ops["cpu"] & ops["cuda"]):
        print(f"{stem:14} kernels/cpu/{stem}.cpp  kernels/cuda/{stem}.cu")
    if problems:
        print("error: op files without a twin (docs/architecture.md, \"Adding an op\"):")
        for line in problems:
            print("  " + line)
        return 1
    print("every op file has its twin")
    return 0


if __name__ == "__main__":
    sys.exit(main())
