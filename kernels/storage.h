// How a run stores its tensors: the precision ("fp32", "bf16-mixed", "bf16") decides what
// is bf16, what has an fp32 master copy, and where stochastic rounding happens; the device
// decides the bytes. The CPU backend keeps every tensor in fp32 memory but, in the bf16
// precisions, rounds what the GPU would store in bf16 (weights, gradients and optimizer states;
// activations stay fp32 on the CPU), so the bf16 logic runs and is tested without a GPU.
#pragma once

namespace grass {

// A run's precision, decided (a run config's "auto" is resolved in train/run_resolution.h).
enum class Precision { F32, Bf16Mixed, Bf16 };

struct Storage {
  Precision precision = Precision::F32;
  bool cuda = false;     // plans and allocates the CUDA backend's sizes
  int weight_bytes = 4;  // the weights the forward reads (bf16 on the GPU)
  int act_bytes = 4;     // activations and backward workspace
  int grad_bytes = 4;    // dense and compressed gradients
  int state_bytes = 4;   // optimizer moments
  bool master = false;   // an fp32 master copy of the weights (bf16-mixed)

  bool bf16_weights() const { return precision != Precision::F32; }
  // pure bf16: weights, gradients and moments are bf16; every optimizer store rounds
  // stochastically (E[round(x)] = x), so small updates are not lost to rounding.
  bool pure_bf16() const { return precision == Precision::Bf16; }
  const char* describe() const;  // "bf16-mixed (bf16 weights, fp32 master weights and states)"
};

// The storage of `precision` on the GPU (cuda) or the CPU.
Storage make_storage(Precision precision, bool cuda);

}  // namespace grass
