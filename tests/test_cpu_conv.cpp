// Tests of the CPU convolution and GEMM backend (core/cpu/conv.h, core/cpu/gemm.h): every fast-path
// implementation against the naive *_ref loops on many shapes (strides, pads, 1x1/3x3/7x7, groups,
// depthwise, odd sizes, with and without bias), gemm against gemm_ref, both batched GEMM paths against
// gemm_batched_ref, and the *_ref backward against central differences so the spec itself is verified.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "actlab/core/allocator.h"
#include "actlab/core/bf16.h"
#include "actlab/core/cpu/conv.h"
#include "actlab/core/precision.h"
#include "actlab/core/cpu/gemm.h"
#include "actlab/core/error.h"
#include "tests/prerequisite.h"

namespace {

using actlab::cpu::ConvImpl;
using actlab::cpu::ConvShape;

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// max |got - want| relative to max |want| (sums over many terms: an elementwise rtol is too strict
// where the true value is near zero).
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double max_diff = 0.0, max_ref = 1e-6;
  for (size_t i = 0; i < got.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
  }
  return std::isfinite(max_diff) ? max_diff / max_ref : 1e30;
}

ConvShape shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R, int64_t S,
                int64_t stride, int64_t pad, int64_t groups) {
  ConvShape s;
  s.N = N, s.C = C, s.H = H, s.W = W, s.K = K, s.R = R, s.S = S;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  s.groups = groups;
  return s;
}

std::vector<ConvShape> test_shapes() {
  std::vector<ConvShape> v = {
      shape(2, 3, 8, 8, 4, 3, 3, 1, 1, 1),      // stem-like, C=3
      shape(3, 4, 7, 5, 6, 3, 3, 2, 1, 1),      // odd sizes, N=3, stride 2
      shape(2, 8, 5, 6, 16, 1, 1, 1, 0, 1),     // 1x1 (no im2col)
      shape(2, 16, 7, 7, 32, 1, 1, 2, 0, 1),    // 1x1 stride 2 (ResNet projection)
      shape(2, 16, 8, 8, 32, 1, 1, 2, 0, 1),    // 1x1 stride 2 on an even map (bf16: a strided view is its col)
      shape(2, 3, 11, 9, 8, 7, 7, 2, 3, 1),     // 7x7 stride 2 pad 3 (ImageNet stem)
      shape(2, 20, 6, 7, 24, 3, 3, 1, 1, 1),    // channels not a multiple of 16
      shape(1, 2, 4, 5, 3, 3, 3, 1, 3, 1),      // pad 3 with a 3x3 kernel
      shape(2, 8, 6, 6, 12, 3, 3, 1, 1, 2),     // groups 2
      shape(2, 16, 9, 7, 16, 3, 3, 1, 1, 16),   // depthwise stride 1
      shape(3, 32, 8, 8, 32, 3, 3, 2, 1, 32),   // depthwise stride 2
      shape(2, 5, 7, 5, 5, 3, 3, 1, 1, 5),      // depthwise, odd channel count
      shape(2, 32, 8, 8, 32, 3, 3, 1, 1, 1),    // Winograd-eligible (3x3 s1, C,K % 16 == 0)
      shape(2, 64, 6, 5, 64, 3, 3, 1, 1, 1),    // Auto picks Winograd here (>= 64 channels)
      shape(2, 16, 12, 12, 16, 3, 3, 1, 1, 1),  // 144 output positions: bf16 Auto keeps oneDNN's backward weights
      shape(2, 16, 4, 4, 80, 3, 3, 1, 1, 1),    // K = 80: the bf16 matmul route's bias sums span two column blocks;
                                                // 4x4 maps: on AMX, Auto's bf16 forward and backward data are matmuls
      shape(2, 24, 8, 8, 16, 3, 3, 2, 1, 1),    // stride 2 onto 4x4 maps: the forward's matmul, oneDNN's backward data
      shape(2, 16, 6, 6, 24, 5, 5, 1, 2, 1),    // 5x5 stride 1: backward data as the flipped forward, padded by 2
      shape(2, 16, 6, 6, 24, 5, 5, 1, 1, 1),    // 5x5 pad 1: a 4x4 output of a 6x6 input (P != H), flipped pad 3
      shape(2, 8, 7, 7, 16, 3, 3, 1, 0, 1),     // 3x3 pad 0: P != H, flipped pad 2
      shape(2, 16, 3, 3, 32, 3, 3, 1, 0, 1),    // a 1x1 output: the matmul's product is the (N, K, 1, 1) output itself
  };
  ConvShape asym = shape(2, 4, 9, 6, 5, 3, 1, 1, 0, 1);  // different strides and pads per axis
  asym.stride_h = 2, asym.pad_w = 1;
  v.push_back(asym);
  ConvShape asym_pad = shape(2, 16, 6, 5, 8, 3, 3, 1, 1, 1);  // stride 1, pads 1 and 0: the flipped pads 1 and 2
  asym_pad.pad_w = 0;
  v.push_back(asym_pad);
  return v;
}

// Winograd trades a little accuracy for speed; everything else must match the spec to ~1e-5.
double tolerance(ConvImpl impl) { return impl == ConvImpl::DnnlWinograd ? 1e-3 : 1e-4; }

