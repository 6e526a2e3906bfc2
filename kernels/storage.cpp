#include "kernels/storage.h"

#include "src/core/error.h"

namespace grass {

const char* Storage::describe() const {
  switch (precision) {
    case Precision::F32: return "fp32";
    case Precision::Bf16Mixed:
      return cuda ? "bf16-mixed (bf16 weights, fp32 master weights and states)"
                  : "bf16-mixed (bf16-rounded weights, fp32 master weights and states)";
    case Precision::Bf16:
      return cuda ? "bf16 (bf16 weights, gradients and states, stochastic rounding)"
                  : "bf16 (bf16-rounded weights, gradients and states, stochastic rounding)";
  }
  return "?";
}

Storage make_storage(Precision precision, bool cuda) {
  Storage s;
  s.cuda = cuda;
  s.precision = precision;
  s.master = s.precision == Precision::Bf16Mixed;
  if (cuda) {  // bf16 where the precision says so; fp32 stays fp32
    const int half = s.bf16_weights() ? 2 : 4;
    s.weight_bytes = half;
    s.act_bytes = half;
    s.grad_bytes = s.pure_bf16() ? 2 : 4;
    s.state_bytes = s.pure_bf16() ? 2 : 4;
  }
  return s;
}

}  // namespace grass
