// Tests of the non-conv CPU kernels (core/cpu/kernels.h): every forward against a naive loop
// written here, mask bits and max-pool indices exactly, every backward against central differences
// of its own forward (double accumulation), SGD against a hand-rolled torch.optim.SGD loop, dropout
// statistics and determinism, label validation. Sizes are odd (N=3, C=5, 7x9) so tails are hit; a
// few cases run above kParallelGrain so the OpenMP path is compared too.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "actlab/core/allocator.h"
#include "actlab/core/bf16.h"
#include "actlab/core/cpu/kernels.h"
#include "actlab/core/error.h"
#include "actlab/core/philox.h"

namespace {

namespace cpu = actlab::cpu;
using Vec = std::vector<float>;
using Vec64 = std::vector<double>;

Vec random_vec(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  actlab::PhiloxStream rng(seed, 7);
  Vec v(n);
  for (float& x : v) x = lo + (hi - lo) * rng.next_uniform();
  return v;
}

// Element-wise |got - want| <= atol + rtol·|want|; reports the first failure only.
void check_close(const Vec& got, const Vec64& want, double rtol, double atol, const char* what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(got[i] - want[i]);
    if (!(diff <= atol + rtol * std::fabs(want[i]))) {
      FAIL_CHECK(std::string(what) << "[" << i << "]: got " << got[i] << " want " << want[i]);
      return;
    }
  }
}
Vec64 to64(const Vec& v) { return Vec64(v.begin(), v.end()); }

// Central differences of a scalar function of x, evaluated in double: d f / d x[i].
Vec64 numeric_grad(const std::function<double(const Vec&)>& f, Vec x, float h) {
  Vec64 g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float orig = x[i];
    x[i] = orig + h;
    const double up = f(x);
    x[i] = orig - h;
    const double down = f(x);
    x[i] = orig;
    g[i] = (up - down) / (2.0 * h);
  }
  return g;
}
// Σ r·y in double: the scalar whose gradient w.r.t. y is r.
double dot(const Vec& r, const Vec& y) {
  double s = 0.0;
  for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(r[i]) * y[i];
  return s;
}

// Allocator live bytes must return to where a test case started.
struct LiveBytesGuard {
  int64_t before = actlab::memory_stats().total.current;
  ~LiveBytesGuard() { CHECK(actlab::memory_stats().total.current == before); }
};

constexpr int64_t kN = 3, kC = 5, kH = 7, kW = 9, kHW = kH * kW;

// ---------------------------------------------------------------------------------------------
// batch norm

struct BnRef {
  Vec64 y, mean, invstd, running_mean, running_var;
};
BnRef bn_train_ref(const Vec& x, const Vec& gamma, const Vec& beta, Vec64 rm, Vec64 rv, int64_t N,
                   int64_t C, int64_t HW, double momentum, double eps) {
  BnRef r{Vec64(x.size()), Vec64(C), Vec64(C), rm, rv};
  const double M = double(N * HW);
  for (int64_t c = 0; c < C; ++c) {
    double mean = 0.0, var = 0.0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) mean += x[(n * C + c) * HW + i];
    mean /= M;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) var += std::pow(x[(n * C + c) * HW + i] - mean, 2);
    var /= M;
    r.mean[c] = mean;
    r.invstd[c] = 1.0 / std::sqrt(var + eps);
    r.running_mean[c] = (1 - momentum) * rm[c] + momentum * mean;
    r.running_var[c] = (1 - momentum) * rv[c] + momentum * var * M / (M - 1);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) {
        const int64_t j = (n * C + c) * HW + i;
        r.y[j] = (x[j] - mean) * r.invstd[c] * gamma[c] + beta[c];
      }
  }
  return r;
}

TEST_CASE(
    "cpu kernels: batchnorm forward (train) matches the naive loop and updates running stats") {
  LiveBytesGuard guard;
  struct Case {
    int64_t N, C, HW;
    float offset;
  };
  // The second case is above kParallelGrain (OpenMP path); the third has |mean| >> std, where a
  // naive one-pass E[x²] - E[x]² variance in float would lose every digit.
  for (const Case& k : {Case{kN, kC, kHW, 0.f}, Case{4, 8, 1024, 0.f}, Case{2, 3, 50, 1000.f}}) {
    CAPTURE(k.N);
    CAPTURE(k.C);
    CAPTURE(k.HW);
    Vec x = random_vec(k.N * k.C * k.HW, 1, -1.f, 2.f);
    for (float& v : x) v += k.offset;
    const Vec gamma = random_vec(k.C, 2, 0.5f, 1.5f), beta = random_vec(k.C, 3);
    Vec rm = random_vec(k.C, 4), rv = random_vec(k.C, 5, 0.5f, 2.f);
    const BnRef ref = bn_train_ref(x, gamma, beta, to64(rm), to64(rv), k.N, k.C, k.HW, 0.1, 1e-5);
    Vec y(x.size()), mean(k.C), invstd(k.C);
    cpu::batchnorm_forward_train(y.data(), mean.data(), invstd.data(), rm.data(), rv.data(),
                                 x.data(), gamma.data(), beta.data(), k.N, k.C, k.HW, 0.1f, 1e-5f);
    check_close(y, ref.y, 1e-4, 1e-4, "y");
    check_close(mean, ref.mean, 1e-6, 1e-6, "save_mean");
    check_close(invstd, ref.invstd, 1e-4, 0, "save_invstd");
    check_close(rm, ref.running_mean, 1e-6, 1e-6, "running_mean");
    check_close(rv, ref.running_var, 1e-4, 1e-6, "running_var");
    // In place (y aliases x) gives the same y; no running stats is allowed.
    Vec inplace = x;
    cpu::batchnorm_forward_train(inplace.data(), mean.data(), invstd.data(), nullptr, nullptr,
                                 inplace.data(), gamma.data(), beta.data(), k.N, k.C, k.HW, 0.1f,
                                 1e-5f);
    CHECK(inplace == y);
  }
  Vec one(4), stat(4);
  CHECK_THROWS_AS(
      cpu::batchnorm_forward_train(one.data(), stat.data(), stat.data(), nullptr, nullptr,
                                   one.data(), nullptr, nullptr, 1, 4, 1, 0.1f, 1e-5f),
      actlab::Error);
}

TEST_CASE("cpu kernels: batchnorm forward (eval) matches the naive loop") {
  const Vec x = random_vec(kN * kC * kHW, 11), gamma = random_vec(kC, 12),
            beta = random_vec(kC, 13);
  const Vec rm = random_vec(kC, 14), rv = random_vec(kC, 15, 0.2f, 3.f);
  Vec y(x.size());
  cpu::batchnorm_forward_eval(y.data(), x.data(), gamma.data(), beta.data(), rm.data(), rv.data(),
                              kN, kC, kHW, 1e-3f);
  Vec64 want(x.size());
  for (size_t j = 0; j < x.size(); ++j) {
    const int64_t c = (j / kHW) % kC;
    want[j] = (x[j] - double(rm[c])) / std::sqrt(double(rv[c]) + 1e-3) * gamma[c] + beta[c];
  }
  check_close(y, want, 1e-5, 1e-5, "y");
}

