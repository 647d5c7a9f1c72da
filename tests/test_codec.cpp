// Tests of the codec arithmetic and CPU kernels (core/codec.h, core/cpu/codec.cpp): every ACTLAB_HD
// function against a naive version written here (directed bf16 rounding by search over all bf16 values,
// PyTorch's float nearest rule, double-precision rounding), and the fused plane/group kernels, AVX-512
// and portable paths both, against the reference codec (core/cpu/codec_ref.cpp), which draws
// philox_uniform8(seed, stream, index) one element at a time, byte for byte.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "actlab/core/codec.h"
#include "actlab/core/allocator.h"

namespace {

using namespace actlab;

// All finite bf16 values, sorted (−0 and +0 compare equal, so either may come back).
const std::vector<float>& finite_bf16_values() {
  static const std::vector<float> values = [] {
    std::vector<float> v;
    for (uint32_t h = 0; h < 65536; ++h) {
      const float f = bf16_to_float(static_cast<uint16_t>(h));
      if (std::isfinite(f)) v.push_back(f);
    }
    std::sort(v.begin(), v.end());
    return v;
  }();
  return values;
}
float naive_round_down(float f) {
  const auto& v = finite_bf16_values();
  return *(std::upper_bound(v.begin(), v.end(), f) - 1);
}
float naive_round_up(float f) {
  const auto& v = finite_bf16_values();
  return *std::lower_bound(v.begin(), v.end(), f);
}

std::vector<float> random_values(size_t n, uint32_t seed, float lo = -3.f, float hi = 3.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Runs the codec kernels at one level of hand-written SIMD paths (cpu::set_codec_simd) until destroyed, so
// the AVX2 and portable paths are checked on AVX-512 machines too.
class CodecSimd {
 public:
  explicit CodecSimd(cpu::CodecSimd level) : was_(cpu::set_codec_simd(level)) {}
  ~CodecSimd() { cpu::set_codec_simd(was_); }
  CodecSimd(const CodecSimd&) = delete;
  CodecSimd& operator=(const CodecSimd&) = delete;

 private:
  cpu::CodecSimd was_;
};

// The levels this CPU runs, widest first (a level it lacks would run the next one down: not listed, so
// each is checked once). The first test case says which they are, so a run on a CPU without AVX2 shows
// that the AVX2 paths went unchecked.
std::vector<cpu::CodecSimd> simd_levels() {
  std::vector<cpu::CodecSimd> levels;
  for (int k = static_cast<int>(cpu::codec_simd_supported()); k >= 0; --k) levels.push_back(static_cast<cpu::CodecSimd>(k));
  return levels;
}

// Planes of a 4-D tensor, (n, c, e) with `channels` per image and E elements each, moved to channels-last (n, e, c).
std::vector<float> moved_channels_last(const std::vector<float>& planes, int64_t channels, int64_t E) {
  std::vector<float> out(planes.size());
  const int64_t images = static_cast<int64_t>(planes.size()) / (channels * E);
  for (int64_t n = 0; n < images; ++n)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t e = 0; e < E; ++e)
        out[static_cast<size_t>((n * E + e) * channels + c)] = planes[static_cast<size_t>((n * channels + c) * E + e)];
  return out;
}

// Bitwise float equality (tells −0 from +0; the unpack paths must agree to the bit).
bool same_bits(float a, float b) { return float_bits(a) == float_bits(b); }

}  // namespace

TEST_CASE("codec: set_codec_simd caps the SIMD level and reports the one in force before") {
  const cpu::CodecSimd top = cpu::codec_simd_supported();
  std::string checked;
  for (const cpu::CodecSimd level : simd_levels()) checked += std::string(checked.empty() ? "" : ", ") + cpu::codec_simd_name(level);
  MESSAGE("codec paths checked on this CPU: " << checked);
  CHECK(cpu::set_codec_simd(cpu::CodecSimd::Portable) == top);
  CHECK(cpu::set_codec_simd(cpu::CodecSimd::Avx2) == cpu::CodecSimd::Portable);
  CHECK(cpu::set_codec_simd(cpu::CodecSimd::Avx512) == (top == cpu::CodecSimd::Portable ? top : cpu::CodecSimd::Avx2));
  CHECK(cpu::set_codec_simd(top) == top);
}

TEST_CASE("codec: bf16 directed rounding matches a search over all bf16 values") {
  std::mt19937 gen(7);
  std::vector<float> cases = {0.f, -0.f, 1.f, -1.f, 1e-40f, -1e-40f, 3.0e38f, -3.0e38f, 0.1f, -0.1f};
  for (int i = 0; i < 3000; ++i) {
    const float mag = std::ldexp(std::uniform_real_distribution<float>(1.f, 2.f)(gen),
                                 std::uniform_int_distribution<int>(-130, 120)(gen));
    cases.push_back(i % 2 ? mag : -mag);
  }
  for (float f : cases) {
    CAPTURE(f);
    CHECK(bf16_to_float(bf16_round_down(f)) == naive_round_down(f));
    CHECK(bf16_to_float(bf16_round_up(f)) == naive_round_up(f));
  }
}

TEST_CASE("codec: quant_params_from_keys gives quant_params' bits on every path, edge ranges included") {
  // Random ranges over the whole exponent range, constant ones (±0, subnormal, huge), ranges whose step falls
  // below the smallest normal float or whose width overflows (a min that rounds down to −inf, a step that rounds
  // up to +inf), infinite ends, NaN at either end (a negative NaN sorts below −inf, a positive one above +inf),
  // signalling NaNs (which truncate to ±inf but round to a quiet NaN), inverted keys (an empty reduction's
  // INT32_MAX/INT32_MIN), and bf16-exact ends; n = 16k + 5, so the sixteen-lane batches and the scalar tail both
  // run. Only the AVX-512 level has the lanes: at the others both sides are the scalar function (the message at
  // the top of this file names the levels this CPU checked).
  std::mt19937 gen(29);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float lowest = std::numeric_limits<float>::lowest(), largest = std::numeric_limits<float>::max();
  const auto key_of_bits = [](uint32_t bits) {  // float_order_key of the float with these bits, never in a register
    const int32_t i = static_cast<int32_t>(bits);
    return i ^ ((i >> 31) & 0x7FFFFFFF);
  };
  std::vector<std::pair<int32_t, int32_t>> keys;
  for (const auto& [lo, hi] : std::vector<std::pair<float, float>>{
           {0.f, 0.f},       {-0.f, 0.f},     {-0.f, -0.f},     {1e-40f, 1e-40f},  {-1e-40f, 1e-40f}, {3e38f, 3e38f},
           {-3e38f, 3e38f},  {1.f, 1.f + 1e-7f}, {1e-38f, 1.1e-38f}, {0.f, 1e-44f}, {-inf, 1.f},       {-1.f, inf},
           {-inf, inf},      {nan, 1.f},      {1.f, nan},       {-nan, -nan},      {1.5f, 2.25f},     {-0.375f, 0.5f},
           {lowest, 0.f},    {lowest, lowest}, {0.f, largest},  {lowest, largest}})
    keys.emplace_back(float_order_key(lo), float_order_key(hi));
  keys.emplace_back(key_of_bits(0xFF800001u), key_of_bits(0x3F800000u));  // a negative signalling NaN min
  keys.emplace_back(key_of_bits(0x3F800000u), key_of_bits(0x7F800001u));  // a positive signalling NaN max
  keys.emplace_back(key_of_bits(0xFFC00001u), key_of_bits(0x7FC00001u));  // quiet NaNs with payloads
  keys.emplace_back(INT32_MAX, INT32_MIN);                                // what a reduction over no values leaves
  for (int i = 0; i < 4000; ++i) {
    const auto value = [&] {
      const float mag = std::ldexp(std::uniform_real_distribution<float>(1.f, 2.f)(gen),
                                   std::uniform_int_distribution<int>(-149, 127)(gen));
      return gen() % 2 ? mag : -mag;
    };
    float lo = value(), hi = value();
    if (lo > hi) std::swap(lo, hi);
    if (i % 7 == 0) hi = lo;
    keys.emplace_back(float_order_key(lo), float_order_key(hi));
  }
  const size_t n = (keys.size() - 5) / 16 * 16 + 5;
  REQUIRE(n <= keys.size());
  std::vector<int32_t> lo_keys(n), hi_keys(n);
  for (size_t j = 0; j < n; ++j) lo_keys[j] = keys[j].first, hi_keys[j] = keys[j].second;
  for (const int bits : {1, 2, 4, 8}) {
    std::vector<uint16_t> want_mins(n), want_steps(n);
    for (size_t j = 0; j < n; ++j)
      quant_params(want_mins[j], want_steps[j], float_from_order_key(lo_keys[j]), float_from_order_key(hi_keys[j]), bits);
    for (const cpu::CodecSimd simd : simd_levels()) {
      const CodecSimd mode(simd);
      CAPTURE(cpu::codec_simd_name(simd));
      CAPTURE(bits);
      std::vector<uint16_t> mins(n), steps(n);
      cpu::quant_params_from_keys(mins.data(), steps.data(), lo_keys.data(), hi_keys.data(), static_cast<int64_t>(n),
                                  bits);
      int64_t differing = 0;
      for (size_t j = 0; j < n; ++j) {
        if ((mins[j] != want_mins[j] || steps[j] != want_steps[j]) && differing++ < 5)
          MESSAGE("keys " << lo_keys[j] << ", " << hi_keys[j] << ": min " << mins[j] << " step " << steps[j]
                          << ", quant_params " << want_mins[j] << " " << want_steps[j]);
      }
      CHECK(differing == 0);
    }
  }
}

