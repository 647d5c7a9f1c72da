// Tests of the lossy activation-cache policies (compress/policies.h, compress/registry.cpp): round trips
// over many shapes inside the per-element bound of the stored bf16 step, unbiasedness over many streams,
// near-lossless and exact-up-to-bf16 settings, nbytes() == expected_bytes() == the closed forms written out
// here, ActivationPacked accounting, determinism, passthrough, and parse errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "actlab/compress/policies.h"
#include "actlab/core/allocator.h"
#include "error_of.h"

namespace {

using namespace actlab;

const std::vector<Shape> kShapes = {{2, 3, 32, 32}, {2, 2, 28, 28}, {2, 3, 14, 14}, {3, 5, 7, 7}, {3, 5, 4, 4},
                                    {4, 3, 1, 1},   {2, 3, 6, 10},  {3, 5, 1, 6},   {4, 10},      {4, 1},
                                    {2, 3, 5},      {2, 2, 3, 8, 8}, {7}};
const char* kLossy[] = {"division:B=8,Q=2", "division:B=4,Q=4", "division:B=3,Q=1", "quant:Q=2", "quant:Q=8",
                        "lfc:B=8", "hfc:B=8,Q=2", "hfc:B=8", "pergroup:G=256,Q=2", "pergroup:G=5,Q=4",
                        "actnn:G=256,Q=2", "actnn:G=8,Q=4", "acgc:E=0,I=100,G=256", "acgc:E=4,I=3,G=5",
                        "division:B=8,Q=2,R=1", "quant:Q=2,R=3", "hfc:B=4,Q=4,R=2"};

Tensor random_tensor(const Shape& shape, uint64_t seed) {
  PhiloxStream rng(seed, 3);
  return Tensor::randn(shape, rng, 0.3f, 1.f);
}

int64_t live_bytes() { return memory_stats(Device::cpu()).total.current; }
int64_t packed_live_bytes() { return memory_stats(Device::cpu())[MemTag::ActivationPacked].current; }

// The stored step of the group that holds element i of a per-group pack.
float group_step(const uint16_t* steps, const GroupGeometry& g, int64_t i) {
  const int64_t n = i / g.sample_elems, d = i % g.sample_elems;
  return bf16_to_float(steps[n * g.groups_per_sample() + d / g.group_size]);
}
// The stored step of the range that holds element i of a plane pack.
float range_step(const uint16_t* steps, const PlaneGeometry& g, int64_t i) {
  const int64_t p = i / g.plane_elems(), e = i % g.plane_elems();
  return bf16_to_float(steps[p * g.ranges_per_plane() + e / g.range_elems()]);
}

// The bound on |unpack(pack(x)) − target| for element i, from what the pack stores: the step of its
// plane or group (plus f32 rounding of the reconstruction); 0 for codes-free packs.
float element_bound(const Packed& p, int64_t i, float magnitude) {
  const float rounding = 1e-6f * (1.f + magnitude);
  if (const auto* planes = dynamic_cast<const PackedPlanes*>(&p)) {
    if (!planes->steps()) return rounding;
    return range_step(planes->steps(), planes->geometry(), i) + rounding;
  }
  if (const auto* groups = dynamic_cast<const PackedGroups*>(&p))
    return group_step(groups->steps(), groups->geometry(), i) + rounding;
  return 0.f;  // passthrough: exact
}

// What backward should see for `spec` (before quantization noise): x, the LFC↑ or the HFC.
std::vector<float> target_of(const std::string& spec, const Tensor& x) {
  const std::string name = spec.substr(0, spec.find(':'));
  if (name != "lfc" && name != "hfc") return x.to_vector();
  const int64_t block = std::stoll(spec.substr(spec.find("B=") + 2));
  auto lfc_policy = parse_policy("lfc:B=" + std::to_string(block));
  const auto lfc_pack = lfc_policy->pack(x, {}, {});
  if (dynamic_cast<const PackedPassthrough*>(lfc_pack.get())) return x.to_vector();  // kept as is
  const std::vector<float> up = lfc_policy->unpack(*lfc_pack, {}).to_vector();
  if (name == "lfc") return up;
  std::vector<float> hfc = x.to_vector();
  for (size_t i = 0; i < hfc.size(); ++i) hfc[i] -= up[i];
  return hfc;
}

}  // namespace

TEST_CASE("policies: a pack handed to a policy that did not make it is an error naming that policy") {
  const Tensor x = random_tensor({2, 3, 8, 8}, 9);
  const char* specs[] = {"exact", "bf16", "swap:P=2", "division:B=8,Q=2", "pergroup:G=16,Q=2", "acgc:E=0,I=100,G=16"};
  for (const char* maker : specs) {
    const auto made_by = parse_policy(maker);
    const auto packed = made_by->pack(x, {}, {1, 1});
    for (const char* reader : specs) {
      if (std::string(maker) == reader) continue;
      const auto other = parse_policy(reader);
      // acgc reads pergroup's groups at their width, and pergroup acgc's: the same codec, not an error.
      const std::set<std::string> pair{std::string(maker).substr(0, 4), std::string(reader).substr(0, 4)};
      if (pair == std::set<std::string>{"perg", "acgc"}) continue;
      INFO(maker, " -> ", reader);
      CHECK_THROWS_WITH_AS(other->unpack(*packed, {}), doctest::Contains("cannot unpack a pack it did not make"), Error);
    }
  }
  // mesa keeps a 4-D map's groups by dim 1 across the batch: the sample-row policies (one pack type with
  // it) must refuse its packs, and it theirs, where each would decode the other's into the wrong order.
  const char* rows[] = {"pergroup:G=16,Q=2", "actnn:G=16,Q=2", "acgc:E=0,I=100,G=16"};
  const auto mesa = parse_policy("mesa:Q=8");
  const auto by_head = mesa->pack(x, {}, {1, 1});
  for (const char* reader : rows) {
    INFO("mesa -> ", reader);
    const auto policy = parse_policy(reader);
    const std::string want = "policy " + policy->name() + " cannot unpack a pack it did not make";
    CHECK_THROWS_WITH_AS(policy->unpack(*by_head, {}), doctest::Contains(want.c_str()), Error);
    INFO(reader, " -> mesa");
    CHECK_THROWS_WITH_AS(mesa->unpack(*parse_policy(reader)->pack(x, {}, {1, 1}), {}),
                         doctest::Contains("cannot unpack a pack it did not make"), Error);
  }
  // Below 4-D both keep rows in order: mesa reads a 2-D pergroup pack as its values.
  const Tensor flat = random_tensor({6, 32}, 10);
  const auto rows_2d = parse_policy("pergroup:G=16,Q=8")->pack(flat, {}, {1, 1});
  CHECK(mesa->unpack(*rows_2d, {}).to_vector() == parse_policy("pergroup:G=16,Q=8")->unpack(*rows_2d, {}).to_vector());
}