TEST_CASE(
    "cpu kernels: batchnorm backward (train) matches central differences through the batch stats") {
  LiveBytesGuard guard;
  const Vec x = random_vec(kN * kC * kHW, 21), gamma = random_vec(kC, 22, 0.5f, 1.5f);
  const Vec beta = random_vec(kC, 23), r = random_vec(x.size(), 24);
  // loss(x, gamma, beta) = Σ r·bn_train(x); r is dloss/dy.
  auto loss = [&](const Vec& xv, const Vec& g, const Vec& b) {
    Vec y(xv.size()), m(kC), s(kC);
    cpu::batchnorm_forward_train(y.data(), m.data(), s.data(), nullptr, nullptr, xv.data(),
                                 g.data(), b.data(), kN, kC, kHW, 0.1f, 1e-5f);
    return dot(r, y);
  };
  Vec y(x.size()), mean(kC), invstd(kC);
  cpu::batchnorm_forward_train(y.data(), mean.data(), invstd.data(), nullptr, nullptr, x.data(),
                               gamma.data(), beta.data(), kN, kC, kHW, 0.1f, 1e-5f);
  Vec dx(x.size()), dgamma(kC), dbeta(kC);
  cpu::batchnorm_backward(dx.data(), dgamma.data(), dbeta.data(), r.data(), x.data(), gamma.data(),
                          mean.data(), invstd.data(), kN, kC, kHW);
  check_close(dx, numeric_grad([&](const Vec& v) { return loss(v, gamma, beta); }, x, 1e-2f), 2e-2,
              2e-3, "dx");
  check_close(dgamma, numeric_grad([&](const Vec& v) { return loss(x, v, beta); }, gamma, 1e-2f),
              1e-3, 1e-3, "dgamma");
  check_close(dbeta, numeric_grad([&](const Vec& v) { return loss(x, gamma, v); }, beta, 1e-2f),
              1e-3, 1e-3, "dbeta");
}

TEST_CASE("cpu kernels: batchnorm backward recomputes x_hat from a reconstructed input") {
  // Activation compression hands backward an approximation x' of x: the kernel must use
  // x_hat' = (x' - save_mean)·save_invstd with the saved statistics, not statistics of x'.
  const int64_t N = 4, C = 8, HW = 1024;  // above kParallelGrain
  const Vec xr = random_vec(N * C * HW, 31), dy = random_vec(xr.size(), 32);
  const Vec gamma = random_vec(C, 33), mean = random_vec(C, 34),
            invstd = random_vec(C, 35, 0.5f, 2.f);
  Vec dx(xr.size()), dgamma(C), dbeta(C);
  cpu::batchnorm_backward(dx.data(), dgamma.data(), dbeta.data(), dy.data(), xr.data(),
                          gamma.data(), mean.data(), invstd.data(), N, C, HW);
  Vec64 want_dx(xr.size()), want_dg(C), want_db(C);
  for (int64_t c = 0; c < C; ++c) {
    auto at = [&](int64_t n, int64_t i) { return (n * C + c) * HW + i; };
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) {
        want_db[c] += dy[at(n, i)];
        want_dg[c] += dy[at(n, i)] * (xr[at(n, i)] - double(mean[c])) * invstd[c];
      }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) {
        const double xhat = (xr[at(n, i)] - double(mean[c])) * invstd[c];
        want_dx[at(n, i)] = gamma[c] * double(invstd[c]) *
                            (dy[at(n, i)] - want_db[c] / (N * HW) - xhat * want_dg[c] / (N * HW));
      }
  }
  check_close(dx, want_dx, 1e-4, 1e-5, "dx");
  check_close(dgamma, want_dg, 1e-4, 1e-3, "dgamma");
  check_close(dbeta, want_db, 1e-4, 1e-3, "dbeta");
}

TEST_CASE("cpu kernels: batchnorm forward (train) gives each channel the bits it gets alone, whatever range it is in") {
  // The whole-tensor call walks ranges of channels sample by sample; a channel's sums keep their order, so
  // its statistics, outputs and running statistics are those of a call on that channel alone.
  for (const auto& [N, C, HW] : {std::tuple<int64_t, int64_t, int64_t>{3, 50, 1024}, {3, 70, 16}, {128, 96, 16}}) {
    CAPTURE(C);
    CAPTURE(HW);
    const Vec x = random_vec(N * C * HW, 61, -1.f, 2.f), gamma = random_vec(C, 62, 0.5f, 1.5f), beta = random_vec(C, 63);
    Vec rm = random_vec(C, 64), rv = random_vec(C, 65, 0.5f, 2.f);
    Vec y(x.size()), mean(C), invstd(C);
    Vec rm_one = rm, rv_one = rv;
    cpu::batchnorm_forward_train(y.data(), mean.data(), invstd.data(), rm.data(), rv.data(), x.data(), gamma.data(),
                                 beta.data(), N, C, HW, 0.1f, 1e-5f);
    for (int64_t c = 0; c < C; ++c) {
      Vec xc(N * HW), yc(N * HW);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < HW; ++i) xc[n * HW + i] = x[(n * C + c) * HW + i];
      float m = 0.f, s = 0.f;
      cpu::batchnorm_forward_train(yc.data(), &m, &s, &rm_one[c], &rv_one[c], xc.data(), &gamma[c], &beta[c], N, 1,
                                   HW, 0.1f, 1e-5f);
      REQUIRE(m == mean[c]);
      REQUIRE(s == invstd[c]);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < HW; ++i) REQUIRE(yc[n * HW + i] == y[(n * C + c) * HW + i]);
    }
    CHECK(rm_one == rm);
    CHECK(rv_one == rv);
  }
}