void check_against_ref(const ConvShape& s, ConvImpl impl, bool with_bias, uint32_t seed) {
  const size_t x_n = s.N * s.C * s.H * s.W, w_n = s.K * (s.C / s.groups) * s.R * s.S;
  const size_t y_n = s.N * s.K * s.P() * s.Q();
  const auto x = random_vector(x_n, seed), w = random_vector(w_n, seed + 1);
  const auto b = random_vector(s.K, seed + 2), dy = random_vector(y_n, seed + 3);
  const float* bias = with_bias ? b.data() : nullptr;

  std::vector<float> y(y_n, NAN), y_ref(y_n);  // NaN: the fast path must assign, not accumulate
  actlab::cpu::conv2d_forward(y.data(), x.data(), w.data(), bias, s, impl);
  actlab::cpu::conv2d_forward_ref(y_ref.data(), x.data(), w.data(), bias, s);
  CHECK(relative_error(y, y_ref) < tolerance(impl));

  std::vector<float> dx(x_n, NAN), dx_ref(x_n);
  actlab::cpu::conv2d_backward_data(dx.data(), dy.data(), w.data(), s, impl);
  actlab::cpu::conv2d_backward_data_ref(dx_ref.data(), dy.data(), w.data(), s);
  CHECK(relative_error(dx, dx_ref) < tolerance(impl));

  std::vector<float> dw(w_n, NAN), dw_ref(w_n), db(s.K, NAN), db_ref(s.K);
  actlab::cpu::conv2d_backward_weight(dw.data(), with_bias ? db.data() : nullptr, dy.data(),
                                      x.data(), s, impl);
  actlab::cpu::conv2d_backward_weight_ref(dw_ref.data(), with_bias ? db_ref.data() : nullptr,
                                          dy.data(), x.data(), s);
  CHECK(relative_error(dw, dw_ref) < tolerance(impl));
  if (with_bias) CHECK(relative_error(db, db_ref) < 1e-4);
}

}  // namespace

TEST_CASE("cpu conv: every implementation matches the reference loops") {
  const int64_t live_before = actlab::memory_stats().total.current;
  const ConvImpl impls[] = {ConvImpl::Auto, ConvImpl::DnnlBlocked, ConvImpl::DnnlNhwc,
                            ConvImpl::DnnlPlain, ConvImpl::DnnlWinograd, ConvImpl::Im2colGemm};
  uint32_t seed = 1;
  for (ConvImpl impl : impls)
    for (const ConvShape& s : test_shapes())
      for (bool with_bias : {false, true}) {
        CAPTURE(s.str());
        CAPTURE(actlab::cpu::conv_impl_name(impl));
        CAPTURE(with_bias);
        check_against_ref(s, impl, with_bias, seed += 7);
      }
  CHECK(actlab::memory_stats().total.current == live_before);  // scratch was all released
}

namespace {
std::vector<float> rounded_bf16(std::vector<float> v) {
  for (float& x : v) x = actlab::round_bf16(x);
  return v;
}
}  // namespace

