// CUDA kernels of the activation codec (core/cuda/codec.h). A "team" of 1-32 consecutive lanes of a
// warp (a power of two, sized to the plane) owns one plane (or group) for the whole pass:
//   pack:   LFC block sums (lanes split the blocks; sums in codec.h's order) -> __syncwarp -> residual and
//           min/max keys per 8-element chunk -> team shuffle reduction -> quant_params -> residual again,
//           8-bit Philox uniforms (half a Philox block per aligned chunk) -> codes -> Q bytes per chunk.
//   unpack: one thread per chunk of any plane: Q bytes -> codes -> LFC↑ + dequantized codes.
// Planes of more than kTeamChunks chunks (token maps, ImageNet-sized feature maps) pack in three grids of
// one thread per LFC block or chunk instead (pack_large_planes), meeting in the planes' min/max by atomics.
// Planes of several code ranges (PlaneGeometry::range_rows) run as two kernels: the plane kernel's LFC
// and residual, then the group kernel with every range a group (the same draws and bytes; see plane_pack).
// An 8-element chunk starting at element 8c of a plane covers exactly bytes [cQ, cQ + Q) of the plane's
// LSB-first code run, so lanes write disjoint bytes. Every value is computed by codec.h's ACTLAB_HD
// functions in the CPU's order (no FMA can change a result: the only product, code·step, is exact), so
// the bytes equal core/cpu/codec.cpp's. Tested in tests/test_cuda_codec.cpp.
#include <cuda_runtime.h>

#include "actlab/core/cuda/codec.h"
#include "actlab/core/allocator.h"
#include "actlab/core/cuda/check.h"
#include "actlab/core/cuda/context.h"
#include "actlab/core/cuda/launch.h"

namespace actlab::cuda {
namespace {

constexpr int kChunk = 8;                  // elements per lane step: Q whole code bytes, half a Philox block
constexpr int kCodecThreads = 256;         // threads per block; teams never straddle a warp
constexpr int64_t kMaxMapEntries = 8192;   // up-sampling maps of H + W entries live in shared memory

// The geometry as plain values for device code (PlaneGeometry's helpers are host functions). Sizes inside
// one plane are 32-bit: 64-bit division and multiplication are multi-instruction sequences on a GPU, and
// index arithmetic was most of the pack kernel's instructions (Nsight Compute on an H200).
struct Planes {
  int64_t planes;
  int H, W, lh, lw, bh, bw, E, LE, code_bytes;
  int bits;
  // E is a multiple of 8 and the f32 tensor (x, or out) is 16-byte aligned: every chunk is two aligned
  // float4 accesses. A warp then moves 32 contiguous bytes per lane in 2 instructions instead of 8 scalar
  // ones at a 32-byte stride, which filled the L2 with partial-sector requests (unpack was L2-bound at
  // under 10 % of the copy bandwidth).
  bool vec;
  // How a chunk's 8 elements meet the LFC (chunk_lfc): the general rule looks each element up through the
  // row and column maps; block-aligned planes (B divides H and W, W a multiple of 8; or a 1×1 LFC) use
  // one LFC value for the whole chunk, and token maps (block width 1) a run of 8 consecutive LFC values.
  int lfc_run;
};
constexpr int kLfcEach = 0, kLfcOne = 1, kLfcRow = 2;
Planes planes_of(const PlaneGeometry& g, const void* f32) {
  ACTLAB_CHECK(g.plane_elems() <= INT32_MAX / 2 && g.code_bytes_per_plane() <= INT32_MAX,
               "codec: a plane of ", g.plane_elems(), " elements is more than the GPU codec indexes");
  const auto i32 = [](int64_t v) { return static_cast<int>(v); };
  const bool one_per_chunk = (g.lfc_h == 1 && g.lfc_w == 1) ||
                             (g.width % kChunk == 0 && g.block_w % kChunk == 0 && g.width == g.lfc_w * g.block_w &&
                              g.height == g.lfc_h * g.block_h);
  const bool row_run = g.block_w == 1 && g.lfc_w == g.width && g.width % kChunk == 0;
  return {g.planes, i32(g.height), i32(g.width), i32(g.lfc_h), i32(g.lfc_w), i32(g.block_h), i32(g.block_w),
          i32(g.plane_elems()), i32(g.lfc_elems()), i32(g.code_bytes_per_plane()), g.bits,
          g.plane_elems() % kChunk == 0 && reinterpret_cast<uintptr_t>(f32) % 16 == 0,
          one_per_chunk ? kLfcOne : row_run ? kLfcRow : kLfcEach};
}

// ---------------------------------------------------------------- teams
struct Team {
  int size;      // lanes, a power of two <= 32
  int lane;      // this thread's lane in the team
  int64_t item;  // the plane or group this team owns (may be past the end: then the team only idles)
};
__device__ __forceinline__ Team my_team(int size) {
  const int per_block = blockDim.x / size;
  return {size, static_cast<int>(threadIdx.x) % size,
          static_cast<int64_t>(blockIdx.x) * per_block + static_cast<int>(threadIdx.x) / size};
}
// Min / max of v over the team. All 32 lanes of the warp must call (teams of a warp are aligned segments).
__device__ __forceinline__ void team_min_max(int32_t& lo, int32_t& hi, int size) {
  for (int offset = size / 2; offset > 0; offset >>= 1) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, offset, size));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, offset, size));
  }
}
int team_size_for(int64_t chunks) {
  int size = 1;
  while (size < 32 && size < chunks) size <<= 1;
  return size;
}
int team_blocks(int64_t items, int team_size) {
  const int64_t per_block = kCodecThreads / team_size;
  const int64_t blocks = (items + per_block - 1) / per_block;
  ACTLAB_CHECK(blocks <= INT32_MAX, "codec: ", items, " planes/groups are more than one grid holds");
  return static_cast<int>(blocks);
}