TEST_CASE("cpu kernels: batchnorm backward by channels, split at its sums, or both, is batchnorm backward, bit for bit") {
  // x handed over one channel at a time (a decoder's output in a per-thread buffer) must give exactly
  // the gradients of the whole-tensor call: same sums in the same order. Sizes below and above
  // kParallelGrain, one range of channels or several (a short last one; kernels_norm.cpp's channel_block);
  // with and without gamma.
  for (const auto& [C, HW] : {std::pair<int64_t, int64_t>{12, 16}, {12, 1024}, {50, 1024}, {70, 16}}) {
    for (const bool affine : {true, false}) {
      CAPTURE(C);
      CAPTURE(HW);
      CAPTURE(affine);
      const int64_t N = 3;
      const Vec x = random_vec(N * C * HW, 41), dy = random_vec(x.size(), 42);
      const Vec gamma = random_vec(C, 43), mean = random_vec(C, 44), invstd = random_vec(C, 45, 0.5f, 2.f);
      const float* g = affine ? gamma.data() : nullptr;
      Vec dx(x.size()), dgamma(C), dbeta(C);
      cpu::batchnorm_backward(dx.data(), dgamma.data(), dbeta.data(), dy.data(), x.data(), g, mean.data(),
                              invstd.data(), N, C, HW);
      std::vector<int> reads(C, 0);
      const cpu::ChannelSource channel = [&](int64_t c, float* out) {
#pragma omp atomic
        ++reads[c];
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < HW; ++i) out[n * HW + i] = x[(n * C + c) * HW + i];
      };
      Vec dx2(x.size(), -7.f), dgamma2(C, -7.f), dbeta2(C, -7.f);
      cpu::batchnorm_backward_channels(dx2.data(), dgamma2.data(), dbeta2.data(), dy.data(), channel, g,
                                       mean.data(), invstd.data(), N, C, HW);
      CHECK(dx2 == dx);
      CHECK(dgamma2 == dgamma);
      CHECK(dbeta2 == dbeta);
      CHECK(reads == std::vector<int>(C, 1));  // each channel decoded once
      // Split at the reduction (what synchronized batch norm all-reduces in between): the same bits too.
      std::vector<double> sum_dy(C), sum_dy_xc(C);
      cpu::batchnorm_grad_sums(sum_dy.data(), sum_dy_xc.data(), dy.data(), x.data(), mean.data(), N, C, HW);
      Vec dx3(x.size(), -7.f);
      cpu::batchnorm_backward_from_sums(dx3.data(), dy.data(), x.data(), g, mean.data(), invstd.data(), sum_dy.data(),
                                        sum_dy_xc.data(), static_cast<double>(N * HW), N, C, HW);
      CHECK(dx3 == dx);
      for (int64_t c = 0; c < C; ++c) {
        CHECK(static_cast<float>(sum_dy[c]) == dbeta[c]);
        CHECK(static_cast<float>(sum_dy_xc[c] * invstd[c]) == dgamma[c]);
      }
      // Split and by channels (synchronized batch norm on a compressed input): each call reads every
      // channel once, and the sums and dx are the same bits again.
      std::fill(reads.begin(), reads.end(), 0);
      std::vector<double> sum_dy4(C, -7.0), sum_dy_xc4(C, -7.0);
      cpu::batchnorm_grad_sums_channels(sum_dy4.data(), sum_dy_xc4.data(), dy.data(), channel, mean.data(), N, C, HW);
      CHECK(sum_dy4 == sum_dy);
      CHECK(sum_dy_xc4 == sum_dy_xc);
      Vec dx4(x.size(), -7.f);
      cpu::batchnorm_backward_from_sums_channels(dx4.data(), dy.data(), channel, g, mean.data(), invstd.data(),
                                                 sum_dy.data(), sum_dy_xc.data(), static_cast<double>(N * HW), N, C,
                                                 HW);
      CHECK(dx4 == dx);
      CHECK(reads == std::vector<int>(C, 2));
      // A source that fails (a decoder out of memory) fails the call with its exception, whatever the
      // thread that met it: it must not escape the OpenMP loop, which would terminate the process.
      const cpu::ChannelSource failing = [&](int64_t c, float* out) {
        if (c == 7) throw actlab::OutOfMemory("decoder out of memory");
        channel(c, out);
      };
      CHECK_THROWS_AS(cpu::batchnorm_backward_channels(dx2.data(), dgamma2.data(), dbeta2.data(), dy.data(), failing,
                                                       g, mean.data(), invstd.data(), N, C, HW),
                      actlab::OutOfMemory);
    }
  }
}

TEST_CASE("cpu kernels: batchnorm backward (eval) matches central differences") {
  const Vec x = random_vec(kN * kC * kHW, 41), gamma = random_vec(kC, 42),
            beta = random_vec(kC, 43);
  const Vec rm = random_vec(kC, 44), rv = random_vec(kC, 45, 0.5f, 2.f),
            r = random_vec(x.size(), 46);
  auto loss = [&](const Vec& xv, const Vec& g, const Vec& b) {
    Vec y(xv.size());
    cpu::batchnorm_forward_eval(y.data(), xv.data(), g.data(), b.data(), rm.data(), rv.data(), kN,
                                kC, kHW, 1e-5f);
    return dot(r, y);
  };
  Vec dx(x.size()), dgamma(kC), dbeta(kC);
  cpu::batchnorm_backward_eval(dx.data(), dgamma.data(), dbeta.data(), r.data(), x.data(),
                               gamma.data(), rm.data(), rv.data(), kN, kC, kHW, 1e-5f);
  check_close(dx, numeric_grad([&](const Vec& v) { return loss(v, gamma, beta); }, x, 1e-2f), 1e-2,
              1e-3, "dx");
  check_close(dgamma, numeric_grad([&](const Vec& v) { return loss(x, v, beta); }, gamma, 1e-2f),
              1e-3, 1e-3, "dgamma");
  check_close(dbeta, numeric_grad([&](const Vec& v) { return loss(x, gamma, v); }, beta, 1e-2f),
              1e-3, 1e-3, "dbeta");
}

// ---------------------------------------------------------------------------------------------
// element-wise

TEST_CASE("cpu kernels: restore_sign gives a decode the signs (or only the zeros) of its mask, NaN kept, tail word "
          "included") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t n : {int64_t(75), int64_t(100003)}) {
    for (const bool signs : {true, false}) {
      CAPTURE(n);
      CAPTURE(signs);
      const Vec x = random_vec(n, 52, -1.f, 1.f);          // what was packed
      Vec v = random_vec(n, 53, -1.f, 1.f);                // a lossy decode of it: signs often wrong
      v[0] = 0.f, v[1] = -2e-38f, v[2] = nan, v[3] = 5e-39f;  // a subnormal where x was positive
      std::vector<uint32_t> mask(cpu::mask_words(n));
      cpu::relu_mask_from_output(mask.data(), x.data(), n);
      Vec out = v;
      cpu::restore_sign(out.data(), mask.data(), n, signs);
      int64_t wrong = 0, first_wrong = -1, kept_negative = 0;
      for (int64_t i = 0; i < n; ++i) {
        const bool positive = x[i] > 0.f;
        const float want = std::isnan(v[i]) ? v[i] : !positive ? 0.f : signs ? std::max(v[i], FLT_MIN) : v[i];
        const bool sign_ok = !signs || (out[i] > 0.f) == positive;
        if (!(std::isnan(want) ? std::isnan(out[i]) : out[i] == want && sign_ok)) {
          if (wrong++ == 0) first_wrong = i;
        }
        kept_negative += positive && out[i] < 0.f;
      }
      CAPTURE(first_wrong);
      CHECK(wrong == 0);
      CHECK(std::isnan(out[2]));
      if (signs) {
        CHECK((out[3] > 0.f) == (x[3] > 0.f));
      } else {
        CHECK(kept_negative > 0);  // the decode's own values where x was positive, negative ones included
      }
    }
  }
}

