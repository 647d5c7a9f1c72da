// CPU vs CUDA parity of the activation codecs and of training on the device: for every policy and many
// shapes (planes whose size is not a multiple of 8, pooling remainders, 2-D and 3-D views, groups that do
// not divide the sample, planes too wide for the shared-memory maps) the packed bytes made on the GPU equal
// the CPU's for the same (seed, stream), and so do the unpacked tensors; then a ResNet-20 forward and
// backward under division:B=8,Q=2 on cuda:0 tracks the CPU's (loss, packed bytes, gradients). Without a
// GPU every case prints "SKIPPED: no CUDA device: ..." and returns. Run: actlab_tests -tc='cuda codec*'.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "actlab/autograd/functions.h"
#include "actlab/autograd/saved_tensor.h"
#include "actlab/autograd/tape.h"
#include "actlab/core/codec.h"
#include "actlab/core/dispatch.h"
#if defined(ACTLAB_WITH_CUDA)
#include "actlab/core/cuda/codec.h"
#endif
#include "actlab/compress/exact.h"
#include "actlab/compress/policies.h"
#include "actlab/models/registry.h"
#include "actlab/models/swin.h"
#include "actlab/models/vit.h"
#include "tests/small_models.h"
#include "tests/test_cuda_util.h"

using namespace actlab;
using namespace actlab::testing;

namespace {

const std::vector<Shape> kShapes = {{2, 3, 32, 32}, {3, 5, 7, 7}, {2, 4, 9, 13}, {4, 6, 4, 4},  {2, 3, 6, 10},
                                    {3, 5, 1, 6},   {5, 37},      {2, 3, 50},    {2, 2, 56, 56}, {2, 8300},
                                    {4, 3, 1, 1},   {7},          {2, 65, 48},   {3, 17, 64}};
const char* kPolicies[] = {"division:B=8,Q=2", "division:B=4,Q=4", "division:B=3,Q=1", "quant:Q=2", "quant:Q=8",
                           "lfc:B=8", "hfc:B=8,Q=2", "hfc:B=8", "pergroup:G=256,Q=2", "pergroup:G=5,Q=4",
                           "pergroup:G=12,Q=1", "actnn:G=256,Q=2", "actnn:G=8,Q=4", "division:B=8,Q=2,R=1",
                           "quant:Q=2,R=3", "hfc:B=4,Q=4,R=2", "division:B=8,Q=8"};  // Q=8: the softmax codes

// Every byte a pack holds until backward, whatever its kind.
const Tensor& pack_bytes(const Packed& p) {
  if (const auto* planes = dynamic_cast<const PackedPlanes*>(&p)) return planes->buffer();
  if (const auto* groups = dynamic_cast<const PackedGroups*>(&p)) return groups->buffer();
  return dynamic_cast<const PackedPassthrough&>(p).tensor();
}

}  // namespace

TEST_CASE("cuda codec: every policy packs the same bytes on CPU and GPU and unpacks the same values") {
  if (!gpu_or_skip("codec parity")) return;
  const LiveBytesOnBoth live;
  {
    uint64_t stream = 1;
    for (const char* spec : kPolicies) {
      const auto policy = parse_policy(spec);
      for (const Shape& shape : kShapes) {
        const std::string what = std::string(spec) + " " + shape_str(shape);
        PhiloxStream rng(stream, 3);
        const Tensor x = Tensor::randn(shape, rng, 0.3f, 1.f);
        const PackContext ctx{1234, stream++};
        const auto cpu_pack = policy->pack(x, {}, ctx);
        const auto gpu_pack = policy->pack(x.to(gpu()), {}, ctx);
        CHECK(gpu_pack->nbytes() == cpu_pack->nbytes());
        CHECK(pack_bytes(*gpu_pack).device() == gpu());
        check_same_bytes(pack_bytes(*cpu_pack), pack_bytes(*gpu_pack), what + " packed bytes");
        const Tensor cpu_out = policy->unpack(*cpu_pack, {}), gpu_out = policy->unpack(*gpu_pack, {});
        CHECK(gpu_out.device() == gpu());
        check_same_bytes(cpu_out, gpu_out, what + " unpacked");
      }
    }
  }
  live.check();
}

