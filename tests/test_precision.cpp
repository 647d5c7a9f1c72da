// Mixed precision (core/precision.h): the names and the support check, the bf16 conversions against
// core/bf16.h, the bf16 policy and what `exact` keeps under bf16, and a bf16 training step and run against
// their fp32 twins. The bf16 convolution itself is checked against the reference loops in
// tests/test_cpu_conv.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "actlab/autograd/functions.h"
#include "actlab/autograd/saved_tensor.h"
#include "actlab/autograd/tape.h"
#include "actlab/compress/exact.h"
#include "actlab/compress/policies.h"
#include "actlab/core/bf16.h"
#include "actlab/core/codec.h"
#include "actlab/core/cpu/conv.h"
#include "actlab/core/ops.h"
#include "actlab/core/philox.h"
#include "actlab/core/precision.h"
#include "actlab/models/registry.h"
#include "actlab/train/config_file.h"
#include "actlab/train/memtable.h"
#include "actlab/train/step.h"
#include "actlab/train/trainer.h"
#include "tests/error_of.h"
#include "tests/prerequisite.h"

using namespace actlab;
using actlab::testing::error_of;

TEST_CASE("precision: names round-trip, unknown names and unsupported devices are one clear error") {
  for (Precision p : {Precision::F32, Precision::BF16, Precision::F16})
    CHECK(parse_precision(precision_name(p)) == p);
  CHECK(parse_precision("f32") == Precision::F32);
  // A configuration stores the canonical name, so a resume with "--precision f32" of an fp32 run is no change.
  TrainConfig c;
  set_config_value(c, "precision", "f32");
  CHECK(c.precision == "fp32");
  set_config_value(c, "precision", "f16");
  CHECK(c.precision == "fp16");
  set_config_value(c, "precision", "half");
  CHECK(c.precision == "half");  // kept for validation's error
  CHECK(canonical_precision_name("bf16") == "bf16");
  CHECK(canonical_precision_name("") == "");
  CHECK(error_of([] { parse_precision("half"); }).find("unknown precision 'half' (accepted: fp32|bf16|fp16)") !=
        std::string::npos);
  CHECK(error_of([] { check_precision_supported(Precision::F32, Device::cpu()); }).empty());
  CHECK(error_of([] { check_precision_supported(Precision::F16, Device::cpu()); }).find("needs a GPU") !=
        std::string::npos);
  // On a GPU both 16-bit precisions are accepted (tensor cores; tests/test_cuda_ops.cpp runs them).
  CHECK(error_of([] { check_precision_supported(Precision::BF16, Device::cuda(0)); }).empty());
  CHECK(error_of([] { check_precision_supported(Precision::F16, Device::cuda(0)); }).empty());
  // fp16 has no CPU kernels: an op asked for it on the CPU refuses in one line.
  {
    PrecisionScope f16(Precision::F16);
    CHECK(error_of([] { ops::linear_forward(Tensor::zeros({2, 3}), Tensor::zeros({4, 3}), Tensor()); })
              .find("fp16 runs on GPUs only") != std::string::npos);
  }
  const std::string bf16_cpu = error_of([] { check_precision_supported(Precision::BF16, Device::cpu()); });
  MESSAGE("this CPU's bf16 instructions: " << cpu_bf16_flags());
  if (cpu_has_bf16())
    CHECK(bf16_cpu.empty());
  else
    CHECK(bf16_cpu.find("neither avx512_bf16 nor amx_bf16") != std::string::npos);
  // The scope nests and restores.
  CHECK(compute_precision() == Precision::F32);
  {
    PrecisionScope outer(Precision::BF16);
    CHECK(compute_precision() == Precision::BF16);
    {
      PrecisionScope inner(Precision::F32);
      CHECK(compute_precision() == Precision::F32);
    }
    CHECK(compute_precision() == Precision::BF16);
  }
  CHECK(compute_precision() == Precision::F32);
}

TEST_CASE("precision: to_bf16 and from_bf16 are core/bf16.h's rounding, element by element") {
  PhiloxStream rng(11, 0);
  Tensor x = Tensor::randn({3, 1000}, rng);
  float* p = x.data<float>();
  p[0] = std::numeric_limits<float>::quiet_NaN();
  p[1] = std::numeric_limits<float>::infinity();
  p[2] = -0.f;
  p[3] = 1.f + 1.f / 256;  // a tie between two bf16 values: even wins
  p[4] = 3.0e38f;          // rounds to +inf? no: stays finite (below bf16's largest finite)
  const Tensor h = ops::to_bf16(x);
  CHECK(h.dtype() == DType::BF16);
  CHECK(h.nbytes() == x.nbytes() / 2);
  const Tensor back = ops::from_bf16(h);
  const auto* hp = static_cast<const uint16_t*>(h.raw_data());
  int64_t mismatches = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    mismatches += hp[i] != float_to_bf16(p[i]);
    const float want = round_bf16(p[i]);
    const float got = back.data<float>()[i];
    mismatches += !(got == want || (std::isnan(got) && std::isnan(want)));
  }
  CHECK(mismatches == 0);
  CHECK(std::isnan(back.data<float>()[0]));
  CHECK(back.data<float>()[3] == 1.f);
  CHECK(std::isfinite(back.data<float>()[4]));
  CHECK_THROWS_AS(ops::from_bf16(x), Error);  // an f32 tensor is not bf16
}

