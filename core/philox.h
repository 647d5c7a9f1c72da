// Counter-based Philox4x32-10 random numbers. A draw is a pure function of (seed, stream, index),
// so CPU loops and CUDA grids produce the same numbers for the same element, in any order and on
// any thread count. Used for init, dropout, shuffling and stochastic rounding.
// Tested in tests/test_core.cpp (known-answer vector, uniformity).
#pragma once
#include <cmath>
#include <cstdint>

#include "actlab/core/hostdevice.h"

namespace actlab {

struct Philox4 {
  uint32_t v[4];
};

ACTLAB_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// Philox4x32 with 10 rounds on counter c and 64-bit key (k0, k1) (Salmon et al., SC'11).
ACTLAB_HD Philox4 philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c.v[0], hi0, lo0);
    philox_mulhilo(0xCD9E8D57u, c.v[2], hi1, lo1);
    c = Philox4{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// The 32 random bits number `index` of stream `stream` under `seed`. Four consecutive indices share
// one Philox block: counter = (index / 4, stream), key = seed.
ACTLAB_HD uint32_t philox_bits(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t block = index >> 2;
  const Philox4 c{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                   static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)}};
  const Philox4 r = philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return r.v[index & 3];
}

// Uniform in [0, 1) with 24 random bits: exactly representable, identical on CPU and GPU.
ACTLAB_HD float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return static_cast<float>(philox_bits(seed, stream, index) >> 8) * (1.0f / 16777216.0f);
}

// Box-Muller on the uniforms of draws index and index + 1 (u1 clamped to 1e-7, the rest in double): the two
// standard normals r·cos θ and r·sin θ of that pair. Tensor::randn fills a tensor with them pair by pair;
// a single redraw (trunc_normal_init's) takes the first of a fresh pair. Host only.
inline void philox_normal_pair(uint64_t seed, uint64_t stream, uint64_t index, double& first, double& second) {
  float u1 = philox_uniform(seed, stream, index);
  const float u2 = philox_uniform(seed, stream, index + 1);
  if (u1 < 1e-7f) u1 = 1e-7f;
  const double r = std::sqrt(-2.0 * std::log(static_cast<double>(u1)));
  const double theta = 2.0 * M_PI * static_cast<double>(u2);
  first = r * std::cos(theta);
  second = r * std::sin(theta);
}

// A random stream handle: (seed, stream) plus a running offset for sequential draws on the host.
class PhiloxStream {
 public:
  PhiloxStream(uint64_t seed = 0, uint64_t stream = 0, uint64_t offset = 0)
      : seed_(seed), stream_(stream), offset_(offset) {}
  uint64_t seed() const { return seed_; }
  uint64_t stream() const { return stream_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }

  uint32_t next_bits() { return philox_bits(seed_, stream_, offset_++); }
  float next_uniform() { return philox_uniform(seed_, stream_, offset_++); }
  // Reserves n draws and returns the first index: a kernel then draws (seed, stream, first + i).
  uint64_t reserve(uint64_t n) { const uint64_t first = offset_; offset_ += n; return first; }
  // Uniform integer in [0, n) (n > 0), by rejection so it is unbiased.
  uint64_t next_below(uint64_t n);
 private:
  uint64_t seed_, stream_, offset_;
};

inline uint64_t PhiloxStream::next_below(uint64_t n) {
  if (n <= 1) return 0;
  if (n <= 0xFFFFFFFFull) {
    const uint32_t limit = static_cast<uint32_t>(0x100000000ull - (0x100000000ull % n));
    for (;;) {
      const uint32_t x = next_bits();
      if (limit == 0 || x < limit) return x % n;
    }
  }
  for (;;) {
    const uint64_t x = (static_cast<uint64_t>(next_bits()) << 32) | next_bits();
    const uint64_t limit = UINT64_MAX - (UINT64_MAX % n);
    if (x < limit) return x % n;
  }
}

}  // namespace actlab