TEST_CASE("cpu kernels: relu, add+relu and relu6 masks are exact, tail word included") {
  LiveBytesGuard guard;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t n : {int64_t(75), int64_t(100003)}) {  // tail of 11 bits; parallel path
    CAPTURE(n);
    Vec x = random_vec(n, 51, -8.f, 8.f);
    x[0] = 0.f, x[1] = -0.f, x[2] = 1e-30f, x[3] = -1e-30f, x[4] = 6.f, x[5] = nan, x[n - 1] = 0.5f;
    const int64_t words = cpu::mask_words(n);
    std::vector<uint32_t> mask(words, 0xDEADBEEFu), mask6(words, 0xDEADBEEFu), from_y(words);
    Vec y(n), y6(n);
    cpu::relu_forward(y.data(), mask.data(), x.data(), n);
    cpu::relu6_forward(y6.data(), mask6.data(), x.data(), n);
    cpu::relu_mask_from_output(from_y.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      const bool pass = v > 0.f, pass6 = v > 0.f && v < 6.f;
      if (cpu::mask_bit(mask.data(), i) != pass || cpu::mask_bit(mask6.data(), i) != pass6) {
        FAIL_CHECK("mask bit " << i << " of x = " << v);
        break;
      }
      if (std::isnan(v)) {
        CHECK(std::isnan(y[i]));
        CHECK(std::isnan(y6[i]));
      } else {
        REQUIRE(y[i] == (v > 0.f ? v : 0.f));
        REQUIRE(y6[i] == std::fmin(std::fmax(v, 0.f), 6.f));
      }
    }
    CHECK(from_y == mask);
    // Specific bits: 0, -0, 6 (ReLU6 boundary) and NaN stop the gradient; 1e-30 and the last pass.
    CHECK_FALSE(cpu::mask_bit(mask.data(), 0));
    CHECK_FALSE(cpu::mask_bit(mask.data(), 1));
    CHECK(cpu::mask_bit(mask.data(), 2));
    CHECK(cpu::mask_bit(mask.data(), 4));
    CHECK_FALSE(cpu::mask_bit(mask6.data(), 4));
    CHECK_FALSE(cpu::mask_bit(mask.data(), 5));
    CHECK(cpu::mask_bit(mask.data(), n - 1));
    const int64_t tail = n % 32;  // the unused high bits of the last word are 0
    CHECK((mask[words - 1] >> tail) == 0u);
    CHECK((mask6[words - 1] >> tail) == 0u);

    const Vec dy = random_vec(n, 52);
    Vec dx(n), dx6(n);
    cpu::relu_backward(dx.data(), mask.data(), dy.data(), n);
    cpu::relu6_backward(dx6.data(), mask6.data(), dy.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      REQUIRE(dx[i] == (cpu::mask_bit(mask.data(), i) ? dy[i] : 0.f));
      REQUIRE(dx6[i] == (cpu::mask_bit(mask6.data(), i) ? dy[i] : 0.f));
    }

    const Vec b = random_vec(n, 53);
    std::vector<uint32_t> mask_sum(words);
    Vec sum(n), fused(n);
    cpu::add(sum.data(), x.data(), b.data(), n);
    cpu::add_relu_forward(fused.data(), mask_sum.data(), x.data(), b.data(), n);
    cpu::relu_forward(y.data(), mask.data(), sum.data(), n);
    CHECK(mask_sum == mask);
    for (int64_t i = 0; i < n; ++i)
      if (!std::isnan(y[i])) REQUIRE(fused[i] == y[i]);
  }
}

TEST_CASE("cpu kernels: add and accumulate") {
  const int64_t n = 40001;  // above kParallelGrain
  const Vec a = random_vec(n, 61), b = random_vec(n, 62);
  Vec y(n), acc = b;
  cpu::add(y.data(), a.data(), b.data(), n);
  cpu::accumulate(acc.data(), a.data(), n);
  for (int64_t i = 0; i < n; ++i) REQUIRE(y[i] == a[i] + b[i]);
  CHECK(acc == y);
  Vec inplace = a;
  cpu::add(inplace.data(), inplace.data(), b.data(), n);  // y aliases a
  CHECK(inplace == y);
}

TEST_CASE("cpu kernels: dropout keeps the right fraction, deterministically, from philox") {
  const int64_t n = 200001;
  const float p = 0.3f;
  const Vec x = random_vec(n, 71, 0.5f, 1.5f);  // nonzero, so y == 0 means dropped
  std::vector<uint32_t> mask(cpu::mask_words(n)), mask2(mask.size()), mask_other(mask.size());
  Vec y(n), y2(n), y_other(n);
  cpu::dropout_forward(y.data(), mask.data(), x.data(), n, p, 1234, 5);
  cpu::dropout_forward(y2.data(), mask2.data(), x.data(), n, p, 1234, 5);
  cpu::dropout_forward(y_other.data(), mask_other.data(), x.data(), n, p, 1234, 6);
  CHECK(y == y2);
  CHECK(mask == mask2);
  CHECK(mask != mask_other);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = actlab::philox_uniform(1234, 5, i) >= p;  // the documented draw
    REQUIRE(cpu::mask_bit(mask.data(), i) == keep);
    REQUIRE(y[i] == (keep ? x[i] * (1.f / (1.f - p)) : 0.f));
    kept += keep;
  }
  const double rate = double(kept) / n, sigma = std::sqrt(p * (1 - p) / n);
  CHECK(std::fabs(rate - (1 - p)) < 5 * sigma);
  CHECK((mask.back() >> (n % 32)) == 0u);

  const Vec dy = random_vec(n, 72);
  Vec dx(n);
  cpu::dropout_backward(dx.data(), mask.data(), dy.data(), n, p);
  for (int64_t i = 0; i < n; ++i)
    REQUIRE(dx[i] == (cpu::mask_bit(mask.data(), i) ? dy[i] * (1.f / (1.f - p)) : 0.f));

  cpu::dropout_forward(y.data(), mask.data(), x.data(), 100, 0.f, 1, 1);
  for (int i = 0; i < 100; ++i) REQUIRE(y[i] == x[i]);
  cpu::dropout_forward(y.data(), mask.data(), x.data(), 100, 1.f, 1, 1);
  for (int i = 0; i < 100; ++i) REQUIRE(y[i] == 0.f);
  CHECK_THROWS_AS(cpu::dropout_forward(y.data(), mask.data(), x.data(), 10, 1.5f, 1, 1),
                  actlab::Error);
}

