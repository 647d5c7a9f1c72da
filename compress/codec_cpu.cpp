// CPU kernels of the activation codec (declared in compress/codec.h): one fused pass per plane or group,
// OpenMP over planes. Each plane is read from memory once; the pool, residual, min/max, quantize and pack
// steps then reuse it from L1. The arithmetic is codec.h's ACTLAB_HD functions, so a CUDA twin can
// reproduce the packed bytes bit for bit. Tested in tests/test_codec.cpp.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "compress/codec.h"
#include "core/allocator.h"

namespace actlab {

PlaneGeometry make_plane_geometry(int64_t planes, int64_t height, int64_t width, int64_t block, int bits) {
  ACTLAB_CHECK(planes >= 0 && height >= 1 && width >= 1 && block >= 1, "bad plane geometry: planes ", planes,
               ", plane ", height, "x", width, ", block ", block);
  PlaneGeometry g;
  g.planes = planes;
  g.height = height;
  g.width = width;
  g.block_h = std::min(block, height);
  g.block_w = std::min(block, width);
  g.lfc_h = height / g.block_h;
  g.lfc_w = width / g.block_w;
  g.bits = bits;
  return g;
}

namespace cpu {
namespace {

constexpr float kUniformScale = 1.0f / 16777216.0f;  // 2^-24, as philox_uniform

// u[i] = philox_uniform(seed, stream, base + i) for i < n, computing each Philox block once for its four
// consecutive indices (philox_uniform recomputes the block per index).
void fill_uniforms(float* u, uint64_t seed, uint64_t stream, uint64_t base, int64_t n) {
  if (n <= 0) return;
  const uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  const uint32_t s0 = static_cast<uint32_t>(stream), s1 = static_cast<uint32_t>(stream >> 32);
  const uint64_t end = base + static_cast<uint64_t>(n);
  const uint64_t first_block = base >> 2, last_block = (end - 1) >> 2;
  // Blocks wholly inside [base, end) write four lanes without bounds checks (vectorizable).
  const uint64_t full_begin = (base + 3) >> 2, full_end = end >> 2;
  for (uint64_t b = full_begin; b < full_end; ++b) {
    const Philox4 r = philox4x32_10(Philox4{{static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), s0, s1}}, k0, k1);
    float* dst = u + (b * 4 - base);
    for (int lane = 0; lane < 4; ++lane) dst[lane] = static_cast<float>(r.v[lane] >> 8) * kUniformScale;
  }
  // The partial head and tail blocks.
  for (uint64_t b : {first_block, last_block}) {
    if (b >= full_begin && b < full_end) continue;
    const Philox4 r = philox4x32_10(Philox4{{static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), s0, s1}}, k0, k1);
    for (int lane = 0; lane < 4; ++lane) {
      const uint64_t idx = b * 4 + lane;
      if (idx >= base && idx < end) u[idx - base] = static_cast<float>(r.v[lane] >> 8) * kUniformScale;
    }
  }
}

// codes[0..n) (one code per byte) → LSB-first runs of kBits-bit fields; n need not fill the last byte.
template <int kBits>
void pack_bits(uint8_t* run, const uint8_t* codes, int64_t n) {
  constexpr int kPerByte = 8 / kBits;
  const int64_t full = n / kPerByte;
  for (int64_t j = 0; j < full; ++j) {
    uint32_t byte = 0;
    for (int k = 0; k < kPerByte; ++k) byte |= static_cast<uint32_t>(codes[j * kPerByte + k]) << (k * kBits);
    run[j] = static_cast<uint8_t>(byte);
  }
  if (full * kPerByte < n) {
    uint32_t byte = 0;
    for (int64_t e = full * kPerByte; e < n; ++e) byte |= static_cast<uint32_t>(codes[e]) << ((e - full * kPerByte) * kBits);
    run[full] = static_cast<uint8_t>(byte);
  }
}

// out[e] = dequantize(code e of run, min, step) for e < n.
template <int kBits>
void unpack_dequantize(float* out, const uint8_t* run, float min, float step, int64_t n) {
  constexpr int kPerByte = 8 / kBits;
  constexpr uint32_t kMask = (1u << kBits) - 1;
  const int64_t full = n / kPerByte;
  for (int64_t j = 0; j < full; ++j) {
    const uint32_t byte = run[j];
    for (int k = 0; k < kPerByte; ++k) out[j * kPerByte + k] = dequantize((byte >> (k * kBits)) & kMask, min, step);
  }
  for (int64_t e = full * kPerByte; e < n; ++e) out[e] = dequantize(unpack_code(run, e, kBits), min, step);
}

void dequantize_run(float* out, const uint8_t* run, float min, float step, int64_t n, int bits) {
  switch (bits) {
    case 1: unpack_dequantize<1>(out, run, min, step, n); break;
    case 2: unpack_dequantize<2>(out, run, min, step, n); break;
    case 4: unpack_dequantize<4>(out, run, min, step, n); break;
    default: unpack_dequantize<8>(out, run, min, step, n); break;
  }
}

// Per-thread scratch of the quantizer: uniforms and one-byte codes for up to `elems` values.
struct QuantScratch {
  float* uniforms;
  uint8_t* codes;
};

// Quantizes v[0..n) followed by (n_total − n) zeros into one byte-aligned run of ceil(bits·n_total/8)
// bytes, with its bf16 min/step. Value i draws philox_uniform(seed, stream, base + i); the zero padding
// widens the range (ActNN) and is stored as code 0.
void quantize_run(uint8_t* run, uint16_t* min_out, uint16_t* step_out, const float* v, int64_t n, int64_t n_total,
                  int bits, uint64_t seed, uint64_t stream, uint64_t base, const QuantScratch& s) {
  float lo = v[0], hi = v[0];
#pragma omp simd reduction(min : lo) reduction(max : hi)
  for (int64_t e = 0; e < n; ++e) {
    lo = std::min(lo, v[e]);
    hi = std::max(hi, v[e]);
  }
  if (n_total > n) {
    lo = std::min(lo, 0.f);
    hi = std::max(hi, 0.f);
  }
  uint16_t min_bits, step_bits;
  quant_params(min_bits, step_bits, lo, hi, bits);
  *min_out = min_bits;
  *step_out = step_bits;
  const float min = bf16_to_float(min_bits), step = bf16_to_float(step_bits);
  const int levels = quant_levels(bits);

  fill_uniforms(s.uniforms, seed, stream, base, n);
  for (int64_t e = 0; e < n; ++e) s.codes[e] = static_cast<uint8_t>(stochastic_code(v[e], min, step, s.uniforms[e], levels));
  std::memset(s.codes + n, 0, static_cast<size_t>(n_total - n));
  switch (bits) {
    case 1: pack_bits<1>(run, s.codes, n_total); break;
    case 2: pack_bits<2>(run, s.codes, n_total); break;
    case 4: pack_bits<4>(run, s.codes, n_total); break;
    default: pack_bits<8>(run, s.codes, n_total); break;
  }
}

// lfc[i·lfc_w + j] = bf16 mean of block (i, j) of plane xp, in codec.h's summation order.
// colsum: scratch of lfc_w·block_w floats.
void pool_plane(uint16_t* lfc, float* colsum, const float* xp, const PlaneGeometry& g) {
  const int64_t used_w = g.lfc_w * g.block_w, area = g.block_h * g.block_w;
  for (int64_t i = 0; i < g.lfc_h; ++i) {
    const float* top = xp + i * g.block_h * g.width;
    for (int64_t c = 0; c < used_w; ++c) colsum[c] = top[c];
    for (int64_t r = 1; r < g.block_h; ++r) {
      const float* row = top + r * g.width;
      for (int64_t c = 0; c < used_w; ++c) colsum[c] += row[c];
    }
    for (int64_t j = 0; j < g.lfc_w; ++j) {
      float sum = colsum[j * g.block_w];
      for (int64_t b = 1; b < g.block_w; ++b) sum += colsum[j * g.block_w + b];
      lfc[i * g.lfc_w + j] = lfc_from_sum(sum, area);
    }
  }
}

// Row h of the nearest-up-sampled LFC of one plane: urow[w] = L[src(h), col_source[w]] in f32.
void upsample_row(float* urow, const uint16_t* lfc, const int32_t* col_source, int64_t h, const PlaneGeometry& g) {
  const uint16_t* lrow = lfc + nearest_source(h, g.lfc_h, g.height) * g.lfc_w;
  for (int64_t w = 0; w < g.width; ++w) urow[w] = bf16_to_float(lrow[col_source[w]]);
}

std::vector<int32_t> column_sources(const PlaneGeometry& g) {
  std::vector<int32_t> src(static_cast<size_t>(g.width));
  for (int64_t w = 0; w < g.width; ++w) src[w] = static_cast<int32_t>(nearest_source(w, g.lfc_w, g.width));
  return src;
}

// Plane loops are worth a thread team only past this many elements.
constexpr int64_t kParallelElems = 1 << 15;

}  // namespace