// The spec of a bf16 call is the reference loop on its multiplied operands rounded to bf16: oneDNN then
// differs only by f32 accumulation order (1e-4 like the fp32 paths), while the unrounded fp32 result is
// ~1e-3 away, so the check also sees that the operands really were rounded.
TEST_CASE("cpu conv: bf16 compute equals the reference loops on bf16-rounded operands") {
  if (!actlab::testing::have_bf16_kernels()) return;
  const int64_t live_before = actlab::memory_stats().total.current;
  using actlab::Precision;
  uint32_t seed = 500;
  for (ConvImpl impl : {ConvImpl::Auto, ConvImpl::DnnlBlocked, ConvImpl::DnnlPlain, ConvImpl::DnnlNhwc,
                        ConvImpl::Im2colGemm})
    for (const ConvShape& s : test_shapes())
      for (bool with_bias : {false, true}) {
        CAPTURE(s.str());
        CAPTURE(actlab::cpu::conv_impl_name(impl));
        CAPTURE(with_bias);
        const size_t x_n = s.N * s.C * s.H * s.W, w_n = s.K * (s.C / s.groups) * s.R * s.S;
        const size_t y_n = s.N * s.K * s.P() * s.Q();
        const auto x = random_vector(x_n, seed += 7), w = random_vector(w_n, seed + 1);
        const auto b = random_vector(s.K, seed + 2), dy = random_vector(y_n, seed + 3);
        const auto xr = rounded_bf16(x), wr = rounded_bf16(w), dyr = rounded_bf16(dy);
        const float* bias = with_bias ? b.data() : nullptr;

        std::vector<float> y(y_n, NAN), y_ref(y_n), y_f32(y_n);
        actlab::cpu::conv2d_forward(y.data(), x.data(), w.data(), bias, s, impl, Precision::BF16);
        actlab::cpu::conv2d_forward_ref(y_ref.data(), xr.data(), wr.data(), bias, s);
        actlab::cpu::conv2d_forward_ref(y_f32.data(), x.data(), w.data(), bias, s);
        CHECK(relative_error(y, y_ref) < 1e-4);
        CHECK(relative_error(y, y_f32) > 1e-4);
        // The forward on a kept bf16 copy of x read as it is: the bits of the widened copy's forward, and of x's
        // own (the convolution's conversion on the way in rounds to nearest, as the copy did).
        std::vector<uint16_t> x_bits(x_n);
        for (size_t i = 0; i < x_n; ++i) x_bits[i] = actlab::float_to_bf16(x[i]);
        std::vector<float> y16(y_n, NAN), y_wide(y_n, NAN);
        actlab::cpu::conv2d_forward_bf16_input(y16.data(), x_bits.data(), w.data(), bias, s, impl);
        actlab::cpu::conv2d_forward(y_wide.data(), xr.data(), w.data(), bias, s, impl, Precision::BF16);
        CHECK(y16 == y_wide);
        CHECK(y16 == y);
        // The same copy laid out channels-last (what a keep is where the kernel reads that layout): the same bits.
        std::vector<uint16_t> x_bits_cl(x_n);
        const int64_t HW = s.H * s.W;
        for (int64_t n = 0; n < s.N; ++n)
          for (int64_t c = 0; c < s.C; ++c)
            for (int64_t p = 0; p < HW; ++p)
              x_bits_cl[static_cast<size_t>((n * HW + p) * s.C + c)] = x_bits[static_cast<size_t>((n * s.C + c) * HW + p)];
        std::vector<float> y16_cl(y_n, NAN);
        actlab::cpu::conv2d_forward_bf16_input(y16_cl.data(), x_bits_cl.data(), w.data(), bias, s, impl,
                                               actlab::cpu::Layout::ChannelsLast);
        CHECK(y16_cl == y16);

        std::vector<float> dx(x_n, NAN), dx_ref(x_n);
        actlab::cpu::conv2d_backward_data(dx.data(), dy.data(), w.data(), s, impl, Precision::BF16);
        actlab::cpu::conv2d_backward_data_ref(dx_ref.data(), dyr.data(), wr.data(), s);
        CHECK(relative_error(dx, dx_ref) < 1e-4);

        std::vector<float> dw(w_n, NAN), dw_ref(w_n), db(s.K, NAN), db_ref(s.K);
        actlab::cpu::conv2d_backward_weight(dw.data(), with_bias ? db.data() : nullptr, dy.data(), x.data(), s, impl,
                                            Precision::BF16);
        actlab::cpu::conv2d_backward_weight_ref(dw_ref.data(), with_bias ? db_ref.data() : nullptr, dyr.data(),
                                                xr.data(), s);
        CHECK(relative_error(dw, dw_ref) < 1e-4);
        // The kept bf16 copy read as it is: the same bits as from the widened copy (Auto, and the matmul route
        // forced, which Auto takes on small maps and dense pointwise layers).
        if (impl == ConvImpl::Auto || impl == ConvImpl::Im2colGemm) {
          std::vector<float> dw16(w_n, NAN), db16(s.K, NAN), dw_wide(w_n, NAN), db_wide(s.K, NAN);
          actlab::cpu::conv2d_backward_weight_bf16_input(dw16.data(), with_bias ? db16.data() : nullptr, dy.data(),
                                                         x_bits.data(), s, impl);
          actlab::cpu::conv2d_backward_weight(dw_wide.data(), with_bias ? db_wide.data() : nullptr, dy.data(),
                                              xr.data(), s, impl, Precision::BF16);
          CHECK(dw16 == dw_wide);
          if (with_bias) CHECK(db16 == db_wide);
          std::vector<float> dw16_cl(w_n, NAN), db16_cl(s.K, NAN);
          actlab::cpu::conv2d_backward_weight_bf16_input(dw16_cl.data(), with_bias ? db16_cl.data() : nullptr,
                                                         dy.data(), x_bits_cl.data(), s, impl,
                                                         actlab::cpu::Layout::ChannelsLast);
          CHECK(dw16_cl == dw16);
          if (with_bias) CHECK(db16_cl == db16);
        }
        // Channels-last f32 activations (x, y, dy, dx: a bf16 run's between its convolutions) give the same bits,
        // transposed: only the ports' copies change.
        {
          using actlab::cpu::Layout;
          const auto to_cl = [](const std::vector<float>& v, int64_t N, int64_t C, int64_t HW, bool forward) {
            std::vector<float> out(v.size());
            for (int64_t n = 0; n < N; ++n)
              for (int64_t c = 0; c < C; ++c)
                for (int64_t p = 0; p < HW; ++p) {
                  const auto nchw = static_cast<size_t>((n * C + c) * HW + p);
                  const auto nhwc = static_cast<size_t>((n * HW + p) * C + c);
                  if (forward)
                    out[nhwc] = v[nchw];
                  else
                    out[nchw] = v[nhwc];
                }
            return out;
          };
          const int64_t PQ = s.P() * s.Q();
          const std::vector<float> x_cl = to_cl(x, s.N, s.C, HW, true), dy_cl = to_cl(dy, s.N, s.K, PQ, true);
          std::vector<float> y_cl(y_n, NAN), y16_cl_out(y_n, NAN), dx_cl(x_n, NAN);
          actlab::cpu::conv2d_forward(y_cl.data(), x_cl.data(), w.data(), bias, s, impl, Precision::BF16,
                                      Layout::ChannelsLast);
          CHECK(to_cl(y_cl, s.N, s.K, PQ, false) == y);
          actlab::cpu::conv2d_forward_bf16_input(y16_cl_out.data(), x_bits_cl.data(), w.data(), bias, s, impl,
                                                 Layout::ChannelsLast, Layout::ChannelsLast);
          CHECK(to_cl(y16_cl_out, s.N, s.K, PQ, false) == y16);
          actlab::cpu::conv2d_backward_data(dx_cl.data(), dy_cl.data(), w.data(), s, impl, Precision::BF16,
                                            Layout::ChannelsLast);
          CHECK(to_cl(dx_cl, s.N, s.C, HW, false) == dx);
          std::vector<float> dw_cl(w_n, NAN), db_cl(s.K, NAN), dw_keep(w_n, NAN), db_keep(s.K, NAN);
          actlab::cpu::conv2d_backward_weight(dw_cl.data(), with_bias ? db_cl.data() : nullptr, dy_cl.data(),
                                              x_cl.data(), s, impl, Precision::BF16, Layout::ChannelsLast);
          CHECK(dw_cl == dw);
          if (with_bias) CHECK(db_cl == db);
          // The kept bf16 copy (channels-last) with a channels-last dy: as with the (N, C, H, W) dy.
          std::vector<float> dw_keep_nchw(w_n, NAN), db_keep_nchw(s.K, NAN);
          actlab::cpu::conv2d_backward_weight_bf16_input(dw_keep.data(), with_bias ? db_keep.data() : nullptr,
                                                         dy_cl.data(), x_bits_cl.data(), s, impl, Layout::ChannelsLast,
                                                         Layout::ChannelsLast);
          actlab::cpu::conv2d_backward_weight_bf16_input(dw_keep_nchw.data(),
                                                         with_bias ? db_keep_nchw.data() : nullptr, dy.data(),
                                                         x_bits_cl.data(), s, impl, Layout::ChannelsLast);
          CHECK(dw_keep == dw_keep_nchw);
          if (with_bias) CHECK(db_keep == db_keep_nchw);
          // fp32 compute has no channels-last path: one error line, not a wrong answer.
          CHECK_THROWS_AS(actlab::cpu::conv2d_forward(y_cl.data(), x_cl.data(), w.data(), bias, s, ConvImpl::Auto,
                                                      Precision::F32, Layout::ChannelsLast),
                          actlab::Error);
        }
        // The bias gradient sums dy: oneDNN may sum the bf16 or the f32 dy; either is within bf16 rounding. The
        // matmul route sums the rounded dy in double, as the reference does.
        const bool matmul = actlab::cpu::conv2d_backward_weight_impl(s, impl, Precision::BF16) == ConvImpl::Im2colGemm;
        if (with_bias) CHECK(relative_error(db, db_ref) < (matmul ? 1e-6 : 1e-2));
      }
  CHECK(actlab::memory_stats().total.current == live_before);
  // Which route bf16 backward weights take: the matmul for im2col (one group) and, for Auto, on small strided maps;
  // on small unstrided maps by the CPU's rule (AMX: 256 input channels or more; avx512_bf16 alone: 4x4 maps);
  // oneDNN's kernel on large maps and for grouped layers.
  const bool amx = actlab::cpu::dnnl_runs_amx();
  const ConvShape large = shape(2, 16, 12, 12, 16, 3, 3, 1, 1, 1), grouped = shape(2, 8, 6, 6, 12, 3, 3, 1, 1, 2);
  const ConvShape small_strided = shape(2, 16, 8, 8, 32, 3, 3, 2, 1, 1);
  const ConvShape wide_8x8 = shape(2, 256, 8, 8, 16, 3, 3, 1, 1, 1), narrow_4x4 = shape(2, 16, 4, 4, 16, 3, 3, 1, 1, 1);
  CHECK(actlab::cpu::conv2d_backward_weight_impl(small_strided, ConvImpl::Auto, Precision::BF16) ==
        ConvImpl::Im2colGemm);
  CHECK(actlab::cpu::conv2d_backward_weight_impl(wide_8x8, ConvImpl::Auto, Precision::BF16) ==
        (amx ? ConvImpl::Im2colGemm : ConvImpl::DnnlBlocked));
  CHECK(actlab::cpu::conv2d_backward_weight_impl(narrow_4x4, ConvImpl::Auto, Precision::BF16) ==
        (amx ? ConvImpl::DnnlBlocked : ConvImpl::Im2colGemm));
  CHECK(actlab::cpu::conv2d_backward_weight_impl(small_strided, ConvImpl::Im2colGemm, Precision::BF16) ==
        ConvImpl::Im2colGemm);
  CHECK(actlab::cpu::conv2d_backward_weight_impl(large, ConvImpl::Auto, Precision::BF16) == ConvImpl::DnnlBlocked);
  CHECK(actlab::cpu::conv2d_backward_weight_impl(grouped, ConvImpl::Im2colGemm, Precision::BF16) ==
        ConvImpl::DnnlBlocked);
  CHECK(actlab::cpu::conv2d_backward_weight_impl(large, ConvImpl::Im2colGemm, Precision::F32) == ConvImpl::Im2colGemm);
  // Which layers' bf16 backward data runs as the forward of the flipped kernels: one-group stride-1 layers, with
  // im2col (the matmul forward: so the loop above checks that route on every CPU with bf16 kernels), and with
  // Auto on AMX (and dense pointwise ones on every CPU, below); never strided or grouped ones, other
  // implementations or fp32.
  CHECK(actlab::cpu::conv2d_backward_data_as_forward(large, ConvImpl::Auto, Precision::BF16) == amx);
  CHECK(actlab::cpu::conv2d_backward_data_as_forward(large, ConvImpl::Im2colGemm, Precision::BF16));
  CHECK_FALSE(actlab::cpu::conv2d_backward_data_as_forward(large, ConvImpl::Im2colGemm, Precision::F32));
  CHECK_FALSE(actlab::cpu::conv2d_backward_data_as_forward(large, ConvImpl::Auto, Precision::F32));
  CHECK_FALSE(actlab::cpu::conv2d_backward_data_as_forward(large, ConvImpl::DnnlBlocked, Precision::BF16));
  CHECK_FALSE(actlab::cpu::conv2d_backward_data_as_forward(small_strided, ConvImpl::Auto, Precision::BF16));
  CHECK_FALSE(actlab::cpu::conv2d_backward_data_as_forward(grouped, ConvImpl::Auto, Precision::BF16));
  // Pointwise layers under Auto run all three passes as matmuls on channels-last operands: backward data as the
  // forward of the transposed weights, the forward as one matmul (so it reads channels-last), backward weights as
  // one matmul; dnnl-plain's pointwise kernel computes on (N, C, H, W) and never reads channels-last. Grouped
  // (depthwise) layers run dnnl-nhwc under Auto, so they read channels-last too.
  const ConvShape pointwise = shape(2, 16, 8, 8, 32, 1, 1, 1, 0, 1);
  CHECK(actlab::cpu::conv2d_backward_data_as_forward(pointwise, ConvImpl::Auto, Precision::BF16));
  CHECK(actlab::cpu::conv2d_bf16_reads_channels_last(pointwise, false, ConvImpl::Auto));
  CHECK(actlab::cpu::conv2d_backward_weight_impl(pointwise, ConvImpl::Auto, Precision::BF16) == ConvImpl::Im2colGemm);
  CHECK_FALSE(actlab::cpu::conv2d_bf16_reads_channels_last(pointwise, false, ConvImpl::DnnlPlain));
  CHECK(actlab::cpu::conv2d_bf16_reads_channels_last(grouped, false, ConvImpl::Auto));
  // The 4x4 maps' forward as one matmul (Auto on AMX) reads its im2col from a channels-last input.
  if (amx) CHECK(actlab::cpu::conv2d_bf16_reads_channels_last(shape(2, 16, 4, 4, 80, 3, 3, 1, 1, 1), true, ConvImpl::Auto));
  CHECK_FALSE(actlab::cpu::conv2d_bf16_reads_channels_last(large, true, ConvImpl::DnnlPlain));
  CHECK(actlab::cpu::conv2d_bf16_reads_channels_last(large, true, ConvImpl::DnnlNhwc));
  // Winograd has no bf16 kernel.
  CHECK_THROWS_WITH_AS(actlab::cpu::conv2d_forward(nullptr, nullptr, nullptr, nullptr, test_shapes()[0],
                                                   ConvImpl::DnnlWinograd, Precision::BF16),
                       doctest::Contains("has no bf16 path"), actlab::Error);
}