TEST_CASE("policies: every policy refuses an undefined tensor in one error naming itself") {
  for (const char* spec : {"exact", "bf16", "swap:P=2", "division:B=8,Q=2", "quant:Q=2", "lfc:B=8", "pergroup:G=16,Q=2",
                           "actnn:G=16,Q=2", "blpa:Q=4", "acgc:E=0,I=100,G=16", "mesa:Q=8"}) {
    const auto policy = parse_policy(spec);
    const std::string error = testing::error_of([&] { policy->pack(Tensor(), {}, {1, 1}); });
    INFO(error);
    CHECK(error.find("cannot pack an undefined tensor") != std::string::npos);
    CHECK(error.find(policy->name()) != std::string::npos);
  }
}

TEST_CASE("policies: a NaN of either sign reaches backward through every lossy policy") {
  // A NaN from numpy, PyTorch or std::numeric_limits has its sign bit clear: its order key sorts above +inf,
  // so only the range's max sees it (a sign-set NaN, x86's 0/0, is the min's). Either must decode as NaN.
  const Shape shape{2, 3, 8, 8};
  const int64_t at = ((1 * 3 + 2) * 8 + 3) * 8 + 4;
  std::vector<const char*> specs(std::begin(kLossy), std::end(kLossy));
  specs.push_back("mesa:Q=8");
  specs.push_back("blpa:Q=4");
  for (const float nan : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()}) {
    for (const char* spec : specs) {
      INFO(spec, std::signbit(nan) ? " (sign-set NaN)" : " (positive NaN)");
      Tensor x = random_tensor(shape, 5);
      x.data<float>()[at] = nan;
      const auto policy = parse_policy(spec);
      const std::vector<float> out = policy->unpack(*policy->pack(x, {}, {3, 1}), {}).to_vector();
      CHECK(std::isnan(out[static_cast<size_t>(at)]));
    }
  }
  // An infinity must not come back finite either: the step's overflow check looks for non-finite values.
  for (const float inf : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    for (const char* spec : specs) {
      INFO(spec, inf > 0 ? " (+inf)" : " (-inf)");
      Tensor x = random_tensor(shape, 5);
      x.data<float>()[at] = inf;
      const auto policy = parse_policy(spec);
      const std::vector<float> out = policy->unpack(*policy->pack(x, {}, {3, 1}), {}).to_vector();
      CHECK_FALSE(std::isfinite(out[static_cast<size_t>(at)]));
    }
  }
}

TEST_CASE("policies: every policy round-trips every shape inside the bound of its stored step") {
  const int64_t live_before = live_bytes();
  for (const char* spec : kLossy) {
    const auto policy = parse_policy(spec);
    for (const Shape& shape : kShapes) {
      INFO(spec);
      CAPTURE(shape_str(shape));
      const Tensor x = random_tensor(shape, 11);
      const auto packed = policy->pack(x, {}, {21, 4});
      CHECK(packed->shape() == shape);
      CHECK(packed->nbytes() == policy->expected_bytes(shape));
      const Tensor out = policy->unpack(*packed, {});
      REQUIRE(out.shape() == shape);
      CHECK(out.is_contiguous());
      CHECK(out.storage() != x.storage());
      const std::vector<float> got = out.to_vector(), want = target_of(spec, x);
      int bad = 0;
      for (size_t i = 0; i < got.size(); ++i)
        if (!(std::fabs(got[i] - want[i]) <= element_bound(*packed, static_cast<int64_t>(i), std::fabs(want[i])))) ++bad;
      CHECK(bad == 0);
    }
  }
  CHECK(live_bytes() == live_before);
}

TEST_CASE("policies: LFC↑ + f32 HFC reconstructs x, division = LFC↑ + its quantized HFC") {
  for (const Shape& shape : {Shape{2, 3, 28, 28}, Shape{3, 5, 7, 7}, Shape{4, 10}}) {
    const Tensor x = random_tensor(shape, 5);
    const auto lfc = parse_policy("lfc:B=8"), hfc = parse_policy("hfc:B=8");
    const std::vector<float> up = lfc->unpack(*lfc->pack(x, {}, {}), {}).to_vector();
    const std::vector<float> high = hfc->unpack(*hfc->pack(x, {}, {}), {}).to_vector();
    const std::vector<float> xs = x.to_vector();
    int bad = 0;
    for (size_t i = 0; i < xs.size(); ++i)
      if (std::fabs(up[i] + high[i] - xs[i]) > 1e-6f * (1.f + std::fabs(xs[i]))) ++bad;
    CHECK(bad == 0);
    // The LFC is a pooled map: constant on each up-sampled block (here rows/cols of 8, floor-aligned).
    if (shape.size() == 4) CHECK(up[0] == up[7]);
  }
}

TEST_CASE("policies: stochastic rounding is unbiased over many streams") {
  const int64_t live_before = live_bytes();
  {
    const Shape shape = {2, 3, 6, 10};
    const Tensor x = random_tensor(shape, 8);
    const int streams = 256;
    for (const char* spec : {"division:B=4,Q=2", "quant:Q=1", "hfc:B=8,Q=2", "pergroup:G=32,Q=2", "actnn:G=32,Q=2",
                             "division:B=4,Q=2,R=1"}) {
      INFO(spec);
      const auto policy = parse_policy(spec);
      const std::vector<float> want = target_of(spec, x);
      std::vector<double> sum(want.size(), 0.0);
      float max_step = 0.f;
      for (int s = 0; s < streams; ++s) {
        const auto packed = policy->pack(x, {}, {2024, static_cast<uint64_t>(s)});
        const std::vector<float> got = policy->unpack(*packed, {}).to_vector();
        for (size_t i = 0; i < got.size(); ++i) {
          sum[i] += got[i];
          max_step = std::max(max_step, element_bound(*packed, static_cast<int64_t>(i), 0.f));
        }
      }
      // Each draw is one of two neighbours a step apart, so its standard deviation is <= step/2. The
      // 8-bit midpoint uniforms bias a draw by at most 2^-9 step, far below 5 standard errors here.
      const double standard_error = max_step / 2.0 / std::sqrt(static_cast<double>(streams));
      double worst = 0.0;
      for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(sum[i] / streams - want[i]));
      CHECK(worst < 5.0 * standard_error);
      CHECK(worst > 0.0);  // it is stochastic, not exact
    }
  }
  CHECK(live_bytes() == live_before);
}