TEST_CASE("precision: the bf16 policy keeps half the bytes, and exact becomes it for lossy saves under bf16") {
  const auto policy = parse_policy("bf16");
  CHECK(policy->name() == "bf16");
  CHECK(policy->expected_bytes({2, 3, 4, 5}) == 2 * 3 * 4 * 5 * 2);
  PhiloxStream rng(5, 0);
  const Tensor x = Tensor::randn({2, 3, 4, 5}, rng);
  const auto packed = policy->pack(x, SaveInfo{}, PackContext{});
  CHECK(packed->nbytes() == x.nbytes() / 2);
  const Tensor u = policy->unpack(*packed, SaveInfo{});
  for (int64_t i = 0; i < x.numel(); ++i) REQUIRE(u.data<float>()[i] == round_bf16(x.data<float>()[i]));

  const SaveInfo lossy{"conv2d", "input", true, "conv1"};
  const SaveInfo strict{"relu", "output", false, "relu"};
  end_pack_step();
  {
    const SavedTensor fp32(x, lossy);
    CHECK(fp32.unpack().data<float>() == x.data<float>());  // exact under fp32 shares the tensor
  }
  PrecisionScope bf16(Precision::BF16);
  const SavedTensor kept(x, lossy), mask_like(x, strict);
  const Tensor k = kept.unpack();
  CHECK(k.data<float>() != x.data<float>());
  CHECK(k.data<float>()[1] == round_bf16(x.data<float>()[1]));
  CHECK(mask_like.unpack().data<float>() == x.data<float>());  // a save that must stay exact is untouched
  // A lossy policy other than exact is not replaced.
  PolicySet division(parse_policy("division:B=2,Q=2"));
  ActivationCacheScope scope(division);
  const SavedTensor packed_div(Tensor::randn({2, 3, 4, 4}, rng), lossy);
  CHECK(packed_div.unpack().shape() == Shape({2, 3, 4, 4}));
  end_pack_step();
}

TEST_CASE("precision: under bf16 a convolution computes on the exact keep's bf16 copy, which only that keep offers") {
  PhiloxStream rng(6, 0);
  const Tensor x = Tensor::randn({2, 3, 6, 6}, rng), w = Tensor::randn({4, 3, 3, 3}, rng);
  const SaveInfo lossy{"conv2d", "input", true, "conv1"};
  const SaveInfo strict{"relu", "output", false, "relu"};
  end_pack_step();
  CHECK_FALSE(SavedTensor(x, lossy).exact_bf16_keep().defined());  // fp32: exact shares the f32 tensor
  const Tensor x16 = ops::to_bf16(x);
  CHECK(error_of([&] { ops::conv2d_forward(x16, w, Tensor(), {1, 1, 1}); })
            .find("conv2d: a bf16 input needs bf16 compute on the CPU") != std::string::npos);
  {
    PrecisionScope bf16(Precision::BF16);
    const SavedTensor kept(x, lossy), strict_save(x, strict);
    const Tensor keep = kept.exact_bf16_keep();
    REQUIRE(keep.defined());
    CHECK(keep.dtype() == DType::BF16);
    CHECK(std::memcmp(keep.raw_data(), x16.raw_data(), static_cast<size_t>(x16.nbytes())) == 0);
    CHECK_FALSE(strict_save.exact_bf16_keep().defined());
    PolicySet division(parse_policy("division:B=2,Q=2"));
    ActivationCacheScope scope(division);
    CHECK_FALSE(SavedTensor(Tensor::randn({2, 3, 4, 4}, rng), lossy).exact_bf16_keep().defined());
  }
  end_pack_step();
  if (!testing::have_bf16_kernels()) return;
  // conv2d under exact@bf16 gives the forward of x itself (x's values are normal: the same bits, core/cpu/conv.h).
  PrecisionScope bf16(Precision::BF16);
  const Tensor y_ref = ops::conv2d_forward(x, w, Tensor(), {1, 1, 1});
  CHECK(std::memcmp(ops::conv2d_forward(x16, w, Tensor(), {1, 1, 1}).raw_data(), y_ref.raw_data(),
                    static_cast<size_t>(y_ref.nbytes())) == 0);
  TapeClearGuard clear;
  const Variable xv(x, true), wv(w, true);
  const Variable y = conv2d(xv, wv, Variable(), {1, 1, 1});
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(y.grad_fn()->exact_bf16_keep("input").defined());  // what the forward read
  const Tensor y_values = y.data().contiguous();  // channels-last where the kernel computes so
  CHECK(std::memcmp(y_values.raw_data(), y_ref.raw_data(), static_cast<size_t>(y_ref.nbytes())) == 0);
}