TEST_CASE("cpu kernels: shortcut option A matches F.pad(x[:, :, ::s, ::s]) and its gradient") {
  struct Case {
    int64_t C_in, C_out, stride;
  };
  for (const Case& k : {Case{3, 8, 2}, Case{4, 4, 1}, Case{5, 12, 3}}) {
    CAPTURE(k.C_in);
    CAPTURE(k.C_out);
    CAPTURE(k.stride);
    const int64_t Ho = (kH + k.stride - 1) / k.stride, Wo = (kW + k.stride - 1) / k.stride;
    const int64_t front = (k.C_out - k.C_in) / 2;
    const Vec x = random_vec(kN * k.C_in * kHW, 81);
    Vec y(kN * k.C_out * Ho * Wo, 42.f);
    cpu::shortcut_pad_forward(y.data(), x.data(), kN, k.C_in, kH, kW, k.stride, k.C_out);
    Vec64 want(y.size(), 0.0);
    for (int64_t n = 0; n < kN; ++n)
      for (int64_t c = 0; c < k.C_in; ++c)
        for (int64_t h = 0; h < Ho; ++h)
          for (int64_t w = 0; w < Wo; ++w)
            want[((n * k.C_out + c + front) * Ho + h) * Wo + w] =
                x[((n * k.C_in + c) * kH + h * k.stride) * kW + w * k.stride];
    check_close(y, want, 0, 0, "y");

    const Vec r = random_vec(y.size(), 82);
    Vec dx(x.size(), 42.f);
    cpu::shortcut_pad_backward(dx.data(), r.data(), kN, k.C_in, kH, kW, k.stride, k.C_out);
    auto loss = [&](const Vec& xv) {
      Vec yv(y.size());
      cpu::shortcut_pad_forward(yv.data(), xv.data(), kN, k.C_in, kH, kW, k.stride, k.C_out);
      return dot(r, yv);
    };
    check_close(dx, numeric_grad(loss, x, 0.25f), 1e-5, 1e-5, "dx");
  }
  Vec buf(1000);
  CHECK_THROWS_AS(cpu::shortcut_pad_forward(buf.data(), buf.data(), 1, 8, 4, 4, 2, 4),
                  actlab::Error);
}

namespace {
// The (N, C, HW) shapes the channels-last transposes are checked on: whole 16 x 16 blocks (the registers'
// transpose), channel counts off the 16 grid, position counts off the 32-position tile and the 16 grid (the
// ragged edges), a single channel and a single position.
constexpr int64_t kLayoutShapes[][3] = {{2, 64, 16}, {3, 37, 81}, {2, 16, 1024}, {1, 3, 1024}, {2, 48, 33}, {1, 1, 50},
                                        {4, 20, 1}, {128, 32, 64}};
// The element-by-element reference: (N, C, HW) -> (N, HW, C), or back when to_channels_last is false.
template <typename T>
std::vector<T> transposed(const std::vector<T>& in, int64_t N, int64_t C, int64_t HW, bool to_channels_last) {
  std::vector<T> out(in.size());
  for (int64_t b = 0; b < N; ++b)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < HW; ++p) {
        const auto nchw = static_cast<size_t>((b * C + c) * HW + p), nhwc = static_cast<size_t>((b * HW + p) * C + c);
        if (to_channels_last)
          out[nhwc] = in[nchw];
        else
          out[nchw] = in[nhwc];
      }
  return out;
}
}  // namespace

TEST_CASE("cpu kernels: the channels-last shortcut is the (N, C, H, W) one transposed, bit for bit") {
  struct Case {
    int64_t C_in, C_out, stride;
  };
  for (const Case& k : {Case{3, 8, 2}, Case{4, 4, 1}, Case{5, 12, 3}, Case{16, 32, 2}}) {
    CAPTURE(k.C_in);
    CAPTURE(k.C_out);
    CAPTURE(k.stride);
    const int64_t Ho = (kH + k.stride - 1) / k.stride, Wo = (kW + k.stride - 1) / k.stride;
    const Vec x = random_vec(kN * k.C_in * kHW, 91);
    Vec y(kN * k.C_out * Ho * Wo, 42.f), y_cl(y.size(), 43.f);
    cpu::shortcut_pad_forward(y.data(), x.data(), kN, k.C_in, kH, kW, k.stride, k.C_out);
    cpu::shortcut_pad_forward_channels_last(y_cl.data(), transposed(x, kN, k.C_in, kHW, true).data(), kN, k.C_in, kH,
                                            kW, k.stride, k.C_out);
    CHECK(transposed(y_cl, kN, k.C_out, Ho * Wo, false) == y);
    const Vec r = random_vec(y.size(), 92);
    Vec dx(x.size(), 42.f), dx_cl(x.size(), 43.f);
    cpu::shortcut_pad_backward(dx.data(), r.data(), kN, k.C_in, kH, kW, k.stride, k.C_out);
    cpu::shortcut_pad_backward_channels_last(dx_cl.data(), transposed(r, kN, k.C_out, Ho * Wo, true).data(), kN, k.C_in,
                                             kH, kW, k.stride, k.C_out);
    CHECK(transposed(dx_cl, kN, k.C_in, kHW, false) == dx);
  }
}