// Grids of one thread per item (an LFC block or a chunk of any plane): blocks for `items`, which must fit
// in 31 bits so that the kernels split an item index into plane and offset in 32-bit arithmetic.
int item_blocks(int64_t items) {
  ACTLAB_CHECK(items <= INT32_MAX, "codec: ", items, " chunks are more than the GPU codec indexes");
  return static_cast<int>((items + kCodecThreads - 1) / kCodecThreads);
}
// This thread's item < items as (plane, offset in the plane) for `per_plane` items a plane; false past the end.
__device__ __forceinline__ bool my_item(int64_t& plane, int& offset, int64_t items, int per_plane) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= items) return false;
  const uint32_t q = i / static_cast<uint32_t>(per_plane);
  plane = q;
  offset = static_cast<int>(i - q * static_cast<uint32_t>(per_plane));
  return true;
}

// ---------------------------------------------------------------- random numbers
__device__ __forceinline__ Philox4 philox_block(uint64_t seed, uint64_t stream, uint64_t block) {
  const Philox4 c{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), static_cast<uint32_t>(stream),
                   static_cast<uint32_t>(stream >> 32)}};
  return philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}
// philox_bits8's extraction of index idx from its block r (byte idx & 3 of word (idx >> 2) & 3).
__device__ __forceinline__ uint32_t bits8_of(const Philox4& r, uint64_t idx) {
  const uint32_t k = static_cast<uint32_t>(idx >> 2) & 3u;
  const uint32_t word = k == 0 ? r.v[0] : k == 1 ? r.v[1] : k == 2 ? r.v[2] : r.v[3];
  return (word >> ((idx & 3) * 8)) & 0xFFu;
}
// u[j] = philox_uniform8(seed, stream, base + j) for j < count (<= 8): one Philox block (of 16 draws) when
// base is a multiple of 8 (every chunk of a plane whose size is), else the one or two blocks the chunk
// touches.
__device__ __forceinline__ void chunk_uniforms(float (&u)[kChunk], uint64_t seed, uint64_t stream, uint64_t base,
                                               int count) {
  const uint64_t b0 = base >> 4;
  const Philox4 first = philox_block(seed, stream, b0);
  if ((base & 7) == 0) {
    const int w0 = static_cast<int>(base & 8) >> 2;  // the chunk is words w0, w0 + 1 of the block
#pragma unroll
    for (int j = 0; j < kChunk; ++j) u[j] = uniform8((first.v[w0 + (j >> 2)] >> ((j & 3) * 8)) & 0xFFu);
    return;
  }
  const Philox4 second = ((base + count - 1) >> 4) != b0 ? philox_block(seed, stream, b0 + 1) : first;
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    const uint64_t idx = base + j;
    u[j] = uniform8(bits8_of((idx >> 4) == b0 ? first : second, idx));
  }
}

// ---------------------------------------------------------------- plane helpers
// map[0..H) = source LFC row of each plane row, map[H..H+W) = source column (nearest rule), built by the
// block when `use` (a kernel-uniform flag); every thread of the block must call.
__device__ void load_maps(int32_t* map, const Planes& g, bool use) {
  if (use) {
    for (int i = threadIdx.x; i < g.H; i += blockDim.x) map[i] = static_cast<int32_t>(nearest_source(i, g.lh, g.H));
    for (int i = threadIdx.x; i < g.W; i += blockDim.x)
      map[g.H + i] = static_cast<int32_t>(nearest_source(i, g.lw, g.W));
  }
  __syncthreads();
}
__device__ __forceinline__ int src_row(const int32_t* map, bool use, const Planes& g, int h) {
  return use ? map[h] : static_cast<int>(nearest_source(h, g.lh, g.H));
}
__device__ __forceinline__ int src_col(const int32_t* map, bool use, const Planes& g, int w) {
  return use ? map[g.H + w] : static_cast<int>(nearest_source(w, g.lw, g.W));
}

// The bf16 mean of LFC block k of plane xp in codec.h's summation order: per block column the rows top
// to bottom, then the column sums left to right. With aligned rows of 4 or 8 block columns the rows are
// float4 loads, each column sum still a chain down its rows: the same additions in the same order.
__device__ __forceinline__ uint16_t pool_block(const float* xp, const Planes& g, int k) {
  const int i = k / g.lw, j = k - i * g.lw;
  const float* top = xp + i * g.bh * g.W + j * g.bw;
  float sum = 0.f;
  if (g.vec && g.W % 4 == 0 && (g.bw == 4 || g.bw == 8)) {
    // col[b] = block column b summed down its rows; q runs over the row's one or two float4 loads
    // (unrolled, so col stays in registers).
    float col[8];
#pragma unroll
    for (int q = 0; q < 8; q += 4)
      if (q < g.bw) {
        const float4 a = *reinterpret_cast<const float4*>(top + q);
        col[q] = a.x, col[q + 1] = a.y, col[q + 2] = a.z, col[q + 3] = a.w;
      }
    for (int r = 1; r < g.bh; ++r)
#pragma unroll
      for (int q = 0; q < 8; q += 4)
        if (q < g.bw) {
          const float4 a = *reinterpret_cast<const float4*>(top + r * g.W + q);
          col[q] += a.x, col[q + 1] += a.y, col[q + 2] += a.z, col[q + 3] += a.w;
        }
    sum = col[0];
#pragma unroll
    for (int b = 1; b < 8; ++b)
      if (b < g.bw) sum = sum + col[b];
    return lfc_from_sum(sum, g.bh * g.bw);
  }
  for (int b = 0; b < g.bw; ++b) {
    float col = top[b];
    for (int r = 1; r < g.bh; ++r) col += top[r * g.W + b];
    sum = b == 0 ? col : sum + col;
  }
  return lfc_from_sum(sum, g.bh * g.bw);
}