// The instruction sets oneDNN needs for its AVX-512 kernels (avx512_core).
static bool avx512_cpu() {
#if defined(__GNUC__) && defined(__x86_64__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

TEST_CASE("cpu conv: backward weight on a channel-blocked input equals the NCHW call bit for bit") {
  // Shapes whose backward-weights primitive computes on aBcd16b (direct blocked, Winograd, 1x1 stride 2)
  // and shapes where it does not (C = 3, C not a multiple of 16, pointwise stride 1 on plain NCHW).
  struct Case { ConvShape s; bool blocked; };
  const Case cases[] = {{shape(2, 16, 8, 8, 32, 3, 3, 2, 1, 1), true},   {shape(4, 64, 8, 8, 64, 3, 3, 1, 1, 1), true},
                        {shape(2, 32, 7, 7, 64, 1, 1, 2, 0, 1), true},   {shape(2, 3, 8, 8, 16, 3, 3, 1, 1, 1), false},
                        {shape(2, 20, 6, 7, 24, 3, 3, 1, 1, 1), false},  {shape(2, 32, 8, 8, 32, 1, 1, 1, 0, 1), false},
                        {shape(4, 32, 8, 8, 32, 3, 3, 1, 1, 32), true},  {shape(4, 144, 16, 16, 144, 3, 3, 2, 1, 144), true},
                        {shape(2, 24, 8, 8, 24, 3, 3, 1, 1, 24), false}, {shape(2, 32, 8, 8, 64, 3, 3, 1, 1, 2), true}};
  uint32_t seed = 500;
  for (const Case& c : cases)
    for (bool with_bias : {false, true}) {
      const ConvShape& s = c.s;
      CAPTURE(s.str());
      CAPTURE(with_bias);
      const int block = actlab::cpu::conv2d_backward_weight_input_block(s, with_bias);
      // oneDNN uses 16-channel blocks on AVX-512 CPUs (8-channel ones on AVX2: then the answer is 0).
      CHECK(block == (c.blocked && avx512_cpu() ? 16 : 0));
      if (block == 0) {
        std::vector<float> any(16);
        CHECK_THROWS_AS(actlab::cpu::conv2d_backward_weight_blocked_input(any.data(), nullptr, any.data(), any.data(), s),
                        actlab::Error);
        continue;
      }
      const std::vector<float> x = random_vector(static_cast<size_t>(s.N * s.C * s.H * s.W), seed++);
      const std::vector<float> dy = random_vector(static_cast<size_t>(s.N * s.K * s.P() * s.Q()), seed++);
      std::vector<float> xb(x.size());  // (n, c/16, h, w, c%16)
      const int64_t HW = s.H * s.W;
      for (int64_t n = 0; n < s.N; ++n)
        for (int64_t ch = 0; ch < s.C; ++ch)
          for (int64_t e = 0; e < HW; ++e) xb[((n * (s.C / 16) + ch / 16) * HW + e) * 16 + ch % 16] = x[(n * s.C + ch) * HW + e];
      const size_t wsize = static_cast<size_t>(s.K * (s.C / s.groups) * s.R * s.S);
      std::vector<float> dw(wsize), dw_blocked(wsize, -7.f), db(s.K), db_blocked(s.K, -7.f);
      actlab::cpu::conv2d_backward_weight(dw.data(), with_bias ? db.data() : nullptr, dy.data(), x.data(), s);
      actlab::cpu::conv2d_backward_weight_blocked_input(dw_blocked.data(), with_bias ? db_blocked.data() : nullptr,
                                                        dy.data(), xb.data(), s);
      CHECK(dw_blocked == dw);
      if (with_bias) CHECK(db_blocked == db);
    }
}

TEST_CASE("cpu conv: a ConvGradShare reorders dy once for both backward passes, with the same results") {
  using actlab::MemTag;
  using actlab::Precision;
  std::vector<Precision> precisions = {Precision::F32};
  // Not have_bf16_kernels(): its SKIPPED line would report the whole case skipped, fp32 part included.
  if (actlab::cpu_runs_bf16_kernels())
    precisions.push_back(Precision::BF16);
  else
    MESSAGE("bf16 part not run: no bf16 kernels on this CPU (" << actlab::cpu_bf16_flags() << ")");
  // Winograd (3x3 s1, 64 channels), direct blocked (stride 2), 1x1 stride 2, pointwise on plain NCHW
  // (no reorder at all in fp32), depthwise, and channels that are not a multiple of 16.
  const ConvShape shapes[] = {shape(2, 64, 6, 5, 64, 3, 3, 1, 1, 1), shape(2, 16, 8, 8, 32, 3, 3, 2, 1, 1),
                              shape(2, 32, 7, 7, 64, 1, 1, 2, 0, 1), shape(2, 32, 8, 8, 32, 1, 1, 1, 0, 1),
                              shape(3, 32, 8, 8, 32, 3, 3, 2, 1, 32), shape(2, 20, 6, 7, 24, 3, 3, 1, 1, 1),
                              shape(2, 16, 12, 12, 16, 3, 3, 1, 1, 1)};
  const int64_t live_before = actlab::memory_stats().total.current;
  uint32_t seed = 900;
  for (Precision pr : precisions)
    for (const ConvShape& s : shapes) {
      CAPTURE(s.str());
      CAPTURE(actlab::precision_name(pr));
      const auto x = random_vector(static_cast<size_t>(s.N * s.C * s.H * s.W), seed++);
      const auto w = random_vector(static_cast<size_t>(s.K * (s.C / s.groups) * s.R * s.S), seed++);
      const auto dy = random_vector(static_cast<size_t>(s.N * s.K * s.P() * s.Q()), seed++);
      // Both passes, returning the Workspace allocations they made.
      auto backward = [&](std::vector<float>& dx, std::vector<float>& dw, std::vector<float>& db) {
        dx.assign(x.size(), NAN), dw.assign(w.size(), NAN), db.assign(static_cast<size_t>(s.K), NAN);
        const int64_t before = actlab::memory_stats()[MemTag::Workspace].alloc_count;
        actlab::cpu::conv2d_backward_weight(dw.data(), db.data(), dy.data(), x.data(), s, ConvImpl::Auto, pr);
        actlab::cpu::conv2d_backward_data(dx.data(), dy.data(), w.data(), s, ConvImpl::Auto, pr);
        return actlab::memory_stats()[MemTag::Workspace].alloc_count - before;
      };
      std::vector<float> dx, dw, db, dx_shared, dw_shared, db_shared;
      const int64_t plain = backward(dx, dw, db);
      int64_t shared = 0;
      {
        const actlab::cpu::ConvGradShare share(dy.data());
        shared = backward(dx_shared, dw_shared, db_shared);
        // A pass on another gradient under the same share reorders its own (nothing shared by mistake).
        const auto other = random_vector(dy.size(), seed++);
        std::vector<float> dx_other(x.size()), dx_other_plain(x.size());
        actlab::cpu::conv2d_backward_data(dx_other.data(), other.data(), w.data(), s, ConvImpl::Auto, pr);
        const actlab::cpu::ConvGradShare inner(nullptr);  // hides the outer share
        actlab::cpu::conv2d_backward_data(dx_other_plain.data(), other.data(), w.data(), s, ConvImpl::Auto, pr);
        CHECK(dx_other == dx_other_plain);
      }
      CHECK(dx_shared == dx);
      CHECK(dw_shared == dw);
      CHECK(db_shared == db);
      // The share saves exactly one allocation where both passes reorder dy into the same layout, and
      // never adds one.
      CHECK(shared <= plain);
      CHECK(shared >= plain - 1);
      // bf16 converts dy on the way in, always; both oneDNN passes then read it in the same layout. The
      // matmul route of backward weights (Auto's on small maps) reads it channels-last, as oneDNN's AMX backward
      // data does; without AMX a strided layer's backward data reads it channel-blocked, so nothing is shared. A
      // dense pointwise layer's two passes are matmuls reading it channels-last on every CPU.
      const bool matmul = actlab::cpu::conv2d_backward_weight_impl(s, ConvImpl::Auto, pr) == ConvImpl::Im2colGemm;
      const bool dense_pointwise = s.R == 1 && s.S == 1 && s.stride_h == 1 && s.pad_h == 0 && s.groups == 1;
      if (pr == Precision::BF16 && (!matmul || dense_pointwise || actlab::cpu::dnnl_runs_amx()))
        CHECK(shared == plain - 1);
    }
  CHECK(actlab::memory_stats().total.current == live_before);
  // Where the layouts agree in fp32: the Winograd and blocked shapes.
  const ConvShape s = shapes[0];
  const auto dy = random_vector(static_cast<size_t>(s.N * s.K * s.P() * s.Q()), 1);
  const auto x = random_vector(static_cast<size_t>(s.N * s.C * s.H * s.W), 2);
  const auto w = random_vector(static_cast<size_t>(s.K * s.C * s.R * s.S), 3);
  std::vector<float> dx(x.size()), dw(w.size());
  int64_t counts[2];
  for (int shared = 0; shared < 2; ++shared) {
    std::unique_ptr<actlab::cpu::ConvGradShare> share;
    if (shared) share = std::make_unique<actlab::cpu::ConvGradShare>(dy.data());
    const int64_t before = actlab::memory_stats()[MemTag::Workspace].alloc_count;
    actlab::cpu::conv2d_backward_weight(dw.data(), nullptr, dy.data(), x.data(), s);
    actlab::cpu::conv2d_backward_data(dx.data(), dy.data(), w.data(), s);
    counts[shared] = actlab::memory_stats()[MemTag::Workspace].alloc_count - before;
  }
  if (avx512_cpu()) CHECK(counts[1] == counts[0] - 1);
}

TEST_CASE("cpu conv: implementation names round-trip - bad shapes throw") {
  for (const char* name : {"auto", "dnnl-blocked", "dnnl-nhwc", "dnnl-plain", "dnnl-wino",
                           "im2col"})
    CHECK(std::string(actlab::cpu::conv_impl_name(actlab::cpu::conv_impl_from_name(name))) ==
          name);
  CHECK_THROWS_AS(actlab::cpu::conv_impl_from_name("cudnn"), actlab::Error);
  std::vector<float> buf(4096);
  ConvShape bad = shape(1, 6, 4, 4, 4, 3, 3, 1, 1, 4);  // groups 4 does not divide C=6
  CHECK_THROWS_AS(actlab::cpu::conv2d_forward(buf.data(), buf.data(), buf.data(), nullptr, bad),
                  actlab::Error);
  bad = shape(1, 4, 2, 2, 4, 5, 5, 1, 0, 1);  // kernel larger than the input
  CHECK_THROWS_AS(actlab::cpu::conv2d_forward_ref(buf.data(), buf.data(), buf.data(), nullptr, bad),
                  actlab::Error);
}

TEST_CASE("cpu conv: reference backward matches central differences") {
  // L = sum(y * g) with fixed g, so dL/dx = backward_data(g), dL/dw = backward_weight(g),
  // dL/db = sum(g). Conv is linear, so the central difference is exact up to rounding.
  for (const ConvShape& s : {shape(2, 2, 5, 4, 3, 3, 3, 2, 1, 1), shape(1, 4, 4, 5, 4, 3, 2, 1, 1, 2),
                             shape(1, 3, 5, 5, 3, 3, 3, 1, 1, 3)}) {
    CAPTURE(s.str());
    const size_t x_n = s.N * s.C * s.H * s.W, w_n = s.K * (s.C / s.groups) * s.R * s.S;
    const size_t y_n = s.N * s.K * s.P() * s.Q();
    auto x = random_vector(x_n, 11), w = random_vector(w_n, 12), b = random_vector(s.K, 13);
    const auto g = random_vector(y_n, 14);
    auto loss = [&]() {
      std::vector<float> y(y_n);
      actlab::cpu::conv2d_forward_ref(y.data(), x.data(), w.data(), b.data(), s);
      double l = 0.0;
      for (size_t i = 0; i < y_n; ++i) l += static_cast<double>(y[i]) * g[i];
      return l;
    };
    auto numeric = [&](std::vector<float>& v, size_t i) {
      const float eps = 1e-2f, saved = v[i];
      v[i] = saved + eps;
      const double up = loss();
      v[i] = saved - eps;
      const double down = loss();
      v[i] = saved;
      return (up - down) / (2.0 * eps);
    };
    std::vector<float> dx(x_n), dw(w_n), db(s.K);
    actlab::cpu::conv2d_backward_data_ref(dx.data(), g.data(), w.data(), s);
    actlab::cpu::conv2d_backward_weight_ref(dw.data(), db.data(), g.data(), x.data(), s);
    for (size_t i = 0; i < x_n; ++i) CHECK(dx[i] == doctest::Approx(numeric(x, i)).epsilon(1e-3));
    for (size_t i = 0; i < w_n; ++i) CHECK(dw[i] == doctest::Approx(numeric(w, i)).epsilon(1e-3));
    for (int64_t k = 0; k < s.K; ++k)
      CHECK(db[k] == doctest::Approx(numeric(b, k)).epsilon(1e-3));
  }
}

TEST_CASE("cpu gemm: matches gemm_ref with transposes, leading dimensions, alpha and beta") {
  const int64_t M = 7, N = 13, K = 5;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.f, 0.5f}) {
        CAPTURE(ta);
        CAPTURE(tb);
        CAPTURE(beta);
        const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 4;
        const auto A = random_vector((ta ? K : M) * lda, 21);
        const auto B = random_vector((tb ? N : K) * ldb, 22);
        auto C = random_vector(M * ldc, 23);
        if (beta == 0.f) std::fill(C.begin(), C.end(), NAN);  // beta 0 must ignore C
        auto C_ref = C;
        actlab::cpu::gemm(ta, tb, M, N, K, 1.5f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
        actlab::cpu::gemm_ref(ta, tb, M, N, K, 1.5f, A.data(), lda, B.data(), ldb, beta,
                              C_ref.data(), ldc);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j)
            CHECK(C[i * ldc + j] == doctest::Approx(C_ref[i * ldc + j]).epsilon(1e-5));
        if (beta != 0.f)  // the padding between rows is never touched
          for (int64_t i = 0; i < M; ++i) CHECK(C[i * ldc + N] == C_ref[i * ldc + N]);
      }
  // A larger product that goes through the blocked kernels.
  const int64_t m = 67, n = 129, k = 300;
  const auto A = random_vector(m * k, 31), B = random_vector(k * n, 32);
  std::vector<float> C(m * n), C_ref(m * n);
  actlab::cpu::gemm(false, false, m, n, k, 1.f, A.data(), k, B.data(), n, 0.f, C.data(), n);
  actlab::cpu::gemm_ref(false, false, m, n, k, 1.f, A.data(), k, B.data(), n, 0.f, C_ref.data(), n);
  CHECK(relative_error(C, C_ref) < 1e-5);
  // K == 0: C = beta * C.
  std::vector<float> c0 = {1.f, 2.f};
  actlab::cpu::gemm(false, false, 1, 2, 0, 1.f, A.data(), 1, B.data(), 2, 2.f, c0.data(), 2);
  CHECK(c0[0] == 2.f);
  CHECK(c0[1] == 4.f);
  CHECK_THROWS_AS(actlab::cpu::gemm(false, false, 2, 2, 2, 1.f, A.data(), 1, B.data(), 2, 0.f,
                                    C.data(), 2),
                  actlab::Error);  // lda 1 < K 2
}

