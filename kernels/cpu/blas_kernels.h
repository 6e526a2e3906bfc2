// Which OpenBLAS kernels run the CPU's GEMMs. OpenBLAS picks them by CPUID when the library
// loads; a CPU newer than the library gets its generic SSE3 "Prescott" kernels: Debian 12's
// OpenBLAS 0.3.21 does not know Emerald Rapids (family 6, model 207), where a 60M training run
// then took 2.95 times as long as with the SkylakeX kernels the CPU supports (docs/benchmarks.md).
#pragma once
#include <string>

namespace grass {

// The kernels OpenBLAS chose ("SkylakeX", "Haswell", "Prescott", ...).
std::string openblas_kernels();
// Whether `kernels` names one of OpenBLAS's SSE-only x86-64 kernel families, which it falls back
// to on a CPU it does not know.
bool sse_only_openblas_kernels(const std::string& kernels);
// The OPENBLAS_CORETYPE this CPU supports when OpenBLAS fell back to SSE-only kernels on a CPU
// with AVX2 or AVX-512 ("SkylakeX", "Haswell"), else "".
std::string better_openblas_kernels();
// First thing in main(): when OpenBLAS fell back and OPENBLAS_CORETYPE is unset, sets it to the
// supported kernels and executes this program again (same process, same arguments) so that
// OpenBLAS loads with them. A user's OPENBLAS_CORETYPE is never overridden. Returns only when
// nothing is to be done or the exec failed.
void reload_with_supported_openblas_kernels(char** argv);
// "SkylakeX", or "SkylakeX (set by grass: OpenBLAS chose Prescott on this CPU)" after a reload.
std::string describe_openblas_kernels();

}  // namespace grass
