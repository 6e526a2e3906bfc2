// What every backend shares: its scratch, planned once per model and leased (kernels/backend.h).
#include "kernels/backend.h"

#include <algorithm>

namespace grass {

bool scratch_covers(const Storage& storage, const WorkspaceShape& a, const WorkspaceShape& b) {
  const BackendScratch x = backend_scratch(storage, a), y = backend_scratch(storage, b);
  return x.attention_bytes >= y.attention_bytes && x.norm_bytes >= y.norm_bytes &&
         x.reduce_bytes >= y.reduce_bytes && x.gemm_bytes >= y.gemm_bytes &&
         x.tokens_bytes >= y.tokens_bytes && x.slice_norms_bytes >= y.slice_norms_bytes &&
         x.rope_bytes >= y.rope_bytes && a.T >= b.T && a.HD == b.HD &&
         a.rope_theta == b.rope_theta && a.attention == b.attention &&
         // the GPU's head fills the caller's logits a chunk at a time: no more rows than b's
         // buffer holds (a forward-only model passes at most its buffer's rows to each call)
         (!storage.cuda || b.forward_only || b.V <= 0 ||
          head_chunk(a.V, a.head_chunk_rows) <= head_chunk(b.V, b.head_chunk_rows));
}

std::unique_ptr<ScratchLease> Backend::plan_scratch(Arena& arena, const WorkspaceShape& shape) {
  const BackendScratch sizes = backend_scratch(storage_, shape);
  auto take = [&](const char* name, int64_t bytes) {
    return bytes ? arena.alloc_bytes(MemCategory::Workspace, std::string("backend.") + name, bytes)
                 : nullptr;
  };
  BackendScratchPointers scratch;
  scratch.attention = take("attention", sizes.attention_bytes);
  scratch.norm = take("rmsnorm", sizes.norm_bytes);
  scratch.reduce = take("reduce", sizes.reduce_bytes);
  scratch.gemm = take("gemm", sizes.gemm_bytes);
  scratch.tokens = take("token_groups", sizes.tokens_bytes);
  scratch.slice_norms = take("slice_norms", sizes.slice_norms_bytes);
  scratch.rope = take("rope", sizes.rope_bytes);
  if (arena.planning()) return std::unique_ptr<ScratchLease>(new ScratchLease(nullptr, scratch, shape));
  std::unique_ptr<ScratchLease> lease(new ScratchLease(this, scratch, shape));
  init_scratch(*lease);
  leases_.push_back(lease.get());
  use_scratch(lease_in_use());
  return lease;
}

const ScratchLease* Backend::lease_in_use() const {
  const ScratchLease* best = nullptr;
  for (const ScratchLease* lease : leases_)  // a newer lease wins unless the one so far covers it
    if (!best || !scratch_covers(storage_, best->shape(), lease->shape()) ||
        scratch_covers(storage_, lease->shape(), best->shape()))
      best = lease;
  return best;
}

ScratchLease::~ScratchLease() {
  if (!backend_) return;
  std::vector<ScratchLease*>& leases = backend_->leases_;
  const bool in_use = backend_->lease_in_use() == this;
  leases.erase(std::remove(leases.begin(), leases.end(), this), leases.end());
  if (in_use) backend_->use_scratch(backend_->lease_in_use());
}

}  // namespace grass