TEST_CASE("codec: quant_params covers the range with the stored bf16 min and step") {
  std::mt19937 gen(11);
  for (int bits : {1, 2, 4, 8}) {
    const int levels = quant_levels(bits);
    for (int i = 0; i < 500; ++i) {
      const float scale = std::ldexp(1.f, std::uniform_int_distribution<int>(-20, 20)(gen));
      float lo = std::uniform_real_distribution<float>(-1.f, 1.f)(gen) * scale;
      float hi = lo + std::uniform_real_distribution<float>(0.f, 2.f)(gen) * scale;
      if (i % 50 == 0) hi = lo;  // constant plane
      uint16_t min_bits, step_bits;
      quant_params(min_bits, step_bits, lo, hi, bits);
      const float min = bf16_to_float(min_bits), step = bf16_to_float(step_bits);
      CAPTURE(lo);
      CAPTURE(hi);
      CHECK(min == naive_round_down(lo));
      REQUIRE(step > 0.f);
      CHECK(static_cast<double>(step) * levels >= static_cast<double>(hi) - min);
      if (hi - min > 0.f) {
        // Not wasteful: at most two bf16 ulps above the exact step.
        const double exact = (static_cast<double>(hi) - min) / levels;
        CHECK(step <= exact * (1.0 + 2.0 / 128.0));
      }
      for (float v : {lo, hi, lo + (hi - lo) * 0.37f}) {
        const float t = (v - min) / step;
        CHECK(t >= 0.f);
        CHECK(t <= static_cast<float>(levels));
      }
    }
  }
}

TEST_CASE("codec: a range too small for a normal step is coded within a step (the step is floored at 2^-126)") {
  // Denormal activations: a bf16 step of 9.2e-41 has no finite reciprocal, and every value used to take the
  // top code (3e-41 decoded as 2.34e-38 at Q = 8, 255 steps off).
  for (int bits : {1, 2, 4, 8}) {
    CAPTURE(bits);
    uint16_t min_bits, step_bits;
    quant_params(min_bits, step_bits, 0.f, 3e-41f, bits);
    CHECK(bf16_to_float(step_bits) == 0x1p-126f);
    CHECK(std::isfinite(quant_scale(bf16_to_float(step_bits))));
    const float step = bf16_to_float(step_bits);
    // Through the kernels, each SIMD level: planes of 0..3e-41 and of up to 1e-38 (a plane of 64 values
    // and one of 4), and the group codec.
    std::vector<float> x = random_values(64, 90 + bits, 0.f, 1e-38f);
    for (float v : {0.f, 1e-41f, 2e-41f, 3e-41f}) x.push_back(v);
    for (const cpu::CodecSimd level : simd_levels()) {
      const cpu::CodecSimd before = cpu::set_codec_simd(level);
      for (const auto& [offset, h, w] : {std::tuple<int64_t, int64_t, int64_t>{0, 8, 8}, {64, 2, 2}}) {
        const PlaneGeometry g = make_plane_geometry(1, h, w, 1, bits);
        std::vector<uint16_t> mins(1), steps(1);
        std::vector<uint8_t> codes(static_cast<size_t>(g.code_bytes_per_plane()));
        std::vector<float> out(static_cast<size_t>(h * w));
        cpu::plane_pack(nullptr, codes.data(), mins.data(), steps.data(), nullptr, x.data() + offset, g, false, 3, 4);
        cpu::plane_unpack(out.data(), nullptr, codes.data(), mins.data(), steps.data(), g);
        for (int64_t i = 0; i < h * w; ++i) CHECK(std::fabs(out[i] - x[offset + i]) < std::max(step, bf16_to_float(steps[0])));
      }
      GroupGeometry gg;
      gg.samples = 1, gg.sample_elems = 68, gg.group_size = 4, gg.bits = bits;
      std::vector<uint16_t> mins(gg.groups()), steps(gg.groups());
      std::vector<uint8_t> codes(gg.groups() * gg.code_bytes_per_group());
      std::vector<float> out(68);
      cpu::group_pack(codes.data(), mins.data(), steps.data(), x.data(), gg, 3, 4);
      cpu::group_unpack(out.data(), codes.data(), mins.data(), steps.data(), gg);
      for (int64_t i = 0; i < 68; ++i) CHECK(std::fabs(out[i] - x[i]) < std::max(step, bf16_to_float(steps[i / 4])));
      cpu::set_codec_simd(before);
    }
  }
}

TEST_CASE("codec: stochastic_code rounds to a neighbour, up with probability frac(t)") {
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  for (int bits : {1, 2, 8}) {
    const int levels = quant_levels(bits);
    for (int i = 0; i < 4000; ++i) {
      const float min = -0.75f, step = 0.125f;
      const float v = min + unit(gen) * step * levels;
      const float u = (std::floor(unit(gen) * 256.f) + 0.5f) / 256.f;  // an 8-bit midpoint uniform
      const double t = (static_cast<double>(v) - min) / step;  // step a power of two: 1/step is exact
      const double lower = std::floor(t);
      const uint32_t expected = static_cast<uint32_t>(lower) + (u < t - lower ? 1 : 0);
      CHECK(stochastic_code(v, min, quant_scale(step), u, levels) == std::min<uint32_t>(expected, levels));
    }
    // Out of range and NaN inputs clamp into [0, levels].
    CHECK(stochastic_code(-5.f, 0.f, 1.f, 0.99f, levels) == 0);
    CHECK(stochastic_code(1e9f, 0.f, 1.f, 0.99f, levels) == static_cast<uint32_t>(levels));
    CHECK(stochastic_code(std::nanf(""), 0.f, 1.f, 0.5f, levels) <= static_cast<uint32_t>(levels));
  }
}

TEST_CASE("codec: philox_uniform8 takes the bytes of the Philox words, 16 elements per block") {
  // Element i: byte i & 3 of word (i >> 2) & 3 of block i >> 4 — that is 32-bit draw i >> 2 of
  // core/philox.h's philox_bits (4 words per block) — and u is the midpoint of the byte's cell.
  for (uint64_t seed : {0ull, 99ull, 0x123456789ABCull})
    for (uint64_t stream : {0ull, 7ull, 1ull << 40})
      for (uint64_t i : {0ull, 1ull, 2ull, 3ull, 4ull, 7ull, 8ull, 13ull, 15ull, 16ull, 1000001ull, (1ull << 35) + 5}) {
        const uint32_t byte = (philox_bits(seed, stream, i >> 2) >> (8 * (i % 4))) & 0xFFu;
        CHECK(philox_bits8(seed, stream, i) == byte);
        CHECK(philox_uniform8(seed, stream, i) == (static_cast<float>(byte) + 0.5f) / 256.f);
      }
  // Uniform on (0, 1): 16 equal bins over 2^16 draws, each within 5 standard errors.
  std::vector<int> bins(16, 0);
  const int draws = 1 << 16;
  double mean = 0.0;
  for (int i = 0; i < draws; ++i) {
    const float u = philox_uniform8(5, 6, static_cast<uint64_t>(i));
    REQUIRE(u > 0.f);
    REQUIRE(u < 1.f);
    ++bins[static_cast<int>(u * 16.f)];
    mean += u;
  }
  for (int b : bins) CHECK(std::abs(b - draws / 16) < 5 * std::sqrt(draws / 16.0));
  CHECK(std::fabs(mean / draws - 0.5) < 5 * std::sqrt(1.0 / 12 / draws));
}

