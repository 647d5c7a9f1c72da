// The activation codec arithmetic: bf16 directed rounding, per-plane/per-group min/step, unbiased
// stochastic rounding, block means and nearest up-sampling indices, as ACTLAB_HD functions shared by the
// CPU kernels (core/cpu/codec.cpp) and their CUDA twin (core/cuda/codec.cu), plus the raw-pointer
// CPU kernel API.
// Layouts and closed forms: docs/policies.md. Tested in tests/test_codec.cpp (against naive loops).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "actlab/core/bf16.h"
#include "actlab/core/hostdevice.h"
#include "actlab/core/philox.h"

namespace actlab {

// ---------------------------------------------------------------- geometry
// A tensor seen as `planes` independent planes of height × width f32 values (4-D NCHW: N·C planes of H×W;
// 2-D (N,D): N planes of 1×D). The low-frequency component (LFC) of a plane is its block_h × block_w
// average pool (kernel = stride, floor mode): lfc_h × lfc_w values; rows/cols past lfc_h·block_h are
// not pooled (PyTorch floor mode) but are still covered by the nearest up-sampling.
struct PlaneGeometry {
  int64_t planes = 0;
  int64_t height = 0, width = 0;
  int64_t block_h = 1, block_w = 1;
  int64_t lfc_h = 0, lfc_w = 0;
  int bits = 0;  // Q of the codes (0 when the codec stores no codes)

  // The codes' ranges: one bf16 min and step per `range_rows` consecutive rows of a plane (0, or any value
  // >= height: one range per plane). When the rows do not divide the height, the plane's last range is
  // zero-padded to full size and the zeros take part in its min and max (docs/policies.md, "One range per
  // token").
  int64_t range_rows = 0;

  int64_t plane_elems() const { return height * width; }
  int64_t lfc_elems() const { return lfc_h * lfc_w; }
  int64_t rows_per_range() const { return range_rows > 0 && range_rows < height ? range_rows : height; }
  int64_t ranges_per_plane() const { return (height + rows_per_range() - 1) / rows_per_range(); }
  int64_t ranges() const { return planes * ranges_per_plane(); }
  int64_t range_elems() const { return rows_per_range() * width; }
  // Each range's codes occupy their own byte-aligned run, LSB first, so planes pack in parallel; a plane's
  // runs follow each other.
  int64_t code_bytes_per_range() const { return (static_cast<int64_t>(bits) * range_elems() + 7) / 8; }
  int64_t code_bytes_per_plane() const { return ranges_per_plane() * code_bytes_per_range(); }
  // True when the runs of consecutive planes hold no padding bits, so a batch of planes is one run.
  bool contiguous_codes() const { return code_bytes_per_plane() * 8 == static_cast<int64_t>(bits) * plane_elems(); }
};

// pool_block = B; the pool kernel per axis is min(B, extent).
PlaneGeometry make_plane_geometry(int64_t planes, int64_t height, int64_t width, int64_t pool_block, int bits);
// A token map (samples, tokens, features) as one plane per sample, pooled along the token axis only: the
// kernel is min(B, tokens) × 1, so the LFC keeps every feature and averages runs of B consecutive tokens,
// and the codes' min and step are per sample (docs/policies.md, "Token maps").
PlaneGeometry make_token_geometry(int64_t samples, int64_t tokens, int64_t features, int64_t pool_block, int bits);

// A tensor seen as `samples` rows of sample_elems values, each zero-padded to groups·group_size and split
// into groups of group_size consecutive elements (ActNN-style per-group quantization).
struct GroupGeometry {
  int64_t samples = 0;
  int64_t sample_elems = 0;
  int64_t group_size = 1;
  int bits = 0;
  // The rows are samples first_sample.. of a larger tensor: a stochastic-rounding draw counts its element
  // from there, so a tensor packed as runs of samples with different bit widths (actnn) draws exactly
  // what one call over the whole tensor would. Memory offsets are the caller's (x, codes, mins, steps).
  int64_t first_sample = 0;