TEST_CASE("policies: division:B=1,Q=8 is near-lossless and lfc:B=1 is x rounded to bf16") {
  const Tensor x = random_tensor({3, 4, 9, 7}, 13);
  const std::vector<float> xs = x.to_vector();
  const auto division = parse_policy("division:B=1,Q=8");
  const std::vector<float> near = division->unpack(*division->pack(x, {}, {1, 2}), {}).to_vector();
  const auto lfc = parse_policy("lfc:B=1");
  const std::vector<float> rounded = lfc->unpack(*lfc->pack(x, {}, {}), {}).to_vector();
  float max_abs = 0.f, max_err = 0.f;
  int not_bf16 = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(xs[i]));
    max_err = std::max(max_err, std::fabs(near[i] - xs[i]));
    if (rounded[i] != round_bf16(xs[i])) ++not_bf16;
  }
  // The residual of a bf16 rounding is < 2^-8 |x|; 255 levels over its range leave < 2^-14 max|x|.
  CHECK(max_err < std::ldexp(max_abs, -14));
  CHECK(not_bf16 == 0);
}

TEST_CASE("policies: nbytes matches the closed forms") {
  const auto bytes = [](const char* spec, const Shape& shape) {
    const auto policy = parse_policy(spec);
    const auto packed = policy->pack(random_tensor(shape, 1), {}, {});
    CHECK(packed->nbytes() == policy->expected_bytes(shape));
    return static_cast<int64_t>(packed->nbytes());
  };
  // division on (N,C,H,W): N·C·(2·h'·w' + ceil(Q·H·W/8) + 4).
  CHECK(bytes("division:B=8,Q=2", {2, 64, 32, 32}) == 128 * (2 * 16 + 256 + 4));
  CHECK(bytes("division:B=8,Q=2", {2, 3, 28, 28}) == 6 * (2 * 9 + 196 + 4));
  CHECK(bytes("division:B=8,Q=2", {3, 5, 7, 7}) == 15 * (2 * 1 + 13 + 4));
  CHECK(bytes("division:B=8,Q=4", {2, 3, 6, 10}) == 6 * (2 * 1 + 30 + 4));
  CHECK(bytes("division:B=8,Q=2", {4, 10}) == 4 * (2 * 1 + 3 + 4));
  CHECK(bytes("division:B=8,Q=2", {4, 3, 1, 1}) == 4 * 12);  // passthrough
  // (N, C, D, H, W) volumes: N·C·D planes of H×W.
  CHECK(bytes("division:B=8,Q=2", {2, 4, 3, 16, 16}) == 24 * (2 * 4 + 64 + 4));
  CHECK(bytes("quant:Q=1", {3, 5, 4, 4}) == 15 * (2 + 4));
  CHECK(bytes("lfc:B=4", {2, 3, 6, 10}) == 6 * 2 * 1 * 2);
  CHECK(bytes("hfc:B=8,Q=8", {2, 3, 5}) == 2 * (15 + 4));  // a (B, T, D) map: one plane per sample
  // division on a (B, T, D) token map: B·(2·⌊T/k⌋·D + ceil(Q·T·D/8) + 4) with k = min(B, T) along T only.
  CHECK(bytes("division:B=8,Q=2", {4, 65, 192}) == 4 * (2 * 8 * 192 + 65 * 192 / 4 + 4));
  CHECK(bytes("division:B=8,Q=2", {2, 5, 6}) == 2 * (2 * 1 * 6 + 8 + 4));  // T < B: the token mean
  CHECK(bytes("quant:Q=4", {3, 10, 7}) == 3 * (35 + 4));
  // R rows per range: the codes' term becomes ceil(H/R')·(ceil(Q·R'·W/8) + 4), R' = min(R, H).
  CHECK(bytes("division:B=8,Q=2,R=1", {4, 65, 192}) == 4 * (2 * 8 * 192 + 65 * (48 + 4)));
  CHECK(bytes("quant:Q=2,R=2", {3, 5, 6}) == 3 * 3 * (3 + 4));              // the last range is padded
  CHECK(bytes("division:B=8,Q=2,R=9", {2, 5, 6}) == 2 * (2 * 1 * 6 + 8 + 4));  // R >= H: one range
  CHECK(bytes("hfc:B=8,Q=1,R=3", {2, 3, 16, 16}) == 6 * 6 * (6 + 4));
  CHECK(bytes("lfc:B=4", {2, 9, 5}) == 2 * 2 * 2 * 5);
  CHECK(bytes("hfc:B=8", {2, 3, 5}) == 30 * 4);
  // pergroup: N·ceil(D/G)·(ceil(G·Q/8) + 4).
  CHECK(bytes("pergroup:G=256,Q=2", {2, 64, 32, 32}) == 2 * 256 * (64 + 4));
  CHECK(bytes("pergroup:G=256,Q=2", {3, 5, 7, 7}) == 3 * 1 * (64 + 4));
  CHECK(bytes("pergroup:G=5,Q=2", {4, 12}) == 4 * 3 * (2 + 4));
  CHECK(bytes("pergroup:G=256,Q=2", {4, 1}) == 16);  // passthrough
}