TEST_CASE("cpu kernels: channels-last batch norm (train, backward) matches the (N, C, HW) kernels") {
  // The same sums in another order (rows of channels): equal to float rounding. Shapes: one row block, several
  // (the parallel path), channels off the vector width, and |mean| >> std.
  struct Case {
    int64_t N, C, HW;
    float offset;
  };
  for (const Case& k : {Case{kN, kC, kHW, 0.f}, Case{16, 16, 1024, 0.f}, Case{4, 37, 81, 0.f}, Case{2, 3, 50, 1000.f}}) {
    CAPTURE(k.N);
    CAPTURE(k.C);
    CAPTURE(k.HW);
    Vec x = random_vec(k.N * k.C * k.HW, 11, -1.f, 2.f);
    for (float& v : x) v += k.offset;
    const Vec gamma = random_vec(k.C, 12, 0.5f, 1.5f), beta = random_vec(k.C, 13), dy = random_vec(x.size(), 14);
    Vec rm = random_vec(k.C, 15), rv = random_vec(k.C, 16, 0.5f, 2.f), rm_cl = rm, rv_cl = rv;
    Vec y(x.size()), mean(k.C), invstd(k.C), y_cl(x.size()), mean_cl(k.C), invstd_cl(k.C);
    cpu::batchnorm_forward_train(y.data(), mean.data(), invstd.data(), rm.data(), rv.data(), x.data(), gamma.data(),
                                 beta.data(), k.N, k.C, k.HW, 0.1f, 1e-5f);
    const Vec x_cl = transposed(x, k.N, k.C, k.HW, true);
    cpu::batchnorm_forward_train_channels_last(y_cl.data(), mean_cl.data(), invstd_cl.data(), rm_cl.data(),
                                               rv_cl.data(), x_cl.data(), gamma.data(), beta.data(), k.N * k.HW, k.C,
                                               0.1f, 1e-5f);
    check_close(transposed(y_cl, k.N, k.C, k.HW, false), to64(y), 1e-4, 1e-4, "y");
    check_close(mean_cl, to64(mean), 1e-6, 1e-6, "save_mean");
    check_close(invstd_cl, to64(invstd), 1e-5, 0, "save_invstd");
    check_close(rm_cl, to64(rm), 1e-6, 1e-6, "running_mean");
    check_close(rv_cl, to64(rv), 1e-5, 1e-6, "running_var");

    Vec dx(x.size()), dgamma(k.C), dbeta(k.C), dx_cl(x.size()), dgamma_cl(k.C), dbeta_cl(k.C);
    cpu::batchnorm_backward(dx.data(), dgamma.data(), dbeta.data(), dy.data(), x.data(), gamma.data(), mean.data(),
                            invstd.data(), k.N, k.C, k.HW);
    cpu::batchnorm_backward_channels_last(dx_cl.data(), dgamma_cl.data(), dbeta_cl.data(),
                                          transposed(dy, k.N, k.C, k.HW, true).data(), x_cl.data(), gamma.data(),
                                          mean.data(), invstd.data(), k.N * k.HW, k.C);
    check_close(transposed(dx_cl, k.N, k.C, k.HW, false), to64(dx), 1e-4, 1e-4, "dx");
    check_close(dgamma_cl, to64(dgamma), 1e-4, 1e-4, "dgamma");
    check_close(dbeta_cl, to64(dbeta), 1e-4, 1e-4, "dbeta");
    // x as bf16 bits (a bf16 run's keep): the bits of the f32 call on the widened x.
    std::vector<uint16_t> x_bits(x_cl.size());
    Vec x_wide(x_cl.size());
    for (size_t i = 0; i < x_cl.size(); ++i) x_bits[i] = actlab::float_to_bf16(x_cl[i]), x_wide[i] = actlab::bf16_to_float(x_bits[i]);
    Vec dx_w(x.size()), dgamma_w(k.C), dbeta_w(k.C), dx_b(x.size()), dgamma_b(k.C), dbeta_b(k.C);
    const Vec dy_cl = transposed(dy, k.N, k.C, k.HW, true);
    cpu::batchnorm_backward_channels_last(dx_w.data(), dgamma_w.data(), dbeta_w.data(), dy_cl.data(), x_wide.data(),
                                          gamma.data(), mean.data(), invstd.data(), k.N * k.HW, k.C);
    cpu::batchnorm_backward_channels_last(dx_b.data(), dgamma_b.data(), dbeta_b.data(), dy_cl.data(), x_bits.data(),
                                          gamma.data(), mean.data(), invstd.data(), k.N * k.HW, k.C);
    CHECK(dx_b == dx_w);
    CHECK(dgamma_b == dgamma_w);
    CHECK(dbeta_b == dbeta_w);
  }
  Vec one(3);
  CHECK_THROWS_AS(cpu::batchnorm_forward_train_channels_last(one.data(), one.data(), one.data(), nullptr, nullptr,
                                                             one.data(), nullptr, nullptr, 1, 3, 0.1f, 1e-5f),
                  actlab::Error);
}

// ---------------------------------------------------------------------------------------------
// pooling

cpu::Pool2dShape pool_shape(int64_t R, int64_t S, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  cpu::Pool2dShape s;
  s.N = kN, s.C = kC, s.H = kH, s.W = kW, s.R = R, s.S = S;
  s.stride_h = sh, s.stride_w = sw, s.pad_h = ph, s.pad_w = pw;
  return s;
}
std::vector<cpu::Pool2dShape> pool_shapes() {
  return {pool_shape(2, 2, 2, 2, 0, 0), pool_shape(3, 3, 2, 2, 1, 1), pool_shape(3, 2, 1, 2, 1, 1),
          pool_shape(3, 3, 1, 1, 0, 0), pool_shape(5, 4, 3, 2, 2, 2)};
}

// Naive window visit: calls f(plane, p, q, r, t, input index) for every in-bounds window position.
template <typename F>
void for_each_window_tap(const cpu::Pool2dShape& s, F f) {
  for (int64_t nc = 0; nc < s.N * s.C; ++nc)
    for (int64_t p = 0; p < s.P(); ++p)
      for (int64_t q = 0; q < s.Q(); ++q)
        for (int64_t r = 0; r < s.R; ++r)
          for (int64_t t = 0; t < s.S; ++t) {
            const int64_t h = p * s.stride_h - s.pad_h + r, w = q * s.stride_w - s.pad_w + t;
            if (h >= 0 && h < s.H && w >= 0 && w < s.W)
              f((nc * s.P() + p) * s.Q() + q, r * s.S + t, (nc * s.H + h) * s.W + w);
          }
}

TEST_CASE("cpu kernels: max pool values, argmax indices and backward scatter are exact") {
  LiveBytesGuard guard;
  for (const cpu::Pool2dShape& s : pool_shapes()) {
    CAPTURE(s.R);
    CAPTURE(s.S);
    CAPTURE(s.stride_h);
    CAPTURE(s.pad_h);
    const int64_t out = s.N * s.C * s.P() * s.Q();
    // Values on a coarse grid so ties are frequent: the first maximum in window order must win.
    Vec x = random_vec(s.N * s.C * s.H * s.W, 91, 0.f, 4.f);
    for (float& v : x) v = std::floor(v);
    Vec y(out);
    std::vector<uint8_t> argmax(out);
    cpu::maxpool2d_forward(y.data(), argmax.data(), x.data(), s);
    Vec64 want(out, -INFINITY);
    std::vector<int64_t> want_idx(out, -1), want_src(out, -1);
    for_each_window_tap(s, [&](int64_t o, int64_t pos, int64_t src) {
      if (x[src] > want[o]) want[o] = x[src], want_idx[o] = pos, want_src[o] = src;
    });
    check_close(y, want, 0, 0, "y");
    for (int64_t o = 0; o < out; ++o) REQUIRE(argmax[o] == want_idx[o]);

    const Vec dy = random_vec(out, 92);
    Vec dx(x.size(), 42.f);
    cpu::maxpool2d_backward(dx.data(), dy.data(), argmax.data(), s);
    Vec64 want_dx(x.size(), 0.0);
    for (int64_t o = 0; o < out; ++o) want_dx[want_src[o]] += dy[o];
    check_close(dx, want_dx, 1e-6, 1e-6, "dx");

    // Central differences on distinct values (gaps 1e-2 >> h, so no window changes its winner).
    Vec distinct(x.size());
    for (size_t i = 0; i < x.size(); ++i) distinct[i] = float((i * 7919) % x.size()) * 1e-2f;
    cpu::maxpool2d_forward(y.data(), argmax.data(), distinct.data(), s);
    cpu::maxpool2d_backward(dx.data(), dy.data(), argmax.data(), s);
    auto loss = [&](const Vec& xv) {
      Vec yv(out);
      std::vector<uint8_t> a(out);
      cpu::maxpool2d_forward(yv.data(), a.data(), xv.data(), s);
      return dot(dy, yv);
    };
    check_close(dx, numeric_grad(loss, distinct, 1e-3f), 1e-3, 1e-3, "dx (numeric)");
  }
  Vec buf(kN * kC * 20 * 20);
  std::vector<uint8_t> idx(buf.size());
  cpu::Pool2dShape big = pool_shape(17, 16, 1, 1, 0, 0);  // 272 window positions > 256
  big.H = big.W = 20;
  CHECK_THROWS_AS(cpu::maxpool2d_forward(buf.data(), idx.data(), buf.data(), big), actlab::Error);
  CHECK_THROWS_AS(cpu::check_pool_shape(pool_shape(2, 2, 2, 2, 2, 0)), actlab::Error);  // pad > R/2
  CHECK_THROWS_AS(cpu::check_pool_shape(pool_shape(2, 2, 0, 2, 0, 0)), actlab::Error);  // stride 0
}