TEST_CASE("codec: 8-bit midpoint stochastic rounding is unbiased to within 2^-9 of a step") {
  // Exact expectation over all 2^8 equally likely uniforms: |E[code] − t| <= 2^-9, of either sign, and
  // zero on average over t.
  std::mt19937 gen(21);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  for (const float step : {0.25f, 0.3f, 1.7e-3f}) {  // 0.25: an exact scale; the others round 1/step
    CAPTURE(step);
    const float min = -1.f;
    double worst_low = 0.0, worst_high = 0.0, mean_bias = 0.0;
    const int values = 2000;
    for (int i = 0; i < values; ++i) {
      const float v = min + unit(gen) * 3.f * step;
      const double t = (static_cast<double>(v) - min) / step;
      double sum = 0.0;
      for (uint32_t bits = 0; bits < 256; ++bits) sum += stochastic_code(v, min, quant_scale(step), uniform8(bits), 3);
      const double bias = sum / 256.0 - t;
      CHECK(std::fabs(bias) <= 1.0 / 512.0 + 1e-6);  // 1e-6: t computed with one rounded scale
      worst_low = std::min(worst_low, bias), worst_high = std::max(worst_high, bias);
      mean_bias += bias / values;
    }
    CHECK(worst_low < -1.0 / 1024.0);  // both signs occur: the bound above is not vacuous
    CHECK(worst_high > 1.0 / 1024.0);
    CHECK(std::fabs(mean_bias) < 1.0 / 512.0 / 10.0);  // and cancel on average
  }
  // With the real Philox draws: the mean code of 2^20 copies of one value is t within 5 standard errors.
  const float min = -1.f, step = 0.25f;
  const int64_t n = 1 << 20;
  const float v = min + 1.3f * step;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i)
    sum += stochastic_code(v, min, quant_scale(step), philox_uniform8(3, 4, static_cast<uint64_t>(i)), 3);
  const double t = (static_cast<double>(v) - min) / step;
  CHECK(std::fabs(sum / n - t) < 5.0 * 0.5 / std::sqrt(static_cast<double>(n)) + 1.0 / 512.0);
}

TEST_CASE("codec: nearest_source, lfc_from_sum, dequantize and unpack_code match naive versions") {
  // PyTorch's rule: scale = (float)in/out, src = min(floor(dst*scale), in-1).
  for (int64_t out : {1, 4, 6, 7, 10, 14, 16, 28, 32, 56}) {
    for (int64_t in = 1; in <= out; ++in) {
      const float scale = static_cast<float>(in) / static_cast<float>(out);
      for (int64_t dst = 0; dst < out; ++dst) {
        const int64_t torch_src = std::min<int64_t>(static_cast<int64_t>(std::floor(dst * scale)), in - 1);
        CHECK(nearest_source(dst, in, out) == torch_src);
      }
    }
  }
  for (float sum : random_values(200, 5, -100.f, 100.f)) {
    for (int64_t area : {1, 4, 49, 64}) CHECK(lfc_from_sum(sum, area) == float_to_bf16(sum / static_cast<float>(area)));
  }
  for (uint32_t code = 0; code < 256; ++code)
    CHECK(dequantize(code, -1.5f, 0.0078125f) == static_cast<float>(-1.5 + code * 0.0078125));
  const std::vector<uint8_t> run = {0xB4, 0x1E, 0xFF, 0x00, 0x5A};
  for (int bits : {1, 2, 4, 8}) {
    for (int64_t e = 0; e < 40 / bits; ++e) {
      uint32_t naive = 0;
      for (int b = 0; b < bits; ++b) naive |= ((run[(e * bits + b) / 8] >> ((e * bits + b) % 8)) & 1u) << b;
      CHECK(unpack_code(run.data(), e, bits) == naive);
    }
  }
}

namespace {

// cpu::plane_pack_ref (core/cpu/codec_ref.cpp, the specification) into vectors.
struct NaivePlanes {
  std::vector<uint16_t> lfc, mins, steps;
  std::vector<uint8_t> codes;
  std::vector<float> residual;
};
NaivePlanes naive_plane_pack(const std::vector<float>& x, const PlaneGeometry& g, bool with_lfc, uint64_t seed,
                             uint64_t stream) {
  NaivePlanes out;
  out.lfc.assign(g.planes * g.lfc_elems(), 0);
  out.codes.assign(g.planes * g.code_bytes_per_plane(), 0);
  out.mins.assign(g.ranges(), 0);
  out.steps.assign(g.ranges(), 0);
  out.residual.assign(g.planes * g.plane_elems(), 0.f);
  cpu::plane_pack_ref(with_lfc ? out.lfc.data() : nullptr, g.bits ? out.codes.data() : nullptr, out.mins.data(),
                      out.steps.data(), out.residual.data(), x.data(), g, with_lfc, seed, stream);
  return out;
}

}  // namespace