namespace {

using BatchedPath = void (*)(bool, bool, int64_t, int64_t, int64_t, int64_t, const float*, const float*, float*);

// One batched product through path against gemm_batched_ref; C starts as NaN: the path must assign.
double batched_error(BatchedPath path, bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K,
                     uint32_t seed) {
  const auto A = random_vector(batch * M * K, seed), B = random_vector(batch * K * N, seed + 1);
  std::vector<float> C(batch * M * N, NAN), C_ref(batch * M * N);
  path(ta, tb, batch, M, N, K, A.data(), B.data(), C.data());
  actlab::cpu::gemm_batched_ref(ta, tb, batch, M, N, K, A.data(), B.data(), C_ref.data());
  return relative_error(C, C_ref);
}

}  // namespace

namespace {

struct BatchedSize {
  int64_t batch, M, N, K;
};

// Calls check(size, ta, tb) for every size and both transposes of each operand, all captured for a
// failure's message; then checks that nothing the calls allocated is still live.
template <typename Check>
void sweep_batched(const std::vector<BatchedSize>& sizes, Check check) {
  const int64_t live_before = actlab::memory_stats().total.current;
  for (const auto& s : sizes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        CAPTURE(s.batch);
        CAPTURE(s.M);
        CAPTURE(s.N);
        CAPTURE(s.K);
        CAPTURE(ta);
        CAPTURE(tb);
        check(s, ta, tb);
      }
  CHECK(actlab::memory_stats().total.current == live_before);  // scratchpads were all released
}

// K == 0: every product is an empty sum (zeros), and A and B are never read.
void check_empty_sum(BatchedPath path) {
  std::vector<float> C(2 * 3 * 4, NAN);
  path(false, true, 2, 3, 4, 0, nullptr, nullptr, C.data());
  CHECK(std::all_of(C.begin(), C.end(), [](float v) { return v == 0.f; }));
}

}  // namespace