TEST_CASE("cpu kernels: average pool (count_include_pad) forward and gradient") {
  for (const cpu::Pool2dShape& s : pool_shapes()) {
    CAPTURE(s.R);
    CAPTURE(s.S);
    CAPTURE(s.stride_h);
    CAPTURE(s.pad_h);
    const int64_t out = s.N * s.C * s.P() * s.Q();
    const Vec x = random_vec(s.N * s.C * s.H * s.W, 101);
    Vec y(out);
    cpu::avgpool2d_forward(y.data(), x.data(), s);
    Vec64 want(out, 0.0);
    for_each_window_tap(s, [&](int64_t o, int64_t, int64_t src) { want[o] += x[src]; });
    for (double& v : want) v /= double(s.R * s.S);  // padding counts in the divisor
    check_close(y, want, 1e-5, 1e-6, "y");

    const Vec r = random_vec(out, 102);
    Vec dx(x.size(), 42.f);
    cpu::avgpool2d_backward(dx.data(), r.data(), s);
    auto loss = [&](const Vec& xv) {
      Vec yv(out);
      cpu::avgpool2d_forward(yv.data(), xv.data(), s);
      return dot(r, yv);
    };
    check_close(dx, numeric_grad(loss, x, 1e-2f), 1e-3, 1e-4, "dx");
  }
}

TEST_CASE("cpu kernels: global average pool forward and gradient") {
  const Vec x = random_vec(kN * kC * kHW, 111), r = random_vec(kN * kC, 112);
  Vec y(kN * kC);
  cpu::global_avgpool_forward(y.data(), x.data(), kN, kC, kHW);
  Vec64 want(kN * kC, 0.0);
  for (size_t j = 0; j < x.size(); ++j) want[j / kHW] += x[j] / double(kHW);
  check_close(y, want, 1e-5, 1e-6, "y");
  Vec dx(x.size());
  cpu::global_avgpool_backward(dx.data(), r.data(), kN, kC, kHW);
  auto loss = [&](const Vec& xv) {
    Vec yv(kN * kC);
    cpu::global_avgpool_forward(yv.data(), xv.data(), kN, kC, kHW);
    return dot(r, yv);
  };
  check_close(dx, numeric_grad(loss, x, 1e-2f), 1e-3, 1e-5, "dx");
}

// ---------------------------------------------------------------------------------------------
// loss, accuracy, optimizer

TEST_CASE("cpu kernels: softmax cross-entropy forward, gradient and label checks") {
  LiveBytesGuard guard;
  const int64_t N = 6, K = 7;
  Vec logits = random_vec(N * K, 121, -4.f, 4.f);
  logits[3] = 80.f;  // a large logit: exp overflows unless the row max is subtracted
  const std::vector<int64_t> labels = {0, 6, 3, 3, 1, 5};
  for (const float eps : {0.f, 0.1f}) {
    CAPTURE(eps);
    float loss = 0.f;
    Vec probs(N * K);
    cpu::softmax_cross_entropy_forward(&loss, probs.data(), logits.data(), labels.data(), N, K,
                                       eps);
    double want_loss = 0.0;
    Vec64 want_probs(N * K);
    for (int64_t i = 0; i < N; ++i) {
      double mx = -INFINITY, z = 0.0;
      for (int64_t k = 0; k < K; ++k) mx = std::max(mx, double(logits[i * K + k]));
      for (int64_t k = 0; k < K; ++k) z += std::exp(logits[i * K + k] - mx);
      for (int64_t k = 0; k < K; ++k) {
        const double logp = logits[i * K + k] - mx - std::log(z);
        const double target = (k == labels[i] ? 1.0 - eps : 0.0) + eps / K;
        want_probs[i * K + k] = std::exp(logp);
        want_loss -= target * logp / N;
      }
    }
    CHECK(loss == doctest::Approx(want_loss).epsilon(1e-5));
    check_close(probs, want_probs, 1e-5, 1e-7, "probs");

    const float dloss = 1.7f;
    Vec dlogits(N * K);
    cpu::softmax_cross_entropy_backward(dlogits.data(), probs.data(), labels.data(), N, K, eps,
                                        dloss);
    auto f = [&](const Vec& lv) {
      float l = 0.f;
      Vec pv(N * K);
      cpu::softmax_cross_entropy_forward(&l, pv.data(), lv.data(), labels.data(), N, K, eps);
      return double(dloss) * l;
    };
    check_close(dlogits, numeric_grad(f, logits, 1e-2f), 1e-2, 2e-4, "dlogits");
  }
  std::vector<int64_t> bad = labels;
  bad[4] = 7;
  float loss;
  Vec probs(N * K);
  try {
    cpu::softmax_cross_entropy_forward(&loss, probs.data(), logits.data(), bad.data(), N, K, 0.f);
    FAIL("a label out of range was accepted");
  } catch (const actlab::Error& e) {
    const std::string msg = e.what();
    CHECK_MESSAGE(msg.find("label 7 at index 4") != std::string::npos, msg);
  }
  bad[4] = -1;
  CHECK_THROWS_AS(cpu::top1_correct(logits.data(), bad.data(), N, K), actlab::Error);
}

TEST_CASE("cpu kernels: top1_correct counts argmax hits, first maximum wins") {
  const int64_t N = 5, K = 4;
  // clang-format off
  const Vec logits = {0, 3, 3, 1,    // tie between 1 and 2: argmax 1
                      2, 0, 0, 2,    // tie between 0 and 3: argmax 0
                      -1, -2, -3, -4,
                      0, 0, 0, 9,
                      5, 6, 7, 8};
  // clang-format on
  CHECK(cpu::top1_correct(logits.data(), std::vector<int64_t>{1, 0, 0, 3, 3}.data(), N, K) == 5);
  CHECK(cpu::top1_correct(logits.data(), std::vector<int64_t>{2, 3, 0, 3, 0}.data(), N, K) == 2);
}