// lfc[k] = pool_block(k) for every block of plane xp, k split over the team.
__device__ void pool_plane(uint16_t* lfc, const float* xp, const Planes& g, const Team& t) {
  for (int k = t.lane; k < g.LE; k += t.size) lfc[k] = pool_block(xp, g, k);
}

// v[0, n) = the chunk of plane elements [e0, e0 + n) of p (n = 8 but at a ragged plane end); returns n.
__device__ __forceinline__ int load_chunk(float (&v)[kChunk], const float* p, const Planes& g, int e0) {
  if (g.vec) {
    const float4 a = *reinterpret_cast<const float4*>(p + e0), b = *reinterpret_cast<const float4*>(p + e0 + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return kChunk;
  }
  const int n = min(kChunk, g.E - e0);
#pragma unroll
  for (int j = 0; j < kChunk; ++j)
    if (j < n) v[j] = p[e0 + j];
  return n;
}
__device__ __forceinline__ void store_chunk(float* p, const float (&v)[kChunk], int n, const Planes& g, int e0) {
  if (g.vec) {
    *reinterpret_cast<float4*>(p + e0) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(p + e0 + 4) = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
#pragma unroll
  for (int j = 0; j < kChunk; ++j)
    if (j < n) p[e0 + j] = v[j];
}

// l[0, n) = LFC↑ of the chunk of plane elements [e0, e0 + n) (nearest rule, through the maps).
__device__ __forceinline__ void chunk_lfc(float (&l)[kChunk], const uint16_t* lp, const Planes& g, const int32_t* map,
                                          bool use_map, int e0, int n) {
  int h = e0 / g.W, w = e0 - h * g.W;
  if (g.lfc_run == kLfcOne) {
    const float up = bf16_to_float(lp[src_row(map, use_map, g, h) * g.lw + src_col(map, use_map, g, w)]);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) l[j] = up;
    return;
  }
  if (g.lfc_run == kLfcRow) {  // block width 1: column w of the plane is column w of the LFC
    const uint16_t* run = lp + src_row(map, use_map, g, h) * g.lw + w;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) l[j] = bf16_to_float(run[j]);
    return;
  }
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    if (j < n) {
      l[j] = bf16_to_float(lp[src_row(map, use_map, g, h) * g.lw + src_col(map, use_map, g, w)]);
      if (++w == g.W) w = 0, ++h;
    }
  }
}

// v[j] = x - LFC↑ (or x itself without LFC) for the chunk of plane elements [e0, e0 + n); returns n.
__device__ __forceinline__ int chunk_values(float (&v)[kChunk], const float* xp, const uint16_t* lp, const Planes& g,
                                            bool with_lfc, const int32_t* map, bool use_map, int e0) {
  const int n = load_chunk(v, xp, g, e0);
  if (!with_lfc) return n;
  float l[kChunk];
  chunk_lfc(l, lp, g, map, use_map, e0, n);
#pragma unroll
  for (int j = 0; j < kChunk; ++j)
    if (j < n) v[j] = v[j] - l[j];
  return n;
}

// Writes the first n (< = 8) codes of a chunk, packed LSB first, as ceil(n·bits/8) bytes at dst.
__device__ __forceinline__ void store_codes(uint8_t* dst, uint64_t word, int n, int bits) {
  const int bytes = (n * bits + 7) / 8;
  for (int k = 0; k < bytes; ++k) dst[k] = static_cast<uint8_t>(word >> (8 * k));
}
__device__ __forceinline__ uint64_t load_codes(const uint8_t* src, int n, int bits) {
  const int bytes = (n * bits + 7) / 8;
  uint64_t word = 0;
  for (int k = 0; k < bytes; ++k) word |= static_cast<uint64_t>(src[k]) << (8 * k);
  return word;
}

// ---------------------------------------------------------------- plane kernels
struct PlanePackArgs {
  uint16_t* lfc;  // the LFC: the pack's section or scratch (with_lfc only)
  uint8_t* codes;
  uint16_t* mins;
  uint16_t* steps;
  float* residual;
  const float* x;
  Planes g;
  bool with_lfc, use_map;
  uint64_t seed, stream;
};