  int64_t groups_per_sample() const { return (sample_elems + group_size - 1) / group_size; }
  int64_t groups() const { return samples * groups_per_sample(); }
  int64_t code_bytes_per_group() const { return (static_cast<int64_t>(bits) * group_size + 7) / 8; }
};

// ---------------------------------------------------------------- per-element arithmetic
// bf16 rounding toward -inf / +inf (bits of the bf16). Finite inputs only (NaN stays NaN, inf stays inf).
// Used so the stored min is <= every value and the stored step covers the range: codes never overflow.
// Written with selects, not early returns, so the CPU loop over a batch of planes vectorizes.
ACTLAB_HD uint16_t bf16_round_down(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t truncated = u & 0xFFFF0000u;
  const bool special = (u & 0x7F800000u) == 0x7F800000u;  // inf / NaN
  const uint32_t away = (truncated != u && (u & 0x80000000u)) ? 1u : 0u;  // inexact negative: one ulp down
  return special ? float_to_bf16(f) : static_cast<uint16_t>((truncated >> 16) + away);
}
ACTLAB_HD uint16_t bf16_round_up(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t truncated = u & 0xFFFF0000u;
  const bool special = (u & 0x7F800000u) == 0x7F800000u;
  const uint32_t away = (truncated != u && !(u & 0x80000000u)) ? 1u : 0u;  // inexact positive: one ulp up
  return special ? float_to_bf16(f) : static_cast<uint16_t>((truncated >> 16) + away);
}

ACTLAB_HD int quant_levels(int bits) { return (1 << bits) - 1; }

// A signed integer with the order of the float (for non-NaN values; −0 sorts just below +0), so min/max
// reductions run as integer compares: they vectorize on the CPU without fast-math and are atomics on a GPU.
ACTLAB_HD int32_t float_order_key(float f) {
  const int32_t i = static_cast<int32_t>(float_bits(f));
  return i ^ ((i >> 31) & 0x7FFFFFFF);
}
ACTLAB_HD float float_from_order_key(int32_t key) {
  return bits_float(static_cast<uint32_t>(key ^ ((key >> 31) & 0x7FFFFFFF)));
}

// The stored (bf16) min and step of a range [lo, hi] for `bits`-bit codes: min = lo rounded down,
// step = (hi - min)/levels rounded up, bumped by one bf16 ulp if levels·step (exact in f32: 8+8 bits)
// still falls short of the f32 range. A constant range gets step 1 (every code is then 0); a NaN range
// (a NaN among the values) a NaN step.
// Guarantee: for every v in [lo, hi], 0 <= fl(fl(v - min)/step) <= levels, and step >= 2^-126, so
// quant_scale(step) is finite.
ACTLAB_HD void quant_params(uint16_t& min_bits, uint16_t& step_bits, float lo, float hi, int bits) {
  min_bits = bf16_round_down(lo);
  const float range = hi - bf16_to_float(min_bits);
  const float levels = static_cast<float>(quant_levels(bits));
  uint16_t step = bf16_round_up(range / levels);
  step = bf16_to_float(step) * levels < range ? static_cast<uint16_t>(step + 1) : step;
  // A NaN anywhere in the range keeps its NaN step: a positive NaN (a GPU's canonical one) sorts above +inf,
  // so `hi` sees it; a negative one (x86's default NaN, from inf - inf) sorts below -inf, so `lo` does and the
  // min is NaN. Either way every decoded value of the plane is NaN and the NaN reaches backward; the bytes
  // differ between the two (tests/test_cuda_codec.cpp compares which values are NaN).
  step_bits = bf16_to_float(step) > 0.f || range != range ? step : float_to_bf16(1.f);
  // A step below the smallest normal float (a range under about 2^-118 at Q = 8) is raised to it: its
  // reciprocal, the quantizer's scale, would overflow to inf and send every value to the top code, up to
  // 2^Q − 1 steps off. The step only grows, so levels·step still covers the range.
  step_bits = bf16_to_float(step_bits) < 0x1p-126f ? static_cast<uint16_t>(0x0080) : step_bits;
}

// The stochastic-rounding uniform of element `index`: 8 random bits, one byte of a 32-bit Philox word, so
// one Philox4x32-10 block serves 16 consecutive elements. Element i takes byte i & 3 of word (i >> 2) & 3
// of block i >> 4 (counter = (i >> 4, stream), key = seed): the block's 16 bytes in little-endian order.
// u = (bits8 + 1/2)·2^-8, the midpoints of 256 equal cells of [0, 1). Why 8 bits: Philox is the largest
// cost of packing (35 % of it at 16 bits per draw, bench/RESULTS_compress.md), and with midpoints
// P(u < f) = ⌈256·f − 1/2⌉/256 differs from f by at most 2^-9: a rounding bias of at most 2^-9 of a step
// per element, of either sign and zero on average over f (tests/test_codec.cpp counts it exactly).
ACTLAB_HD uint32_t philox_bits8(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t block = index >> 4;
  const Philox4 c{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                   static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)}};
  const Philox4 r = philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return (r.v[(index >> 2) & 3] >> ((index & 3) * 8)) & 0xFFu;
}
// Exact in f32 (9 significant bits).
ACTLAB_HD float uniform8(uint32_t bits8) { return (static_cast<float>(bits8) + 0.5f) * (1.0f / 256.0f); }
ACTLAB_HD float philox_uniform8(uint64_t seed, uint64_t stream, uint64_t index) {
  return uniform8(philox_bits8(seed, stream, index));
}