TEST_CASE("policies: every policy's closed forms refuse a shape past what they count and answer up to it") {
  // Every registered form: policy_forms() is one line per form, its examples in the first 24 columns
  // (" | " between two), then a closing line of keys without a newline.
  std::vector<std::string> specs;
  const std::string forms = policy_forms();
  for (size_t at = 0, end; (end = forms.find('\n', at)) != std::string::npos; at = end + 1) {
    std::string examples = forms.substr(at, std::min<size_t>(24, end - at));
    for (size_t bar; (bar = examples.find(" | ")) != std::string::npos; examples.erase(0, bar + 3))
      specs.push_back(examples.substr(0, bar));
    specs.push_back(examples.substr(0, examples.find(' ')));
  }
  REQUIRE(specs.size() >= 13);  // exact, bf16, division, quant, lfc, hfc (2), pergroup, actnn, blpa, mesa, acgc, swap
  const int64_t most = ActivationCachePolicy::kMaxClosedFormElements;
  SaveInfo wide;
  wide.min_bits = 8;
  for (const std::string& spec : specs) {
    CAPTURE(spec);
    const auto policy = parse_policy(spec);
    // 2^60 elements: 8 bits each is 2^63, which a 64-bit count of bits wraps (blpa's, mesa's and actnn's did).
    const Shape past = {8, most};
    const std::string message = testing::error_of([&] { policy->expected_bytes(past); });
    CHECK(message.find("policy " + policy->name() + ": a float32 tensor of shape " + shape_str(past) +
                       " has more elements than the closed forms count (2^57)") == 0);
    CHECK(testing::error_of([&] { policy->layer_expected_bytes(past, wide); }) == message);
    CHECK(testing::error_of([&] { policy->expected_bytes({most + 1}); }).find("more elements than") != std::string::npos);
    CHECK(testing::error_of([&] { policy->expected_bytes({-1, 4, 16, 16}); })
              .find("shape dimensions must be >= 0, got (-1,4,16,16)") != std::string::npos);
    // A product past int64 is shape_numel's own refusal, not a wrapped count.
    CHECK(testing::error_of([&] { policy->expected_bytes({int64_t(1) << 32, int64_t(1) << 32}); })
              .find("has more elements than a 64-bit count holds") != std::string::npos);
    // Up to the bound every count grows with the shape (no wrap), and a normal shape is answered as before.
    // 8-bit codes (min_bits) are the widest count.
    const size_t at_most = policy->expected_bytes({8, most / 8}), half = policy->expected_bytes({8, most / 16});
    const size_t wide_most = policy->layer_expected_bytes({8, most / 8}, wide);
    const size_t wide_half = policy->layer_expected_bytes({8, most / 16}, wide);
    CHECK(policy->expected_bytes({2, 3, 32, 32}) == policy->layer_expected_bytes({2, 3, 32, 32}, {}));
    CHECK(policy->expected_bytes({3, 0, int64_t(1) << 62}) == 0);  // a zero extent holds nothing
    if (spec == "swap:P=2,F=64") {
      CHECK(at_most + wide_most == 0);  // swap keeps nothing on the device
    } else {
      CHECK(at_most > half);
      CHECK(half > 0);
      CHECK(wide_most > wide_half);
      CHECK(wide_most >= at_most);
      CHECK(policy->expected_bytes({2, 3, 32, 32}) > 0);
    }
  }
  // The per-group forms pad every row to whole groups: a huge G on short rows passes 64 bits far below 2^57
  // elements (pergroup's count of (2^36, 2) at G = 999999999 wrapped to 1.3e19 of a true 6.9e19).
  for (const char* spec : {"pergroup:G=999999999,Q=8", "actnn:G=999999992,Q=8", "acgc:E=0,I=100,G=999999999"}) {
    CAPTURE(spec);
    const auto policy = parse_policy(spec);
    CHECK(testing::error_of([&] { policy->expected_bytes({int64_t(1) << 36, 2}); })
              .find("padded to whole groups of G=99999999") != std::string::npos);
    CHECK(policy->expected_bytes({4, 2}) > 0);  // a short tensor is still answered
  }
}

TEST_CASE("policies: R rows per range keeps a min and step per row group, R >= H packs the one-range bytes") {
  const auto bytes_of = [](const Packed& p) {
    const Tensor& buffer = dynamic_cast<const PackedPlanes&>(p).buffer();
    const uint8_t* data = static_cast<const uint8_t*>(buffer.raw_data());
    return std::vector<uint8_t>(data, data + buffer.nbytes());
  };
  // R >= H: the geometry's one range per plane, so the whole buffer (LFC, min, step, codes) is the same.
  for (const auto& [shape, spec] : {std::pair<Shape, const char*>{{2, 5, 6}, "division:B=8,Q=2"},
                                    {{2, 3, 6, 10}, "division:B=4,Q=4"}, {{3, 10, 7}, "quant:Q=1"},
                                    {{2, 3, 6, 10}, "hfc:B=2,Q=2"}}) {
    CAPTURE(spec);
    const Tensor x = random_tensor(shape, 21);
    const auto one = parse_policy(spec);
    const auto rows = parse_policy(std::string(spec) + ",R=" + std::to_string(shape[shape.size() - 2]));
    const auto a = one->pack(x, {}, {3, 9}), b = rows->pack(x, {}, {3, 9});
    CHECK(bytes_of(*a) == bytes_of(*b));
    CHECK(one->unpack(*a, {}).to_vector() == rows->unpack(*b, {}).to_vector());
  }
  // A (B, T, D) map with one loud token: with R = 1 the other tokens keep their own, small steps.
  const int64_t T = 12, D = 16;
  Tensor x = random_tensor({2, T, D}, 4);
  float* v = x.data<float>();
  for (int64_t d = 0; d < D; ++d) v[3 * D + d] *= 100.f;  // token 3 of sample 0
  const auto sample = parse_policy("division:B=4,Q=2"), token = parse_policy("division:B=4,Q=2,R=1");
  const auto ps = sample->pack(x, {}, {1, 1}), pt = token->pack(x, {}, {1, 1});
  const auto& planes = dynamic_cast<const PackedPlanes&>(*pt);
  const float one_step = bf16_to_float(dynamic_cast<const PackedPlanes&>(*ps).steps()[0]);
  float loud = 0.f, quiet = 0.f;
  for (int64_t t = 0; t < T; ++t) {
    float& worst = t < 4 ? loud : quiet;
    worst = std::max(worst, bf16_to_float(planes.steps()[t]));
  }
  // Token 3's pool block (tokens 0..3) shares its mean, so its residuals are loud; the rest are not.
  CHECK(loud > 10.f * quiet);
  CHECK(loud <= one_step);
  // Error of the quiet tokens of sample 0 (tokens 4..11) under each layout: bounded by their own steps.
  const std::vector<float> xs = x.to_vector(), gs = sample->unpack(*ps, {}).to_vector(),
                           gt = token->unpack(*pt, {}).to_vector();
  float err_sample = 0.f, err_token = 0.f;
  for (int64_t i = 4 * D; i < T * D; ++i) {
    err_sample = std::max(err_sample, std::fabs(gs[i] - xs[i]));
    err_token = std::max(err_token, std::fabs(gt[i] - xs[i]));
  }
  CHECK(err_token <= quiet * 1.0001f);
  CHECK(err_token * 10.f < err_sample);
}

TEST_CASE("policies: ActivationPacked live bytes are the sum of the live packs' nbytes") {
  const int64_t live_before = live_bytes(), packed_before = packed_live_bytes();
  {
    std::vector<std::unique_ptr<Packed>> packs;
    int64_t sum = 0;
    for (const char* spec : kLossy) {
      const auto policy = parse_policy(spec);
      for (const Shape& shape : kShapes) {
        packs.push_back(policy->pack(random_tensor(shape, 2), {}, {}));
        sum += static_cast<int64_t>(packs.back()->nbytes());
        CHECK(packed_live_bytes() - packed_before == sum);
      }
    }
    packs.resize(packs.size() / 2);  // free half
    sum = 0;
    for (const auto& p : packs) sum += static_cast<int64_t>(p->nbytes());
    CHECK(packed_live_bytes() - packed_before == sum);
  }
  CHECK(packed_live_bytes() == packed_before);
  CHECK(live_bytes() == live_before);
}