TEST_CASE("cpu kernels: sgd_update follows torch.optim.SGD over several steps") {
  const int64_t n = 37;
  const float lr = 0.05f, wd = 5e-4f;
  struct Case {
    float momentum, dampening;
    bool nesterov;
  };
  for (const Case& k : {Case{0.f, 0.f, false}, Case{0.9f, 0.f, false}, Case{0.9f, 0.f, true},
                        Case{0.8f, 0.3f, false}}) {
    CAPTURE(k.momentum);
    CAPTURE(k.dampening);
    CAPTURE(k.nesterov);
    Vec w = random_vec(n, 131), buf(n, 123.f);  // buf garbage: the first step must overwrite it
    Vec64 w_ref = to64(w), buf_ref(n, 0.0);
    for (int step = 0; step < 5; ++step) {
      const Vec grad = random_vec(n, 140 + step);
      cpu::sgd_update(w.data(), k.momentum > 0 ? buf.data() : nullptr, grad.data(), n, lr,
                      k.momentum, k.dampening, wd, k.nesterov, step == 0);
      for (int64_t i = 0; i < n; ++i) {  // the torch loop, in double
        double g = grad[i] + wd * w_ref[i];
        if (k.momentum != 0.f) {
          buf_ref[i] = step == 0 ? g : k.momentum * buf_ref[i] + (1.0 - k.dampening) * g;
          g = k.nesterov ? g + k.momentum * buf_ref[i] : buf_ref[i];
        }
        w_ref[i] -= lr * g;
      }
    }
    check_close(w, w_ref, 1e-5, 1e-6, "w");
    if (k.momentum > 0) check_close(buf, buf_ref, 1e-5, 1e-6, "momentum_buf");
  }
  Vec w(4), g(4), b(4);
  CHECK_THROWS_AS(
      cpu::sgd_update(w.data(), b.data(), g.data(), 4, 0.1f, 0.9f, 0.1f, 0.f, true, false),
      actlab::Error);
  CHECK_THROWS_AS(
      cpu::sgd_update(w.data(), nullptr, g.data(), 4, 0.1f, 0.9f, 0.f, 0.f, false, true),
      actlab::Error);
}

}  // namespace

TEST_CASE("cpu kernels: bf16 conversions are core/bf16.h's element functions, specials and chunk tails included") {
  // Above the parallel grain and off the 16384-element chunk grid (a short last chunk), with the values whose
  // rounding has a rule of its own: NaNs with payloads (kept NaN, quieted), ±inf, ±0, subnormals, the
  // largest finite value (rounds to inf), and exact ties (round to even).
  const int64_t n = 3 * 16384 + 123;
  std::vector<float> x(static_cast<size_t>(n));
  actlab::PhiloxStream rng(7, 3);
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = (static_cast<float>(rng.next_bits() % 20001) - 10000.f) * 1.3e-3f;
  const uint32_t specials[] = {0x7FC00000u, 0x7F800001u, 0xFFBFFFFFu, 0x7F800000u, 0xFF800000u, 0x00000000u,
                               0x80000000u, 0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu, 0x3F808000u, 0x3F818000u,
                               0x3F80FFFFu, 0xBF808001u};
  for (size_t k = 0; k < sizeof(specials) / sizeof(specials[0]); ++k) {
    std::memcpy(&x[k], &specials[k], 4);
    std::memcpy(&x[static_cast<size_t>(n) - 1 - k], &specials[k], 4);
  }
  std::vector<uint16_t> h(static_cast<size_t>(n), 0xAAAA), hs(static_cast<size_t>(n), 0x5555);
  cpu::to_bf16(h.data(), x.data(), n);
  cpu::to_bf16_serial(hs.data(), x.data(), n);
  bool same = true;
  for (int64_t i = 0; i < n; ++i) same = same && h[i] == actlab::float_to_bf16(x[i]) && hs[i] == h[i];
  CHECK(same);
  std::vector<float> back(static_cast<size_t>(n), -1.f), back_s(static_cast<size_t>(n), -2.f);
  cpu::from_bf16(back.data(), h.data(), n);
  cpu::from_bf16_serial(back_s.data(), h.data(), n);
  same = true;
  for (int64_t i = 0; i < n; ++i)
    same = same && std::memcmp(&back[i], &back_s[i], 4) == 0 && actlab::float_bits(back[i]) == (static_cast<uint32_t>(h[i]) << 16);
  CHECK(same);
}


TEST_CASE("cpu kernels: to_bf16_channels_last is to_bf16 transposed to (N, HW, C), on AVX-512 and portably") {
  // The reference twin: to_bf16 in (N, C, HW) order, then each element moved to (n, p, c); special values (NaN
  // payloads, infinities, subnormals, ties) scattered through each shape.
  const uint32_t specials[] = {0x7FC00000u, 0x7F800001u, 0xFFBFFFFFu, 0x7F800000u, 0xFF800000u, 0x80000000u,
                               0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu, 0x3F808000u, 0x3F818000u, 0xBF808001u};
  for (const auto& sh : kLayoutShapes) {
    const int64_t N = sh[0], C = sh[1], HW = sh[2], n = N * C * HW;
    CAPTURE(N);
    CAPTURE(C);
    CAPTURE(HW);
    std::vector<float> x(static_cast<size_t>(n));
    actlab::PhiloxStream rng(11, static_cast<uint64_t>(n));
    for (auto& v : x) v = (static_cast<float>(rng.next_bits() % 20001) - 10000.f) * 1.7e-3f;
    for (size_t k = 0; k < sizeof(specials) / sizeof(specials[0]); ++k)
      std::memcpy(&x[(k * 7919) % x.size()], &specials[k], 4);
    std::vector<uint16_t> nchw(static_cast<size_t>(n));
    cpu::to_bf16(nchw.data(), x.data(), n);
    const std::vector<uint16_t> expected = transposed(nchw, N, C, HW, true);
    for (const bool avx512 : {true, false}) {
      CAPTURE(avx512);
      std::vector<uint16_t> got(static_cast<size_t>(n), 0xAAAA);
      cpu::to_bf16_channels_last(got.data(), x.data(), N, C, HW, avx512);
      CHECK(got == expected);
    }
  }
}

TEST_CASE("cpu kernels: channels_last_to_nchw and nchw_to_channels_last are the transposing copies, on AVX-512 and portably") {
  // NaN payloads and signed zeros copied as bits.
  for (const auto& sh : kLayoutShapes) {
    const int64_t N = sh[0], C = sh[1], HW = sh[2], n = N * C * HW;
    CAPTURE(N);
    CAPTURE(C);
    CAPTURE(HW);
    std::vector<float> x(static_cast<size_t>(n));
    actlab::PhiloxStream rng(13, static_cast<uint64_t>(n));
    for (auto& v : x) v = static_cast<float>(rng.next_bits() % 20001) - 10000.f;
    const uint32_t nan_payload = 0x7FC01234u, negative_zero = 0x80000000u;
    std::memcpy(&x[0], &nan_payload, 4);
    std::memcpy(&x[x.size() / 2], &negative_zero, 4);
    for (const bool to_channels_last : {false, true}) {
      CAPTURE(to_channels_last);
      const std::vector<float> expected = transposed(x, N, C, HW, to_channels_last);
      for (const bool avx512 : {true, false}) {
        CAPTURE(avx512);
        std::vector<float> got(static_cast<size_t>(n), -1.f);
        if (to_channels_last)
          cpu::nchw_to_channels_last(got.data(), x.data(), N, C, HW, avx512);
        else
          cpu::channels_last_to_nchw(got.data(), x.data(), N, C, HW, avx512);
        CHECK(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)) == 0);
      }
    }
  }
}