// The quantizer's scale 1/step, rounded once per plane or group (IEEE f32 division on CPU and GPU), so the
// per-element work is a multiply, as in the reference's (x − min)·scale.
ACTLAB_HD float quant_scale(float step) { return 1.0f / step; }

// Unbiased stochastic rounding of v to a code in [0, levels]: with t = (v − min)·scale (scale =
// quant_scale(step)), code = floor(t) + (u < t − floor(t)), u an 8-bit midpoint uniform
// (philox_uniform8). This is floor(t + u) in exact arithmetic, but it cannot round up past ceil(t) in f32;
// E[code] = t to within 2^-9. t differs from (v − min)/step by at most two f32 roundings (relative
// 2^-23 each), which the clamp covers at the top. NaN and out-of-range t are clamped into [0, levels].
ACTLAB_HD uint32_t stochastic_code(float v, float min, float scale, float u, int levels) {
  float t = (v - min) * scale;
  t = t > 0.f ? t : 0.f;  // also maps NaN to 0; plain compares (not fminf) keep the CPU loop vectorized
  t = t < static_cast<float>(levels) ? t : static_cast<float>(levels);
  const int lower = static_cast<int>(t);  // t >= 0, so truncation is floor (and vectorizes without SSE4.1)
  return static_cast<uint32_t>(lower) + static_cast<uint32_t>(u < t - static_cast<float>(lower));
}

// min + code·step. The product is exact in f32 (code <= 8 bits, bf16 step has 8 significant bits),
// so an FMA contraction gives the same bits as separate multiply and add — unless the product overflows,
// which takes a plane whose range is within ~2 % of FLT_MAX (the top code then decodes to inf or to a
// finite value depending on the kernel); such activations have already overflowed training anyway.
ACTLAB_HD float dequantize(uint32_t code, float min, float step) {
  return min + static_cast<float>(code) * step;
}

// PyTorch's nearest rule src = floor(dst·in/out), in exact integer arithmetic.
ACTLAB_HD int64_t nearest_source(int64_t dst, int64_t in_size, int64_t out_size) {
  return dst * in_size / out_size;
}

// The bf16 LFC value of a block from its f32 sum: sum / area, rounded to nearest even.
// Summation order (the kernels follow it so results are bit-reproducible): for each block column b,
// colsum_b = sum over the block's rows top to bottom; block sum = colsum_0 + colsum_1 + ... left to right.
ACTLAB_HD uint16_t lfc_from_sum(float sum, int64_t area) {
  return float_to_bf16(sum / static_cast<float>(area));
}

// Q-bit code `code` of element e in a byte-aligned LSB-first run (bits in {1,2,4,8} so no code
// straddles a byte).
ACTLAB_HD uint32_t unpack_code(const uint8_t* run, int64_t e, int bits) {
  const int64_t bit = e * bits;
  return (static_cast<uint32_t>(run[bit >> 3]) >> (bit & 7)) & static_cast<uint32_t>(quant_levels(bits));
}