TEST_CASE("codec: plane_pack and plane_unpack match the per-element spec byte for byte") {
  const int64_t live_before = memory_stats().total.current;
  // token: a (samples, tokens, features) map, pooled along the tokens only (make_token_geometry); rows: the
  // geometry's range_rows (one min and step per that many rows; a last range cut short is zero-padded).
  // Planes of run-time extents 16 or more wide take the row routines when simd is on and the CPU has
  // AVX-512BW (row_plane_keys/codes, unpack_row_plane): 64-wide chunks, masked row tails, codes bit-packed
  // from registers or (rows of several ranges off the vector grid, e.g. 50×50 as one range) through the
  // byte scratch; LFC rows as they are, permuted (<= 16 values) or gathered (25 values of 40×200).
  struct Case { int64_t planes, h, w, block; int bits; bool token = false; int64_t rows = 0; };
  const Case cases[] = {{6, 32, 32, 8, 2}, {4, 28, 28, 8, 4}, {15, 7, 7, 8, 2}, {15, 4, 4, 8, 1}, {5, 6, 10, 4, 8},
                        {7, 14, 14, 8, 2}, {3, 1, 10, 8, 2}, {40, 1, 3, 2, 4}, {2, 9, 5, 3, 1},
                        {70, 8, 8, 8, 2}, {6, 8, 8, 4, 4}, {300, 4, 4, 8, 2}, {9, 16, 16, 8, 4}, {2, 56, 56, 8, 2},
                        {5, 32, 32, 8, 1}, {4, 32, 32, 8, 4}, {3, 32, 32, 8, 8}, {6, 16, 16, 8, 2}, {4, 16, 16, 8, 1},
                        {3, 16, 16, 8, 8}, {4, 65, 192, 8, 2, true}, {3, 5, 6, 8, 4, true}, {2, 17, 33, 4, 1, true},
                        {2, 64, 48, 8, 8, true}, {3, 50, 16, 16, 2, true},
                        {4, 50, 192, 8, 2, true, 1}, {3, 50, 50, 8, 2, true, 1}, {2, 17, 33, 4, 1, true, 4},
                        {2, 50, 64, 8, 4, true, 3}, {3, 32, 32, 8, 2, false, 8}, {5, 6, 10, 4, 8, false, 4},
                        {9, 8, 8, 8, 1, false, 3}, {3, 8, 8, 8, 2, false, 20}, {3, 20, 128, 8, 1, true},
                        {2, 9, 64, 4, 8, true, 2}, {3, 5, 128, 8, 4, false, 2}, {2, 33, 256, 8, 2, true, 4},
                        {3, 50, 64, 8, 2, false, 1}, {3, 50, 64, 8, 2}, {3, 50, 50, 8, 2, false, 1}, {3, 50, 50, 8, 2},
                        {2, 50, 50, 8, 4, false, 3}, {2, 20, 48, 8, 1, false, 1}, {2, 20, 48, 8, 8, false, 3},
                        {2, 23, 17, 4, 4, false, 1}, {2, 23, 17, 4, 1, true, 1}, {2, 19, 37, 8, 2, true, 1},
                        {2, 40, 200, 8, 2, false, 1}, {2, 112, 112, 8, 2}, {12, 20, 20, 8, 4, false, 1},
                        {12, 20, 20, 8, 2}, {5, 8, 8, 8, 1}, {5, 8, 8, 8, 4}, {5, 8, 8, 8, 8}, {20, 4, 4, 8, 4},
                        {20, 4, 4, 8, 8}};
  uint32_t seed_counter = 1;
  for (const Case& c : cases) {
    PlaneGeometry g = c.token ? make_token_geometry(c.planes, c.h, c.w, c.block, c.bits)
                              : make_plane_geometry(c.planes, c.h, c.w, c.block, c.bits);
    g.range_rows = c.rows;
    CHECK(g.ranges_per_plane() == (c.rows > 0 ? (c.h + std::min(c.rows, c.h) - 1) / std::min(c.rows, c.h) : 1));
    if (c.token) {
      CHECK(g.block_w == 1);
      CHECK(g.lfc_w == c.w);
      CHECK(g.block_h == std::min(c.block, c.h));
    }
    const int64_t E = g.plane_elems();
    const std::vector<float> x = random_values(static_cast<size_t>(c.planes * E), seed_counter++);
    for (const cpu::CodecSimd simd : simd_levels())
    for (bool with_lfc : {true, false}) {
      const CodecSimd mode(simd);
      CAPTURE(c.h);
      CAPTURE(c.w);
      CAPTURE(c.rows);
      CAPTURE(with_lfc);
      CAPTURE(cpu::codec_simd_name(simd));
      const uint64_t seed = 1234 + c.bits, stream = 77 + c.planes;
      const NaivePlanes want = naive_plane_pack(x, g, with_lfc, seed, stream);
      std::vector<uint16_t> lfc(want.lfc.size(), 0xFFFF), mins(g.ranges()), steps(g.ranges());
      std::vector<uint8_t> codes(want.codes.size(), 0xAA);
      std::vector<float> residual(x.size(), -1.f);
      cpu::plane_pack(with_lfc ? lfc.data() : nullptr, codes.data(), mins.data(), steps.data(), residual.data(),
                      x.data(), g, with_lfc, seed, stream);
      if (with_lfc) CHECK(lfc == want.lfc);
      CHECK(mins == want.mins);
      CHECK(steps == want.steps);
      CHECK(codes == want.codes);
      CHECK(residual == want.residual);
      // Without the f32 residual output (what the division policy asks for; 32², 16², 8² and 4² planes with
      // B = 8 and one range then take the register routines when simd is on and the CPU has AVX-512BW,
      // whose unpack decodes straight from the runs): the same bytes.
      std::vector<uint16_t> lfc2(want.lfc.size(), 0xFFFF), mins2(g.ranges()), steps2(g.ranges());
      std::vector<uint8_t> codes2(want.codes.size(), 0x55);
      cpu::plane_pack(with_lfc ? lfc2.data() : nullptr, codes2.data(), mins2.data(), steps2.data(), nullptr, x.data(),
                      g, with_lfc, seed, stream);
      if (with_lfc) CHECK(lfc2 == want.lfc);
      CHECK(mins2 == want.mins);
      CHECK(steps2 == want.steps);
      CHECK(codes2 == want.codes);
      if (with_lfc) {  // the LFC pooled but not stored (the hfc policy): the codes of the residual all the same
        std::vector<uint8_t> codes3(want.codes.size(), 0x33);
        cpu::plane_pack(nullptr, codes3.data(), mins2.data(), steps2.data(), nullptr, x.data(), g, true, seed, stream);
        CHECK(codes3 == want.codes);
      }

      // Unpack: LFC↑ + dequantized codes, per element, as the reference codec computes them.
      std::vector<float> out(x.size());
      cpu::plane_unpack(out.data(), with_lfc ? lfc.data() : nullptr, codes.data(), mins.data(), steps.data(), g);
      std::vector<float> ref(x.size());
      cpu::plane_unpack_ref(ref.data(), with_lfc ? lfc.data() : nullptr, codes.data(), mins.data(), steps.data(), g);
      CHECK(std::memcmp(ref.data(), out.data(), out.size() * sizeof(float)) == 0);
    }
  }
  CHECK(memory_stats().total.current == live_before);
}

TEST_CASE("codec: plane_pack is independent of the thread count and LFC-only unpack is LFC↑") {
  // 64×16×16 is above the parallel threshold (two threads split the planes); 40×7×7 has a 1×1 LFC; the
  // token map codes one range per token (range_rows = 1).
  PlaneGeometry tokens = make_token_geometry(64, 50, 64, 8, 2);
  tokens.range_rows = 1;
  for (const PlaneGeometry& g : {make_plane_geometry(64, 16, 16, 8, 2), make_plane_geometry(40, 7, 7, 8, 2), tokens}) {
    const int64_t E = g.plane_elems(), LE = g.lfc_elems();
    const std::vector<float> x = random_values(static_cast<size_t>(g.planes * E), 99);
    std::vector<uint16_t> lfc(g.planes * LE), mins(g.ranges()), steps(g.ranges());
    std::vector<uint8_t> codes(g.planes * g.code_bytes_per_plane());
    cpu::plane_pack(lfc.data(), codes.data(), mins.data(), steps.data(), nullptr, x.data(), g, true, 5, 6);
    const NaivePlanes want = naive_plane_pack(x, g, true, 5, 6);
    CHECK(lfc == want.lfc);
    CHECK(mins == want.mins);
    CHECK(codes == want.codes);
    std::vector<float> up(x.size());
    cpu::plane_unpack(up.data(), lfc.data(), nullptr, nullptr, nullptr, g);
    bool all_equal = true;
    for (int64_t p = 0; p < g.planes; ++p)
      for (int64_t h = 0; h < g.height; ++h)
        for (int64_t w = 0; w < g.width; ++w) {
          const int64_t i = h * g.lfc_h / g.height, j = w * g.lfc_w / g.width;
          all_equal = all_equal && up[p * E + h * g.width + w] == bf16_to_float(lfc[p * LE + i * g.lfc_w + j]);
        }
    CHECK(all_equal);
  }
}