TEST_CASE("precision: a keep hinted channels-last is kept so, and every consumer of it reads the same values") {
  PhiloxStream rng(9, 0);
  const Tensor x = Tensor::randn({2, 16, 8, 8}, rng), w = Tensor::randn({16, 16, 3, 3}, rng);
  const ops::ConvParams p{1, 1, 1};
  SaveInfo hinted{"conv2d", "input", true, "conv1"};
  hinted.channels_last = true;
  const Tensor x16 = ops::to_bf16(x);
  // The policy: the same bits in the other layout, the same unpack(), no channel reader (strided channels).
  const Bf16Policy& bf16_keep = bf16_policy();
  const auto packed = bf16_keep.pack(x, hinted, PackContext{});
  CHECK(packed->nbytes() == x16.nbytes());
  const Tensor cl = bf16_keep.unpack_bf16(*packed, hinted);
  REQUIRE(cl.is_channels_last());
  CHECK_FALSE(cl.is_contiguous());
  const Tensor cl_as_nchw = cl.contiguous();
  CHECK(std::memcmp(cl_as_nchw.raw_data(), x16.raw_data(), static_cast<size_t>(x16.nbytes())) == 0);
  const Tensor back = bf16_keep.unpack(*packed, hinted);
  CHECK(back.is_contiguous());
  int64_t mismatches = 0;
  for (int64_t i = 0; i < x.numel(); ++i) mismatches += back.data<float>()[i] != round_bf16(x.data<float>()[i]);
  CHECK(mismatches == 0);
  CHECK(bf16_keep.channel_reader(*packed, hinted) == nullptr);
  CHECK(bf16_keep.channel_reader(*bf16_keep.pack(x, SaveInfo{}, PackContext{}), SaveInfo{}) != nullptr);
  // SWAP offloads raw bytes: its copy stays (N, C, H, W) whatever the hint.
  {
    PrecisionScope bf16(Precision::BF16);
    const auto swap = parse_policy("swap:P=2");
    const auto offloaded = swap->pack(x, hinted, PackContext{});
    const Tensor fetched = swap->unpack_bf16(*offloaded, hinted);
    REQUIRE(fetched.defined());
    CHECK(fetched.is_contiguous());
    CHECK(std::memcmp(fetched.raw_data(), x16.raw_data(), static_cast<size_t>(x16.nbytes())) == 0);
  }
  if (!testing::have_bf16_kernels()) return;
  PrecisionScope bf16(Precision::BF16);
  // The convolution reads either layout to the same bits, forward and backward weights.
  const Tensor y_nchw = ops::conv2d_forward(x16, w, Tensor(), p), y_cl = ops::conv2d_forward(cl, w, Tensor(), p);
  CHECK(std::memcmp(y_nchw.raw_data(), y_cl.raw_data(), static_cast<size_t>(y_nchw.nbytes())) == 0);
  const Tensor dy = Tensor::randn(y_nchw.shape(), rng);
  const Tensor dw_nchw = ops::conv2d_backward_weight(dy, x16, w.shape(), p, false, nullptr);
  const Tensor dw_cl = ops::conv2d_backward_weight(dy, cl, w.shape(), p, false, nullptr);
  CHECK(std::memcmp(dw_nchw.raw_data(), dw_cl.raw_data(), static_cast<size_t>(dw_nchw.nbytes())) == 0);
  CHECK(error_of([&] { ops::conv2d_forward(x16.permute({0, 1, 3, 2}), w, Tensor(), p); })
            .find("a contiguous or channels-last tensor") != std::string::npos);
  // conv2d keeps its input channels-last where its kernel reads that layout (on this CPU: as the query says),
  // and its output and weight gradient are those of the (N, C, H, W) copy. A batch norm saving the same tensor
  // shares the keep and widens it whole.
  const bool reads_cl = ops::conv2d_bf16_reads_channels_last(x, w.shape(), p, false);
  MESSAGE("this CPU's bf16 3x3 convolution reads channels-last: " << std::string(reads_cl ? "yes" : "no"));
  TapeClearGuard clear;
  const Variable xv(x, true), wv(w, true);
  const Variable y = conv2d(xv, wv, Variable(), {1, 1, 1});
  const Tensor keep = y.grad_fn()->exact_bf16_keep("input");
  REQUIRE(keep.defined());
  CHECK(keep.is_channels_last() == reads_cl);
  CHECK(y.data().is_channels_last() == reads_cl);  // under exact the output stays in the kernel's layout
  const Tensor y_values = y.data().contiguous();
  CHECK(std::memcmp(y_values.raw_data(), y_nchw.raw_data(), static_cast<size_t>(y_nchw.nbytes())) == 0);
  const SavedTensor shared(x, SaveInfo{"batchnorm2d", "input", true, "bn1"});
  CHECK(shared.exact_bf16_keep().raw_data() == keep.raw_data());
  const Tensor widened = shared.unpack();
  mismatches = 0;
  for (int64_t i = 0; i < x.numel(); ++i) mismatches += widened.data<float>()[i] != round_bf16(x.data<float>()[i]);
  CHECK(mismatches == 0);
  backward(y, dy);
  CHECK(std::memcmp(wv.grad().raw_data(), dw_nchw.raw_data(), static_cast<size_t>(dw_nchw.nbytes())) == 0);
  end_pack_step();
}

