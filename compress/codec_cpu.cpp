// CPU kernels of the activation codec (declared in compress/codec.h): one fused pass per plane or group,
// OpenMP over planes. Each plane is read from memory once; pool, residual, min/max, quantize and pack then
// reuse it from L1. The arithmetic is codec.h's ACTLAB_HD functions, so a CUDA twin can reproduce the
// packed bytes bit for bit. Tested in tests/test_codec.cpp; measured by bench/bench_compress.cpp.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "compress/codec.h"
#include "core/allocator.h"

// The plane/group loops are compiled for AVX-512 and AVX2 as well as the baseline and picked at load time
// (GCC function multi-versioning): Philox and the quantizer are 3x faster on AVX-512 than on SSE2. Only
// IEEE add/sub/mul/div, compares and conversions are used (no contractible a*b+c with an inexact product),
// so every version produces the same bits.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define ACTLAB_CODEC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ACTLAB_CODEC_CLONES
#endif
#if defined(__GNUC__)
#define ACTLAB_INLINE inline __attribute__((always_inline))  // inlined into each cloned caller
#else
#define ACTLAB_INLINE inline
#endif

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
// Plane loops are worth a thread team only past this many elements.
constexpr int64_t kParallelElems = 1 << 15;

// u[i] = philox_uniform(seed, stream, base + i) for i < n, computing each Philox block once for its four
// consecutive indices (philox_uniform recomputes the block per index).
ACTLAB_INLINE void fill_uniforms(float* u, uint64_t seed, uint64_t stream, uint64_t base, int64_t n) {
  if (n <= 0) return;
  const uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  const uint32_t s0 = static_cast<uint32_t>(stream), s1 = static_cast<uint32_t>(stream >> 32);
  const uint64_t end = base + static_cast<uint64_t>(n);
  const auto block_bits = [&](uint64_t b) {
    return philox4x32_10(Philox4{{static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), s0, s1}}, k0, k1);
  };
  // Blocks wholly inside [base, end) write four lanes without bounds checks (vectorized across blocks).
  const uint64_t full_begin = (base + 3) >> 2, full_end = end >> 2;
  for (uint64_t b = full_begin; b < full_end; ++b) {
    const Philox4 r = block_bits(b);
    float* dst = u + (b * 4 - base);
    for (int lane = 0; lane < 4; ++lane) dst[lane] = static_cast<float>(r.v[lane] >> 8) * kUniformScale;
  }
  // The partial head and tail blocks (a block is partial when it sticks out of [base, end)).
  const auto partial = [&](uint64_t b) {
    const Philox4 r = block_bits(b);
    for (uint64_t idx = std::max(b * 4, base); idx < std::min(b * 4 + 4, end); ++idx)
      u[idx - base] = static_cast<float>(r.v[idx & 3] >> 8) * kUniformScale;
  };
  const uint64_t head = base >> 2, tail = (end - 1) >> 2;
  if (head < full_begin || head >= full_end) partial(head);
  if (tail != head && tail >= full_end) partial(tail);
}