__global__ void plane_pack_kernel(PlanePackArgs a, int team_size) {
  extern __shared__ int32_t pack_map[];
  const Planes& g = a.g;
  load_maps(pack_map, g, a.with_lfc && a.use_map);
  const Team t = my_team(team_size);
  const bool active = t.item < g.planes;
  const int64_t p = t.item;
  const int chunks = (g.E + kChunk - 1) / kChunk;
  const float* xp = a.x + (active ? p * g.E : 0);
  uint16_t* lp = a.with_lfc ? a.lfc + (active ? p * g.LE : 0) : nullptr;
  if (active && a.with_lfc) pool_plane(lp, xp, g, t);
  __syncwarp();  // the team's LFC writes are visible to every lane before the residual reads them
  if (!a.codes && !a.residual) return;  // lfc: the pool alone
  int32_t lo = INT32_MAX, hi = INT32_MIN;
  float v[kChunk];
  for (int c = active ? t.lane : chunks; c < chunks; c += t.size) {
    const int n = chunk_values(v, xp, lp, g, a.with_lfc, pack_map, a.use_map, c * kChunk);
    for (int j = 0; j < n; ++j) {
      if (a.residual) a.residual[p * g.E + c * kChunk + j] = v[j];
      const int32_t key = float_order_key(v[j]);
      lo = min(lo, key);
      hi = max(hi, key);
    }
  }
  if (!a.codes) return;
  team_min_max(lo, hi, t.size);
  if (!active) return;
  uint16_t min_bits, step_bits;
  quant_params(min_bits, step_bits, float_from_order_key(lo), float_from_order_key(hi), g.bits);
  if (t.lane == 0) a.mins[p] = min_bits, a.steps[p] = step_bits;
  const float min_value = bf16_to_float(min_bits), scale = quant_scale(bf16_to_float(step_bits));
  const int levels = quant_levels(g.bits);
  for (int c = t.lane; c < chunks; c += t.size) {
    const int n = chunk_values(v, xp, lp, g, a.with_lfc, pack_map, a.use_map, c * kChunk);
    float u[kChunk];
    chunk_uniforms(u, a.seed, a.stream, static_cast<uint64_t>(p * g.E + c * kChunk), n);
    uint64_t word = 0;
    for (int j = 0; j < n; ++j)
      word |= static_cast<uint64_t>(stochastic_code(v[j], min_value, scale, u[j], levels)) << (j * g.bits);
    store_codes(a.codes + p * g.code_bytes + c * g.bits, word, n, g.bits);
  }
}

// The same pack for planes too large for one team (token maps: a (256, 65, 192) map is 256 planes of
// 1560 chunks, one warp each, 32 blocks on a 132-SM GPU): three grids with one thread per LFC block or
// per chunk, the planes' min and max keys met by atomics in between. Min and max do not depend on the
// order they are taken in, and every other value is computed per element as above, so the bytes are the
// team kernel's. Keys are stored as key ^ 0x80000000 so that unsigned order is float order and a memset
// (0xFF for the mins, 0 for the maxes) is the neutral start.
__global__ void plane_pool_kernel(uint16_t* lfc, const float* x, Planes g) {
  int64_t p;
  int k;
  if (my_item(p, k, g.planes * g.LE, g.LE)) lfc[p * g.LE + k] = pool_block(x + p * g.E, g, k);
}

__device__ __forceinline__ uint32_t unsigned_key(int32_t key) { return static_cast<uint32_t>(key) ^ 0x80000000u; }
__device__ __forceinline__ int32_t signed_key(uint32_t key) { return static_cast<int32_t>(key ^ 0x80000000u); }

// One thread per chunk: its residual (stored when asked), and its min / max keys folded into the plane's.
// A warp whose 32 chunks share a plane reduces them first and makes one pair of atomics.
__global__ void plane_range_kernel(PlanePackArgs a, uint32_t* lo_keys, uint32_t* hi_keys, int chunks) {
  extern __shared__ int32_t range_map[];
  const Planes& g = a.g;
  load_maps(range_map, g, a.with_lfc && a.use_map);
  int64_t p;
  int c;
  const bool active = my_item(p, c, g.planes * chunks, chunks);
  if (!active) p = -1;
  int32_t lo = INT32_MAX, hi = INT32_MIN;
  if (active) {
    float v[kChunk];
    const int n = chunk_values(v, a.x + p * g.E, a.with_lfc ? a.lfc + p * g.LE : nullptr, g, a.with_lfc, range_map,
                               a.use_map, c * kChunk);
    for (int j = 0; j < n; ++j) {
      if (a.residual) a.residual[p * g.E + c * kChunk + j] = v[j];
      const int32_t key = float_order_key(v[j]);
      lo = min(lo, key);
      hi = max(hi, key);
    }
  }
  if (!a.codes) return;  // no lane below shuffles: the whole warp leaves together or not at all
  const int64_t p0 = __shfl_sync(0xffffffffu, p, 0);
  if (__all_sync(0xffffffffu, p == p0)) {
    team_min_max(lo, hi, 32);
    if ((threadIdx.x & 31) != 0) return;
  }
  if (!active) return;
  atomicMin(lo_keys + p, unsigned_key(lo));
  atomicMax(hi_keys + p, unsigned_key(hi));
}

