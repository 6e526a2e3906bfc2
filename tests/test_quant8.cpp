// The 8-bit blockwise quantizer (kernels/quant8.h) against bitsandbytes itself
// (tests/fixtures/quant8_ref, written by tools/reference/make_quant8_fixture.py from
// create_dynamic_map and quantize_blockwise) and against its own rules: the sign of m kept, no
// nonzero v decoding to 0, an all-zero block without a division, the nearest code everywhere else.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/quant8.h"

using grass::Quant8Map;

namespace {

const std::string kFixture = std::string(GRASS_SOURCE_DIR) + "/tests/fixtures/quant8_ref/fixture.json";

nlohmann::json fixture() {
  std::ifstream in(kFixture);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

std::vector<float> floats(const nlohmann::json& bits) {
  std::vector<float> out;
  for (const auto& b : bits) out.push_back(std::bit_cast<float>(b.get<uint32_t>()));
  return out;
}

// Whether the engine's rule moves a code off the nearest one: a nonzero value whose nearest code
// decodes to 0 or to the other sign.
bool guard_moves(const Quant8Map& map, float x, uint8_t nearest) {
  const float v = map.value[nearest];
  return (x > 0.0f && v <= 0.0f) || (x < 0.0f && v >= 0.0f);
}

}  // namespace

TEST_CASE("quant8: the dynamic maps are bitsandbytes' create_dynamic_map, bit for bit", "[quant8]") {
  const nlohmann::json f = fixture();
  for (const bool is_signed : {true, false}) {
    INFO((is_signed ? "signed" : "unsigned") << " map; " << f["source"].get<std::string>());
    const Quant8Map map = grass::dynamic_quant8_map(is_signed);
    const std::vector<float> want = floats(f[is_signed ? "signed_map" : "unsigned_map"]);
    REQUIRE(want.size() == 256);
    int differ = 0;
    for (int c = 0; c < 256; c++) differ += std::bit_cast<uint32_t>(map.value[c]) != std::bit_cast<uint32_t>(want[size_t(c)]);
    CHECK(differ == 0);
    CHECK(map.value[map.zero] == 0.0f);
    CHECK(map.value[255] == 1.0f);
    for (int c = 0; c < 255; c++) {
      CHECK(map.value[c] < map.value[c + 1]);
      CHECK((map.value[c] < map.bound[c] && map.bound[c] < map.value[c + 1]));
    }
  }
}

TEST_CASE("quant8: blockwise codes are bitsandbytes' quantize_blockwise codes", "[quant8]") {
  // bitsandbytes' portable rule gives the nearest code; the engine's is the same but for a
  // nonzero value whose nearest code decodes to 0 or the other sign, one further out (the
  // fixture's block of tiny values has them). The all-zero block is the map's 0 in both.
  const nlohmann::json f = fixture();
  const int block = f["block"].get<int>();
  const std::vector<float> x = floats(f["input"]);
  const int64_t n = int64_t(x.size());
  for (const bool is_signed : {true, false}) {
    INFO((is_signed ? "signed" : "unsigned"));
    const Quant8Map map = grass::dynamic_quant8_map(is_signed);
    std::vector<float> input = x;
    if (!is_signed)
      for (float& v : input) v = std::fabs(v);
    std::vector<uint8_t> codes(x.size());
    std::vector<float> absmax(size_t((n + block - 1) / block));
    grass::ops::quantize_blockwise(map, input.data(), n, block, codes.data(), absmax.data());
    const std::vector<float> want_absmax = floats(f[is_signed ? "signed_absmax" : "unsigned_absmax"]);
    const nlohmann::json& want_codes = f[is_signed ? "signed_codes" : "unsigned_codes"];
    REQUIRE(absmax.size() == want_absmax.size());
    for (size_t b = 0; b < absmax.size(); b++) CHECK(absmax[b] == want_absmax[b]);
    int64_t same = 0, guarded = 0, other = 0;
    for (int64_t i = 0; i < n; i++) {
      const int want = want_codes[size_t(i)].get<int>(), got = codes[size_t(i)];
      if (got == want) {
        same++;
      } else if (guard_moves(map, input[size_t(i)], uint8_t(want)) && std::abs(got - want) == 1) {
        guarded++;
      } else {
        other++;
        UNSCOPED_INFO("element " << i << ": x " << input[size_t(i)] << " code " << got
                                 << ", bitsandbytes " << want);
      }
    }
    INFO(same << " codes as bitsandbytes', " << guarded << " moved off 0 or the other sign");
    CHECK(other == 0);
    CHECK(guarded > 0);
    for (int64_t i = 5 * block; i < 6 * block; i++) CHECK(int(codes[size_t(i)]) == map.zero);
  }
}

TEST_CASE("quant8: the nearest code, no nonzero state at 0 or the other sign, zero blocks undivided",
          "[quant8]") {
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::student_t_distribution<float> heavy(3.0f);
  const int block = 256;
  const int64_t n = 64 * block + 37;
  std::vector<float> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) {
    m[size_t(i)] = heavy(rng) * 1e-3f;
    v[size_t(i)] = m[size_t(i)] * m[size_t(i)];
  }
  for (int64_t i = 5 * block; i < 6 * block; i++) m[size_t(i)] = v[size_t(i)] = 0.0f;  // a reset block
  m[7] = v[7] = 0.0f;
  for (const bool is_signed : {true, false}) {
    INFO((is_signed ? "signed (m)" : "unsigned (v)"));
    const Quant8Map map = grass::dynamic_quant8_map(is_signed);
    const std::vector<float>& x = is_signed ? m : v;
    std::vector<uint8_t> codes(x.size(), 0xAB);
    std::vector<float> absmax(size_t((n + block - 1) / block), std::numeric_limits<float>::quiet_NaN());
    std::vector<float> back(x.size(), std::numeric_limits<float>::quiet_NaN());
    grass::ops::quantize_blockwise(map, x.data(), n, block, codes.data(), absmax.data());
    grass::ops::dequantize_blockwise(map, codes.data(), absmax.data(), n, block, back.data());
    int64_t bad_sign = 0, zeroed = 0, not_nearest = 0;
    for (int64_t i = 0; i < n; i++) {
      const float xi = x[size_t(i)], a = absmax[size_t(i / block)];
      REQUIRE(std::isfinite(back[size_t(i)]));
      if (xi == 0.0f) {
        CHECK(back[size_t(i)] == 0.0f);
        continue;
      }
      if (std::signbit(back[size_t(i)]) != std::signbit(xi)) bad_sign++;
      if (back[size_t(i)] == 0.0f) zeroed++;
      // nearest: s (the rule's x · (1 / absmax), not x / absmax, which can differ in the last
      // bit) lies between the code's two bounds, a tie to the lower, unless a rule moved it by one
      const int c = codes[size_t(i)];
      const float s = xi * (1.0f / a);
      const bool above_lower = c == 0 || map.bound[c - 1] < s, within_upper = c == 255 || s <= map.bound[c];
      const int nearest = !above_lower ? c - 1 : !within_upper ? c + 1 : c;
      if (nearest != c && !(guard_moves(map, xi, uint8_t(nearest)) && std::abs(nearest - c) == 1))
        not_nearest++;
      // and no other value lies nearer than the chosen one by more than the rounding of a bound
      const float err = std::fabs(map.value[c] - s);
      for (const int d : {c - 1, c + 1})
        if (d >= 0 && d < 256 && !guard_moves(map, xi, uint8_t(d)) &&
            std::fabs(map.value[d] - s) < err - 2.0f * std::numeric_limits<float>::epsilon() * std::fabs(s))
          not_nearest++;
    }
    CHECK(bad_sign == 0);
    CHECK(zeroed == 0);
    CHECK(not_nearest == 0);
    for (int64_t i = 5 * block; i < 6 * block; i++) {
      CHECK(codes[size_t(i)] == map.zero);
      CHECK(absmax[5] == 0.0f);
    }
  }
}