// codes[0..n) (one code per byte) → a run of LSB-first kBits-bit fields; n need not fill the last byte.
template <int kBits>
ACTLAB_INLINE void pack_bits(uint8_t* run, const uint8_t* codes, int64_t n) {
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

// codes[e] = code e of an LSB-first run, for e < n (one code per byte).
template <int kBits>
ACTLAB_INLINE void unpack_bits(uint8_t* codes, const uint8_t* run, int64_t n) {
  constexpr int kPerByte = 8 / kBits;
  constexpr uint32_t kMask = (1u << kBits) - 1;
  const int64_t full = n / kPerByte;
  for (int64_t j = 0; j < full; ++j)
    for (int k = 0; k < kPerByte; ++k) codes[j * kPerByte + k] = static_cast<uint8_t>((run[j] >> (k * kBits)) & kMask);
  for (int64_t e = full * kPerByte; e < n; ++e) codes[e] = static_cast<uint8_t>(unpack_code(run, e, kBits));
}

ACTLAB_INLINE void unpack_run(uint8_t* codes, const uint8_t* run, int64_t n, int bits) {
  switch (bits) {
    case 1: unpack_bits<1>(codes, run, n); break;
    case 2: unpack_bits<2>(codes, run, n); break;
    case 4: unpack_bits<4>(codes, run, n); break;
    default: unpack_bits<8>(codes, run, n); break;
  }
}

// min/max of v[0..n) as float order keys (see float_order_key): integer compares vectorize.
ACTLAB_INLINE void min_max_keys(int32_t& lo, int32_t& hi, const float* v, int64_t n) {
  for (int64_t e = 0; e < n; ++e) {
    const int32_t k = float_order_key(v[e]);
    lo = k < lo ? k : lo;
    hi = k > hi ? k : hi;
  }
}

// codes[e] = stochastic_code(v[e]) for e < n, with uniforms u.
ACTLAB_INLINE void quantize_codes(uint8_t* codes, const float* v, const float* u, int64_t n, float min, float step,
                                  int levels) {
  for (int64_t e = 0; e < n; ++e) codes[e] = static_cast<uint8_t>(stochastic_code(v[e], min, step, u[e], levels));
}

ACTLAB_INLINE void pack_run(uint8_t* run, const uint8_t* codes, int64_t n, int bits) {
  switch (bits) {
    case 1: pack_bits<1>(run, codes, n); break;
    case 2: pack_bits<2>(run, codes, n); break;
    case 4: pack_bits<4>(run, codes, n); break;
    default: pack_bits<8>(run, codes, n); break;
  }
}

// The bf16 min/step of a range given as order keys, stored to *min_out/*step_out and returned as f32.
ACTLAB_INLINE void range_params(float& min, float& step, uint16_t* min_out, uint16_t* step_out, int32_t lo,
                                int32_t hi, int bits) {
  quant_params(*min_out, *step_out, float_from_order_key(lo), float_from_order_key(hi), bits);
  min = bf16_to_float(*min_out);
  step = bf16_to_float(*step_out);
}

// lfc[i·lfc_w + j] = bf16 mean of block (i, j) of plane xp, in codec.h's summation order.
// colsum: scratch of lfc_w·block_w floats.
ACTLAB_INLINE void pool_plane(uint16_t* lfc, float* colsum, const float* xp, const PlaneGeometry& g) {
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

// The nearest-rule source index of every output row and column, computed once per call.
struct UpsampleMap {
  std::vector<int32_t> row, col;
  explicit UpsampleMap(const PlaneGeometry& g) : row(g.height), col(g.width) {
    for (int64_t h = 0; h < g.height; ++h) row[h] = static_cast<int32_t>(nearest_source(h, g.lfc_h, g.height));
    for (int64_t w = 0; w < g.width; ++w) col[w] = static_cast<int32_t>(nearest_source(w, g.lfc_w, g.width));
  }
};

// up (height × width) = the plane's LFC nearest-up-sampled, in f32: one gather per distinct source row,
// copies for the rows that repeat it. Lets the residual and reconstruction run as flat loops over the
// plane, which stay vectorized even when rows are shorter than a vector (4×4, 8×8 maps).
ACTLAB_INLINE void upsample_plane(float* up, const uint16_t* lfc, const UpsampleMap& map, const PlaneGeometry& g) {
  for (int64_t h = 0; h < g.height; ++h) {
    float* row = up + h * g.width;
    if (h > 0 && map.row[h] == map.row[h - 1]) {
      std::memcpy(row, row - g.width, static_cast<size_t>(g.width) * 4);
      continue;
    }
    const uint16_t* lfc_row = lfc + map.row[h] * g.lfc_w;
    for (int64_t w = 0; w < g.width; ++w) row[w] = bf16_to_float(lfc_row[map.col[w]]);
  }
}

// Small planes are processed in batches of consecutive planes of about this many elements: their
// element indices are contiguous, so one Philox pass and (when Q·E is a multiple of 8, so runs are
// contiguous too) one bit-pack/unpack pass serve the whole batch and stay vectorized.
constexpr int64_t kBatchElems = 4096;
int64_t planes_per_batch(const PlaneGeometry& g) { return std::max<int64_t>(1, kBatchElems / g.plane_elems()); }

// Everything plane_pack needs, so the per-thread worker is one (cloned) call.
struct PlanePackArgs {
  uint16_t* lfc;
  uint8_t* codes;
  uint16_t* mins;
  uint16_t* steps;
  float* residual;
  const float* x;
  const PlaneGeometry* g;
  const UpsampleMap* map;
  bool with_lfc;
  uint64_t seed, stream;
};
// Per-thread scratch of plane_pack for a batch of B·E elements: residuals and uniforms (f32), the
// up-sampled plane and column sums (f32), an LFC when it is not stored (bf16), codes (u8).
int64_t plane_scratch_bytes(const PlaneGeometry& g) {
  const int64_t batch = planes_per_batch(g) * g.plane_elems();
  return ((2 * batch + g.plane_elems() + g.width) * 4 + g.lfc_elems() * 2 + batch + 63) / 64 * 64;
}

// Plane p of a batch: pool (when with_lfc), residual into r_out (or x itself), min/max keys.
// Returns the values to quantize.
ACTLAB_INLINE const float* plane_residual(int32_t& lo, int32_t& hi, float* r_out, uint16_t* lfc_out, float* up,
                                          float* colsum, const float* xp, const PlanePackArgs& a) {
  const PlaneGeometry& g = *a.g;
  const int64_t E = g.plane_elems();
  lo = INT32_MAX, hi = INT32_MIN;
  if (!a.with_lfc) {
    min_max_keys(lo, hi, xp, E);
    return xp;
  }
  pool_plane(lfc_out, colsum, xp, g);
  if (!r_out) return nullptr;
  if (g.lfc_elems() == 1) {  // a plane no larger than the block (8×8, 4×4 maps): the LFC is one mean
    const float mean = bf16_to_float(lfc_out[0]);
    for (int64_t e = 0; e < E; ++e) r_out[e] = xp[e] - mean;
  } else {
    upsample_plane(up, lfc_out, *a.map, g);
    for (int64_t e = 0; e < E; ++e) r_out[e] = xp[e] - up[e];
  }
  min_max_keys(lo, hi, r_out, E);
  return r_out;
}

ACTLAB_CODEC_CLONES
void pack_planes(const PlanePackArgs& a, int64_t first, int64_t last, uint8_t* scratch) {
  const PlaneGeometry& g = *a.g;
  const int64_t E = g.plane_elems(), LE = g.lfc_elems(), code_bytes = g.code_bytes_per_plane();
  const int64_t batch = planes_per_batch(g);
  const bool contiguous_runs = (g.bits * E) % 8 == 0;
  float* rbuf = reinterpret_cast<float*>(scratch);
  float* uniforms = rbuf + batch * E;
  float* up = uniforms + batch * E;
  float* colsum = up + E;
  uint16_t* lfc_scratch = reinterpret_cast<uint16_t*>(colsum + g.width);
  uint8_t* cbuf = reinterpret_cast<uint8_t*>(lfc_scratch + LE);
  for (int64_t p0 = first; p0 < last; p0 += batch) {
    const int64_t nb = std::min(batch, last - p0);
    if (a.codes) fill_uniforms(uniforms, a.seed, a.stream, static_cast<uint64_t>(p0 * E), nb * E);
    for (int64_t q = 0; q < nb; ++q) {
      const int64_t p = p0 + q;
      int32_t lo, hi;
      float* r_out = a.residual ? a.residual + p * E : a.codes ? rbuf + q * E : nullptr;
      if (!a.with_lfc && a.residual) std::memcpy(r_out, a.x + p * E, static_cast<size_t>(E) * 4);
      const float* r = plane_residual(lo, hi, r_out, a.lfc ? a.lfc + p * LE : lfc_scratch, up, colsum, a.x + p * E, a);
      if (!a.codes) continue;
      float min, step;
      range_params(min, step, a.mins + p, a.steps + p, lo, hi, g.bits);
      quantize_codes(cbuf + q * E, r, uniforms + q * E, E, min, step, quant_levels(g.bits));
      if (!contiguous_runs) pack_run(a.codes + p * code_bytes, cbuf + q * E, E, g.bits);
    }
    if (a.codes && contiguous_runs) pack_run(a.codes + p0 * code_bytes, cbuf, nb * E, g.bits);
  }
}

struct PlaneUnpackArgs {
  float* out;
  const uint16_t* lfc;
  const uint8_t* codes;
  const uint16_t* mins;
  const uint16_t* steps;
  const PlaneGeometry* g;
  const UpsampleMap* map;
};
// Per-thread scratch: the up-sampled plane (f32) and a batch of codes (u8).
int64_t unpack_scratch_bytes(const PlaneGeometry& g) {
  return (g.plane_elems() * 4 + planes_per_batch(g) * g.plane_elems() + 63) / 64 * 64;
}

ACTLAB_CODEC_CLONES
void unpack_planes(const PlaneUnpackArgs& a, int64_t first, int64_t last, uint8_t* scratch) {
  const PlaneGeometry& g = *a.g;
  const int64_t E = g.plane_elems(), LE = g.lfc_elems(), code_bytes = g.code_bytes_per_plane();
  const int64_t batch = planes_per_batch(g);
  const bool contiguous_runs = (g.bits * E) % 8 == 0;
  float* up = reinterpret_cast<float*>(scratch);
  uint8_t* cbuf = scratch + E * 4;
  for (int64_t p0 = first; p0 < last; p0 += batch) {
    const int64_t nb = std::min(batch, last - p0);
    if (a.codes && contiguous_runs) unpack_run(cbuf, a.codes + p0 * code_bytes, nb * E, g.bits);
    for (int64_t q = 0; q < nb; ++q) {
      const int64_t p = p0 + q;
      float* op = a.out + p * E;
      const uint8_t* codes = cbuf + q * E;
      if (a.lfc && LE > 1) upsample_plane(a.codes ? up : op, a.lfc + p * LE, *a.map, g);
      const float mean = a.lfc && LE == 1 ? bf16_to_float(a.lfc[p]) : 0.f;  // a one-value LFC
      if (!a.codes) {
        if (LE == 1) std::fill(op, op + E, mean);
        continue;
      }
      if (!contiguous_runs) unpack_run(cbuf + q * E, a.codes + p * code_bytes, E, g.bits);
      const float min = bf16_to_float(a.mins[p]), step = bf16_to_float(a.steps[p]);
      if (a.lfc && LE == 1) {
        for (int64_t e = 0; e < E; ++e) op[e] = mean + dequantize(codes[e], min, step);
      } else if (a.lfc) {
        for (int64_t e = 0; e < E; ++e) op[e] = up[e] + dequantize(codes[e], min, step);
      } else {
        for (int64_t e = 0; e < E; ++e) op[e] = dequantize(codes[e], min, step);
      }
    }
  }
}

// Splits [0, n) evenly over the team and calls f(first, last, scratch of this thread).
template <typename F>
void for_each_thread_range(int64_t n, int64_t work, int64_t scratch_bytes, F f) {
  const int threads = work >= kParallelElems ? std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>(n))) : 1;
  Buffer scratch(static_cast<size_t>(scratch_bytes * threads), MemTag::Workspace);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
    f(n * t / team, n * (t + 1) / team, scratch.as<uint8_t>() + scratch_bytes * t);
  }
}

}  // namespace