// One thread per chunk: the plane's quantization parameters from its keys (chunk 0 stores them), then the
// chunk's codes as plane_pack_kernel's second pass writes them.
__global__ void plane_code_kernel(PlanePackArgs a, const uint32_t* lo_keys, const uint32_t* hi_keys, int chunks) {
  extern __shared__ int32_t code_map[];
  const Planes& g = a.g;
  load_maps(code_map, g, a.with_lfc && a.use_map);
  int64_t p;
  int c;
  if (!my_item(p, c, g.planes * chunks, chunks)) return;
  uint16_t min_bits, step_bits;
  quant_params(min_bits, step_bits, float_from_order_key(signed_key(lo_keys[p])),
               float_from_order_key(signed_key(hi_keys[p])), g.bits);
  if (c == 0) a.mins[p] = min_bits, a.steps[p] = step_bits;
  const float min_value = bf16_to_float(min_bits), scale = quant_scale(bf16_to_float(step_bits));
  float v[kChunk];
  const int n = chunk_values(v, a.x + p * g.E, a.with_lfc ? a.lfc + p * g.LE : nullptr, g, a.with_lfc, code_map,
                             a.use_map, c * kChunk);
  float u[kChunk];
  chunk_uniforms(u, a.seed, a.stream, static_cast<uint64_t>(p * g.E + c * kChunk), n);
  const int levels = quant_levels(g.bits);
  uint64_t word = 0;
  for (int j = 0; j < n; ++j)
    word |= static_cast<uint64_t>(stochastic_code(v[j], min_value, scale, u[j], levels)) << (j * g.bits);
  store_codes(a.codes + p * g.code_bytes + c * g.bits, word, n, g.bits);
}

struct PlaneUnpackArgs {
  float* out;
  const uint16_t* lfc;  // nullptr: no LFC term
  const uint8_t* codes;  // nullptr: no code term
  const uint16_t* mins;
  const uint16_t* steps;
  Planes g;
  bool use_map;
  bool accumulate;  // no codes: out = LFC↑ + out (out holds the ranges' decoded codes)
};

// One thread per chunk of any plane (no plane-wide step here, so no team: large planes fill the GPU too).
__global__ void plane_unpack_kernel(PlaneUnpackArgs a, int chunks) {
  extern __shared__ int32_t unpack_map[];
  const Planes& g = a.g;
  load_maps(unpack_map, g, a.lfc && a.use_map);
  int64_t p;
  int c;
  if (!my_item(p, c, g.planes * chunks, chunks)) return;  // no block-wide operation follows
  const uint16_t* lp = a.lfc ? a.lfc + p * g.LE : nullptr;
  const float min_value = a.codes ? bf16_to_float(a.mins[p]) : 0.f, step = a.codes ? bf16_to_float(a.steps[p]) : 0.f;
  const uint32_t levels = a.codes ? static_cast<uint32_t>(quant_levels(g.bits)) : 0u;
  float* op = a.out + p * g.E;
  const int e0 = c * kChunk;
  const int n = min(kChunk, g.E - e0);
  const uint64_t word = a.codes ? load_codes(a.codes + p * g.code_bytes + c * g.bits, n, g.bits) : 0;
  float v[kChunk];
  // With ranges, out already holds the dequantized codes; the LFC is added to them.
  if (!a.codes && a.accumulate) load_chunk(v, op, g, e0);
  float up[kChunk];
  if (lp) chunk_lfc(up, lp, g, unpack_map, a.use_map, e0, n);
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    if (j < n) {
      const uint32_t code = static_cast<uint32_t>(word >> (j * g.bits)) & levels;
      if (lp) {  // the CPU's expression
        v[j] = a.codes ? up[j] + dequantize(code, min_value, step) : a.accumulate ? up[j] + v[j] : up[j];
      } else {
        v[j] = dequantize(code, min_value, step);
      }
    }
  }
  store_chunk(op, v, n, g, e0);
}

// ---------------------------------------------------------------- group kernels
struct Groups {
  int64_t groups, per_sample, D, G, code_bytes;
  int bits;
  int64_t first_sample;  // where the draws of row 0 start (GroupGeometry::first_sample)
};
Groups groups_of(const GroupGeometry& g) {
  return {g.groups(), g.groups_per_sample(), g.sample_elems, g.group_size, g.code_bytes_per_group(), g.bits,
          g.first_sample};
}

// The order keys of the min and max of a group's `count` values v (zero padding included when count < G),
// reduced over the team. Every lane of the warp calls (an inactive team reduces nothing).
__device__ __forceinline__ void group_min_max(int32_t& lo, int32_t& hi, const float* v, int64_t count, int64_t G,
                                              bool active, const Team& t) {
  lo = INT32_MAX, hi = INT32_MIN;
  for (int64_t e = active ? t.lane : count; e < count; e += t.size) {
    const int32_t key = float_order_key(v[e]);
    lo = min(lo, key);
    hi = max(hi, key);
  }
  team_min_max(lo, hi, t.size);
  if (count < G) lo = min(lo, float_order_key(0.f)), hi = max(hi, float_order_key(0.f));  // zero padding
}

__global__ void group_pack_kernel(uint8_t* codes, uint16_t* mins, uint16_t* steps, const float* x, Groups g,
                                  uint64_t seed, uint64_t stream, int team_size) {
  const Team t = my_team(team_size);
  const bool active = t.item < g.groups;
  const int64_t k = active ? t.item : 0;
  const int64_t begin = (k % g.per_sample) * g.G, count = min64(g.G, g.D - begin);
  const int64_t base = (k / g.per_sample) * g.D + begin;  // the group's first element in x
  const int64_t chunks = (g.G + kChunk - 1) / kChunk;
  int32_t lo, hi;
  group_min_max(lo, hi, x + base, count, g.G, active, t);
  if (!active) return;
  uint16_t min_bits, step_bits;
  quant_params(min_bits, step_bits, float_from_order_key(lo), float_from_order_key(hi), g.bits);
  if (t.lane == 0) mins[k] = min_bits, steps[k] = step_bits;
  const float min_value = bf16_to_float(min_bits), scale = quant_scale(bf16_to_float(step_bits));
  const int levels = quant_levels(g.bits);
  for (int64_t c = t.lane; c < chunks; c += t.size) {
    const int64_t e0 = c * kChunk;
    const int real = static_cast<int>(max64(0, min64(kChunk, count - e0)));  // padding: code 0
    uint64_t word = 0;
    if (real > 0) {
      float u[kChunk];
      chunk_uniforms(u, seed, stream, static_cast<uint64_t>(g.first_sample * g.D + base + e0), real);
      for (int j = 0; j < real; ++j)
        word |= static_cast<uint64_t>(stochastic_code(x[base + e0 + j], min_value, scale, u[j], levels)) << (j * g.bits);
    }
    store_codes(codes + k * g.code_bytes + c * g.bits, word, static_cast<int>(min64(kChunk, g.G - e0)), g.bits);
  }
}