TEST_CASE("codec: plane_pack_channels_last writes plane_pack's bytes from the channels-last tensor") {
  // Register shapes (32², 16², 8², 4²), odd ones, planes over 1024 elements (sixteen-channel tiles), channel counts
  // on and off the sixteen grid, one tile per image and several (a partial last one: 40 channels of 32²), codes
  // without an LFC (quant) and an LFC without codes (lfc), several code ranges per plane, and the residual output;
  // every SIMD level. On AVX-512 the sixteen-channel groups (channels % 16 == 0, one range, no residual) take the
  // lane-per-plane path: Q = 1, 2, 4, 8, blocks that do not tile the plane (12² with B = 8) and 56² (49 LFC values)
  // among them, and planes whose draws do not start on a Philox block (7², 14², 2², 5×3: E % 16 != 0) with their
  // partial last chunk of positions; a NaN and an inf in one plane each.
  struct Case {
    int64_t n, c, h, w, bits, range_rows;
    bool with_lfc, with_codes;
  };
  for (const Case& k : {Case{2, 16, 32, 32, 2, 0, true, true}, Case{3, 37, 16, 16, 2, 0, true, true},
                        Case{2, 64, 8, 8, 4, 0, true, true}, Case{4, 96, 4, 4, 2, 0, true, true},
                        Case{2, 20, 7, 7, 2, 0, true, true}, Case{1, 3, 32, 32, 8, 0, true, true},
                        Case{2, 40, 32, 32, 2, 0, true, true}, Case{2, 48, 48, 48, 2, 0, true, true},
                        Case{2, 32, 16, 16, 2, 0, false, true}, Case{2, 32, 16, 16, 2, 0, true, false},
                        Case{2, 32, 16, 16, 2, 4, true, true}, Case{2, 32, 16, 16, 1, 0, true, true},
                        Case{3, 16, 8, 8, 8, 0, true, true}, Case{2, 16, 12, 12, 2, 0, true, true},
                        Case{2, 32, 56, 56, 4, 0, true, true}, Case{2, 16, 7, 7, 2, 0, true, true},
                        Case{3, 32, 14, 14, 4, 0, true, true}, Case{2, 16, 14, 14, 1, 0, true, true},
                        Case{2, 16, 2, 2, 2, 0, true, true}, Case{1, 16, 5, 3, 8, 0, true, true},
                        Case{2, 16, 7, 7, 2, 0, false, true}}) {
    CAPTURE(k.c);
    CAPTURE(k.h);
    CAPTURE(k.range_rows);
    CAPTURE(k.with_lfc);
    CAPTURE(k.with_codes);
    PlaneGeometry g = make_plane_geometry(k.n * k.c, k.h, k.w, 8, static_cast<int>(k.bits));
    g.range_rows = k.range_rows;
    const int64_t E = g.plane_elems();
    std::vector<float> x = random_values(static_cast<size_t>(g.planes * E), 17);
    x[static_cast<size_t>(E + 3)] = std::numeric_limits<float>::quiet_NaN();  // plane 1
    x[static_cast<size_t>(2 * E + 5)] = std::numeric_limits<float>::infinity();  // plane 2
    const std::vector<float> x_cl = moved_channels_last(x, k.c, E);
    for (const cpu::CodecSimd simd : simd_levels()) {
      const CodecSimd mode(simd);
      CAPTURE(cpu::codec_simd_name(simd));
      for (const bool with_residual : {false, true}) {
        std::vector<uint16_t> lfc(g.planes * g.lfc_elems()), mins(g.ranges()), steps(g.ranges());
        std::vector<uint8_t> codes(g.planes * g.code_bytes_per_plane());
        std::vector<float> residual(with_residual ? x.size() : 0);
        auto lfc2 = lfc, mins2 = mins, steps2 = steps;
        auto codes2 = codes;
        auto residual2 = residual;
        uint8_t* const c1 = k.with_codes ? codes.data() : nullptr;
        uint8_t* const c2 = k.with_codes ? codes2.data() : nullptr;
        cpu::plane_pack(lfc.data(), c1, mins.data(), steps.data(), with_residual ? residual.data() : nullptr, x.data(), g,
                        k.with_lfc, 5, 6);
        cpu::plane_pack_channels_last(lfc2.data(), c2, mins2.data(), steps2.data(),
                                      with_residual ? residual2.data() : nullptr, x_cl.data(), g, k.c, k.with_lfc, 5, 6);
        CHECK(lfc2 == lfc);
        CHECK(codes2 == codes);
        CHECK(mins2 == mins);
        CHECK(steps2 == steps);
        // NaN bits too; no memcmp of empty vectors (their data() may be null, which memcmp must not be given).
        CHECK((residual.empty() || std::memcmp(residual2.data(), residual.data(), residual.size() * sizeof(float)) == 0));
      }
    }
  }
  // The residual's codes with the LFC pooled but not stored (hfc's pack), and a seed and stream whose high words
  // are set (the Philox counter's and key's upper halves), on a plane whose draws do not start on a block.
  {
    const PlaneGeometry g = make_plane_geometry(3 * 32, 14, 14, 8, 2);
    const int64_t E = g.plane_elems();
    const std::vector<float> x = random_values(static_cast<size_t>(g.planes * E), 23);
    const std::vector<float> x_cl = moved_channels_last(x, 32, E);
    const uint64_t seed = 0x9E3779B97F4A7C15ull, stream = 0xD1B54A32D192ED03ull;
    for (const cpu::CodecSimd simd : simd_levels()) {
      const CodecSimd mode(simd);
      CAPTURE(cpu::codec_simd_name(simd));
      std::vector<uint16_t> mins(g.ranges()), steps(g.ranges());
      std::vector<uint8_t> codes(g.planes * g.code_bytes_per_plane());
      auto mins2 = mins, steps2 = steps;
      auto codes2 = codes;
      cpu::plane_pack(nullptr, codes.data(), mins.data(), steps.data(), nullptr, x.data(), g, true, seed, stream);
      cpu::plane_pack_channels_last(nullptr, codes2.data(), mins2.data(), steps2.data(), nullptr, x_cl.data(), g, 32,
                                    true, seed, stream);
      CHECK(codes2 == codes);
      CHECK(mins2 == mins);
      CHECK(steps2 == steps);
    }
  }
  std::vector<float> x(24);
  CHECK_THROWS_AS(cpu::plane_pack_channels_last(nullptr, nullptr, nullptr, nullptr, nullptr, x.data(),
                                                make_plane_geometry(6, 2, 2, 2, 2), 4, true, 1, 2),
                  Error);  // 6 planes are not images of 4 channels
}

TEST_CASE("codec: a plane pack of several ranges is the group codec over the residual, range by range") {
  // What the CUDA codec runs for range_rows (core/cuda/codec.cu): the plane pack's LFC and f32 residual,
  // then group_pack with every plane a sample and every range a group. The same draws (element e of plane
  // p at p·E + e) and the same zero padding give the same bytes; the decode adds LFC↑ to group_unpack's.
  struct Case { int64_t planes, h, w, rows; int bits; };
  for (const Case& c : {Case{4, 50, 192, 1, 2}, Case{3, 17, 33, 4, 1}, Case{2, 50, 50, 1, 4}, Case{5, 6, 10, 4, 8}}) {
    CAPTURE(c.h);
    CAPTURE(c.rows);
    PlaneGeometry g = make_token_geometry(c.planes, c.h, c.w, 8, c.bits);
    g.range_rows = c.rows;
    const int64_t E = g.plane_elems();
    const std::vector<float> x = random_values(static_cast<size_t>(c.planes * E), 31);
    std::vector<uint16_t> lfc(g.planes * g.lfc_elems()), mins(g.ranges()), steps(g.ranges());
    std::vector<uint8_t> codes(g.planes * g.code_bytes_per_plane());
    cpu::plane_pack(lfc.data(), codes.data(), mins.data(), steps.data(), nullptr, x.data(), g, true, 8, 2);

    std::vector<float> residual(x.size());
    std::vector<uint16_t> lfc2(lfc.size()), mins2(mins.size()), steps2(steps.size());
    cpu::plane_pack(lfc2.data(), nullptr, nullptr, nullptr, residual.data(), x.data(), g, true, 8, 2);
    GroupGeometry groups;
    groups.samples = g.planes, groups.sample_elems = E, groups.group_size = g.range_elems(), groups.bits = c.bits;
    REQUIRE(groups.groups() == g.ranges());
    REQUIRE(groups.code_bytes_per_group() == g.code_bytes_per_range());
    std::vector<uint8_t> codes2(codes.size());
    cpu::group_pack(codes2.data(), mins2.data(), steps2.data(), residual.data(), groups, 8, 2);
    CHECK(lfc2 == lfc);
    CHECK(mins2 == mins);
    CHECK(steps2 == steps);
    CHECK(codes2 == codes);

    std::vector<float> out(x.size()), decoded(x.size()), up(x.size());
    cpu::plane_unpack(out.data(), lfc.data(), codes.data(), mins.data(), steps.data(), g);
    cpu::group_unpack(decoded.data(), codes.data(), mins.data(), steps.data(), groups);
    cpu::plane_unpack(up.data(), lfc.data(), nullptr, nullptr, nullptr, g);
    bool all_equal = true;
    for (size_t i = 0; i < out.size(); ++i) all_equal = all_equal && same_bits(out[i], up[i] + decoded[i]);
    CHECK(all_equal);
  }
  // The channel decoders read one range per plane and say so for more.
  PlaneGeometry g = make_plane_geometry(16, 4, 4, 8, 2);
  g.range_rows = 1;
  std::vector<float> out(16 * 16);
  std::vector<uint16_t> lfc(16), mins(g.ranges()), steps(g.ranges());
  std::vector<uint8_t> codes(g.planes * g.code_bytes_per_plane());
  CHECK_THROWS_AS(cpu::plane_unpack_channel(out.data(), lfc.data(), codes.data(), mins.data(), steps.data(), g, 16, 0),
                  Error);
  CHECK_THROWS_AS(cpu::plane_unpack_blocked(out.data(), lfc.data(), codes.data(), mins.data(), steps.data(), g, 16),
                  Error);
}