TEST_CASE("precision: under bf16 the plane codecs decode straight to bf16, unpack()'s values rounded") {
  // (N, C, H, W): maps of the register paths, one off them (7×7), and a plane with several ranges (no
  // channel reader: no bf16 decode either).
  PhiloxStream rng(8, 0);
  const SaveInfo lossy{"conv2d", "input", true, "conv1"};
  for (const char* spec : {"division:B=8,Q=2", "quant:Q=4", "lfc:B=8", "hfc:B=8,Q=2", "division:B=8,Q=2,R=2"}) {
    // {4, 16, 32, 32}: above the parallel grain, so the channels run on several threads' buffers.
    for (const Shape& shape : {Shape{3, 5, 32, 32}, Shape{4, 3, 7, 7}, Shape{2, 16, 4, 4}, Shape{4, 16, 32, 32}}) {
      CAPTURE(spec);
      CAPTURE(shape_str(shape));
      const auto policy = parse_policy(spec);
      const Tensor x = Tensor::randn(shape, rng);
      const auto packed = policy->pack(x, lossy, PackContext{});
      CHECK_FALSE(policy->unpack_bf16(*packed, lossy).defined());  // fp32: the consumer takes unpack()
      PrecisionScope bf16(Precision::BF16);
      const Tensor h = policy->unpack_bf16(*packed, lossy);
      const bool ranged = std::string(spec).find("R=2") != std::string::npos;
      CHECK(h.defined() == !ranged);
      if (!h.defined()) continue;
      CHECK(h.dtype() == DType::BF16);
      CHECK(h.shape() == shape);
      const Tensor want = ops::to_bf16(policy->unpack(*packed, lossy));
      CHECK(std::memcmp(h.raw_data(), want.raw_data(), static_cast<size_t>(want.nbytes())) == 0);
      // A consumer computing channels-last gets that layout where the channels are whole blocks of 16 (the
      // same values), the (N, C, H, W) one elsewhere.
      SaveInfo hinted = lossy;
      hinted.channels_last = true;
      const Tensor h_cl = policy->unpack_bf16(*packed, hinted);
      REQUIRE(h_cl.defined());
      CHECK(h_cl.is_channels_last() == (shape[1] % 16 == 0));
      const Tensor h_cl_nchw = h_cl.contiguous();
      CHECK(std::memcmp(h_cl_nchw.raw_data(), want.raw_data(), static_cast<size_t>(want.nbytes())) == 0);
    }
  }
  if (!testing::have_bf16_kernels()) return;
  // A DIVISION@bf16 convolution's backward weights from that bf16 decode are those of the f32 decode
  // rounded on the way into the bf16 kernels: a 3×3 layer on 16² maps, and one on 4² maps (16 output
  // positions: without AMX the backward weights' bf16 matmul route, core/cpu/conv.cpp; on AMX oneDNN's kernel,
  // as on 16²).
  PrecisionScope bf16(Precision::BF16);
  const auto policy = parse_policy("division:B=8,Q=2");
  for (const int64_t hw : {16, 4}) {
    CAPTURE(hw);
    const Tensor x = Tensor::randn({4, 16, hw, hw}, rng), dy = Tensor::randn({4, 8, hw, hw}, rng);
    const auto packed = policy->pack(x, lossy, PackContext{});
    const Tensor dw_f32 =
        ops::conv2d_backward_weight(dy, policy->unpack(*packed, lossy), {8, 16, 3, 3}, {1, 1, 1}, false, nullptr);
    const Tensor dw_bf16 =
        ops::conv2d_backward_weight(dy, policy->unpack_bf16(*packed, lossy), {8, 16, 3, 3}, {1, 1, 1}, false, nullptr);
    CHECK(std::memcmp(dw_f32.raw_data(), dw_bf16.raw_data(), static_cast<size_t>(dw_f32.nbytes())) == 0);
  }
}

TEST_CASE("precision: the plane codecs pack a channels-last save as the planar one, and decode it channels-last") {
  // What a bf16 run's channels-last flow asks of a policy: pack() takes the channels-last tensor as it is
  // (takes_channels_last) with the (N, C, H, W) pack's bytes, so unpack() gives the same values; and
  // unpack_channels_last, where the lane kernels run (AVX-512, C % 16 == 0, one range), writes those values
  // channels-last. Elsewhere it is undefined and SavedTensor transposes unpack()'s tensor instead.
  PhiloxStream rng(9, 0);
  const SaveInfo lossy{"batch_norm", "input", true, "bn1"};
  const bool avx512 = cpu::codec_simd_supported() == cpu::CodecSimd::Avx512;
  for (const char* spec : {"division:B=8,Q=2", "quant:Q=4", "lfc:B=8", "hfc:B=8,Q=2", "division:B=8,Q=2,R=2",
                           "pergroup:G=256,Q=2"}) {
    for (const Shape& shape : {Shape{4, 16, 14, 14}, Shape{2, 32, 8, 8}, Shape{3, 5, 8, 8}}) {
      CAPTURE(spec);
      CAPTURE(shape_str(shape));
      const auto policy = parse_policy(spec);
      const Tensor x = Tensor::randn(shape, rng);
      const bool plane_codec = std::string(spec).find("pergroup") == std::string::npos;
      CHECK(policy->takes_channels_last() == plane_codec);
      const auto planar = policy->pack(x, lossy, PackContext{3, 4});
      const Tensor want = policy->unpack(*planar, lossy);
      if (plane_codec) {
        const auto packed_cl = policy->pack(x.channels_last(), lossy, PackContext{3, 4});
        CHECK(packed_cl->nbytes() == planar->nbytes());
        const Tensor from_cl = policy->unpack(*packed_cl, lossy);
        CHECK(std::memcmp(from_cl.raw_data(), want.raw_data(), static_cast<size_t>(want.nbytes())) == 0);
      }
      const Tensor got = policy->unpack_channels_last(*planar, lossy);
      const bool ranged = std::string(spec).find("R=2") != std::string::npos;
      CHECK(got.defined() == (avx512 && plane_codec && !ranged && shape[1] % 16 == 0));
      if (!got.defined()) continue;
      CHECK(got.is_channels_last());
      const Tensor got_nchw = got.contiguous();
      CHECK(std::memcmp(got_nchw.raw_data(), want.raw_data(), static_cast<size_t>(want.nbytes())) == 0);
    }
  }
}