TEST_CASE("policies: channel_reader reads unpack's channels where a policy has one, else nullptr") {
  const Tensor x = random_tensor({3, 5, 8, 8}, 13);
  for (const char* spec : {"division:B=8,Q=2", "quant:Q=4", "lfc:B=4", "hfc:B=8,Q=2", "hfc:B=8", "exact",
                           "pergroup:G=256,Q=2", "bf16", "division:B=8,Q=2,R=1"}) {
    INFO(spec);
    const auto policy = parse_policy(spec);
    const auto packed = policy->pack(x, {}, {5, 1});
    const std::vector<float> whole = policy->unpack(*packed, {}).to_vector();
    const auto reader = policy->channel_reader(*packed, {});
    const std::string name = std::string(spec).substr(0, std::string(spec).find(':'));
    // The codec policies decode a channel; exact keeps the tensor (nothing to decode), per-group codes
    // straddle channels and a full-precision HFC is an f32 copy; bf16 widens a channel's planes. Packs with
    // ranges per row group have no channel read (it decodes one range per plane; policies.h).
    const bool rows = std::string(spec).find("R=") != std::string::npos;
    const bool reads = (name == "division" || name == "quant" || name == "lfc" || std::string(spec) == "hfc:B=8,Q=2" ||
                        name == "bf16") && !rows;
    REQUIRE((reader != nullptr) == reads);
    if (!reads) continue;
    bool all_equal = true;
    for (int64_t c = 0; c < 5; ++c) {
      std::vector<float> channel(3 * 64, -1.f);
      reader->read(c, channel.data());
      for (int64_t n = 0; n < 3; ++n)
        for (int64_t e = 0; e < 64; ++e) all_equal = all_equal && channel[n * 64 + e] == whole[(n * 5 + c) * 64 + e];
    }
    CHECK(all_equal);
    // Not 4-D, or (the codecs) kept as a copy (1×1 maps): nullptr.
    CHECK(policy->channel_reader(*policy->pack(random_tensor({4, 64}, 3), {}, {5, 1}), {}) == nullptr);
    if (name != "bf16")
      CHECK(policy->channel_reader(*policy->pack(random_tensor({4, 8, 1, 1}, 3), {}, {5, 1}), {}) == nullptr);
  }
}

TEST_CASE("policies: unpack_blocked is unpack in 16-channel blocks where a policy writes it, else undefined") {
  const Tensor x = random_tensor({2, 32, 8, 8}, 12);
  for (const char* spec : {"division:B=8,Q=2", "quant:Q=4", "lfc:B=4", "hfc:B=8,Q=2", "hfc:B=8", "exact",
                           "pergroup:G=256,Q=2", "quant:Q=4,R=1"}) {
    INFO(spec);
    const auto policy = parse_policy(spec);
    const auto packed = policy->pack(x, {}, {5, 1});
    const std::vector<float> planes = policy->unpack(*packed, {}).to_vector();
    const Tensor blocked = policy->unpack_blocked(*packed, {}, 16);
    const std::string name = std::string(spec).substr(0, std::string(spec).find(':'));
    // The codec policies write blocks; exact (a reorder costs the same as writing blocks), per-group
    // codes, a full-precision HFC (an f32 copy) and ranges per row group leave it to the consumer.
    const bool writes = (name == "division" || name == "quant" || name == "lfc" || std::string(spec) == "hfc:B=8,Q=2") &&
                        std::string(spec).find("R=") == std::string::npos;
    REQUIRE(blocked.defined() == writes);
    if (!writes) continue;
    CHECK(blocked.shape() == Shape({2, 2, 8, 8, 16}));
    const std::vector<float> b = blocked.to_vector();
    bool all_equal = true;
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t c = 0; c < 32; ++c)
        for (int64_t e = 0; e < 64; ++e) all_equal = all_equal && b[((n * 2 + c / 16) * 64 + e) * 16 + c % 16] == planes[(n * 32 + c) * 64 + e];
    CHECK(all_equal);
    // Not whole channel blocks, not 4-D, or another block size: undefined.
    CHECK_FALSE(policy->unpack_blocked(*policy->pack(random_tensor({2, 24, 8, 8}, 3), {}, {5, 1}), {}, 16).defined());
    CHECK_FALSE(policy->unpack_blocked(*policy->pack(random_tensor({4, 64}, 3), {}, {5, 1}), {}, 16).defined());
    CHECK_FALSE(policy->unpack_blocked(*packed, {}, 8).defined());
  }
}

TEST_CASE("policies: packs are deterministic per (seed, stream) and keep no reference to x") {
  for (const char* spec : {"division:B=8,Q=2", "quant:Q=4", "hfc:B=4,Q=1", "pergroup:G=64,Q=2", "actnn:G=64,Q=2"}) {
    INFO(spec);
    const auto policy = parse_policy(spec);
    const Tensor x = random_tensor({2, 3, 14, 14}, 4);
    const long refs = x.storage().use_count();
    const auto a = policy->pack(x, {}, {7, 1}), b = policy->pack(x, {}, {7, 1}), c = policy->pack(x, {}, {7, 2});
    CHECK(x.storage().use_count() == refs);
    const auto bytes_of = [](const Packed& p) {
      const Tensor& buffer = dynamic_cast<const PackedPlanes*>(&p) ? dynamic_cast<const PackedPlanes&>(p).buffer()
                                                                   : dynamic_cast<const PackedGroups&>(p).buffer();
      const uint8_t* data = static_cast<const uint8_t*>(buffer.raw_data());
      return std::vector<uint8_t>(data, data + buffer.nbytes());
    };
    CHECK(bytes_of(*a) == bytes_of(*b));
    CHECK(bytes_of(*a) != bytes_of(*c));
    // A strided view packs like its contiguous copy.
    const Tensor strided = random_tensor({2, 14, 14, 3}, 4).permute({0, 3, 1, 2});
    REQUIRE(!strided.is_contiguous());
    CHECK(bytes_of(*policy->pack(strided, {}, {7, 1})) == bytes_of(*policy->pack(strided.contiguous(), {}, {7, 1})));
  }
}