// A division pack (LFC + codes, B = 8) of random planes, and the three decodings it offers by the terms
// passed: 0 LFC + codes (division), 1 codes only (quant), 2 LFC only (lfc).
struct RandomPlanePack {
  PlaneGeometry g;
  std::vector<uint16_t> lfc, mins, steps;
  std::vector<uint8_t> codes;
  RandomPlanePack(int64_t planes, int64_t h, int64_t w, int bits, uint32_t seed)
      : g(make_plane_geometry(planes, h, w, 8, bits)), lfc(g.planes * g.lfc_elems()), mins(g.planes),
        steps(g.planes), codes(g.planes * g.code_bytes_per_plane()) {
    const std::vector<float> x = random_values(static_cast<size_t>(g.planes * g.plane_elems()), seed);
    cpu::plane_pack(lfc.data(), codes.data(), mins.data(), steps.data(), nullptr, x.data(), g, true, seed, 4);
  }
  const uint16_t* lfc_for(int terms) const { return terms == 1 ? nullptr : lfc.data(); }
  const uint8_t* codes_for(int terms) const { return terms == 2 ? nullptr : codes.data(); }
  // plane_unpack of the decoding `terms` selects: the reference the other unpack layouts are checked against.
  // The reference decode (plane_unpack_ref, which the plane_pack test checks against the spec): the fast
  // plane_unpack shares its direct decode with the channel reads these tests check.
  std::vector<float> planes(int terms) const {
    std::vector<float> out(static_cast<size_t>(g.planes * g.plane_elems()));
    cpu::plane_unpack_ref(out.data(), lfc_for(terms), codes_for(terms), mins.data(), steps.data(), g);
    return out;
  }
};

TEST_CASE("codec: plane_unpack_channel writes the reference decode's planes of one channel") {
  // (samples, channels, h, w, bits): compile-time maps (with codes, 32², 16², 8², 4² decode straight from
  // the code run when simd is on and the CPU has AVX-512BW; Q = 1, 2, 4, 8 each occur among them; 7×7 does
  // not), a generic one (6×10) and a map smaller than B in one axis (3×12). Compared bit for bit with
  // plane_unpack_ref, with and without the AVX-512 paths.
  struct Case { int64_t n, c, h, w; int bits; };
  for (const Case& k : {Case{3, 5, 32, 32, 2}, Case{2, 3, 32, 32, 1}, Case{2, 2, 32, 32, 8}, Case{3, 3, 16, 16, 4},
                        Case{2, 3, 16, 16, 2}, Case{3, 2, 8, 8, 8}, Case{2, 4, 8, 8, 2}, Case{2, 3, 7, 7, 4},
                        Case{4, 2, 4, 4, 1}, Case{3, 3, 4, 4, 4}, Case{2, 3, 6, 10, 8}, Case{3, 2, 3, 12, 2}}) {
    const RandomPlanePack pk(k.n * k.c, k.h, k.w, k.bits, 9);
    const PlaneGeometry& g = pk.g;
    const int64_t E = g.plane_elems();
    for (int terms = 0; terms < 3; ++terms) {
      CAPTURE(k.h);
      CAPTURE(k.w);
      CAPTURE(terms);
      const uint16_t *l = pk.lfc_for(terms), *mins = pk.mins.data(), *steps = pk.steps.data();
      const uint8_t* c = pk.codes_for(terms);
      const std::vector<float> planes = pk.planes(terms);
      for (const cpu::CodecSimd simd : simd_levels()) {
        const CodecSimd mode(simd);
        CAPTURE(cpu::codec_simd_name(simd));
        bool all_equal = true;
        for (int64_t ch = 0; ch < k.c; ++ch) {
          std::vector<float> channel(static_cast<size_t>(k.n * E), -1.f);
          cpu::plane_unpack_channel(channel.data(), l, c, mins, steps, g, k.c, ch);
          for (int64_t n = 0; n < k.n; ++n)
            for (int64_t e = 0; e < E; ++e)
              all_equal = all_equal && same_bits(channel[n * E + e], planes[(n * k.c + ch) * E + e]);
        }
        CHECK(all_equal);
      }
    }
  }
  std::vector<float> out(16);
  std::vector<uint16_t> lfc(6);
  const PlaneGeometry g = make_plane_geometry(6, 2, 2, 2, 2);
  CHECK_THROWS_AS(cpu::plane_unpack_channel(out.data(), lfc.data(), nullptr, nullptr, nullptr, g, 4, 0), Error);
  CHECK_THROWS_AS(cpu::plane_unpack_channel(out.data(), lfc.data(), nullptr, nullptr, nullptr, g, 3, 3), Error);
}

// The cases of the sixteen-channel block decodes, (samples, channels, h, w, bits): 32² and 16² maps, 7×7 (E % 16
// != 0: the tail), 4×4, several samples, sizes above and below the parallel threshold.
struct BlockCase { int64_t n, c, h, w; int bits; };
constexpr BlockCase kBlockCases[] = {{2, 32, 32, 32, 2}, {3, 16, 7, 7, 4}, {1, 48, 4, 4, 2}, {4, 16, 16, 16, 1},
                                     {2, 16, 28, 28, 8}, {2, 16, 14, 14, 2}, {2, 32, 5, 3, 1}, {1, 16, 3, 3, 8}};

// check(k, pk, terms, planes, simd) for every case of kBlockCases, every decode term (terms 0: LFC and codes, 1:
// codes only, 2: LFC only) and every SIMD level in force, planes being plane_unpack_ref's values of that pack.
template <typename F>
void for_each_block_case(uint32_t seed, F check) {
  for (const BlockCase& k : kBlockCases) {
    const RandomPlanePack pk(k.n * k.c, k.h, k.w, k.bits, seed);
    for (int terms = 0; terms < 3; ++terms) {
      CAPTURE(k.h);
      CAPTURE(terms);
      const std::vector<float> planes = pk.planes(terms);
      for (const cpu::CodecSimd simd : simd_levels()) {
        const CodecSimd mode(simd);
        CAPTURE(cpu::codec_simd_name(simd));
        check(k, pk, terms, planes, simd);
      }
    }
  }
}

TEST_CASE("codec: plane_unpack_blocked writes the reference decode's values in 16-channel blocks") {
  // Every SIMD level: the register transpose of code bytes, and the portable loop.
  for_each_block_case(7, [](const BlockCase& k, const RandomPlanePack& pk, int terms, const std::vector<float>& planes,
                            cpu::CodecSimd) {
    const int64_t E = pk.g.plane_elems();
    std::vector<float> blocked(planes.size(), -1.f);
    cpu::plane_unpack_blocked(blocked.data(), pk.lfc_for(terms), pk.codes_for(terms), pk.mins.data(), pk.steps.data(),
                              pk.g, k.c);
    bool all_equal = true;
    for (int64_t n = 0; n < k.n; ++n)
      for (int64_t ch = 0; ch < k.c; ++ch)
        for (int64_t e = 0; e < E; ++e)
          all_equal = all_equal && same_bits(blocked[((n * (k.c / 16) + ch / 16) * E + e) * 16 + ch % 16],
                                             planes[(n * k.c + ch) * E + e]);
    CHECK(all_equal);
  });
  std::vector<float> out(16 * 4);
  std::vector<uint16_t> lfc(24);
  CHECK_THROWS_AS(cpu::plane_unpack_blocked(out.data(), lfc.data(), nullptr, nullptr, nullptr,
                                            make_plane_geometry(24, 2, 2, 2, 2), 24),
                  Error);  // 24 channels: not whole blocks
}