TEST_CASE("cpu gemm_batched: the per-matrix loop and oneDNN's matmul match gemm_batched_ref") {
  const struct { const char* name; BatchedPath path; } paths[] = {
      {"gemm_batched", &actlab::cpu::gemm_batched},
      {"per_matrix", &actlab::cpu::gemm_batched_per_matrix},
      {"dnnl", &actlab::cpu::gemm_batched_dnnl}};
  // batch 1, single rows / columns / inner size, odd sizes, more matrices than any thread count, and
  // ViT-Tiny's and Swin-T's attention products.
  const std::vector<BatchedSize> sizes = {{1, 7, 13, 5},  {3, 1, 9, 4},    {5, 11, 1, 3},    {2, 6, 5, 1},
                                          {1, 33, 9, 20}, {301, 9, 7, 11}, {24, 50, 64, 50}, {24, 49, 49, 32}};
  uint32_t seed = 60;
  for (const auto& p : paths) {
    CAPTURE(p.name);
    sweep_batched(sizes, [&](const BatchedSize& s, bool ta, bool tb) {
      CHECK(batched_error(p.path, ta, tb, s.batch, s.M, s.N, s.K, seed += 2) < 1e-5);
    });
    check_empty_sum(p.path);
  }
  std::vector<float> C(4);
  CHECK_THROWS_AS(actlab::cpu::gemm_batched_dnnl(false, false, 1, 2, -2, 1, C.data(), C.data(), C.data()),
                  actlab::Error);
}