// A volume (N, C, D, H, W), a 3-D convolution's save, is coded as the planes of its (N, C·D, H, W) view: the
// same bytes, so the same draws and the same decoded values.
TEST_CASE("policies: a 5-D save packs the bytes of its 4-D view, planes of its last two axes") {
  for (const char* spec : {"division:B=8,Q=2", "quant:Q=4", "lfc:B=4", "hfc:B=8,Q=2", "division:B=8,Q=2,R=3"}) {
    INFO(spec);
    const auto policy = parse_policy(spec);
    const Tensor x = random_tensor({2, 3, 4, 12, 10}, 8);
    const Tensor view = x.reshape({2, 12, 12, 10});
    const auto packed = policy->pack(x, {}, {5, 2}), packed_view = policy->pack(view, {}, {5, 2});
    const auto* a = dynamic_cast<const PackedPlanes*>(packed.get());
    const auto* b = dynamic_cast<const PackedPlanes*>(packed_view.get());
    REQUIRE(a != nullptr);
    REQUIRE(b != nullptr);
    CHECK(a->geometry().planes == 24);
    CHECK(a->nbytes() == policy->expected_bytes(x.shape()));
    CHECK(a->nbytes() < static_cast<size_t>(x.numel()) * 4);
    REQUIRE(a->buffer().nbytes() == b->buffer().nbytes());
    CHECK(std::memcmp(a->buffer().raw_data(), b->buffer().raw_data(), a->buffer().nbytes()) == 0);
    const Tensor out = policy->unpack(*a, {});
    CHECK(out.shape() == x.shape());
    CHECK(out.to_vector() == policy->unpack(*b, {}).to_vector());
  }
}

TEST_CASE("policies: 1x1 planes, D == 1 and other ranks pass through exactly as owned copies") {
  for (const char* spec : kLossy) {
    const auto policy = parse_policy(spec);
    for (const Shape& shape : {Shape{4, 3, 1, 1}, Shape{4, 1}, Shape{7}, Shape{2, 1, 2, 1, 1}}) {
      const bool per_group = std::string(spec).rfind("pergroup", 0) == 0 || std::string(spec).rfind("actnn", 0) == 0 ||
                             std::string(spec).rfind("acgc", 0) == 0;
      if (per_group && shape_numel(shape) != shape[0]) continue;  // groups span the whole sample
      INFO(spec);
      CAPTURE(shape_str(shape));
      Tensor x = random_tensor(shape, 6);
      const std::vector<float> original = x.to_vector();
      const auto packed = policy->pack(x, {}, {});
      CHECK(dynamic_cast<const PackedPassthrough*>(packed.get()) != nullptr);
      CHECK(packed->nbytes() == static_cast<size_t>(x.numel()) * 4);
      x.fill_(123.f);  // the pack must not see later writes to x
      CHECK(policy->unpack(*packed, {}).to_vector() == original);
    }
  }
}

TEST_CASE("policies: a save that names min_bits is coded at max(Q, min_bits), in the policy's own layout") {
  // SaveInfo::min_bits (a softmax output's kProbabilityBits): a Q-bit policy packs such a save exactly as
  // its own form with Q = max(Q, min_bits) would — same bytes — and says so in layer_expected_bytes.
  SaveInfo wide;
  wide.lossy_ok = true;
  wide.min_bits = 8;
  const std::vector<std::pair<const char*, const char*>> widened = {
      {"division:B=8,Q=2", "division:B=8,Q=8"}, {"division:B=8,Q=2,R=1", "division:B=8,Q=8,R=1"},
      {"quant:Q=1", "quant:Q=8"}, {"hfc:B=4,Q=4", "hfc:B=4,Q=8"}, {"pergroup:G=64,Q=2", "pergroup:G=64,Q=8"},
      {"actnn:G=64,Q=2", "actnn:G=64,Q=8"}, {"mesa:Q=4", "mesa:Q=8"}, {"blpa:Q=4", "blpa:Q=8"},
      // Already as wide, or no codes to widen: unchanged.
      {"division:B=8,Q=8", "division:B=8,Q=8"}, {"lfc:B=8", "lfc:B=8"}, {"hfc:B=8", "hfc:B=8"}};
  for (const Shape& shape : {Shape{2, 3, 10, 10}, Shape{3, 9, 16}}) {
    const Tensor x = random_tensor(shape, 4);
    for (const auto& [spec, as] : widened) {
      CAPTURE(spec);
      CAPTURE(shape_str(shape));
      const auto policy = parse_policy(spec), reference = parse_policy(as);
      const PackContext ctx{5, 7, 0};
      const auto packed = policy->pack(x, wide, ctx), want = reference->pack(x, {}, ctx);
      CHECK(packed->nbytes() == want->nbytes());
      CHECK(packed->nbytes() == policy->layer_expected_bytes(shape, wide));
      CHECK(policy->layer_expected_bytes(shape, {}) == policy->expected_bytes(shape));
      CHECK(policy->unpack(*packed, wide).to_vector() == reference->unpack(*want, {}).to_vector());
    }
  }
  // AC-GC picks 2, 4 or 8 bits per save; a save that asks for 8 gets 8 from its first pack on.
  const auto acgc = parse_policy("acgc:E=0,I=100,G=64");
  const Tensor x = random_tensor({2, 3, 10, 10}, 4);
  const auto packed = acgc->pack(x, wide, {5, 7, 0});
  CHECK(packed->nbytes() == parse_policy("pergroup:G=64,Q=8")->expected_bytes(x.shape()));
  CHECK(packed->nbytes() == acgc->layer_expected_bytes(x.shape(), wide));
}

TEST_CASE("policies: parse_policy accepts the documented forms and rejects the rest") {
  CHECK(parse_policy("division")->name() == "division:B=8,Q=2");
  CHECK(parse_policy("division:Q=4")->name() == "division:B=8,Q=4");
  CHECK(parse_policy("division:Q=4,B=12")->name() == "division:B=12,Q=4");
  CHECK(parse_policy("quant")->name() == "quant:Q=2");
  CHECK(parse_policy("lfc:B=4")->name() == "lfc:B=4");
  CHECK(parse_policy("hfc:B=8")->name() == "hfc:B=8");
  CHECK(parse_policy("hfc:Q=2")->name() == "hfc:B=8,Q=2");
  CHECK(parse_policy("pergroup")->name() == "pergroup:G=256,Q=2");
  CHECK(parse_policy("actnn")->name() == "actnn:G=256,Q=2");
  CHECK(parse_policy("actnn:Q=4")->name() == "actnn:G=256,Q=4");
  CHECK(parse_policy("blpa")->name() == "blpa:Q=4");
  CHECK(parse_policy("blpa:Q=8")->name() == "blpa:Q=8");
  CHECK(parse_policy("division:R=1")->name() == "division:B=8,Q=2,R=1");
  CHECK(parse_policy("hfc:R=4,Q=1")->name() == "hfc:B=8,Q=1,R=4");
  CHECK(parse_policy("exact")->is_exact());
  for (const char* spec : kLossy) CHECK(parse_policy(parse_policy(spec)->name())->name() == spec);

  for (const char* bad : {"division:B=0", "division:Q=3", "division:B=", "division:B=8,,Q=2", "division:B=8,",
                          "division:", "division:X=1", "division:B=8,B=4", "division:B=-1", "division:B=1e3",
                          "quant:B=8", "lfc:Q=2", "pergroup:G=0", "pergroup:B=8", "exact:Q=2", "divison", "",
                          "hfc:Q=16", "division:b=8", "actnn:G=12", "actnn:G=0", "actnn:Q=3", "actnn:B=8",
                          "blpa:Q=2", "blpa:Q=1", "blpa:Q=16", "blpa:G=256", "division:R=0", "lfc:R=1",
                          "hfc:B=8,R=1", "pergroup:R=1", "division:R=x"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_policy(bad), Error);
    try {
      parse_policy(bad);
    } catch (const Error& e) {
      const std::string message = e.what();
      CHECK(message.find("division:B=8,Q=2") != std::string::npos);
      CHECK(message.find("pergroup:G=256,Q=2") != std::string::npos);
      CHECK(message.find('\n') == std::string::npos);
    }
  }
  CHECK(policy_forms().find("hfc:B=8,Q=2") != std::string::npos);
}