TEST_CASE("codec: plane_unpack_bf16_channels_last is the reference decode rounded to bf16, channels-last") {
  // The cases of plane_unpack_blocked (its sixteen-channel blocks are what this decode narrows where the lane
  // kernels do not run), with and without the AVX-512 paths, against float_to_bf16 of plane_unpack_ref's values
  // moved to (n, e, c).
  for_each_block_case(8, [](const BlockCase& k, const RandomPlanePack& pk, int terms, const std::vector<float>& planes,
                            cpu::CodecSimd) {
    std::vector<uint16_t> expected;
    for (const float v : moved_channels_last(planes, k.c, pk.g.plane_elems())) expected.push_back(float_to_bf16(v));
    std::vector<uint16_t> got(planes.size(), 0xAAAA);
    cpu::plane_unpack_bf16_channels_last(got.data(), pk.lfc_for(terms), pk.codes_for(terms), pk.mins.data(),
                                         pk.steps.data(), pk.g, k.c);
    CHECK(got == expected);
  });
  std::vector<uint16_t> out(16 * 4);
  std::vector<uint16_t> lfc(24);
  CHECK_THROWS_AS(cpu::plane_unpack_bf16_channels_last(out.data(), lfc.data(), nullptr, nullptr, nullptr,
                                                       make_plane_geometry(24, 2, 2, 2, 2), 24),
                  Error);  // 24 channels: not whole blocks
}

TEST_CASE("codec: plane_unpack_channels_last is the reference decode, channels-last, where the lane kernels run") {
  // The cases of plane_unpack_blocked (32², 4², 16² with Q = 1, 28² with Q = 8: 3×3 LFC blocks that do not tile the
  // plane; 7², 14², 5×3 and 3² with Q = 1, 2, 4, 8: planes of E % 16 != 0, so a partial last chunk) run the lane
  // kernels on AVX-512; the narrower SIMD levels are refused, and so are channels off the sixteen grid. Each
  // decode term alone and both, against plane_unpack_ref's values moved to (n, e, c).
  int decoded = 0;
  for_each_block_case(9, [&](const BlockCase& k, const RandomPlanePack& pk, int terms,
                             const std::vector<float>& planes, cpu::CodecSimd simd) {
    std::vector<float> got(planes.size(), -1.f);
    const auto decode = [&] {
      cpu::plane_unpack_channels_last(got.data(), pk.lfc_for(terms), pk.codes_for(terms), pk.mins.data(),
                                      pk.steps.data(), pk.g, k.c);
    };
    const bool lanes = cpu::plane_channels_last_lanes(pk.g, k.c);
    CHECK(lanes == (simd == cpu::CodecSimd::Avx512));
    if (!lanes) {
      CHECK_THROWS_AS(decode(), Error);
      return;
    }
    decode();
    const std::vector<float> expected = moved_channels_last(planes, k.c, pk.g.plane_elems());
    CHECK(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)) == 0);
    ++decoded;
  });
  // Where the CPU has AVX-512 every case ran with every term combination.
  const int cases = static_cast<int>(sizeof(kBlockCases) / sizeof(kBlockCases[0]));
  CHECK(decoded == (cpu::codec_simd_supported() == cpu::CodecSimd::Avx512 ? cases * 3 : 0));
  const PlaneGeometry g24 = make_plane_geometry(2 * 24, 4, 4, 8, 2);
  CHECK_FALSE(cpu::plane_channels_last_lanes(g24, 24));
  std::vector<float> out(static_cast<size_t>(g24.planes * 16));
  std::vector<uint16_t> lfc(static_cast<size_t>(g24.planes));
  CHECK_THROWS_AS(cpu::plane_unpack_channels_last(out.data(), lfc.data(), nullptr, nullptr, nullptr, g24, 24), Error);
}

TEST_CASE("codec: group_pack and group_unpack match the per-element spec, padding included") {
  struct Case { int64_t samples, elems, group; int bits; };
  for (const Case& c : {Case{3, 300, 256, 2}, Case{4, 10, 4, 4}, Case{2, 7, 16, 1}, Case{5, 64, 8, 8}}) {
    GroupGeometry g;
    g.samples = c.samples, g.sample_elems = c.elems, g.group_size = c.group, g.bits = c.bits;
    const std::vector<float> x = random_values(static_cast<size_t>(c.samples * c.elems), 17 + c.bits, 0.5f, 2.f);
    std::vector<uint16_t> mins(g.groups()), steps(g.groups());
    std::vector<uint8_t> codes(g.groups() * g.code_bytes_per_group(), 0xCC);
    cpu::group_pack(codes.data(), mins.data(), steps.data(), x.data(), g, 42, 9);
    for (int64_t k = 0; k < g.groups(); ++k) {
      const int64_t n = k / g.groups_per_sample(), first = (k % g.groups_per_sample()) * c.group;
      const int64_t count = std::min(c.group, c.elems - first);
      float lo = count < c.group ? 0.f : INFINITY, hi = count < c.group ? 0.f : -INFINITY;  // zero padding
      for (int64_t d = 0; d < count; ++d) lo = std::min(lo, x[n * c.elems + first + d]), hi = std::max(hi, x[n * c.elems + first + d]);
      uint16_t min_bits, step_bits;
      quant_params(min_bits, step_bits, lo, hi, c.bits);
      CHECK(mins[k] == min_bits);
      CHECK(steps[k] == step_bits);
      const uint8_t* run = codes.data() + k * g.code_bytes_per_group();
      for (int64_t d = 0; d < c.group; ++d) {
        uint32_t want = 0;
        if (d < count) {
          const uint64_t index = static_cast<uint64_t>(n * c.elems + first + d);
          want = stochastic_code(x[index], bf16_to_float(min_bits), 1.0f / bf16_to_float(step_bits),
                                 philox_uniform8(42, 9, index), quant_levels(c.bits));
        }
        CHECK(unpack_code(run, d, c.bits) == want);
      }
    }
    // The reference codec writes the same bytes.
    std::vector<uint16_t> ref_mins(g.groups()), ref_steps(g.groups());
    std::vector<uint8_t> ref_codes(codes.size(), 0x33);
    cpu::group_pack_ref(ref_codes.data(), ref_mins.data(), ref_steps.data(), x.data(), g, 42, 9);
    CHECK(ref_codes == codes);
    CHECK(ref_mins == mins);
    CHECK(ref_steps == steps);
    std::vector<float> out(x.size()), ref_out(x.size());
    cpu::group_unpack(out.data(), codes.data(), mins.data(), steps.data(), g);
    cpu::group_unpack_ref(ref_out.data(), codes.data(), mins.data(), steps.data(), g);
    CHECK(std::memcmp(ref_out.data(), out.data(), out.size() * sizeof(float)) == 0);
    for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
      const int64_t n = i / c.elems, d = i % c.elems, k = n * g.groups_per_sample() + d / c.group;
      const float want = dequantize(unpack_code(codes.data() + k * g.code_bytes_per_group(), d % c.group, c.bits),
                                    bf16_to_float(mins[k]), bf16_to_float(steps[k]));
      CHECK(out[i] == want);
    }
  }
}

TEST_CASE("codec: group_pack in runs of samples (first_sample) writes what one call over the tensor writes") {
  for (const cpu::CodecSimd simd : simd_levels()) {
    CodecSimd mode(simd);
    GroupGeometry g;
    g.samples = 5, g.sample_elems = 300, g.group_size = 64, g.bits = 2;
    const std::vector<float> x = random_values(static_cast<size_t>(g.samples * g.sample_elems), 23);
    std::vector<uint16_t> mins(g.groups()), steps(g.groups());
    std::vector<uint8_t> codes(g.groups() * g.code_bytes_per_group());
    cpu::group_pack(codes.data(), mins.data(), steps.data(), x.data(), g, 42, 9);
    // Samples [0, 2) and [2, 5) as two calls, the second told where its rows start; fast and reference.
    for (const bool reference : {false, true}) {
      std::vector<uint16_t> run_mins(g.groups()), run_steps(g.groups());
      std::vector<uint8_t> run_codes(codes.size(), 0xCC);
      const int64_t K = g.groups_per_sample(), bytes = g.code_bytes_per_group();
      for (const int64_t first : {int64_t{0}, int64_t{2}}) {
        GroupGeometry r = g;
        r.samples = first == 0 ? 2 : 3, r.first_sample = first;
        uint8_t* c = run_codes.data() + first * K * bytes;
        const float* rows = x.data() + first * g.sample_elems;
        if (reference) {
          cpu::group_pack_ref(c, run_mins.data() + first * K, run_steps.data() + first * K, rows, r, 42, 9);
        } else {
          cpu::group_pack(c, run_mins.data() + first * K, run_steps.data() + first * K, rows, r, 42, 9);
        }
      }
      CHECK(run_codes == codes);
      CHECK(run_mins == mins);
      CHECK(run_steps == steps);
    }
  }
}