__global__ void group_unpack_kernel(float* out, const uint8_t* codes, const uint16_t* mins, const uint16_t* steps,
                                    Groups g, int team_size) {
  const Team t = my_team(team_size);
  if (t.item >= g.groups) return;
  const int64_t k = t.item;
  const int64_t begin = (k % g.per_sample) * g.G, count = min64(g.G, g.D - begin);
  const int64_t base = (k / g.per_sample) * g.D + begin;
  const float min_value = bf16_to_float(mins[k]), step = bf16_to_float(steps[k]);
  const uint32_t levels = static_cast<uint32_t>(quant_levels(g.bits));
  for (int64_t c = t.lane; c * kChunk < count; c += t.size) {
    const int64_t e0 = c * kChunk;
    const int n = static_cast<int>(min64(kChunk, count - e0));
    const uint64_t word = load_codes(codes + k * g.code_bytes + c * g.bits, n, g.bits);
    for (int j = 0; j < n; ++j)
      out[base + e0 + j] = dequantize(static_cast<uint32_t>(word >> (j * g.bits)) & levels, min_value, step);
  }
}

// ranges[k] = hi − lo of group k (f32, as the CPU subtracts), zero padding included.
__global__ void group_range_kernel(float* ranges, const float* x, Groups g, int team_size) {
  const Team t = my_team(team_size);
  const bool active = t.item < g.groups;
  const int64_t k = active ? t.item : 0;
  const int64_t begin = (k % g.per_sample) * g.G, count = min64(g.G, g.D - begin);
  const int64_t base = (k / g.per_sample) * g.D + begin;
  int32_t lo, hi;
  group_min_max(lo, hi, x + base, count, g.G, active, t);
  if (!active || t.lane != 0) return;
  ranges[k] = float_from_order_key(hi) - float_from_order_key(lo);
}

// out[n] = Σ_j ranges[n·K + j]² in j order, each square exact in double: the CPU's sum, bit for bit.
__global__ void range_norm_kernel(double* out, const float* ranges, int64_t samples, int64_t per_sample) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= samples) return;
  double sum = 0.0;
  for (int64_t j = 0; j < per_sample; ++j) {
    const double r = ranges[n * per_sample + j];
    sum += r * r;
  }
  out[n] = sum;
}

void check_bits(int bits) {
  ACTLAB_CHECK(bits == 1 || bits == 2 || bits == 4 || bits == 8, "codec: bit width must be 1, 2, 4 or 8, got ", bits);
}

// The code ranges of planes as groups: range k of plane p is group p·ranges_per_plane + k of sample p, so
// the group kernels draw element e of plane p at p·E + e and write the plane codec's layout (codec.h).
Groups ranges_of(const PlaneGeometry& g) {
  return {g.ranges(), g.ranges_per_plane(), g.plane_elems(), g.range_elems(), g.code_bytes_per_range(), g.bits, 0};
}

// Planes of more chunks than this take the three grids of pack_large_planes: a team of 32 lanes would
// loop over more than 8 chunks a lane, and few planes would leave most of the GPU idle.
constexpr int kTeamChunks = 256;

// plane_pool_kernel, plane_range_kernel and plane_code_kernel for the planes of `a` (the team kernel's
// outputs, the same bytes).
void pack_large_planes(const PlanePackArgs& a, int chunks, size_t shared, int device, cudaStream_t s) {
  const Planes& g = a.g;
  if (a.with_lfc) {
    plane_pool_kernel<<<item_blocks(g.planes * g.LE), kCodecThreads, 0, s>>>(a.lfc, a.x, g);
    ACTLAB_CUDA_CHECK_LAUNCH();
  }
  if (!a.codes && !a.residual) return;  // lfc: the pool alone
  Buffer keys;  // the planes' min keys, then their max keys; freed in stream order
  uint32_t *lo = nullptr, *hi = nullptr;
  if (a.codes) {
    const size_t bytes = static_cast<size_t>(g.planes) * sizeof(uint32_t);
    keys = Buffer(2 * bytes, MemTag::Workspace, Device::cuda(device));
    lo = keys.as<uint32_t>(), hi = lo + g.planes;
    ACTLAB_CUDA_CHECK(cudaMemsetAsync(lo, 0xFF, bytes, s));
    ACTLAB_CUDA_CHECK(cudaMemsetAsync(hi, 0, bytes, s));
  }
  const int blocks = item_blocks(g.planes * chunks);
  plane_range_kernel<<<blocks, kCodecThreads, shared, s>>>(a, lo, hi, chunks);
  ACTLAB_CUDA_CHECK_LAUNCH();
  if (!a.codes) return;
  plane_code_kernel<<<blocks, kCodecThreads, shared, s>>>(a, lo, hi, chunks);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

}  // namespace

