// CPU kernels of the BLPA codes (core/codec.h: blpa_pack, blpa_unpack): the per-channel statistics in the
// order the reference states (core/cpu/codec_ref.cpp), OpenMP over channels, then the codes OpenMP over
// bytes, so a byte's 8/Q codes are written by one thread. The per-element arithmetic is codec.h's
// blpa_code / blpa_value. Tested byte for byte against the reference in tests/test_codec.cpp.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "actlab/core/codec.h"

namespace actlab::cpu {
namespace {

// Below this many elements a kernel runs on one thread (a team costs more than the work).
constexpr int64_t kParallelElems = 1 << 15;

// Channel c's statistics: sum, min, max over n then e (the reference's order: the double sums then agree
// bit for bit), then the squared deviations from the mean in the same order.
BlpaChannel channel_params(const float* x, const BlpaGeometry& g, int64_t c) {
  const int64_t C = g.channels, E = g.inner, count = g.outer * E;
  double sum = 0.0;
  float lo = INFINITY, hi = -INFINITY;
  bool nan = false;
  for (int64_t n = 0; n < g.outer; ++n) {
    const float* v = x + (n * C + c) * E;
    for (int64_t e = 0; e < E; ++e) {
      sum += v[e];
      lo = std::min(lo, v[e]);
      hi = std::max(hi, v[e]);
      nan = nan || v[e] != v[e];
    }
  }
  const double mean = sum / static_cast<double>(count);
  double squares = 0.0;
  for (int64_t n = 0; n < g.outer; ++n) {
    const float* v = x + (n * C + c) * E;
    for (int64_t e = 0; e < E; ++e) {
      const double d = v[e] - mean;
      squares += d * d;
    }
  }
  if (nan) lo = hi = NAN;
  return blpa_channel(mean, std::sqrt(squares / static_cast<double>(count)), lo, hi, g.bits);
}

}  // namespace

void blpa_pack(BlpaChannel* params, uint8_t* codes, const float* x, const BlpaGeometry& g) {
  const bool parallel = g.numel() >= kParallelElems;
#pragma omp parallel for schedule(static) if (parallel && g.channels > 1)
  for (int64_t c = 0; c < g.channels; ++c) params[c] = channel_params(x, g, c);
  const int64_t per_byte = 8 / g.bits, numel = g.numel(), E = g.inner, C = g.channels;
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
#pragma omp parallel for schedule(static) if (numel >= kParallelElems)
  for (int64_t i = 0; i < numel; ++i) out[i] = blpa_value(unpack_code(codes, i, g.bits), params[(i / E) % C]);
}

}  // namespace actlab::cpu