void plane_pack(uint16_t* lfc, uint8_t* codes, uint16_t* mins, uint16_t* steps, float* residual,
                const float* x, const PlaneGeometry& g, bool with_lfc, uint64_t seed, uint64_t stream) {
  const UpsampleMap map(g);
  const PlanePackArgs args{lfc, codes, mins, steps, residual, x, &g, &map, with_lfc, seed, stream};
  for_each_thread_range(g.planes, g.planes * g.plane_elems(), plane_scratch_bytes(g),
                        [&](int64_t first, int64_t last, uint8_t* scratch) { pack_planes(args, first, last, scratch); });
}

void plane_unpack(float* out, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                  const uint16_t* steps, const PlaneGeometry& g) {
  const UpsampleMap map(g);
  const PlaneUnpackArgs args{out, lfc, codes, mins, steps, &g, &map};
  for_each_thread_range(g.planes, g.planes * g.plane_elems(), unpack_scratch_bytes(g),
                        [&](int64_t first, int64_t last, uint8_t* scratch) { unpack_planes(args, first, last, scratch); });
}

namespace {

ACTLAB_CODEC_CLONES
void pack_groups(uint8_t* codes, uint16_t* mins, uint16_t* steps, const float* x, const GroupGeometry& g,
                 uint64_t seed, uint64_t stream, int64_t first, int64_t last, uint8_t* scratch) {
  const int64_t G = g.group_size, per_sample = g.groups_per_sample(), code_bytes = g.code_bytes_per_group();
  float* uniforms = reinterpret_cast<float*>(scratch);
  uint8_t* cbuf = scratch + G * 4;
  for (int64_t k = first; k < last; ++k) {
    const int64_t n = k / per_sample, begin = (k % per_sample) * G;
    const int64_t count = std::min(G, g.sample_elems - begin);
    const uint64_t base = static_cast<uint64_t>(n * g.sample_elems + begin);
    const float* v = x + base;
    int32_t lo = count < G ? float_order_key(0.f) : float_order_key(v[0]), hi = lo;  // padding zeros count
    min_max_keys(lo, hi, v, count);
    float min, step;
    range_params(min, step, mins + k, steps + k, lo, hi, g.bits);
    fill_uniforms(uniforms, seed, stream, base, count);
    quantize_codes(cbuf, v, uniforms, count, min, step, quant_levels(g.bits));
    std::memset(cbuf + count, 0, static_cast<size_t>(G - count));  // padding: code 0
    pack_run(codes + k * code_bytes, cbuf, G, g.bits);
  }
}

ACTLAB_CODEC_CLONES
void unpack_groups(float* out, const uint8_t* codes, const uint16_t* mins, const uint16_t* steps,
                   const GroupGeometry& g, int64_t first, int64_t last, uint8_t* scratch) {
  const int64_t G = g.group_size, per_sample = g.groups_per_sample(), code_bytes = g.code_bytes_per_group();
  for (int64_t k = first; k < last; ++k) {
    const int64_t n = k / per_sample, begin = (k % per_sample) * G;
    const int64_t count = std::min(G, g.sample_elems - begin);
    unpack_run(scratch, codes + k * code_bytes, count, g.bits);
    const float min = bf16_to_float(mins[k]), step = bf16_to_float(steps[k]);
    float* o = out + n * g.sample_elems + begin;
    for (int64_t e = 0; e < count; ++e) o[e] = dequantize(scratch[e], min, step);
  }
}

}  // namespace

void group_pack(uint8_t* codes, uint16_t* mins, uint16_t* steps, const float* x, const GroupGeometry& g,
                uint64_t seed, uint64_t stream) {
  for_each_thread_range(g.groups(), g.samples * g.sample_elems, (g.group_size * 5 + 63) / 64 * 64,
                        [&](int64_t first, int64_t last, uint8_t* scratch) {
                          pack_groups(codes, mins, steps, x, g, seed, stream, first, last, scratch);
                        });
}

void group_unpack(float* out, const uint8_t* codes, const uint16_t* mins, const uint16_t* steps,
                  const GroupGeometry& g) {
  for_each_thread_range(g.groups(), g.samples * g.sample_elems, (g.group_size + 63) / 64 * 64,
                        [&](int64_t first, int64_t last, uint8_t* scratch) {
                          unpack_groups(out, codes, mins, steps, g, first, last, scratch);
                        });
}

}  // namespace cpu
}  // namespace actlab