TEST_CASE("precision: fp16 conversion is IEEE round to nearest even, and exact keeps fp16 copies under fp16") {
  // The rounding cases of binary16 (core/bf16.h float_to_f16): normals, ties, overflow, subnormals, specials.
  CHECK(float_to_f16(1.f) == 0x3C00);
  CHECK(float_to_f16(-2.f) == 0xC000);
  CHECK(float_to_f16(65504.f) == 0x7BFF);                  // the largest finite
  CHECK(float_to_f16(65519.f) == 0x7BFF);                  // below the tie with 65536
  CHECK(float_to_f16(65520.f) == 0x7C00);                  // the tie rounds to even: +inf
  CHECK(float_to_f16(1.f + 1.f / 2048) == 0x3C00);         // tie between 0x3C00 and 0x3C01: even
  CHECK(float_to_f16(1.f + 3.f / 2048) == 0x3C02);         // tie between 0x3C01 and 0x3C02: even
  CHECK(float_to_f16(std::ldexp(1.f, -24)) == 0x0001);     // the smallest subnormal
  CHECK(float_to_f16(std::ldexp(1.f, -25)) == 0x0000);     // half of it: a tie, to even (zero)
  CHECK(float_to_f16(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(float_to_f16(std::ldexp(1.f, -14)) == 0x0400);     // the smallest normal
  CHECK(float_to_f16(-0.f) == 0x8000);
  CHECK(float_to_f16(std::numeric_limits<float>::infinity()) == 0x7C00);
  CHECK(std::isnan(f16_to_float(float_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  // Every finite fp16 value widens exactly and rounds back to itself.
  int64_t mismatches = 0;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0) continue;  // NaNs
    mismatches += float_to_f16(f16_to_float(static_cast<uint16_t>(h))) != h;
  }
  CHECK(mismatches == 0);
  CHECK(f16_to_float(0x0001) == std::ldexp(1.f, -24));
  CHECK(f16_to_float(0x7BFF) == 65504.f);

  PhiloxStream rng(6, 0);
  const Tensor x = Tensor::randn({2, 3, 4, 5}, rng);
  const Tensor h = ops::to_f16(x);
  CHECK(h.dtype() == DType::F16);
  CHECK(h.nbytes() == x.nbytes() / 2);
  const Tensor back = ops::from_f16(h);
  for (int64_t i = 0; i < x.numel(); ++i)
    REQUIRE(back.data<float>()[i] == f16_to_float(float_to_f16(x.data<float>()[i])));
  const SaveInfo lossy{"conv2d", "input", true, "conv1"};
  end_pack_step();
  {
    PrecisionScope f16(Precision::F16);
    const SavedTensor kept(x, lossy);
    CHECK(kept.nbytes() == x.nbytes() / 2);
    const Tensor k = kept.unpack();
    for (int64_t i = 0; i < x.numel(); ++i) REQUIRE(k.data<float>()[i] == back.data<float>()[i]);
  }
  end_pack_step();
}

namespace {
constexpr int64_t kBatch = 32, kSide = 32;
struct StepRun {
  StepResult result;
  std::vector<Tensor> grads;
};
// The input shape of a model: (batch, channels, side, side).
struct Input {
  std::string model = "resnet20";
  int64_t batch = kBatch, channels = 3, side = kSide;
};
StepRun one_step(Precision precision, const std::string& policy, bool round_input = false, const Input& in = {}) {
  seed_init(7);
  set_pack_seed(7);
  set_pack_step(0);
  auto model = make_model({in.model, in.channels, 10, in.side});
  PhiloxStream rng(7, 1);
  Tensor x, y;
  {
    MemTagScope tag(MemTag::Data);
    x = Tensor::randn({in.batch, in.channels, in.side, in.side}, rng);
    y = Tensor::empty({in.batch}, DType::I64);
    for (int64_t i = 0; i < in.batch; ++i) y.data<int64_t>()[i] = i % 10;
    if (round_input) x = ops::from_bf16(ops::to_bf16(x));
  }
  PrecisionScope scope(precision);
  StepRun r;
  StepOptions options;
  options.record_saves = true;
  r.result = run_step(*model, nullptr, parse_policy_set(policy), x, y, options);
  for (const auto& p : model->parameters()) r.grads.push_back(p.grad().clone());
  return r;
}
double relative_distance(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double diff = 0, norm = 0;
  for (size_t k = 0; k < a.size(); ++k)
    for (int64_t i = 0; i < a[k].numel(); ++i) {
      const double d = a[k].data<float>()[i] - b[k].data<float>()[i];
      diff += d * d;
      norm += static_cast<double>(b[k].data<float>()[i]) * b[k].data<float>()[i];
    }
  return std::sqrt(diff / norm);
}
}  // namespace

// A ReLU network's gradient is not a smooth function of its activations: a perturbation of bf16's size
// flips the masks of the elements near zero and moves the gradient by far more than 2^-9 (at this init,
// fp32 on the bf16-rounded input alone moves it by ~4 %). So the bf16 step is held to that yardstick: its
// gradients must move from fp32's, by no more than a small multiple of what rounding the input does.
TEST_CASE("precision: a bf16 ResNet-20 step keeps half the exact bytes, and its gradients stay as close to fp32's as bf16 input rounding allows") {
  if (!testing::have_bf16_kernels()) return;
  if (!cpu_has_bf16()) MESSAGE("this CPU has no bf16 instructions: oneDNN emulates them (slow, same numbers)");
  const StepRun f32 = one_step(Precision::F32, "exact");
  const StepRun bf16 = one_step(Precision::BF16, "exact");
  const StepRun rounded_input = one_step(Precision::F32, "exact", true);
  CHECK(f32.result.saved.raw == bf16.result.saved.raw);
  CHECK(bf16.result.saved.packed * 2 == f32.result.saved.packed);
  CHECK(bf16.result.saved.packed == bf16.result.saved.expected);
  CHECK(bf16.result.activation_bytes < f32.result.activation_bytes * 6 / 10);
  const double distance = relative_distance(bf16.grads, f32.grads);
  const double yardstick = relative_distance(rounded_input.grads, f32.grads);
  MESSAGE("relative distance from the fp32 gradients: bf16 " << distance << ", fp32 on the bf16-rounded input "
                                                           << yardstick);
  CHECK(yardstick > 0);
  CHECK(distance > 1e-4);            // really computed in bf16
  CHECK(distance < 3 * yardstick);   // and no further off than bf16 itself forces
  CHECK(std::fabs(bf16.result.loss - f32.result.loss) < 1e-3 * std::fabs(f32.result.loss));
  // Checkpointing under bf16 keeps each segment's input as exact does there, in bf16, and recomputes from
  // it: one more rounding, of the same size as the yardstick's.
  const StepRun ckpt = one_step(Precision::BF16, "checkpoint:segments=3");
  CHECK(ckpt.result.recomputed_segments == 2);
  CHECK(ckpt.result.activation_bytes < bf16.result.activation_bytes / 2);
  const double ckpt_distance = relative_distance(ckpt.grads, f32.grads);
  MESSAGE("checkpoint:segments=3 under bf16: " << ckpt_distance << " from fp32");
  CHECK(ckpt_distance < 3 * yardstick);
  // DIVISION's packs do not change with the precision: it reads the same fp32 activations.
  const StepRun div = one_step(Precision::BF16, "division:B=8,Q=2");
  CHECK(div.result.saved.packed == div.result.saved.expected);
  CHECK(div.result.saved.packed < bf16.result.saved.packed);
}

// Under exact@bf16 (and DIVISION@bf16) a convolution whose kernel reads channels-last writes its output so, and
// batch norm, ReLU, the residual add and option-A shortcuts keep that layout (no transposes between layers). Which
// convolutions read channels-last depends on the CPU (cpu::conv2d_bf16_reads_channels_last): 3x3 ones on AMX,
// dense pointwise ones on every CPU with bf16 kernels; the block is run with 3x3 and with 1x1 kernels.
// A policy in the set that reads (N, C, H, W) (per-group, on a module this block does not have) keeps everything
// planar: the two runs differ only in the order batch norm sums in, and must agree to float rounding, forward and
// backward.
TEST_CASE("precision: under exact@bf16 activations flow channels-last between convolutions, with the (N, C, H, W) run's values") {
  if (!testing::have_bf16_kernels()) return;
  struct Run {
    float loss = 0;
    std::vector<Tensor> grads;
    bool conv_cl = false, bn_relu_cl = false, block_cl = false, grad_cl = false;
  };
  for (const int64_t k : {3, 1}) {
    CAPTURE(k);
    const auto run = [k](const std::string& policy) {
      end_pack_step();  // the same pack streams in every run (stochastic rounding draws)
      set_pack_seed(7);
      set_pack_step(0);
      PhiloxStream rng(3, 1);
      const Tensor x = Tensor::randn({8, 16, 8, 8}, rng);
      Variable w1(Tensor::randn({16, 16, k, k}, rng, 0.f, 0.1f), true);
      Variable w2(Tensor::randn({32, 16, k, k}, rng, 0.f, 0.1f), true);
      Variable g1(Tensor::full({16}, 1.f), true), b1(Tensor::zeros({16}), true);
      Variable g2(Tensor::full({32}, 1.f), true), b2(Tensor::zeros({32}), true);
      Variable fc(Tensor::randn({10, 32}, rng, 0.f, 0.1f), true);
      Tensor rm1 = Tensor::zeros({16}), rv1 = Tensor::full({16}, 1.f), rm2 = Tensor::zeros({32}), rv2 = Tensor::full({32}, 1.f);
      Tensor labels = Tensor::zeros({8}, DType::I64);
      for (int64_t i = 0; i < 8; ++i) labels.data<int64_t>()[i] = i % 10;
      PrecisionScope bf16(Precision::BF16);
      const PolicySet set = parse_policy_set(policy);
      ActivationCacheScope scope(set);
      Run r;
      Variable xv(x.clone(), true);
      Variable h = conv2d(xv, w1, Variable(), {1, k / 2, 1});
      r.conv_cl = h.data().is_channels_last();
      h = relu(batch_norm(h, g1, b1, rm1, rv1, true));
      r.bn_relu_cl = h.data().is_channels_last();
      Variable h2 = batch_norm(conv2d(h, w2, Variable(), {2, k / 2, 1}), g2, b2, rm2, rv2, true);
      h2 = add_relu(h2, shortcut_pad(h, 2, 32));
      r.block_cl = h2.data().is_channels_last();
      const Variable loss = cross_entropy(linear(flatten(global_avg_pool(h2)), fc, Variable()), labels);
      backward(loss);
      r.loss = loss.data().data<float>()[0];
      for (const Variable* v : {&xv, &w1, &w2, &g1, &b1, &g2, &fc}) r.grads.push_back(v->grad().contiguous().clone());
      r.grad_cl = xv.grad().is_channels_last();
      return r;
    };
    // What the routing says of the two convolutions (asked under bf16, for a channels-last output); a pointwise one
    // reads channels-last on every CPU with bf16 kernels, so each CPU runs at least one flow.
    bool first_cl = false, second_cl = false;
    {
      PrecisionScope bf16(Precision::BF16);
      const Tensor x = Tensor::zeros({8, 16, 8, 8});
      first_cl = ops::conv2d_bf16_reads_channels_last(x, {16, 16, k, k}, {1, k / 2, 1}, false, true);
      second_cl = ops::conv2d_bf16_reads_channels_last(x, {32, 16, k, k}, {2, k / 2, 1}, false, true);
    }
    if (k == 1) CHECK(first_cl);
    if (k == 3 && actlab::cpu::dnnl_runs_amx()) CHECK((first_cl && second_cl));  // AMX kernels compute 3x3 so
    const Run flow = run("exact"), planar = run("exact|nomatch=pergroup:G=256,Q=2");
    CHECK(flow.conv_cl == first_cl);
    CHECK(flow.bn_relu_cl == first_cl);
    CHECK(flow.block_cl == (first_cl && second_cl));  // the add pairs the shortcut's layout with the branch's
    CHECK_FALSE(planar.conv_cl);
    CHECK_FALSE(planar.bn_relu_cl);
    CHECK_FALSE(planar.block_cl);
    CHECK_FALSE(flow.grad_cl);  // a leaf's gradient is its own contiguous tensor
    CHECK(std::fabs(flow.loss - planar.loss) < 1e-5f * std::fabs(planar.loss));
    const double distance = relative_distance(flow.grads, planar.grads);
    MESSAGE("channels-last flow against the (N, C, H, W) run: relative gradient distance " << distance);
    CHECK(distance < 1e-3);
    // DIVISION flows channels-last too (its packs are the same bytes, made tile by tile, and batch norm's backward
    // reads its f32 decode channels-last): again only batch norm's summation order differs.
    const Run div_flow = run("division:B=8,Q=2"), div_planar = run("division:B=8,Q=2|nomatch=pergroup:G=256,Q=2");
    CHECK(div_flow.conv_cl == first_cl);
    CHECK(div_flow.bn_relu_cl == first_cl);
    CHECK(div_flow.block_cl == (first_cl && second_cl));
    CHECK_FALSE(div_planar.conv_cl);
    CHECK_FALSE(div_planar.block_cl);
    CHECK(std::fabs(div_flow.loss - div_planar.loss) < 1e-5f * std::fabs(div_planar.loss));
    const double div_distance = relative_distance(div_flow.grads, div_planar.grads);
    MESSAGE("DIVISION, channels-last flow against the (N, C, H, W) run: relative gradient distance " << div_distance);
    CHECK(div_distance < 1e-3);
  }
}

// A tensor of one channel (or one position) is contiguous and channels-last at once in memory: as a convolution's
// operand it pairs with the other operand's layout, either way.
TEST_CASE("precision: a one-channel convolution operand pairs with a channels-last one") {
  if (!testing::have_bf16_kernels()) return;
  PrecisionScope bf16(Precision::BF16);
  PhiloxStream rng(9, 0);
  const ops::ConvParams p{1, 1, 1};
  const auto same_bits = [](const Tensor& a, const Tensor& b) {
    const Tensor ca = a.contiguous(), cb = b.contiguous();
    return ca.shape() == cb.shape() && std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
  };
  const Tensor x = Tensor::randn({2, 4, 5, 5}, rng), w = Tensor::randn({1, 4, 3, 3}, rng);
  const Tensor dy = Tensor::randn({2, 1, 5, 5}, rng);  // the gradient of a one-channel output
  Tensor db_nchw, db_cl;
  const Tensor dw_nchw = ops::conv2d_backward_weight(dy, x, w.shape(), p, true, &db_nchw);
  const Tensor dw_cl = ops::conv2d_backward_weight(dy, x.channels_last(), w.shape(), p, true, &db_cl);
  CHECK(same_bits(dw_cl, dw_nchw));
  CHECK(same_bits(db_cl, db_nchw));
  const Tensor x1 = Tensor::randn({2, 1, 5, 5}, rng), w1 = Tensor::randn({4, 1, 3, 3}, rng);
  const Tensor y_cl = ops::conv2d_forward(x1, w1, Tensor(), p, true);  // a one-channel f32 input, output channels-last
  CHECK(y_cl.is_channels_last());
  CHECK(same_bits(y_cl, ops::conv2d_forward(x1, w1, Tensor(), p)));
  CHECK(error_of([&] { ops::conv2d_forward(x, Tensor::randn({3, 4, 3, 3}, rng), Tensor(), p, true); })
            .find("must be laid out as the output is asked to be (channels-last)") != std::string::npos);
}

// A ViT's linear layers and attention matmuls compute in bf16 too. Its GELUs and softmaxes are smooth, so
// rounding the input alone barely moves its gradients (0.05 % here) and the bf16 distance is bf16's own
// arithmetic over twelve blocks (0.7 % measured): held to a few percent.
TEST_CASE("precision: a bf16 ViT step runs its linear layers and attention matmuls in bf16") {
  if (!testing::have_bf16_kernels()) return;
  const Input vit{"vit_tiny_cifar", 4, 1, 28};
  const StepRun f32 = one_step(Precision::F32, "exact", false, vit);
  const StepRun bf16 = one_step(Precision::BF16, "exact", false, vit);
  const StepRun rounded_input = one_step(Precision::F32, "exact", true, vit);
  CHECK(bf16.result.saved.packed * 2 == f32.result.saved.packed);
  const double distance = relative_distance(bf16.grads, f32.grads);
  const double yardstick = relative_distance(rounded_input.grads, f32.grads);
  MESSAGE("ViT: bf16 " << distance << " from fp32, fp32 on the bf16-rounded input " << yardstick);
  CHECK(yardstick < distance);  // the rounding inside the blocks, not of the input, is what moves them
  CHECK(distance > 1e-4);
  CHECK(distance < 3e-2);
  CHECK(std::fabs(bf16.result.loss - f32.result.loss) < 1e-2 * std::fabs(f32.result.loss));
}

TEST_CASE("precision: actlab-train's --precision trains in bf16, and refuses fp16 on a CPU in one line") {
  TrainConfig c;
  c.dataset = "synthetic";
  c.synthetic_size = 128;
  c.batch_size = 32;
  c.quiet = true;
  c.precision = "fp16";
  CHECK(error_of([&] { train(c); }).find("--precision fp16 needs a GPU") != std::string::npos);
  c.precision = "bfloat";
  CHECK(error_of([&] { train(c); }).find("unknown precision 'bfloat'") != std::string::npos);
  if (!cpu_has_bf16()) {
    c.precision = "bf16";
    CHECK(error_of([&] { train(c); }).find("neither avx512_bf16 nor amx_bf16") != std::string::npos);
    return;
  }
  c.precision = "fp32";
  const TrainSummary full = train(c);
  c.precision = "bf16";
  const TrainSummary half = train(c);
  CHECK(compute_precision() == Precision::F32);  // the run's scope ended with it
  CHECK(half.saved_raw_bytes == full.saved_raw_bytes);
  CHECK(half.saved_packed_bytes * 2 == full.saved_packed_bytes);
  CHECK(std::isfinite(half.final_test_acc));
}

TEST_CASE("precision: a tool's run entry POLICY@PRECISION, and the memory step under bf16") {
  const RunEntry plain = parse_run_entry("division:B=8,Q=2", Precision::F32);
  CHECK(plain.policy == "division:B=8,Q=2");
  CHECK(plain.precision == Precision::F32);
  CHECK(plain.label() == "division:B=8,Q=2");
  const RunEntry half = parse_run_entry("checkpoint+division:B=8,Q=2@bf16", Precision::F32);
  CHECK(half.policy == "checkpoint+division:B=8,Q=2");
  CHECK(half.precision == Precision::BF16);
  CHECK(half.label() == "checkpoint+division:B=8,Q=2@bf16");
  CHECK(parse_run_entry("exact", Precision::BF16).label() == "exact@bf16");
  CHECK(error_of([] { parse_run_entry("exact@fp8", Precision::F32); }).find("unknown precision 'fp8'") !=
        std::string::npos);
  if (!cpu_has_bf16()) return;
  StepMemoryConfig c;
  c.model = "resnet20";
  c.batch = 8;
  c.image_size = 16;
  const StepMemoryResult full = measure_step_memory(c);
  c.precision = Precision::BF16;
  const StepMemoryResult bf16 = measure_step_memory(c);
  CHECK(compute_precision() == Precision::F32);
  CHECK(bf16.saved_packed_bytes * 2 == full.saved_packed_bytes);
  CHECK(bf16.saved_packed_bytes == bf16.saved_expected_bytes);
}