TEST_CASE("codec: group_range_norms is Σ (hi − lo)² per sample, padding included, the reference's bits") {
  struct Case { int64_t samples, elems, group; };
  for (const cpu::CodecSimd simd : simd_levels()) {
    CodecSimd mode(simd);
    for (const Case& c : {Case{3, 300, 256}, Case{4, 10, 4}, Case{2, 7, 16}, Case{64, 1024, 256}}) {
      GroupGeometry g;
      g.samples = c.samples, g.sample_elems = c.elems, g.group_size = c.group, g.bits = 2;
      const std::vector<float> x = random_values(static_cast<size_t>(c.samples * c.elems), 29, 0.5f, 2.f);
      std::vector<double> got(static_cast<size_t>(c.samples), -1.0), ref(got.size(), -2.0);
      cpu::group_range_norms(got.data(), x.data(), g);
      cpu::group_range_norms_ref(ref.data(), x.data(), g);
      CHECK(std::memcmp(got.data(), ref.data(), got.size() * sizeof(double)) == 0);
      for (int64_t n = 0; n < c.samples; ++n) {
        double want = 0.0;
        for (int64_t first = 0; first < c.elems; first += c.group) {
          const auto begin = x.begin() + n * c.elems + first;
          const int64_t count = std::min(c.group, c.elems - first);
          float lo = *std::min_element(begin, begin + count), hi = *std::max_element(begin, begin + count);
          if (count < c.group) lo = std::min(lo, 0.f), hi = std::max(hi, 0.f);  // all values > 0 here
          want += static_cast<double>(hi - lo) * static_cast<double>(hi - lo);
        }
        CHECK(got[static_cast<size_t>(n)] == want);
      }
    }
  }
}

TEST_CASE("codec: blpa_code keeps the sign, picks the cell of its value and blpa_value its midpoint") {
  for (const int bits : {4, 8}) {
    const int top = (1 << bits) - 1;
    // A channel with mean 0.3 and σ 1: step 6/2^Q, the window centred on the mean.
    const BlpaChannel p = blpa_channel(0.3, 1.0, -5.f, 5.f, bits);
    CHECK(p.step == static_cast<float>(6.0 / (1 << bits)));
    CHECK(p.shift == static_cast<float>((1 << (bits - 1)) - std::floor(0.3 / p.step)));
    for (const float v : random_values(20000, 31 + bits, -5.f, 5.f)) {
      const uint32_t code = blpa_code(v, p, bits);
      REQUIRE(code <= static_cast<uint32_t>(top));
      CHECK((code >= p.shift) == (v > 0.f));
      const float k = static_cast<float>(code) - p.shift;  // v ∈ (k·step, (k+1)·step] unless clipped
      const bool clipped = code == 0 || code == static_cast<uint32_t>(top);
      if (!clipped) CHECK((v > k * p.step && v <= (k + 1) * p.step));
      const float back = blpa_value(code, p);
      CHECK((back > 0.f) == (v > 0.f));
      if (!clipped) CHECK(std::fabs(back - v) <= p.step * 0.5f * 1.0001f);
    }
    CHECK(blpa_code(0.f, p, bits) == static_cast<uint32_t>(p.shift) - 1);  // 0 is not positive
    CHECK(blpa_code(1e-30f, p, bits) == static_cast<uint32_t>(p.shift));   // however small, it is
    CHECK(blpa_code(NAN, p, bits) == static_cast<uint32_t>(p.shift) - 1);
    // The window follows the mean but the sign always survives: shift stays in [1, 2^Q − 1].
    CHECK(blpa_channel(100.0, 1.0, 0.f, 1.f, bits).shift == 1.f);
    CHECK(blpa_channel(-100.0, 1.0, 0.f, 1.f, bits).shift == static_cast<float>(top));
    CHECK(blpa_channel(NAN, NAN, 0.f, 1.f, bits).shift == static_cast<float>(1 << (bits - 1)));
    // A constant channel (σ = 0) decodes exactly through its [lo, hi]; a ReLU output's zeros decode to 0.
    const BlpaChannel constant = blpa_channel(0.75, 0.0, 0.75f, 0.75f, bits);
    CHECK(blpa_value(blpa_code(0.75f, constant, bits), constant) == 0.75f);
    const BlpaChannel relu = blpa_channel(0.4, 0.6, 0.f, 3.f, bits);
    CHECK(blpa_value(blpa_code(0.f, relu, bits), relu) == 0.f);
    CHECK(std::isnan(blpa_value(3, blpa_channel(0.0, 1.0, NAN, NAN, bits))));
    CHECK(std::isnan(blpa_value(3, blpa_channel(0.0, INFINITY, -1.f, INFINITY, bits))));  // a channel with ±inf
    CHECK(std::isnan(blpa_value(3, blpa_channel(0.0, INFINITY, -INFINITY, 1.f, bits))));
  }
}

TEST_CASE("codec: blpa_pack and blpa_unpack match the reference byte for byte") {
  struct Case { int64_t outer, channels, inner; int bits; };
  for (const Case& c : {Case{4, 3, 49, 4}, Case{3, 5, 7, 4}, Case{2, 16, 256, 8}, Case{1, 1, 1001, 4},
                        Case{64, 8, 64, 4}}) {
    BlpaGeometry g;
    g.outer = c.outer, g.channels = c.channels, g.inner = c.inner, g.bits = c.bits;
    std::vector<float> x = random_values(static_cast<size_t>(g.numel()), 37 + c.bits, -2.f, 3.f);
    if (c.channels > 2) x[static_cast<size_t>(c.inner)] = NAN;  // channel 1 of sample 0
    std::vector<BlpaChannel> params(static_cast<size_t>(c.channels)), ref_params(params.size());
    std::vector<uint8_t> codes(static_cast<size_t>(g.code_bytes()), 0xCC), ref_codes(codes.size(), 0x33);
    cpu::blpa_pack(params.data(), codes.data(), x.data(), g);
    cpu::blpa_pack_ref(ref_params.data(), ref_codes.data(), x.data(), g);
    CHECK(codes == ref_codes);
    CHECK(std::memcmp(params.data(), ref_params.data(), params.size() * sizeof(BlpaChannel)) == 0);
    std::vector<float> out(x.size()), ref_out(x.size());
    cpu::blpa_unpack(out.data(), params.data(), codes.data(), g);
    cpu::blpa_unpack_ref(ref_out.data(), params.data(), codes.data(), g);
    CHECK(std::memcmp(out.data(), ref_out.data(), out.size() * sizeof(float)) == 0);
    // The statistics are the channel's: step = 6σ/2^Q over its outer·inner values (channel 0 has no NaN).
    double sum = 0.0, squares = 0.0;
    for (int64_t n = 0; n < c.outer; ++n)
      for (int64_t e = 0; e < c.inner; ++e) sum += x[static_cast<size_t>(n * c.channels * c.inner + e)];
    const double mean = sum / static_cast<double>(c.outer * c.inner);
    for (int64_t n = 0; n < c.outer; ++n)
      for (int64_t e = 0; e < c.inner; ++e) {
        const double d = x[static_cast<size_t>(n * c.channels * c.inner + e)] - mean;
        squares += d * d;
      }
    const float sigma = static_cast<float>(std::sqrt(squares / static_cast<double>(c.outer * c.inner)));
    CHECK(params[0].step == doctest::Approx(6.f * sigma / static_cast<float>(1 << c.bits)).epsilon(1e-6));
    if (c.channels > 2) {
      CHECK(std::isnan(params[1].lo));
      CHECK(std::isnan(out[static_cast<size_t>(c.inner) + 1]));  // the NaN reaches backward
    }
  }
}
