// 8-bit blockwise quantization on the GPU (kernels/cuda/quant8.cu) against the CPU reference
// (kernels/cpu/quant8.cpp), code for code and bit for bit: issue 27's "same codes on the CPU and
// the GPU" over values that include 0 and -0, denormals, each block's ±absmax, NaN and ±Inf,
// blocks spanning magnitudes from 1e-30 to 1e30, an all-zero block and a last, shorter block.
// 10⁷ values on a GPU, 10⁶ on the emulator (its fibers are slower than a GPU's threads).
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/quant8.h"
#include "tests/gpu/gpu_test_util.h"

#if __has_include(<cuda_emu.h>)
constexpr int64_t kValues = 1000000;
#else
constexpr int64_t kValues = 10000000;
#endif

using namespace grass;
using namespace grass::gputest;

namespace {

// Fresh values: Gaussian blocks whose scale is 10^u, u uniform in [-30, 30], and the special
// values at random places (each block of 256 starts with a new scale).
std::vector<float> awkward_values(int64_t n) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-30.0f, 30.0f);
  std::uniform_int_distribution<int> special(0, 99);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f, -0.0f, 1e-40f, -3e-42f, std::numeric_limits<float>::quiet_NaN(),
                            inf, -inf, std::numeric_limits<float>::denorm_min()};
  std::vector<float> x(static_cast<size_t>(n));
  float scale = 1.0f;
  for (int64_t i = 0; i < n; i++) {
    if (i % 256 == 0) scale = std::pow(10.0f, exponent(rng));
    x[size_t(i)] = normal(rng) * scale;
    const int s = special(rng);
    if (s < 8) x[size_t(i)] = specials[s];
  }
  for (int64_t i = 512; i < 768 && i < n; i++) x[size_t(i)] = 0.0f;  // an all-zero block of 256
  return x;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

TEST_CASE("quant8: the GPU's codes, absmax and decoded values are the CPU's, bit for bit",
          "[gpu][quant8]") {
  TestContext tc;
  const int64_t n = kValues + 77;  // the last block shorter for every block size below
  const std::vector<float> x = awkward_values(n);
  DeviceBuffer<float> d_x(x.size()), d_back(x.size());
  DeviceBuffer<uint8_t> d_codes(x.size());
  d_x.upload(x);
  for (const bool is_signed : {true, false})
    for (const int block : {256, 2048, 100}) {
      INFO((is_signed ? "signed" : "unsigned") << " map, blocks of " << block);
      const Quant8Map map = dynamic_quant8_map(is_signed);
      const int64_t blocks = (n + block - 1) / block;
      std::vector<float> input = x;
      if (!is_signed)
        for (float& v : input) v = std::fabs(v);
      d_x.upload(input);
      DeviceBuffer<float> d_absmax(static_cast<size_t>(blocks));
      d_codes.poison();
      d_absmax.poison();
      d_back.poison();
      cuda::quantize_blockwise(tc.ctx, map, d_x.ptr, n, block, d_codes.ptr, d_absmax.ptr);
      cuda::dequantize_blockwise(tc.ctx, map, d_codes.ptr, d_absmax.ptr, n, block, d_back.ptr);
      std::vector<uint8_t> codes(x.size());
      std::vector<float> absmax(static_cast<size_t>(blocks)), back(x.size());
      ops::quantize_blockwise(map, input.data(), n, block, codes.data(), absmax.data());
      ops::dequantize_blockwise(map, codes.data(), absmax.data(), n, block, back.data());
      const std::vector<uint8_t> got = d_codes.download();
      int64_t differ = 0;
      for (int64_t i = 0; i < n; i++) differ += got[size_t(i)] != codes[size_t(i)];
      CHECK(differ == 0);
      CHECK(same_bits(d_absmax.download(), absmax));
      CHECK(same_bits(d_back.download(), back));
      if (block == 256) CHECK(absmax[2] == 0.0f);  // the all-zero block
    }
}
