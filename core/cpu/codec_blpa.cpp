// CPU kernels of the BLPA codes (core/codec.h: blpa_pack, blpa_unpack): the per-channel statistics in the
// order the reference states (core/cpu/codec_ref.cpp), OpenMP over channels, then the codes OpenMP over
// planes (or bytes, when a plane does not start on a byte), so a byte's 8/Q codes are written by one thread. The per-element arithmetic is codec.h's
// blpa_code / blpa_value. Tested byte for byte against the reference in tests/test_codec.cpp.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "actlab/core/codec.h"
#include "actlab/core/cpu/kernels.h"

namespace actlab::cpu {
namespace {

// Below this many elements a kernel runs on one thread (a team costs more than the work).
constexpr int64_t kParallelElems = 1 << 15;

// Channel c's statistics in the reference's order (core/cpu/codec_ref.cpp: value k of the channel into
// double lane k % 8, lanes summed in order), so the parameters agree bit for bit. When every plane holds a
// multiple of 8 values, value e of a plane lands in lane e % 8 and the lanes are eight independent vector
// accumulators; otherwise the lane index is carried across planes.
BlpaChannel channel_params(const float* x, const BlpaGeometry& g, int64_t c) {
  const int64_t C = g.channels, E = g.inner, count = g.outer * E;
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float lo = INFINITY, hi = -INFINITY;
  bool nan = false;
  const bool aligned = E % 8 == 0;
  int64_t k = 0;
  for (int64_t n = 0; n < g.outer; ++n) {
    const float* v = x + (n * C + c) * E;
    if (aligned) {
      for (int64_t e = 0; e < E; e += 8)
        for (int j = 0; j < 8; ++j) {
          lanes[j] += v[e + j];
          lo = std::min(lo, v[e + j]);
          hi = std::max(hi, v[e + j]);
          nan |= v[e + j] != v[e + j];  // | not ||: no branch in the vector loop
        }
    } else {
      for (int64_t e = 0; e < E; ++e, ++k) {
        lanes[k % 8] += v[e];
        lo = std::min(lo, v[e]);
        hi = std::max(hi, v[e]);
        nan = nan || v[e] != v[e];
      }
    }
  }
  double sum = 0.0;
  for (double l : lanes) sum += l;
  const double mean = sum / static_cast<double>(count);
  double square_lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  k = 0;
  for (int64_t n = 0; n < g.outer; ++n) {
    const float* v = x + (n * C + c) * E;
    if (aligned) {
      for (int64_t e = 0; e < E; e += 8)
        for (int j = 0; j < 8; ++j) {
          const double d = v[e + j] - mean;
          square_lanes[j] += d * d;
        }
    } else {
      for (int64_t e = 0; e < E; ++e, ++k) {
        const double d = v[e] - mean;
        square_lanes[k % 8] += d * d;
      }
    }
  }
  double squares = 0.0;
  for (double l : square_lanes) squares += l;
  if (nan) lo = hi = NAN;
  return blpa_channel(mean, std::sqrt(squares / static_cast<double>(count)), lo, hi, g.bits);
}

// One plane's codes and one plane's values, compiled for AVX-512 and AVX2 as well (ACTLAB_CPU_CLONES): the
// baseline build has no rounding instruction, so ceilf was a library call per element. Only division,
// rounding, compares and one product with no add after it: every clone gives the same bits.
ACTLAB_CPU_CLONES void encode_plane(uint8_t* out, const float* v, int64_t bytes, BlpaChannel p, int bits) {
  // Codes first into a small buffer (a loop the compiler vectorizes), then the 8/Q codes of each byte joined.
  constexpr int64_t kChunk = 256;
  const int64_t per_byte = 8 / bits, count = bytes * per_byte;
  uint8_t code[kChunk];
  for (int64_t start = 0; start < count; start += kChunk) {
    const int64_t n = std::min(kChunk, count - start);
    for (int64_t i = 0; i < n; ++i) code[i] = static_cast<uint8_t>(blpa_code(v[start + i], p, bits));
    uint8_t* o = out + start / per_byte;
    if (per_byte == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = code[i];
    } else {  // Q = 4
      for (int64_t i = 0; i < n / 2; ++i) o[i] = static_cast<uint8_t>(code[2 * i] | (code[2 * i + 1] << 4));
    }
  }
}

ACTLAB_CPU_CLONES void decode_plane(float* out, const uint8_t* run, int64_t first, int64_t count, BlpaChannel p,
                                    int bits) {
  for (int64_t e = 0; e < count; ++e) out[e] = blpa_value(unpack_code(run, first + e, bits), p);
}

}  // namespace

void blpa_pack(BlpaChannel* params, uint8_t* codes, const float* x, const BlpaGeometry& g) {
  const bool parallel = g.numel() >= kParallelElems;
#pragma omp parallel for schedule(static) if (parallel && g.channels > 1)
  for (int64_t c = 0; c < g.channels; ++c) params[c] = channel_params(x, g, c);
  const int64_t per_byte = 8 / g.bits, numel = g.numel(), E = g.inner, C = g.channels;
  if (E % per_byte == 0) {
    // Every plane (n, c) starts on a byte: one channel's parameters per plane, no per-element division
    // (which cost more than the code itself). Same bytes as the element loop below.
    const int64_t plane_bytes = E / per_byte;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t plane = 0; plane < g.outer * C; ++plane)
      encode_plane(codes + plane * plane_bytes, x + plane * E, plane_bytes, params[plane % C], g.bits);
    return;
  }
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t j = 0; j < g.code_bytes(); ++j) {
    uint32_t byte = 0;
    for (int64_t k = 0; k < per_byte && j * per_byte + k < numel; ++k) {
      const int64_t i = j * per_byte + k;
      byte |= blpa_code(x[i], params[(i / E) % C], g.bits) << (k * g.bits);
    }
    codes[j] = static_cast<uint8_t>(byte);
  }
}

void blpa_unpack(float* out, const BlpaChannel* params, const uint8_t* codes, const BlpaGeometry& g) {
  const int64_t numel = g.numel(), E = g.inner, C = g.channels;
  // Per plane: the channel's parameters once, the element index within the code run as the only index.
#pragma omp parallel for schedule(static) if (numel >= kParallelElems)
  for (int64_t plane = 0; plane < g.outer * C; ++plane)
    decode_plane(out + plane * E, codes, plane * E, E, params[plane % C], g.bits);
}

}  // namespace actlab::cpu
