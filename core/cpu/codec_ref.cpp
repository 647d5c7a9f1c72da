// The reference activation codec (core/codec.h, *_ref): the specification of cpu::plane_pack,
// plane_unpack, group_pack and group_unpack, one element at a time. Slow on purpose; nothing but the
// tests calls it. Every step is a formula of docs/policies.md:
//   L[i][j]   = bf16( Σ over the B_h × B_w block of x / (B_h·B_w) ), the block sum taken column by column
//   R[h][w]   = x[h][w] − bf16→f32( L[⌊h·lfc_h/H⌋][⌊w·lfc_w/W⌋] )            (R = x without the LFC)
//   min, step = quant_params(min R, max R, Q) per range of rows                 (both bf16)
//   code      = stochastic_code(R, min, 1/step, philox_uniform8(seed, stream, p·E + e), 2^Q − 1)
//   unpack    = L↑ + min + code·step
#include <algorithm>
#include <cmath>
#include <vector>

#include "actlab/core/codec.h"

namespace actlab::cpu {

void plane_pack_ref(uint16_t* lfc, uint8_t* codes, uint16_t* mins, uint16_t* steps, float* residual, const float* x,
                    const PlaneGeometry& g, bool with_lfc, uint64_t seed, uint64_t stream) {
  const int64_t E = g.plane_elems();
  std::vector<uint16_t> plane_lfc(static_cast<size_t>(g.lfc_elems()));
  std::vector<float> r(static_cast<size_t>(E));
  for (int64_t p = 0; p < g.planes; ++p) {
    const float* X = x + p * E;
    if (with_lfc) {
      for (int64_t i = 0; i < g.lfc_h; ++i)
        for (int64_t j = 0; j < g.lfc_w; ++j) {
          float sum = 0.f;
          for (int64_t b = 0; b < g.block_w; ++b) {
            float col = 0.f;
            for (int64_t a = 0; a < g.block_h; ++a) col += X[(i * g.block_h + a) * g.width + j * g.block_w + b];
            sum += col;
          }
          plane_lfc[i * g.lfc_w + j] = float_to_bf16(sum / static_cast<float>(g.block_h * g.block_w));
        }
      if (lfc) std::copy(plane_lfc.begin(), plane_lfc.end(), lfc + p * g.lfc_elems());
    }
    for (int64_t h = 0; h < g.height; ++h)
      for (int64_t w = 0; w < g.width; ++w) {
        const float up = with_lfc ? bf16_to_float(plane_lfc[nearest_source(h, g.lfc_h, g.height) * g.lfc_w +
                                                             nearest_source(w, g.lfc_w, g.width)])
                                  : 0.f;
        r[h * g.width + w] = X[h * g.width + w] - up;
      }
    if (residual) std::copy(r.begin(), r.end(), residual + p * E);
    if (codes == nullptr || g.bits == 0) continue;
    // Range k covers plane elements [k·RE, (k+1)·RE); one cut short by the plane's end counts its zero
    // padding in its min and max, and the padding keeps code 0.
    const int64_t RE = g.range_elems();
    for (int64_t k = 0; k < g.ranges_per_plane(); ++k) {
      const int64_t first = k * RE, count = std::min(RE, E - first), at = p * g.ranges_per_plane() + k;
      float lo = count < RE ? 0.f : INFINITY, hi = count < RE ? 0.f : -INFINITY;
      for (int64_t e = first; e < first + count; ++e) {
        lo = std::min(lo, r[e]);
        hi = std::max(hi, r[e]);
      }
      quant_params(mins[at], steps[at], lo, hi, g.bits);
      uint8_t* run = codes + at * g.code_bytes_per_range();
      std::fill(run, run + g.code_bytes_per_range(), uint8_t{0});
      const float min = bf16_to_float(mins[at]), inv_step = 1.0f / bf16_to_float(steps[at]);
      for (int64_t d = 0; d < count; ++d) {
        const float u = philox_uniform8(seed, stream, static_cast<uint64_t>(p * E + first + d));
        const uint32_t code = stochastic_code(r[first + d], min, inv_step, u, quant_levels(g.bits));
        run[d * g.bits / 8] |= static_cast<uint8_t>(code << (d * g.bits % 8));
      }
    }
  }
}

void plane_unpack_ref(float* out, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                      const uint16_t* steps, const PlaneGeometry& g) {
  const int64_t E = g.plane_elems();
  for (int64_t p = 0; p < g.planes; ++p)
    for (int64_t e = 0; e < E; ++e) {
      const int64_t h = e / g.width, w = e % g.width;
      const float up = lfc ? bf16_to_float(lfc[p * g.lfc_elems() + nearest_source(h, g.lfc_h, g.height) * g.lfc_w +
                                               nearest_source(w, g.lfc_w, g.width)])
                           : 0.f;
      const int64_t at = p * g.ranges_per_plane() + e / g.range_elems();  // the range of element e
      const float deq = codes ? dequantize(unpack_code(codes + at * g.code_bytes_per_range(), e % g.range_elems(),
                                                       g.bits),
                                           bf16_to_float(mins[at]), bf16_to_float(steps[at]))
                              : 0.f;
      out[p * E + e] = lfc && codes ? up + deq : lfc ? up : deq;
    }
}

void group_pack_ref(uint8_t* codes, uint16_t* mins, uint16_t* steps, const float* x, const GroupGeometry& g,
                    uint64_t seed, uint64_t stream) {
  for (int64_t k = 0; k < g.groups(); ++k) {
    const int64_t n = k / g.groups_per_sample(), first = (k % g.groups_per_sample()) * g.group_size;
    const int64_t count = std::min(g.group_size, g.sample_elems - first);
    // A group cut short by the end of the sample counts its zero padding in the range.
    float lo = count < g.group_size ? 0.f : INFINITY, hi = count < g.group_size ? 0.f : -INFINITY;
    for (int64_t d = 0; d < count; ++d) {
      lo = std::min(lo, x[n * g.sample_elems + first + d]);
      hi = std::max(hi, x[n * g.sample_elems + first + d]);
    }
    quant_params(mins[k], steps[k], lo, hi, g.bits);
    uint8_t* run = codes + k * g.code_bytes_per_group();
    std::fill(run, run + g.code_bytes_per_group(), uint8_t{0});
    for (int64_t d = 0; d < count; ++d) {  // padding keeps code 0
      const int64_t at = n * g.sample_elems + first + d;
      const uint64_t index = static_cast<uint64_t>((g.first_sample + n) * g.sample_elems + first + d);
      const uint32_t code = stochastic_code(x[at], bf16_to_float(mins[k]), 1.0f / bf16_to_float(steps[k]),
                                            philox_uniform8(seed, stream, index), quant_levels(g.bits));
      run[d * g.bits / 8] |= static_cast<uint8_t>(code << (d * g.bits % 8));
    }
  }
}

void group_unpack_ref(float* out, const uint8_t* codes, const uint16_t* mins, const uint16_t* steps,
                      const GroupGeometry& g) {
  for (int64_t i = 0; i < g.samples * g.sample_elems; ++i) {
    const int64_t n = i / g.sample_elems, d = i % g.sample_elems;
    const int64_t k = n * g.groups_per_sample() + d / g.group_size;
    out[i] = dequantize(unpack_code(codes + k * g.code_bytes_per_group(), d % g.group_size, g.bits),
                        bf16_to_float(mins[k]), bf16_to_float(steps[k]));
  }
}

void group_range_norms_ref(double* out, const float* x, const GroupGeometry& g) {
  for (int64_t n = 0; n < g.samples; ++n) {
    out[n] = 0.0;
    for (int64_t first = 0; first < g.sample_elems; first += g.group_size) {
      const int64_t count = std::min(g.group_size, g.sample_elems - first);
      float lo = count < g.group_size ? 0.f : INFINITY, hi = count < g.group_size ? 0.f : -INFINITY;
      for (int64_t d = 0; d < count; ++d) {
        lo = std::min(lo, x[n * g.sample_elems + first + d]);
        hi = std::max(hi, x[n * g.sample_elems + first + d]);
      }
      const double range = static_cast<double>(hi - lo);
      out[n] += range * range;
    }
  }
}

// The channel statistics in the order blpa_pack promises: the channel's values counted k = 0, 1, ... over
// n then e; value k is added into double lane k % 8, and the eight lanes are summed 0 to 7 (the sum, then
// the squared deviations from the mean the same way). Eight lanes let the fast kernel use vector adds.
void blpa_pack_ref(BlpaChannel* params, uint8_t* codes, const float* x, const BlpaGeometry& g) {
  const int64_t C = g.channels, E = g.inner, count = g.outer * E;
  for (int64_t c = 0; c < C; ++c) {
    double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float lo = INFINITY, hi = -INFINITY;
    bool nan = false;
    int64_t k = 0;
    for (int64_t n = 0; n < g.outer; ++n)
      for (int64_t e = 0; e < E; ++e, ++k) {
        const float v = x[(n * C + c) * E + e];
        lanes[k % 8] += v;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
        nan = nan || v != v;
      }
    double sum = 0.0;
    for (double l : lanes) sum += l;
    const double mean = sum / static_cast<double>(count);
    double square_lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    k = 0;
    for (int64_t n = 0; n < g.outer; ++n)
      for (int64_t e = 0; e < E; ++e, ++k) {
        const double d = x[(n * C + c) * E + e] - mean;
        square_lanes[k % 8] += d * d;
      }
    double squares = 0.0;
    for (double l : square_lanes) squares += l;
    if (nan) lo = hi = NAN;
    params[c] = blpa_channel(mean, std::sqrt(squares / static_cast<double>(count)), lo, hi, g.bits);
  }
  std::fill(codes, codes + g.code_bytes(), uint8_t{0});
  for (int64_t i = 0; i < g.numel(); ++i) {
    const uint32_t code = blpa_code(x[i], params[(i / E) % C], g.bits);
    codes[i * g.bits / 8] |= static_cast<uint8_t>(code << (i * g.bits % 8));
  }
}

void blpa_unpack_ref(float* out, const BlpaChannel* params, const uint8_t* codes, const BlpaGeometry& g) {
  for (int64_t i = 0; i < g.numel(); ++i)
    out[i] = blpa_value(unpack_code(codes, i, g.bits), params[(i / g.inner) % g.channels]);
}

}  // namespace actlab::cpu