TEST_CASE("policies: mesa keeps one range per head of a 4-D map over the batch and one per tensor otherwise") {
  const int64_t live_before = live_bytes();
  CHECK(parse_policy("mesa")->name() == "mesa:Q=8");
  CHECK(parse_policy("mesa:Q=4")->name() == "mesa:Q=4");
  CHECK_THROWS_AS(parse_policy("mesa:B=8"), Error);
  CHECK_THROWS_AS(parse_policy("mesa:Q=3"), Error);
  const auto mesa = parse_policy("mesa:Q=8");
  {
    // (B, heads, T, d) = (3, 4, 5, 6): head 2 a hundred times larger than the rest.
    Tensor x = random_tensor({3, 4, 5, 6}, 31);
    for (int64_t b = 0; b < 3; ++b) x.select(0, b).select(0, 2).mul_(100.f);
    const auto packed = mesa->pack(x, {}, {5, 1});
    CHECK(packed->shape() == Shape{3, 4, 5, 6});
    CHECK(packed->nbytes() == mesa->expected_bytes({3, 4, 5, 6}));
    CHECK(mesa->expected_bytes({3, 4, 5, 6}) == 4 * (3 * 5 * 6 + 4));  // 4 ranges of 90 one-byte codes
    const auto* groups = dynamic_cast<const PackedGroups*>(packed.get());
    REQUIRE(groups != nullptr);
    std::vector<float> steps(4);
    for (int h = 0; h < 4; ++h) steps[h] = bf16_to_float(groups->steps()[h]);
    CHECK(steps[2] > 30 * steps[0]);  // the large head has its own range ...
    CHECK(steps[1] < 2 * steps[0]);   // ... and does not coarsen the others
    const std::vector<float> got = mesa->unpack(*packed, {}).to_vector(), want = x.to_vector();
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const int64_t head = (static_cast<int64_t>(i) / 30) % 4;
      if (!(std::fabs(got[i] - want[i]) <= steps[head] * 1.0001f)) ++bad;
  }
  CHECK(bad == 0);
  // A token map (B, T, D): one range for the tensor.
  const Tensor t = random_tensor({2, 7, 9}, 32);
  const auto tp = mesa->pack(t, {}, {5, 2});
  CHECK(tp->nbytes() == static_cast<size_t>(2 * 7 * 9 + 4));
  const float step = bf16_to_float(dynamic_cast<const PackedGroups&>(*tp).steps()[0]);
  const std::vector<float> tg = mesa->unpack(*tp, {}).to_vector(), tw = t.to_vector();
  for (size_t i = 0; i < tg.size(); ++i) CHECK(std::fabs(tg[i] - tw[i]) <= step * 1.0001f);
  // A single value is an exact copy.
  CHECK(dynamic_cast<const PackedPassthrough*>(mesa->pack(random_tensor({1}, 33), {}, {}).get()) != nullptr);
  }
  CHECK(live_bytes() == live_before);
}

namespace {
double allocation_cost(const std::vector<double>& cost, const std::vector<uint8_t>& bits) {
  double sum = 0.0;
  for (size_t n = 0; n < cost.size(); ++n) {
    const double levels = (1 << bits[n]) - 1;
    sum += cost[n] / (levels * levels);
  }
  return sum;
}
}  // namespace

TEST_CASE("actnn: the bit allocation spends exactly N·Q bits on widths {1,2,4,8} and favours wide ranges") {
  std::mt19937 gen(5);
  std::lognormal_distribution<double> spread(0.0, 2.0);
  for (const int q : {1, 2, 4, 8}) {
    for (const size_t n : {size_t{1}, size_t{2}, size_t{3}, size_t{5}, size_t{7}, size_t{128}}) {
      CAPTURE(q);
      CAPTURE(n);
      std::vector<double> cost(n);
      for (double& c : cost) c = spread(gen);
      const std::vector<uint8_t> bits = allocate_sample_bits(cost, q);
      REQUIRE(bits.size() == n);
      int64_t total = 0;
      for (const uint8_t b : bits) {
        CHECK((b == 1 || b == 2 || b == 4 || b == 8));
        total += b;
      }
      CHECK(total == static_cast<int64_t>(n) * q);
      // Never worse than giving every sample Q bits (checked on these cases; the greedy is not exact).
      CHECK(allocation_cost(cost, bits) <= allocation_cost(cost, std::vector<uint8_t>(n, static_cast<uint8_t>(q))));
      // Equal costs, zero ones too, give every sample Q bits.
      CHECK(allocate_sample_bits(std::vector<double>(n, 2.5), q) == std::vector<uint8_t>(n, static_cast<uint8_t>(q)));
      CHECK(allocate_sample_bits(std::vector<double>(n, 0.0), q) == std::vector<uint8_t>(n, static_cast<uint8_t>(q)));
    }
  }
  // One wide sample among narrow ones takes the bits: 3 samples, 6 bits.
  CHECK(allocate_sample_bits({1.0, 1.0, 1e4}, 2) == std::vector<uint8_t>{1, 1, 4});
  CHECK(allocate_sample_bits({1e4, NAN, 1.0}, 2).size() == 3);  // a NaN range does not break the order
  CHECK_THROWS_AS(allocate_sample_bits({1.0}, 3), Error);
}