void plane_pack(uint16_t* lfc, uint8_t* codes, uint16_t* mins, uint16_t* steps, float* residual,
                const float* x, const PlaneGeometry& g, bool with_lfc, uint64_t seed, uint64_t stream) {
  const int64_t E = g.plane_elems(), LE = g.lfc_elems(), code_bytes = g.code_bytes_per_plane();
  const std::vector<int32_t> col_source = column_sources(g);
  // Per thread: residual, up-sampled row, column sums, uniforms (f32), an LFC if not stored, codes (u8).
  const int64_t scratch_floats = E + 2 * g.width + E, scratch_bytes = (scratch_floats * 4 + LE * 2 + E + 63) / 64 * 64;
  const int threads = omp_get_max_threads();
  Buffer scratch(static_cast<size_t>(scratch_bytes * threads), MemTag::Workspace);
#pragma omp parallel num_threads(threads) if (g.planes * E >= kParallelElems)
  {
    uint8_t* mine = scratch.as<uint8_t>() + scratch_bytes * omp_get_thread_num();
    float* rbuf = reinterpret_cast<float*>(mine);
    float* urow = rbuf + E;
    float* colsum = urow + g.width;
    QuantScratch qs{colsum + g.width, reinterpret_cast<uint8_t*>(colsum + g.width + E) + LE * 2};
    uint16_t* lfc_scratch = reinterpret_cast<uint16_t*>(colsum + g.width + E);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < g.planes; ++p) {
      const float* xp = x + p * E;
      const float* r = xp;
      if (with_lfc) {
        uint16_t* lp = lfc ? lfc + p * LE : lfc_scratch;
        pool_plane(lp, colsum, xp, g);
        if (codes || residual) {
          float* rp = residual ? residual + p * E : rbuf;
          for (int64_t h = 0; h < g.height; ++h) {
            upsample_row(urow, lp, col_source.data(), h, g);
            const float* xrow = xp + h * g.width;
            float* rrow = rp + h * g.width;
            for (int64_t w = 0; w < g.width; ++w) rrow[w] = xrow[w] - urow[w];
          }
          r = rp;
        }
      } else if (residual) {
        std::memcpy(residual + p * E, xp, static_cast<size_t>(E) * 4);
      }
      if (codes)
        quantize_run(codes + p * code_bytes, mins + p, steps + p, r, E, E, g.bits, seed, stream,
                     static_cast<uint64_t>(p * E), qs);
    }
  }
}

