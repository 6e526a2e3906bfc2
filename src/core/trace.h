// NVTX ranges for Nsight Systems: the step's phases and the model's layers show up by name on the
// timeline (nsys profile build/grass train ...). Built without CUDA (no NVTX) they cost nothing.
#pragma once
#ifdef GRASS_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace grass {

class TraceRange {
 public:
#ifdef GRASS_HAVE_NVTX
  explicit TraceRange(const char* name) { nvtxRangePushA(name); }
  ~TraceRange() { nvtxRangePop(); }
#else
  explicit TraceRange(const char*) {}
#endif
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;
};

}  // namespace grass