TEST_CASE("cuda codec: NaN and infinity decode to NaN in the same planes on CPU and GPU") {
  if (!gpu_or_skip("codec parity with NaN and infinity")) return;
  const LiveBytesOnBoth live;
  {
    // Byte parity cannot hold where a NaN is made: x86 makes the negative default NaN (inf - inf) and keeps an
    // input NaN's payload, a GPU makes the positive canonical one, so a NaN sorts to the other end of a range.
    // What must hold: the same values come back NaN (the plane or range the NaN or infinity is in), and every
    // other value comes back with the same bits.
    const Shape shape{2, 3, 16, 16};
    for (const char* spec : {"division:B=8,Q=2", "quant:Q=2", "hfc:B=8,Q=2", "pergroup:G=256,Q=2",
                             "division:B=8,Q=2,R=1"}) {
      const auto policy = parse_policy(spec);
      PhiloxStream rng(7, 3);
      Tensor x = Tensor::randn(shape, rng, 0.f, 1.f);
      float* p = x.data<float>();
      p[5] = std::nanf("");                             // plane 0
      p[2 * 256 + 17] = std::numeric_limits<float>::infinity();   // plane 2
      p[4 * 256 + 3] = -std::numeric_limits<float>::infinity();   // plane 4
      const PackContext ctx{99, 1};
      const Tensor cpu_out = policy->unpack(*policy->pack(x, {}, ctx), {});
      const Tensor gpu_out = policy->unpack(*policy->pack(x.to(gpu()), {}, ctx), {}).to(Device::cpu());
      const float* a = cpu_out.data<float>();
      const float* b = gpu_out.data<float>();
      int64_t nan_mismatch = 0, value_mismatch = 0, nans = 0;
      for (int64_t i = 0; i < cpu_out.numel(); ++i) {
        nans += std::isnan(a[i]) ? 1 : 0;
        if (std::isnan(a[i]) != std::isnan(b[i])) ++nan_mismatch;
        else if (!std::isnan(a[i]) && std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++value_mismatch;
      }
      CAPTURE(spec);
      CHECK(nans > 0);  // the NaN reaches backward
      CHECK(nan_mismatch == 0);
      CHECK(value_mismatch == 0);
    }
  }
  live.check();
}

TEST_CASE("cuda codec: packs on the GPU are tagged ActivationPacked there and hold the closed-form bytes") {
  if (!gpu_or_skip("ActivationPacked accounting on cuda:0")) return;
  const int64_t packed_before = memory_stats(gpu())[MemTag::ActivationPacked].current;
  {
    const auto policy = parse_policy("division:B=8,Q=2");
    const Shape shape{8, 16, 32, 32};
    const Tensor x = uniform(shape, 3).to(gpu());
    std::unique_ptr<Packed> pack;
    {
      MemTagScope tag(MemTag::ActivationPacked);  // how SavedTensor calls a lossy policy
      pack = policy->pack(x, {}, {1, 2});
    }
    CHECK(pack->nbytes() == policy->expected_bytes(shape));
    CHECK(memory_stats(gpu())[MemTag::ActivationPacked].current - packed_before == int64_t(pack->nbytes()));
  }
  CHECK(memory_stats(gpu())[MemTag::ActivationPacked].current == packed_before);
}

TEST_CASE("cuda codec: the raw kernels match the CPU on a batch of odd planes") {
  if (!gpu_or_skip("raw codec kernels")) return;
  // 55 elements: chunks straddle Philox blocks. With range_rows 3: four ranges of 15 elements per plane, the
  // last one zero-padded (the GPU runs the group kernel over the residual for them).
  for (const int64_t range_rows : {0, 3}) {
    CAPTURE(range_rows);
    PlaneGeometry g = make_plane_geometry(6, 11, 5, 4, 4);
    g.range_rows = range_rows;
    const Tensor x = uniform({g.planes, g.height, g.width}, 9);
    const int64_t lfc_n = g.planes * g.lfc_elems(), code_n = g.planes * g.code_bytes_per_plane();
    const auto raw = [&](Device d) {  // u8 tensors hold the bf16 sections as raw bytes
      Tensor lfc = Tensor::empty({2 * lfc_n}, DType::U8, d), codes = Tensor::zeros({code_n}, DType::U8, d);
      Tensor mins = Tensor::empty({2 * g.ranges()}, DType::U8, d);
      Tensor steps = Tensor::empty({2 * g.ranges()}, DType::U8, d);
      const Tensor xd = x.to(d);
      auto* lp = reinterpret_cast<uint16_t*>(lfc.data<uint8_t>());
      auto* mp = reinterpret_cast<uint16_t*>(mins.data<uint8_t>());
      auto* sp = reinterpret_cast<uint16_t*>(steps.data<uint8_t>());
      // The kernels directly, through the same switch the policies use (core/dispatch.h).
      ACTLAB_DISPATCH(d,
                      cuda::plane_pack(lp, codes.data<uint8_t>(), mp, sp, nullptr, xd.data<float>(), g, true, 5, 6,
                                       gpu.device()),
                      cpu::plane_pack(lp, codes.data<uint8_t>(), mp, sp, nullptr, xd.data<float>(), g, true, 5, 6));
      return std::vector<Tensor>{codes, lfc, mins, steps};
    };
    const std::vector<Tensor> want = raw(Device::cpu()), got = raw(gpu());
    check_same_bytes(want[0], got[0], "codes");
    check_same_bytes(want[1], got[1], "lfc");
    check_same_bytes(want[2], got[2], "mins");
    check_same_bytes(want[3], got[3], "steps");
  }
}

TEST_CASE("cuda codec: the raw kernels give the aligned path's bytes from a misaligned x and into a misaligned out") {
  if (!gpu_or_skip("raw codec kernels on misaligned pointers")) return;
  // Planes of a multiple of 8 elements take the float4 path only from a 16-byte-aligned pointer; a view one
  // float in (what an unaligned slice hands the codec) must fall back to scalar accesses, same bytes.
  // 16x16 with B=8: one LFC value per chunk, pool rows of 8; 8x12 with B=4: pool rows of 4; a token map:
  // runs of 8 LFC values; 48x48: planes of 288 chunks, packed by the grids for large planes.
  const PlaneGeometry geometries[] = {make_plane_geometry(6, 16, 16, 8, 2), make_plane_geometry(4, 8, 12, 4, 4),
                                      make_token_geometry(3, 17, 64, 8, 2), make_plane_geometry(2, 48, 48, 8, 2)};
  for (const PlaneGeometry& g : geometries) {
    for (const int64_t offset : {0, 1}) {
      CAPTURE(g.height);
      CAPTURE(offset);
      const int64_t n = g.planes * g.plane_elems(), lfc_n = g.planes * g.lfc_elems();
      const Tensor x = uniform({n + 4}, 21);  // x's elements are [offset, offset + n)
      const auto round_trip = [&](Device d) {  // u8 tensors hold the bf16 sections as raw bytes
        Tensor lfc = Tensor::empty({2 * lfc_n}, DType::U8, d);
        Tensor codes = Tensor::zeros({g.planes * g.code_bytes_per_plane()}, DType::U8, d);
        Tensor mins = Tensor::empty({2 * g.ranges()}, DType::U8, d);
        Tensor steps = Tensor::empty({2 * g.ranges()}, DType::U8, d);
        Tensor out = Tensor::zeros({n + 4}, DType::F32, d);
        const Tensor xd = x.to(d);
        auto* lp = reinterpret_cast<uint16_t*>(lfc.data<uint8_t>());
        auto* mp = reinterpret_cast<uint16_t*>(mins.data<uint8_t>());
        auto* sp = reinterpret_cast<uint16_t*>(steps.data<uint8_t>());
        const float* xp = xd.data<float>() + offset;
        float* op = out.data<float>() + offset;
        ACTLAB_DISPATCH(d,
                        (cuda::plane_pack(lp, codes.data<uint8_t>(), mp, sp, nullptr, xp, g, true, 7, 8, gpu.device()),
                         cuda::plane_unpack(op, lp, codes.data<uint8_t>(), mp, sp, g, gpu.device())),
                        (cpu::plane_pack(lp, codes.data<uint8_t>(), mp, sp, nullptr, xp, g, true, 7, 8),
                         cpu::plane_unpack(op, lp, codes.data<uint8_t>(), mp, sp, g)));
        return std::vector<Tensor>{codes, lfc, mins, steps, out.slice(0, offset, offset + n)};
      };
      const std::vector<Tensor> want = round_trip(Device::cpu()), got = round_trip(gpu());
      check_same_bytes(want[0], got[0], "codes");
      check_same_bytes(want[1], got[1], "lfc");
      check_same_bytes(want[2], got[2], "mins");
      check_same_bytes(want[3], got[3], "steps");
      check_same_bytes(want[4], got[4], "unpacked");
    }
  }
}

namespace {

// One forward + backward of `model` on device d under `policies`: the loss and the ActivationPacked bytes
// held after forward (all of them released by the end of backward).
std::pair<Tensor, int64_t> packed_step(Module& model, Device d, const Tensor& x, const Tensor& labels,
                                       const PolicySet& policies) {
  Tape::current().clear();  // resets the per-step pack counter: both runs draw the same streams
  set_pack_seed(17);
  set_pack_step(0);
  const int64_t packed_before = memory_stats(d)[MemTag::ActivationPacked].current;
  Variable loss;
  int64_t packed = 0;
  {
    ActivationCacheScope scope(policies);
    MemTagScope tag(MemTag::Activation);
    loss = cross_entropy(model(Variable(x.to(d))), labels.to(d));
    packed = memory_stats(d)[MemTag::ActivationPacked].current - packed_before;
  }
  model.zero_grad();
  backward(loss);
  CHECK(memory_stats(d)[MemTag::ActivationPacked].current == packed_before);  // released during backward
  return {loss.data().to(Device::cpu()), packed};
}

// The same model built twice from one seed, one copy moved to the GPU: one step on each under `policy`,
// then the losses, the packed bytes and every gradient compared.
void check_step_tracks_cpu(const std::function<std::shared_ptr<Module>()>& make, const Tensor& x,
                           const std::string& policy) {
  auto cpu_model = make(), gpu_model = make();
  gpu_model->to(gpu());
  Tensor labels = Tensor::empty({x.size(0)}, DType::I64);
  for (int64_t i = 0; i < x.size(0); ++i) labels.data<int64_t>()[i] = (3 * i + 1) % 10;
  const PolicySet policies(parse_policy(policy));
  const auto cpu_step = packed_step(*cpu_model, Device::cpu(), x, labels, policies);
  const auto gpu_step = packed_step(*gpu_model, gpu(), x, labels, policies);
  check_close(cpu_step.first, gpu_step.first, 1e-4, "loss");
  CHECK(gpu_step.second == cpu_step.second);  // the same packs (sizes are the closed forms of the same shapes)
  if (policy != "exact") CHECK(gpu_step.second > 0);
  // Gradients through the decompressed activations: close, not equal — a last-bit difference in a conv or
  // GEMM can move a stochastic code across its threshold (one step of that element) or a plane's bf16 min.
  // A wrong layout or index would be off by O(1).
  const auto cpu_params = cpu_model->named_parameters(), gpu_params = gpu_model->named_parameters();
  REQUIRE(cpu_params.size() == gpu_params.size());
  for (size_t i = 0; i < cpu_params.size(); ++i)
    check_close(cpu_params[i].second.grad(), gpu_params[i].second.grad(), 2e-2, "grad of " + cpu_params[i].first);
}

}  // namespace

TEST_CASE("cuda codec: a ResNet-20 step under division:B=8,Q=2 on cuda:0 tracks the CPU step") {
  if (!gpu_or_skip("a ResNet-20 training step on cuda:0")) return;
  check_step_tracks_cpu([] {
    seed_init(5);
    return make_model({"resnet20", 3, 10, 32});
  }, uniform({4, 3, 32, 32}, 11), "division:B=8,Q=2");
}

TEST_CASE("cuda codec: a small ViT step on cuda:0 tracks the CPU step (token ops, token-axis DIVISION, split)") {
  if (!gpu_or_skip("a ViT training step on cuda:0")) return;
  // vit_tiny_cifar's layers at a width and depth the reference CPU GEMM of a minimal build runs in seconds;
  // the class token's split sends no gradient to the patch tokens' part, which a GPU fill must handle.
  VitConfig config;
  config.dim = 48;
  config.depth = 2;
  for (const char* policy : {"exact", "division:B=8,Q=2"}) {
    INFO("policy " << policy);
    check_step_tracks_cpu([&] {
      seed_init(5);
      return std::shared_ptr<Module>(std::make_shared<VisionTransformer>(config));
    }, uniform({4, 3, 32, 32}, 11), policy);
  }
}

TEST_CASE("cuda codec: a small Swin step on cuda:0 tracks the CPU step (shifted windows, mask, device position index)") {
  if (!gpu_or_skip("a Swin training step on cuda:0")) return;
  // Two stages (a patch merging between them), windows of 4 shifted by 2, and the relative-position index
  // that Module::to moves to the device with the weights: written after the last GPU session, so its first
  // run there is this case's.
  SwinConfig config = testing::small_swin(3);
  config.num_classes = 10;  // the step's labels go up to 9
  for (const char* policy : {"exact", "division:B=8,Q=2"}) {
    INFO("policy " << policy);
    check_step_tracks_cpu([&] {
      seed_init(5);
      return make_swin(config);
    }, uniform({4, 3, 16, 16}, 11), policy);
  }
}

TEST_CASE("cuda codec: blpa packs the CPU's codes on the GPU, with its channel statistics to double rounding") {
  if (!gpu_or_skip("blpa parity")) return;
  uint64_t seed = 70;
  for (const char* spec : {"blpa:Q=4", "blpa:Q=8"}) {
    const auto policy = parse_policy(spec);
    for (const Shape& shape : kShapes) {
      const std::string what = std::string(spec) + " " + shape_str(shape);
      PhiloxStream rng(seed++, 3);
      const Tensor x = Tensor::randn(shape, rng, 0.3f, 1.f);
      const auto cpu_pack = policy->pack(x, {}, {});
      const auto gpu_pack = policy->pack(x.to(gpu()), {}, {});
      const auto* cpu_blpa = dynamic_cast<const PackedBlpa*>(cpu_pack.get());
      const auto* gpu_blpa = dynamic_cast<const PackedBlpa*>(gpu_pack.get());
      REQUIRE_MESSAGE(cpu_blpa != nullptr, what);
      REQUIRE_MESSAGE(gpu_blpa != nullptr, what);
      CHECK(gpu_blpa->buffer().device() == gpu());
      CHECK(gpu_pack->nbytes() == cpu_pack->nbytes());
      const BlpaGeometry& g = cpu_blpa->geometry();
      const Tensor want = cpu_blpa->buffer(), got = gpu_blpa->buffer().to(Device::cpu());
      const auto* wp = reinterpret_cast<const BlpaChannel*>(want.data<uint8_t>());
      const auto* gp = reinterpret_cast<const BlpaChannel*>(got.data<uint8_t>());
      for (int64_t c = 0; c < g.channels; ++c) {
        CAPTURE(c);
        CHECK_MESSAGE(gp[c].lo == wp[c].lo, what);  // min and max are exact on both
        CHECK_MESSAGE(gp[c].hi == wp[c].hi, what);
        CHECK_MESSAGE(gp[c].step == doctest::Approx(wp[c].step).epsilon(1e-6), what);  // a few ulps at most
        CHECK_MESSAGE(std::abs(gp[c].shift - wp[c].shift) <= 1.f, what);
      }
      // Codes: the same wherever the channel parameters came out the same, which is nearly everywhere.
      const uint8_t* wc = want.data<uint8_t>() + g.channels * sizeof(BlpaChannel);
      const uint8_t* gc = got.data<uint8_t>() + g.channels * sizeof(BlpaChannel);
      int64_t differing = 0;
      for (int64_t j = 0; j < g.code_bytes(); ++j) differing += wc[j] != gc[j];
      CHECK_MESSAGE(differing <= std::max<int64_t>(1, g.code_bytes() / 1000), what, ": ", differing, " code bytes differ");
      // Values: within one cell of the CPU's.
      const std::vector<float> a = policy->unpack(*cpu_pack, {}).to_vector();
      const std::vector<float> b = policy->unpack(*gpu_pack, {}).to(Device::cpu()).to_vector();
      REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        const float step = wp[(static_cast<int64_t>(i) / g.inner) % g.channels].step;
        if (!(std::abs(a[i] - b[i]) <= 1.001f * step)) {
          FAIL_CHECK(what << "[" << i << "]: cuda " << b[i] << " vs cpu " << a[i] << " (cell " << step << ")");
          break;
        }
      }
    }
  }
}

