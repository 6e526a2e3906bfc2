// sm_80's warp-level matrix instructions and asynchronous copies, for kernels that keep their tiles
// in registers (the FA2-style attention of issue 45): mma.sync m16n8k16 (bf16 in, fp32
// accumulate), ldmatrix (x1, x2, x4, and .trans) and cp.async.cg with its groups. Under nvcc each
// is its inline PTX; on the CUDA emulator (tests/cuda_emu) each is the emulator's exact model,
// fragment layouts and group semantics included (tests/cuda_emu/include/cuda_runtime.h), so a
// wrong fragment index or a missing wait fails the emulated tests (tests/gpu/test_gpu_mma_ptx.cpp).
//
// The fragments, as the PTX ISA lays them out (g = lane / 4, t = lane % 4; each uint32_t holds
// two bf16, the lower index in its low 16 bits):
//   A, 16 x 16, row-major:  a[0] = A[g][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]
//                           a[2] = A[g][2t+8, +9]     a[3] = A[g+8][2t+8, +9]
//   B, 16 (k) x 8 (n):      b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]
//   C and D, 16 x 8 fp32:   c[0] = C[g][2t]  c[1] = C[g][2t+1]  c[2] = C[g+8][2t]  c[3] = C[g+8][2t+1]
// ldmatrix: lane 8m + r gives the shared-memory address of row r of matrix m (16 bytes, 16-byte
// aligned; lanes past the last matrix give none); lane l receives in r[m] row l/4, elements
// 2(l%4) and +1 of matrix m, or with .trans those of the transpose. So x4 of a row-major 16 x 16
// tile, lane l addressing row l % 16 at column 8 (l / 16), gives exactly A's a[0..3]; x2 of a
// B stored as [n][k] (lanes 0-15: row l % 8, column 8 (l / 8)) gives b[0..1], and x2.trans of a B
// stored as [k][n] (lanes 0-15: row l, column 0) gives them too.
//
// Include only from .cu files; the PTX forms need sm_80 or newer.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "kernels/cuda/mma_ptx.cuh: mma.sync.m16n8k16 on bf16, ldmatrix and cp.async need sm_80 or newer"
#endif

namespace grass::cuda {

#if defined(__CUDA_ARCH__)
// The shared-state-space address PTX's .shared operands take.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

// c += a·b for one 16 x 8 tile of the warp (every lane calls it; fragments above). The fp32 sum's
// order is the hardware's; the emulator's is stated in cuda_runtime.h (k ascending, one rounding
// a step), so results agree with a GPU's to the last bits, not bit for bit.
__device__ __forceinline__ void mma_m16n8k16_bf16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(__CUDA_ARCH__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif !defined(__CUDACC__)
  cuda_emu::mma_m16n8k16_bf16(c, a, b, c);
#endif
}

// ldmatrix.sync.aligned.m8n8.x{kCount}{.trans}.shared.b16 into r[0..kCount-1]; `row` is this
// lane's row address (used from lanes 0 .. 8·kCount-1).
template <int kCount, bool kTrans>
__device__ __forceinline__ void ldmatrix(uint32_t* r, const void* row) {
  static_assert(kCount == 1 || kCount == 2 || kCount == 4, "ldmatrix loads 1, 2 or 4 matrices");
#if defined(__CUDA_ARCH__)
  const uint32_t p = shared_address(row);
  if constexpr (kCount == 1 && !kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(p) : "memory");
  if constexpr (kCount == 1 && kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0]) : "r"(p) : "memory");
  if constexpr (kCount == 2 && !kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(p) : "memory");
  if constexpr (kCount == 2 && kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(p) : "memory");
  if constexpr (kCount == 4 && !kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(p) : "memory");
  if constexpr (kCount == 4 && kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(p) : "memory");
#elif !defined(__CUDACC__)
  cuda_emu::ldmatrix(r, kCount, kTrans, row);
#endif
}
__device__ __forceinline__ void ldmatrix_x1(uint32_t r[1], const void* row) { ldmatrix<1, false>(r, row); }
__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void* row) { ldmatrix<2, false>(r, row); }
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* row) { ldmatrix<4, false>(r, row); }
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t r[1], const void* row) { ldmatrix<1, true>(r, row); }
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t r[2], const void* row) { ldmatrix<2, true>(r, row); }
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* row) { ldmatrix<4, true>(r, row); }

// cp.async.cg.shared.global of 16 bytes (both addresses 16-byte aligned; .cg: cached in L2 only).
// The copy joins this thread's open group; it is complete only after a cp_async_wait that covers
// its group, and visible to other threads only after a barrier that follows their waits.
__device__ __forceinline__ void cp_async_cg_16(void* shared_dst, const void* global_src) {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n"
               :
               : "r"(shared_address(shared_dst)), "l"(__cvta_generic_to_global(global_src))
               : "memory");
#elif !defined(__CUDACC__)
  cuda_emu::cp_async_16(shared_dst, global_src);
#endif
}
// Closes this thread's open group of copies (an empty group is a group).
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#elif !defined(__CUDACC__)
  cuda_emu::cp_async_commit();
#endif
}
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  static_assert(kPending >= 0, "cp.async.wait_group takes a count of groups");
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#elif !defined(__CUDACC__)
  cuda_emu::cp_async_wait(kPending);
#endif
}

// Two floats rounded to bf16 (nearest even) in one register, lo in the low half: an A or B
// fragment register from values in registers (the P of P·V from the accumulators).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16;
}

}  // namespace grass::cuda