void plane_unpack(float* out, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                  const uint16_t* steps, const PlaneGeometry& g) {
  const int64_t E = g.plane_elems(), LE = g.lfc_elems(), code_bytes = g.code_bytes_per_plane();
  const std::vector<int32_t> col_source = column_sources(g);
  const int threads = omp_get_max_threads();
  Buffer scratch(static_cast<size_t>(g.width * 4 * threads), MemTag::Workspace);
#pragma omp parallel num_threads(threads) if (g.planes * E >= kParallelElems)
  {
    float* urow = scratch.as<float>() + g.width * omp_get_thread_num();
#pragma omp for schedule(static)
    for (int64_t p = 0; p < g.planes; ++p) {
      float* op = out + p * E;
      if (codes) dequantize_run(op, codes + p * code_bytes, bf16_to_float(mins[p]), bf16_to_float(steps[p]), E, g.bits);
      if (!lfc) continue;
      for (int64_t h = 0; h < g.height; ++h) {
        upsample_row(urow, lfc + p * LE, col_source.data(), h, g);
        float* orow = op + h * g.width;
        if (codes) {
          for (int64_t w = 0; w < g.width; ++w) orow[w] = urow[w] + orow[w];
        } else {
          std::memcpy(orow, urow, static_cast<size_t>(g.width) * 4);
        }
      }
    }
  }
}

void group_pack(uint8_t* codes, uint16_t* mins, uint16_t* steps, const float* x, const GroupGeometry& g,
                uint64_t seed, uint64_t stream) {
  const int64_t G = g.group_size, per_sample = g.groups_per_sample(), code_bytes = g.code_bytes_per_group();
  const int threads = omp_get_max_threads();
  const int64_t scratch_bytes = (G * 5 + 63) / 64 * 64;
  Buffer scratch(static_cast<size_t>(scratch_bytes * threads), MemTag::Workspace);
#pragma omp parallel num_threads(threads) if (g.samples * g.sample_elems >= kParallelElems)
  {
    uint8_t* mine = scratch.as<uint8_t>() + scratch_bytes * omp_get_thread_num();
    const QuantScratch qs{reinterpret_cast<float*>(mine), mine + G * 4};
#pragma omp for schedule(static)
    for (int64_t k = 0; k < g.groups(); ++k) {
      const int64_t n = k / per_sample, first = (k % per_sample) * G;
      const int64_t count = std::min(G, g.sample_elems - first);
      const uint64_t base = static_cast<uint64_t>(n * g.sample_elems + first);
      quantize_run(codes + k * code_bytes, mins + k, steps + k, x + base, count, G, g.bits, seed, stream, base, qs);
    }
  }
}

void group_unpack(float* out, const uint8_t* codes, const uint16_t* mins, const uint16_t* steps,
                  const GroupGeometry& g) {
  const int64_t G = g.group_size, per_sample = g.groups_per_sample(), code_bytes = g.code_bytes_per_group();
#pragma omp parallel for schedule(static) if (g.samples * g.sample_elems >= kParallelElems)
  for (int64_t k = 0; k < g.groups(); ++k) {
    const int64_t n = k / per_sample, first = (k % per_sample) * G;
    const int64_t count = std::min(G, g.sample_elems - first);
    dequantize_run(out + n * g.sample_elems + first, codes + k * code_bytes, bf16_to_float(mins[k]),
                   bf16_to_float(steps[k]), count, g.bits);
  }
}

}  // namespace cpu
}  // namespace actlab