// As for the bf16 convolution: the spec is the reference on the operands rounded to bf16 (f32 accumulation
// order apart), and the unrounded product is far enough away to show the rounding happened.
TEST_CASE("cpu gemm_batched_bf16: equals gemm_batched_ref on bf16-rounded operands") {
  if (!actlab::testing::have_bf16_kernels()) return;
  const std::vector<BatchedSize> sizes = {{1, 7, 13, 5},  {3, 1, 9, 4},    {5, 11, 1, 3},
                                          {1, 33, 9, 20}, {301, 9, 7, 11}, {24, 49, 49, 32}};
  uint32_t seed = 900;
  sweep_batched(sizes, [&](const BatchedSize& s, bool ta, bool tb) {
    const auto A = random_vector(s.batch * s.M * s.K, seed += 2), B = random_vector(s.batch * s.K * s.N, seed + 1);
    std::vector<float> C(s.batch * s.M * s.N, NAN), C_ref(C.size()), C_f32(C.size());
    actlab::cpu::gemm_batched_bf16(ta, tb, s.batch, s.M, s.N, s.K, A.data(), B.data(), C.data());
    actlab::cpu::gemm_batched_ref(ta, tb, s.batch, s.M, s.N, s.K, rounded_bf16(A).data(), rounded_bf16(B).data(),
                                  C_ref.data());
    actlab::cpu::gemm_batched_ref(ta, tb, s.batch, s.M, s.N, s.K, A.data(), B.data(), C_f32.data());
    CHECK(relative_error(C, C_ref) < 1e-5);
    CHECK(relative_error(C, C_f32) > 1e-4);
  });
  check_empty_sum(&actlab::cpu::gemm_batched_bf16);
  // The one-product form on operands already in bf16 (the bf16 convolution's backward weights).
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t M = 19, N = 33, K = 70;
      const auto A = rounded_bf16(random_vector(M * K, seed += 2)), B = rounded_bf16(random_vector(K * N, seed + 1));
      std::vector<uint16_t> a16(A.size()), b16(B.size());
      for (size_t i = 0; i < A.size(); ++i) a16[i] = actlab::float_to_bf16(A[i]);
      for (size_t i = 0; i < B.size(); ++i) b16[i] = actlab::float_to_bf16(B[i]);
      std::vector<float> C(M * N, NAN), C_ref(M * N);
      actlab::cpu::gemm_bf16_bits(ta, tb, M, N, K, a16.data(), b16.data(), C.data());
      actlab::cpu::gemm_ref(ta, tb, M, N, K, 1.f, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.f, C_ref.data(), N);
      CAPTURE(ta);
      CAPTURE(tb);
      CHECK(relative_error(C, C_ref) < 1e-5);
    }
}

TEST_CASE("cpu gemm_batched: oneDNN's matmul is safe to call from several threads on a shape none has used") {
  // The first call of a shape creates its primitive; four threads race for it, then share it.
  std::vector<double> errors(4, 1e30);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < errors.size(); ++t)
    threads.emplace_back([&errors, t] {
      double worst = 0;
      for (int round = 0; round < 3; ++round)
        worst = std::max(worst, batched_error(&actlab::cpu::gemm_batched_dnnl, true, true, 37, 19, 23, 29,
                                              90 + static_cast<uint32_t>(t)));
      errors[t] = worst;
    });
  for (auto& th : threads) th.join();
  for (double e : errors) CHECK(e < 1e-5);
}