TEST_CASE("cuda codec: sample_range_norms (actnn's widths, acgc's error estimate) gives the CPU's bits") {
  if (!gpu_or_skip("range norms")) return;
  // Groups that divide the sample, a padded last group, groups wider than the sample, and groups of more chunks
  // than a team has lanes (8300 elements in groups of 4096, so each lane walks several chunks).
  struct Case { int64_t samples, elems, group; };
  uint64_t seed = 90;
  for (const Case& c : {Case{3, 300, 256}, Case{4, 10, 4}, Case{2, 7, 16}, Case{64, 1024, 256}, Case{5, 8300, 4096}}) {
    const std::string what = std::to_string(c.samples) + "x" + std::to_string(c.elems) + " in groups of " +
                             std::to_string(c.group);
    GroupGeometry g;
    g.samples = c.samples, g.sample_elems = c.elems, g.group_size = c.group, g.bits = 2;
    PhiloxStream rng(seed++, 3);
    const Tensor x = Tensor::randn({c.samples, c.elems}, rng, 0.3f, 1.f);
    const std::vector<double> want = sample_range_norms(x, g), got = sample_range_norms(x.to(gpu()), g);
    REQUIRE(got.size() == want.size());
    for (size_t n = 0; n < want.size(); ++n) CHECK_MESSAGE(got[n] == want[n], what, ", sample ", n);
  }
}
