// The padded ffn on the GPU (run config pad_ffn, on by default with the CUDA backend): a model of
// LLaMA-1B's ffn 5461 stored 5464 wide trains as the unpadded one does, with its pad held at
// exactly zero, and its MLP GEMMs get 16-byte-aligned rows (tests/pad_ffn_runs.h says what the
// comparisons allow; docs/memory.md why the ffn is padded).
#include <catch2/catch.hpp>

#include "tests/pad_ffn_runs.h"

#if __has_include(<cuda_emu.h>)
#include <cuda_emu.h>
#define GRASS_TEST_CUDA_EMU 1
#endif

using namespace grass;

TEST_CASE("a padded ffn of 5461 trains on the GPU as the unpadded model does", "[gpu][pad]") {
  // The padded and unpadded GEMMs are different kernels on a GPU (cuBLASLt picks its kernel and
  // split-K by shape and alignment; the emulator's cuBLAS, a K tile by alignment), whose bf16 outputs
  // may round the other way: held to kPadBf16Outputs (tests/pad_ffn_runs.h says why); the pad
  // stays exactly +0.0.
  using test::kPadBf16Outputs, test::kPadStochastic;
  const test::PadCase c = GENERATE(test::PadCase{"adamw", "bf16-mixed", 2, 5461, kPadBf16Outputs},
                                   test::PadCase{"grass", "bf16-mixed", 2, 5461, kPadBf16Outputs},
                                   test::PadCase{"grass", "bf16", 1, 5461, kPadStochastic});
  test::check_padding_changes_nothing(c, /*cuda=*/true, /*steps=*/4);
}

#ifdef GRASS_TEST_CUDA_EMU
TEST_CASE("a padded ffn keeps every MLP GEMM on cuBLASLt", "[gpu][pad]") {
  // The emulator's cuBLASLt, like the real one's fast kernels, wants 16-byte-aligned rows: 5461
  // bf16 elements (2-byte rows) go to the cublasGemmEx fallback, 5464 do not.
  for (const bool pad : {true, false}) {
    INFO((pad ? "padded" : "unpadded"));
    RunConfig cfg = test::pad_ffn_run("adamw", "bf16-mixed", 1, 5461, pad);
    gputest::TrainingRun run(cfg, PrecisionChoice::Bf16Mixed, /*cuda=*/true);
    const uint64_t before = cuda_emu::gemm_ex_calls();
    const int64_t n = int64_t(cfg.micro_batch_size) * cfg.seq_len;
    train_step(run.state, cfg, 0, cfg.optimizer.lr, [&](int32_t* inputs, int32_t* targets) {
      for (int64_t i = 0; i < n; i++) {
        inputs[i] = int32_t((i * 37 + 5) % cfg.model.vocab_size);
        targets[i] = int32_t((i * 11 + 3) % cfg.model.vocab_size);
      }
    });
    run.backend->synchronize();
    // unpadded: gate and up forward, down forward, dX of down, gate and up, dW of all three
    CHECK((cuda_emu::gemm_ex_calls() - before == 0) == pad);
  }
}
#endif