void plane_pack(uint16_t* lfc, uint8_t* codes, uint16_t* mins, uint16_t* steps, float* residual, const float* x,
                const PlaneGeometry& g, bool with_lfc, uint64_t seed, uint64_t stream, int device) {
  if (g.planes == 0) return;
  if (codes) check_bits(g.bits);
  DeviceScope gpu(device);
  const bool ranged = codes && g.ranges_per_plane() > 1;
  Buffer ranged_residual;  // the residual the ranges are coded from, when the caller keeps none
  if (ranged && with_lfc && residual == nullptr) {
    ranged_residual = Buffer(static_cast<size_t>(g.planes * g.plane_elems()) * sizeof(float), MemTag::Workspace,
                             Device::cuda(device));
    residual = ranged_residual.as<float>();
  }
  PlanePackArgs a{lfc, ranged ? nullptr : codes, mins, steps, residual, x, planes_of(g, x), with_lfc,
                  g.height + g.width <= kMaxMapEntries, seed, stream};
  Buffer lfc_scratch;  // the LFC of codecs that use it without storing it (hfc), freed in stream order
  if (with_lfc && lfc == nullptr) {
    lfc_scratch = Buffer(static_cast<size_t>(g.planes * g.lfc_elems()) * sizeof(uint16_t), MemTag::Workspace,
                         Device::cuda(device));
    a.lfc = lfc_scratch.as<uint16_t>();
  }
  const int chunks = static_cast<int>((g.plane_elems() + kChunk - 1) / kChunk);
  const size_t shared = with_lfc && a.use_map ? static_cast<size_t>(g.height + g.width) * sizeof(int32_t) : 0;
  if (chunks > kTeamChunks) {
    pack_large_planes(a, chunks, shared, device, gpu.stream());
  } else if (with_lfc || a.residual || a.codes) {  // quant (no LFC, no residual) still codes x
    const int team = team_size_for(chunks);
    plane_pack_kernel<<<team_blocks(g.planes, team), kCodecThreads, shared, gpu.stream()>>>(a, team);
    ACTLAB_CUDA_CHECK_LAUNCH();
  }
  if (!ranged) return;
  const Groups r = ranges_of(g);
  const int range_team = team_size_for((r.G + kChunk - 1) / kChunk);
  group_pack_kernel<<<team_blocks(r.groups, range_team), kCodecThreads, 0, gpu.stream()>>>(
      codes, mins, steps, with_lfc ? residual : x, r, seed, stream, range_team);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void plane_unpack(float* out, const uint16_t* lfc, const uint8_t* codes, const uint16_t* mins,
                  const uint16_t* steps, const PlaneGeometry& g, int device) {
  if (g.planes == 0) return;
  ACTLAB_CHECK(lfc || codes, "codec: plane_unpack needs an LFC or codes");
  if (codes) check_bits(g.bits);
  DeviceScope gpu(device);
  const bool ranged = codes && g.ranges_per_plane() > 1;
  if (ranged) {  // the ranges' codes first; the LFC, if any, is added by the plane kernel below
    const Groups r = ranges_of(g);
    const int range_team = team_size_for((r.G + kChunk - 1) / kChunk);
    group_unpack_kernel<<<team_blocks(r.groups, range_team), kCodecThreads, 0, gpu.stream()>>>(out, codes, mins, steps,
                                                                                              r, range_team);
    ACTLAB_CUDA_CHECK_LAUNCH();
    if (!lfc) return;
  }
  const PlaneUnpackArgs a{out, lfc, ranged ? nullptr : codes, mins, steps, planes_of(g, out),
                          g.height + g.width <= kMaxMapEntries, ranged};
  const int chunks = static_cast<int>((g.plane_elems() + kChunk - 1) / kChunk);
  const size_t shared = lfc && a.use_map ? static_cast<size_t>(g.height + g.width) * sizeof(int32_t) : 0;
  plane_unpack_kernel<<<item_blocks(g.planes * chunks), kCodecThreads, shared, gpu.stream()>>>(a, chunks);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void group_pack(uint8_t* codes, uint16_t* mins, uint16_t* steps, const float* x, const GroupGeometry& g,
                uint64_t seed, uint64_t stream, int device) {
  if (g.groups() == 0) return;
  check_bits(g.bits);
  DeviceScope gpu(device);
  const int team = team_size_for((g.group_size + kChunk - 1) / kChunk);
  group_pack_kernel<<<team_blocks(g.groups(), team), kCodecThreads, 0, gpu.stream()>>>(codes, mins, steps, x,
                                                                                     groups_of(g), seed, stream, team);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void group_unpack(float* out, const uint8_t* codes, const uint16_t* mins, const uint16_t* steps,
                  const GroupGeometry& g, int device) {
  if (g.groups() == 0) return;
  check_bits(g.bits);
  DeviceScope gpu(device);
  const int team = team_size_for((g.group_size + kChunk - 1) / kChunk);
  group_unpack_kernel<<<team_blocks(g.groups(), team), kCodecThreads, 0, gpu.stream()>>>(out, codes, mins, steps,
                                                                                       groups_of(g), team);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void group_range_norms(double* out, const float* x, const GroupGeometry& g, int device) {
  if (g.groups() == 0) return;
  DeviceScope gpu(device);
  Buffer ranges(static_cast<size_t>(g.groups()) * sizeof(float), MemTag::Workspace, Device::cuda(device));
  const int team = team_size_for((g.group_size + kChunk - 1) / kChunk);
  group_range_kernel<<<team_blocks(g.groups(), team), kCodecThreads, 0, gpu.stream()>>>(ranges.as<float>(), x,
                                                                                       groups_of(g), team);
  ACTLAB_CUDA_CHECK_LAUNCH();
  const int threads = 128;
  range_norm_kernel<<<static_cast<unsigned>((g.samples + threads - 1) / threads), threads, 0, gpu.stream()>>>(
      out, ranges.as<float>(), g.samples, g.groups_per_sample());
  ACTLAB_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- BLPA
namespace {

// min / max over the block, valid in every thread (blockDim.x a multiple of 32); scratch: 32 floats.
template <bool kMin>
__device__ float block_extreme(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMin ? fminf(v, o) : fmaxf(v, o);
  }
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) v = kMin ? fminf(v, scratch[w]) : fmaxf(v, scratch[w]);
    scratch[0] = v;
  }
  __syncthreads();
  v = scratch[0];
  __syncthreads();
  return v;
}

// One block per channel: the channel's mean, standard deviation (both in double, two passes as on the
// CPU), min, max and NaN flag, then its parameters by codec.h's blpa_channel.
__global__ void blpa_channel_kernel(BlpaChannel* params, const float* x, int64_t outer, int64_t C, int64_t E,
                                    int bits) {
  __shared__ double sums[32];
  __shared__ float extremes[32];
  __shared__ double mean_shared;
  const int64_t c = blockIdx.x, count = outer * E;
  double sum = 0.0;
  float lo = INFINITY, hi = -INFINITY;
  int nan = 0;
  for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
    const float v = x[((k / E) * C + c) * E + k % E];
    sum += v;
    lo = fminf(lo, v);  // fminf/fmaxf skip a NaN, as the CPU's std::min/max do: the flag reports it
    hi = fmaxf(hi, v);
    nan |= v != v;
  }
  sum = block_sum(sum, sums);
  lo = block_extreme<true>(lo, extremes);
  hi = block_extreme<false>(hi, extremes);
  nan = __syncthreads_or(nan);
  if (threadIdx.x == 0) mean_shared = sum / static_cast<double>(count);
  __syncthreads();
  const double mean = mean_shared;
  double squares = 0.0;
  for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
    const double d = static_cast<double>(x[((k / E) * C + c) * E + k % E]) - mean;
    squares += d * d;
  }
  squares = block_sum(squares, sums);
  if (threadIdx.x != 0) return;
  if (nan) lo = hi = NAN;
  params[c] = blpa_channel(mean, sqrt(squares / static_cast<double>(count)), lo, hi, bits);
}

// Byte j holds the 8/Q codes of elements j·8/Q ..; one thread per byte, so no byte is shared.
__global__ void blpa_encode_kernel(uint8_t* codes, const float* x, const BlpaChannel* params, int64_t numel,
                                   int64_t C, int64_t E, int bits) {
  const int per_byte = 8 / bits;
  const int64_t bytes = (numel * bits + 7) / 8;
  for (int64_t j = global_thread(); j < bytes; j += grid_threads()) {
    uint32_t byte = 0;
    for (int k = 0; k < per_byte; ++k) {
      const int64_t i = j * per_byte + k;
      if (i < numel) byte |= blpa_code(x[i], params[(i / E) % C], bits) << (k * bits);
    }
    codes[j] = static_cast<uint8_t>(byte);
  }
}

__global__ void blpa_decode_kernel(float* out, const uint8_t* codes, const BlpaChannel* params, int64_t numel,
                                   int64_t C, int64_t E, int bits) {
  for (int64_t i = global_thread(); i < numel; i += grid_threads())
    out[i] = blpa_value(unpack_code(codes, i, bits), params[(i / E) % C]);
}

void check_blpa(const BlpaGeometry& g) {
  ACTLAB_CHECK(g.bits == 4 || g.bits == 8, "cuda::blpa: Q must be 4 or 8, got ", g.bits);
  ACTLAB_CHECK(g.channels <= 0x7fffffff, "cuda::blpa: ", g.channels, " channels exceed the grid");
}

}  // namespace

void blpa_pack(BlpaChannel* params, uint8_t* codes, const float* x, const BlpaGeometry& g, int device) {
  if (g.numel() == 0) return;
  check_blpa(g);
  DeviceScope gpu(device);
  blpa_channel_kernel<<<static_cast<unsigned>(g.channels), kBlockThreads, 0, gpu.stream()>>>(params, x, g.outer,
                                                                                            g.channels, g.inner, g.bits);
  ACTLAB_CUDA_CHECK_LAUNCH();
  blpa_encode_kernel<<<grid_blocks(g.code_bytes()), kBlockThreads, 0, gpu.stream()>>>(codes, x, params, g.numel(),
                                                                                      g.channels, g.inner, g.bits);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

void blpa_unpack(float* out, const BlpaChannel* params, const uint8_t* codes, const BlpaGeometry& g, int device) {
  if (g.numel() == 0) return;
  check_blpa(g);
  DeviceScope gpu(device);
  blpa_decode_kernel<<<grid_blocks(g.numel()), kBlockThreads, 0, gpu.stream()>>>(out, codes, params, g.numel(),
                                                                                 g.channels, g.inner, g.bits);
  ACTLAB_CUDA_CHECK_LAUNCH();
}

}  // namespace actlab::cuda