// ---------------------------------------------------------------- BLPA codes
// BLPA (Chakrabarti & Moseley 2019; docs/policies.md, "blpa"): each value of a channel takes the cell
// (k·step, (k+1)·step] that holds it, step = 6σ/2^Q — a fixed window of 2^Q cells, ±3 standard deviations
// wide, placed so the channel mean sits near its middle — and code = k + shift clamped to [0, 2^Q − 1].
// 0 is a cell boundary and 1 <= shift <= 2^Q − 1, so code >= shift exactly when v > 0: the sign (what a
// ReLU's gradient needs) survives every value, clipped ones too. Decoding gives the cell's midpoint,
// clamped to the channel's [lo, hi] (a ReLU output's zeros decode to 0, a constant channel exactly).
struct BlpaGeometry {
  int64_t outer = 0, channels = 0, inner = 0;  // element (n, c, e) is x[(n·channels + c)·inner + e]
  int bits = 4;                                // Q ∈ {4, 8}, BLPA's two widths
  int64_t numel() const { return outer * channels * inner; }
  int64_t code_bytes() const { return (numel() * bits + 7) / 8; }
};

// The per-channel parameters a BLPA pack keeps (16 bytes). NaN lo/hi: the channel held a NaN.
struct BlpaChannel {
  float step, shift, lo, hi;
};

// step = 6σ/2^Q (1 when that is not a positive finite f32: a constant channel, which lo = hi then decodes
// exactly); shift = 2^(Q−1) − ⌊mean/step⌋ clamped into [1, 2^Q − 1] (2^(Q−1) when not finite). A channel
// holding ±inf gets NaN lo/hi, so it decodes to NaN as a plane with an infinite range does in the Q-bit
// codecs: clamped into the grid, an infinity would come back as a finite value no overflow check sees.
ACTLAB_HD BlpaChannel blpa_channel(double mean, double stddev, float lo, float hi, int bits) {
  if (lo - lo != 0.f || hi - hi != 0.f) lo = hi = NAN;  // x − x is 0 for finite x, NaN for ±inf and NaN
  const double cells = static_cast<double>(1 << bits);
  float step = static_cast<float>(6.0 * stddev / cells);
  step = step > 0.f && step <= 3.0e38f ? step : 1.f;  // also maps NaN to 1
  double shift = cells / 2 - floor(mean / static_cast<double>(step));
  if (shift != shift) shift = cells / 2;  // a NaN or infinite mean
  shift = shift < 1.0 ? 1.0 : shift > cells - 1 ? cells - 1 : shift;
  return {step, static_cast<float>(shift), lo, hi};
}

ACTLAB_HD uint32_t blpa_code(float v, const BlpaChannel& p, int bits) {
  const float top = static_cast<float>((1 << bits) - 1);
  const float k0 = ceilf(v / p.step) - 1.f;  // v ∈ (k·step, (k+1)·step]
  // The division can round a value next to a cell boundary across it; the sign is decided on v itself.
  // Selects, not branches: the sign of activations is a coin flip the branch predictor loses, and a
  // branch-free body lets the CPU kernel's loop vectorize.
  const float positive = k0 > 0.f ? k0 : 0.f;
  const float other = k0 < -1.f ? k0 : -1.f;  // also maps NaN to −1
  float k = v > 0.f ? positive : other;
  k = k > -p.shift ? k : -p.shift;
  k = k < top - p.shift ? k : top - p.shift;
  return static_cast<uint32_t>(static_cast<int32_t>(k + p.shift));  // k + shift ∈ [0, 2^Q − 1]
}

ACTLAB_HD float blpa_value(uint32_t code, const BlpaChannel& p) {
  float v = (static_cast<float>(code) - p.shift + 0.5f) * p.step;
  v = v < p.lo ? p.lo : v;
  v = v > p.hi ? p.hi : v;
  return p.lo != p.lo ? p.lo : v;  // a channel with a NaN decodes to NaN, as the codec's planes do
}

