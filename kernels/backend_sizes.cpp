// The sizes of each backend's scratch and saved tensors, computed from the storage alone so that
// `grass mem` plans a GPU run on a machine without one. The CUDA backend checks at bind time that
// its kernels need no more than this (kernels/cuda/cuda_backend.cu), so the two cannot drift.
#include <algorithm>

#include "kernels/backend.h"

namespace grass {

namespace {
constexpr int64_t kGemmWorkspaceBytes = int64_t(32) << 20;  // cuBLASLt's recommended on Hopper
constexpr int64_t kCudnnHeadroomBytes = int64_t(4) << 20;
constexpr int64_t kNormRowBlocks = 1024;    // kernels/cuda/rmsnorm.cu: kRowBlocks
constexpr int64_t kReducePartials = 1024;  // kernels/cuda/reduce.cu: kSumMaxBlocks
// Pure bf16's GaLore/FLORA update back-projects this many fp32 elements at a time (64 MiB).
constexpr int64_t kLowRankUpdateChunkElements = int64_t(16) << 20;
}  // namespace

int64_t attention_saved_bytes(const Storage& storage, int B, int T, int NH) {
  const int64_t rows = int64_t(B) * NH * T;
  return 4 * (storage.cuda ? rows : rows * T);  // logsumexp per row, or the probabilities
}

int64_t cudnn_attention_workspace_bytes(int B, int T, int NH, int HD) {
  // The deterministic backward on sm90 takes the dP-workspace path (issue 25, B2): dP in bf16 for
  // each head over T rounded up to 64 by T rounded up to 128, its row statistics in fp32, and an
  // fp32 dQ accumulator; 4 MiB for the graphs' own small buffers. Read from the engines' sizes,
  // not yet measured: the backend compares it with what its graphs ask for when it builds them,
  // and stops at start-up naming both if it is short.
  const auto pad = [](int64_t x, int64_t to) { return (x + to - 1) / to * to; };
  const int64_t heads = int64_t(B) * NH;
  return 2 * heads * pad(T, 64) * pad(T, 128) + 4 * heads * T + 4 * heads * T * HD +
         kCudnnHeadroomBytes;
}

int64_t head_chunk(int V, int64_t chunk_rows) {
  if (chunk_rows > 0 || V <= 0) return chunk_rows;  // V 0: a shape with no head
  return std::max<int64_t>(1, kHeadChunkElements / V);
}

int64_t head_rows(const Storage& storage, int64_t N, int V, int64_t chunk_rows) {
  return storage.cuda ? std::min(N, head_chunk(V, chunk_rows)) : N;
}

int64_t large_head_chunk_rows(int V) { return std::max(kLargeHeadChunkRows, head_chunk(V, 0)); }

int64_t galore_solver_work_floats(int64_t m, int64_t k) {
  // LAPACK asks for n·nb floats for a QR of m x n (nb, its block size, 32 to 64 in OpenBLAS) and
  // 1 + 6k + 2k² for a k x k eigenproblem with vectors. cuSOLVER (CUDA 13.0, H100, 2026-11-26;
  // the GPU test "cuSOLVER's work space fits the plan" prints its figures) asks for at least
  // 786,432 floats (3 MiB) at any shape, 4,424,147 for syevd at k = 1,032 (2.07 times LAPACK's)
  // and up to 1,919,232 for the QRs of 13,824 x 520. Planned: 256 columns of m for the QRs,
  // three times LAPACK's eigensolver, and a floor of 2^20 floats (4 MiB; one workspace per run).
  // The GPU backend compares the plan with cuSOLVER's answer before the reservation.
  constexpr int64_t kFloorFloats = int64_t(1) << 20;
  return std::max(kFloorFloats, 256 * (m + k) + 3 * (1 + 6 * k + 2 * k * k));
}

int64_t galore_basis_workspace_bytes(const Storage& storage, int out, int in, int r,
                                     const GaloreBasisMethod& how) {
  if (!storage.cuda || !how.randomized) return 0;
  // kernels/cuda/galore_basis.cu: Ω then Z [k, n], Q [k, m], S [k, k], W [k, r], λ and τ [k],
  // cuSOLVER's info and its work space, each region 256-byte aligned.
  const int64_t m = std::max(out, in), n = m;  // either side may be projected
  const int64_t k = std::min<int64_t>(r + how.oversample, std::min(out, in));
  const auto region = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  return region(4 * k * n) + region(4 * k * m) + region(4 * k * k) + region(4 * k * r) +
         2 * region(4 * k) + region(4) + region(4 * galore_solver_work_floats(m, k));
}

GaloreBatchLayout galore_batch_layout(const Storage& storage, int64_t max_side, int64_t k,
                                      int slots) {
  const auto region = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  GaloreBatchLayout l;
  l.lambda = region(4 * slots * k * k);
  l.q = l.lambda + region(4 * slots * k);
  l.q_stride = k * max_side;
  l.info = l.q + region(4 * slots * k * max_side);
  l.work = l.info + region(4 * int64_t(slots));
  l.work_bytes = storage.cuda ? 4 * slots * galore_solver_work_floats(k, k) : 0;
  l.bytes = l.work + region(l.work_bytes);
  return l;
}

int64_t draw_rows_workspace_bytes(const Storage& storage, int64_t N) {
  if (!storage.cuda) return 0;
  // kernels/cuda/sampling.cu (draw_workspace): w and cum [N] uint64, rank and top [N] int32, the
  // draw's state, each region 256-byte aligned.
  const auto region = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  return 2 * region(8 * N) + 2 * region(4 * N) + 256;
}

int64_t lowrank_workspace_bytes(const Storage& storage, int out, int in, int r) {
  if (!storage.cuda) return 0;
  // kernels/cuda/lowrank.cu (cuda_ops.h has the layout): two bf16 buffers of r·max(out, in)
  // elements, either side may be projected, each 16-byte aligned: P transposed [r, side] and the
  // Adam direction ([r, in] or [out, r]); then 16 bytes for the sum of squares of the update's
  // RMS bound. bf16-mixed back-projects straight into the fp32 master copy; pure bf16 adds the
  // fp32 back-projection of a chunk of whole rows of w, at most kLowRankUpdateChunkElements (the
  // whole w when it is smaller).
  const int64_t half = (2 * int64_t(r) * std::max(out, in) + 15) / 16 * 16;
  int64_t bytes = 2 * half + 16;
  if (storage.pure_bf16() && in > 0) {
    const int64_t rows =
        std::min<int64_t>(out, std::max<int64_t>(1, kLowRankUpdateChunkElements / in));
    bytes += 4 * rows * in;
  }
  return bytes;
}

BackendScratch backend_scratch(const Storage& storage, const WorkspaceShape& s) {
  BackendScratch scratch;
  const int64_t N = int64_t(s.B) * s.T;
  if (!storage.cuda) {
    if (!s.forward_only) scratch.attention_bytes = 4 * int64_t(s.B) * s.NH * s.T * s.T;  // dscores
    return scratch;  // (RoPE rotates q and k in place)
  }
  if (s.forward_only) {  // the forward's GEMMs, the head's loss sum and the RoPE table
    scratch.reduce_bytes = 8 * kReducePartials;
    scratch.gemm_bytes = kGemmWorkspaceBytes;
    scratch.rope_bytes = s.attention == AttentionKernel::Grass ? 4 * int64_t(s.T) * s.HD : 0;
    if (s.attention == AttentionKernel::Cudnn)
      scratch.attention_bytes = cudnn_attention_workspace_bytes(s.B, s.T, s.NH, s.HD);
    return scratch;
  }
  scratch.attention_bytes = 4 * int64_t(s.B) * s.NH * s.T;  // D = rowsum(dout ⊙ out)
  // cos and sin [T, HD/2] for the engine's kernels' loads; "mma" and cuDNN's take q and k rotated
  // in place, with no table
  scratch.rope_bytes = s.attention == AttentionKernel::Grass ? 4 * int64_t(s.T) * s.HD : 0;
  if (s.attention == AttentionKernel::Cudnn) {
    // cuDNN's workspace
    scratch.attention_bytes = cudnn_attention_workspace_bytes(s.B, s.T, s.NH, s.HD);
  }
  scratch.norm_bytes = 4 * std::min<int64_t>(N, kNormRowBlocks) * s.C;
  scratch.reduce_bytes = 8 * kReducePartials;  // the partial sums; the result is the caller's
  scratch.gemm_bytes = kGemmWorkspaceBytes;
  scratch.tokens_bytes = 4 * (3 * N + 1);  // positions [N], group starts [N + 1], tokens [N]
  // grass_slice_norms: one double per row or column of a projection (C, F or NH·HD wide; the
  // KV projections are narrower): 108 KiB at 13B, kept by every run rather than sized per
  // optimizer.
  scratch.slice_norms_bytes = 8 * std::max({s.C, s.F, s.NH * s.HD});
  return scratch;
}

}  // namespace grass