TEST_CASE("actnn: per-sample widths follow the sample ranges, bytes = the closed form of the allocation") {
  const int64_t live_before = live_bytes(), packed_before = packed_live_bytes();
  {
    const auto policy = parse_policy("actnn:G=256,Q=2");
    const auto& actnn = dynamic_cast<const AdaptiveGroupPolicy&>(*policy);
    // 8 samples of (16, 8, 8); sample 3 a hundred times wider, samples 5 and 6 a hundred times narrower.
    const Shape shape = {8, 16, 8, 8};
    Tensor x = random_tensor(shape, 41);
    x.select(0, 3).mul_(100.f);
    x.select(0, 5).mul_(0.01f);
    x.select(0, 6).mul_(0.01f);
    const auto packed = policy->pack(x, {}, {3, 7});
    const auto& groups = dynamic_cast<const PackedGroups&>(*packed);
    const std::vector<uint8_t>& bits = groups.sample_bits();
    REQUIRE(bits.size() == 8);
    int total = 0;
    for (const uint8_t b : bits) total += b;
    CHECK(total == 8 * 2);  // the average is Q
    CHECK(bits[3] > 2);
    CHECK(bits[5] == 1);
    CHECK(bits[6] == 1);
    // Measured bytes = the closed form for this allocation = the shape's closed form (G % 8 == 0).
    const int64_t K = 1024 / 256;
    int64_t codes = 0;
    for (const uint8_t b : bits) codes += K * 256 * b / 8;
    CHECK(packed->nbytes() == static_cast<size_t>(8 * K * 4 + codes + 8));
    CHECK(packed->nbytes() == actnn.bytes_for_widths(shape, bits));
    CHECK(packed->nbytes() == actnn.expected_bytes(shape));
    CHECK(packed_live_bytes() - packed_before == static_cast<int64_t>(packed->nbytes()));
    // The widths are in the pack itself (its last N bytes), so backward has what it needs.
    const uint8_t* buffer = static_cast<const uint8_t*>(groups.buffer().raw_data());
    CHECK(std::vector<uint8_t>(buffer + groups.nbytes() - 8, buffer + groups.nbytes()) == bits);
    // Each sample's error stays inside its own groups' steps: the narrow samples are not coarsened.
    const std::vector<float> got = policy->unpack(*packed, {}).to_vector(), want = x.to_vector();
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (!(std::fabs(got[i] - want[i]) <= element_bound(*packed, static_cast<int64_t>(i), std::fabs(want[i])))) ++bad;
    CHECK(bad == 0);
    // With equal ranges every sample has Q bits and the codes are pergroup's, byte for byte.
    const Tensor one = random_tensor({16, 8, 8}, 42);
    Tensor same = Tensor::empty({4, 16, 8, 8});
    for (int64_t n = 0; n < 4; ++n) same.select(0, n).copy_(one);
    const auto a = policy->pack(same, {}, {3, 7});
    const auto b = parse_policy("pergroup:G=256,Q=2")->pack(same, {}, {3, 7});
    const Tensor& ab = dynamic_cast<const PackedGroups&>(*a).buffer();
    const Tensor& bb = dynamic_cast<const PackedGroups&>(*b).buffer();
    REQUIRE(ab.nbytes() == bb.nbytes() + 4);
    CHECK(std::memcmp(ab.raw_data(), bb.raw_data(), bb.nbytes()) == 0);
  }
  CHECK(packed_live_bytes() == packed_before);
  CHECK(live_bytes() == live_before);
}

TEST_CASE("blpa: sign-preserving codes on a ±3σ grid per channel, midpoints within half a step") {
  const int64_t live_before = live_bytes(), packed_before = packed_live_bytes();
  {
    for (const int q : {4, 8}) {
      const auto policy = parse_policy("blpa:Q=" + std::to_string(q));
      for (const Shape& shape : {Shape{2, 3, 32, 32}, Shape{3, 5, 7, 7}, Shape{4, 3, 1, 1}, Shape{4, 10},
                                 Shape{2, 3, 5}, Shape{7}, Shape{3, 5, 4, 4}}) {
        CAPTURE(q);
        CAPTURE(shape_str(shape));
        const Tensor x = random_tensor(shape, 43);
        const auto packed = policy->pack(x, {}, {});
        const auto* blpa = dynamic_cast<const PackedBlpa*>(packed.get());
        REQUIRE(blpa != nullptr);
        // ceil(numel·Q/8) code bytes + 16 per channel (dim 1 of a map, else one).
        const int64_t channels = shape.size() == 4 ? shape[1] : 1, numel = shape_numel(shape);
        CHECK(packed->nbytes() == static_cast<size_t>((numel * q + 7) / 8 + 16 * channels));
        CHECK(packed->nbytes() == policy->expected_bytes(shape));
        CHECK(packed_live_bytes() - packed_before == static_cast<int64_t>(packed->nbytes()));
        const std::vector<float> got = policy->unpack(*packed, {}).to_vector(), want = x.to_vector();
        const int64_t inner = numel / (shape.size() == 4 ? shape[0] * channels : 1);
        int sign_flips = 0, bad = 0, clipped = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          const BlpaChannel& p = blpa->params()[(static_cast<int64_t>(i) / inner) % channels];
          if ((got[i] > 0.f) != (want[i] > 0.f)) ++sign_flips;
          const float k = std::ceil(want[i] / p.step) - 1.f;  // the cell of the value
          if (k + p.shift < 0.f || k + p.shift > static_cast<float>((1 << q) - 1)) {
            ++clipped;
            continue;
          }
          if (!(std::fabs(got[i] - want[i]) <= 0.5f * p.step * 1.0001f)) ++bad;
        }
        CHECK(sign_flips == 0);
        CHECK(bad == 0);
        CHECK(clipped * 50 <= static_cast<int>(got.size()));  // ±3σ holds nearly all of a normal sample
      }
    }
    // A ReLU output keeps its zeros exactly and its positives positive; deterministic (no randomness).
    const auto policy = parse_policy("blpa:Q=4");
    std::vector<float> values = random_tensor({4, 6, 8, 8}, 44).to_vector();
    for (float& v : values) v = std::max(v, 0.f);
    const Tensor r = Tensor::from_vector(values, {4, 6, 8, 8});
    const auto p1 = policy->pack(r, {}, {1, 1}), p2 = policy->pack(r, {}, {2, 9});
    const std::vector<float> got = policy->unpack(*p1, {}).to_vector(), want = r.to_vector();
    int zeros_kept = 0, zeros = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (want[i] == 0.f) ++zeros, zeros_kept += got[i] == 0.f;
    CHECK(zeros > 0);
    CHECK(zeros_kept == zeros);
    const Tensor& b1 = dynamic_cast<const PackedBlpa&>(*p1).buffer();
    const Tensor& b2 = dynamic_cast<const PackedBlpa&>(*p2).buffer();
    CHECK(std::memcmp(b1.raw_data(), b2.raw_data(), b1.nbytes()) == 0);
    // An empty tensor is an empty copy.
    CHECK(policy->pack(Tensor::zeros({0, 3}), {}, {})->nbytes() == 0);
    CHECK(policy->expected_bytes({0, 3}) == 0);
  }
  CHECK(packed_live_bytes() == packed_before);
  CHECK(live_bytes() == live_before);
}