namespace cpu {

// ---------------------------------------------------------------- CPU kernels (OpenMP over planes)
// The kernels take hand-written AVX-512 paths when the CPU has AVX-512F/BW, AVX2 ones when it has AVX2 and
// FMA only, and portable loops otherwise; all give the same bytes and values. set_codec_simd(widest) caps
// the level (Portable: the portable loops alone) so the tests check every path the CPU can run; levels the
// CPU lacks fall back to the widest it has below them. For tests and benchmarks, not thread-safe against
// running kernels. Returns the level in force before the call.
enum class CodecSimd { Portable, Avx2, Avx512 };
CodecSimd set_codec_simd(CodecSimd widest);
// The widest level this CPU runs (what the kernels use unless capped), and a level's name ("avx512", ...).
CodecSimd codec_simd_supported();
const char* codec_simd_name(CodecSimd level);

// quant_params of n ranges from the order keys (float_order_key) of their min and max, the bf16 bits to mins and
// steps: sixteen ranges at a time in the vector lanes as the lane pack computes them (AVX-512 under the codec
// SIMD level in force), the scalar function for the rest and on other CPUs. The same bits either way: its user is
// tests/test_codec.cpp, which compares the lanes with quant_params.
void quant_params_from_keys(uint16_t* mins, uint16_t* steps, const int32_t* lo_keys, const int32_t* hi_keys, int64_t n,
                            int bits);

// Division-family pack of x: (g.planes, g.height, g.width) f32 contiguous. Per plane p:
//   with_lfc: L = bf16 block means (written to lfc[p·lfc_elems ..] when lfc != nullptr), R = x − L↑;
//   otherwise R = x.
//   codes != nullptr: bits-bit stochastic codes of R, range k of plane p (g.ranges_per_plane() per plane)
//     → codes[(p·ranges_per_plane + k)·code_bytes_per_range ..] with mins[p·ranges_per_plane + k] and
//     steps[...] (bf16 bits); element e of plane p draws philox_uniform8(seed, stream, p·E + e).
//   residual != nullptr: R in f32 → residual[p·E ..].
// Outputs are assigned (never accumulated) and must not alias x; unused outputs may be nullptr.
void plane_pack(uint16_t* lfc, uint8_t* codes, uint16_t* mins, uint16_t* steps, float* residual,
                const float* x, const PlaneGeometry& g, bool with_lfc, uint64_t seed, uint64_t stream);
// plane_pack of x given channels-last: x (N, height, width, channels) with N·channels = g.planes, plane
// n·channels + c being channel c of image n: the same bytes as plane_pack of the (N, C, H, W) tensor, without
// writing that tensor out (a bf16 run's activations). Where plane_channels_last_lanes holds and no residual is
// asked for, groups of sixteen channels pack with the planes in the vector lanes; otherwise tiles of planes are
// transposed into a per-thread buffer and packed there.
void plane_pack_channels_last(uint16_t* lfc, uint8_t* codes, uint16_t* mins, uint16_t* steps, float* residual,
                              const float* x, const PlaneGeometry& g, int64_t channels, bool with_lfc, uint64_t seed,
                              uint64_t stream);

// out (g.planes, height, width) f32 = (lfc ? L↑ : 0) + (codes ? dequantized codes : 0). Assigns.
void plane_unpack(float* out, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                  const uint16_t* steps, const PlaneGeometry& g);

// The same values as plane_unpack, written in the channel-blocked layout oneDNN's convolutions work in
// (aBcd16b): planes are (n, c) with `channels` per sample, channels % kChannelBlock == 0, and value
// (n, c, e) goes to out[((n·channels/16 + c/16)·E + e)·16 + c%16]. A convolution's backward-weights pass
// then reads the unpacked input directly instead of a reorder of it (bench/RESULTS_compress.md).
// One range per plane only (g.ranges_per_plane() == 1; it and plane_unpack_channel refuse others).
constexpr int64_t kChannelBlock = 16;
void plane_unpack_blocked(float* out, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                          const uint16_t* steps, const PlaneGeometry& g, int64_t channels);

// Whether the sixteen-channel lane kernels run for this geometry on this CPU (under the codec SIMD level in force):
// AVX-512, channels a multiple of 16, one code range per plane (any plane size). They keep sixteen planes
// (channels c..c+15 of an image) in the vector lanes, so a channels-last tensor is read or written as it lies:
// plane_pack_channels_last's fast path, plane_unpack_channels_last, plane_unpack_bf16_channels_last's fast path.
bool plane_channels_last_lanes(const PlaneGeometry& g, int64_t channels);
// The same values as plane_unpack written channels-last: value (n, c, e) at out[(n·E + e)·channels + c] (batch
// norm's backward in a bf16 run's channels-last flow reads them so). Requires plane_channels_last_lanes (throws
// otherwise; a consumer then transposes plane_unpack's planes).
void plane_unpack_channels_last(float* out, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                                const uint16_t* steps, const PlaneGeometry& g, int64_t channels);
// The same values rounded to bf16 (core/bf16.h's float_to_bf16) and written channels-last: value (n, c, e) at
// out[(n·E + e)·channels + c]. The bf16 form a convolution that computes channels-last reads as it is
// (PlaneCodecPolicy::unpack_bf16). The same requirements as plane_unpack_blocked.
void plane_unpack_bf16_channels_last(uint16_t* out, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                                     const uint16_t* steps, const PlaneGeometry& g, int64_t channels);

// The planes (n, c) of one channel c, n < g.planes / channels, as plane_unpack computes them, written one
// after another into out (planes/channels · E f32). Serial: a consumer going over channels in its own
// parallel loop (batch-norm backward) decodes each channel into a buffer that stays in cache.
void plane_unpack_channel(float* out, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                          const uint16_t* steps, const PlaneGeometry& g, int64_t channels, int64_t c);

// Per-group pack of x: (g.samples, g.sample_elems) f32 contiguous. Group j of sample n covers sample
// elements [j·G, (j+1)·G); elements past sample_elems are zeros (they take part in min/max, as in ActNN)
// and get code 0. Element d of sample n draws philox_uniform8(seed, stream, (g.first_sample + n)·sample_elems + d).
// codes: g.groups() runs of code_bytes_per_group; mins/steps: g.groups() bf16 bits. Assigns.
void group_pack(uint8_t* codes, uint16_t* mins, uint16_t* steps, const float* x, const GroupGeometry& g,
                uint64_t seed, uint64_t stream);

// out (g.samples, g.sample_elems) f32 = dequantized codes (padding dropped). Assigns.
void group_unpack(float* out, const uint8_t* codes, const uint16_t* mins, const uint16_t* steps,
                  const GroupGeometry& g);

// out[n] (g.samples doubles) = Σ over the groups j of sample n of (hi_j − lo_j)², the range of each group
// as group_pack takes it (zero padding included) — ActNN's ‖range_n‖², the per-sample cost of the actnn
// policy's bit allocation. Each square is exact in double and the sum runs over j in order, so the result
// does not depend on threads, FMA contraction or the device. g.bits is not used. Assigns.
void group_range_norms(double* out, const float* x, const GroupGeometry& g);

// BLPA codes (blpa_code): x (g.outer, g.channels, g.inner) f32 contiguous; params: g.channels BlpaChannel
// (mean and standard deviation of each channel over its outer·inner values, in double, n then e in order);
// codes: ceil(numel·bits/8) bytes, element i at bits [(i·bits) mod 8, +bits) of byte ⌊i·bits/8⌋. Assigns.
void blpa_pack(BlpaChannel* params, uint8_t* codes, const float* x, const BlpaGeometry& g);
// out (g.outer, g.channels, g.inner) f32 = blpa_value of each code. Assigns.
void blpa_unpack(float* out, const BlpaChannel* params, const uint8_t* codes, const BlpaGeometry& g);

// ---------------------------------------------------------------- the reference codec
// The executable specification of the kernels above (core/cpu/codec_ref.cpp): the same contracts
// and outputs, written one element at a time with no SIMD, no threads and no tricks, in the order the
// docs/policies.md formulas read. tests/test_codec.cpp checks every fast path (AVX-512 and portable)
// against these, byte for byte.
void plane_pack_ref(uint16_t* lfc, uint8_t* codes, uint16_t* mins, uint16_t* steps, float* residual,
                    const float* x, const PlaneGeometry& g, bool with_lfc, uint64_t seed, uint64_t stream);
void plane_unpack_ref(float* out, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                      const uint16_t* steps, const PlaneGeometry& g);
void group_pack_ref(uint8_t* codes, uint16_t* mins, uint16_t* steps, const float* x, const GroupGeometry& g,
                    uint64_t seed, uint64_t stream);
void group_unpack_ref(float* out, const uint8_t* codes, const uint16_t* mins, const uint16_t* steps,
                      const GroupGeometry& g);
void group_range_norms_ref(double* out, const float* x, const GroupGeometry& g);
void blpa_pack_ref(BlpaChannel* params, uint8_t* codes, const float* x, const BlpaGeometry& g);
void blpa_unpack_ref(float* out, const BlpaChannel* params, const uint8_t* codes, const BlpaGeometry& g);

}  // namespace cpu
}  // namespace actlab
