// The transformer ops (autograd/functions_token.cpp, core/cpu/kernels_token.cpp): GELU and LayerNorm
// against double-precision formulas, gradcheck through autograd, and what they keep for backward:
// every byte held after a forward is in the policy's report.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstring>

#include "actlab/autograd/functions.h"
#include "actlab/autograd/saved_tensor.h"
#include "actlab/autograd/tape.h"
#include "actlab/compress/policy.h"
#include "actlab/core/allocator.h"
#include "actlab/core/cpu/gemm.h"
#include "actlab/core/cpu/kernels.h"
#include "actlab/core/ops.h"
#include "actlab/core/precision.h"
#include "actlab/core/token_math.h"
#include "gradcheck.h"

using namespace actlab;
using actlab::testing::gradcheck;
using actlab::testing::param;

namespace {
double gelu_ref(double x, bool tanh_form) {
  return tanh_form ? 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)))
                   : 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}
}  // namespace

TEST_CASE("gelu: both forms match the formula in double, and gradcheck") {
  const Variable x = param({3, 7, 11}, 1, 2.f);
  for (const bool tanh_form : {false, true}) {
    CAPTURE(tanh_form);
    const auto got = gelu(x, tanh_form).data().to_vector();
    const auto in = x.data().to_vector();
    double worst = 0;
    for (size_t i = 0; i < in.size(); ++i) worst = std::max(worst, std::fabs(got[i] - gelu_ref(in[i], tanh_form)));
    CHECK(worst < 2e-6);
    Tape::current().clear();
    gradcheck([&](std::vector<Variable>& v) { return gelu(v[0], tanh_form); }, {param({2, 5, 6}, 2)}, 1e-2, 2e-2);
  }
}

TEST_CASE("layer_norm: each row normalised over the last dimension, and gradcheck of x, gamma and beta") {
  const Variable x = param({2, 5, 16}, 3, 3.f), g = param({16}, 4), b = param({16}, 5);
  const auto y = layer_norm(x, g, b).data().to_vector();
  const auto xv = x.data().to_vector(), gv = g.data().to_vector(), bv = b.data().to_vector();
  double worst = 0;
  for (int r = 0; r < 10; ++r) {
    double mean = 0, var = 0;
    for (int j = 0; j < 16; ++j) mean += xv[r * 16 + j] / 16.0;
    for (int j = 0; j < 16; ++j) var += (xv[r * 16 + j] - mean) * (xv[r * 16 + j] - mean) / 16.0;
    for (int j = 0; j < 16; ++j) {
      const double want = (xv[r * 16 + j] - mean) / std::sqrt(var + 1e-5) * gv[j] + bv[j];
      worst = std::max(worst, std::fabs(y[r * 16 + j] - want));
    }
  }
  CHECK(worst < 1e-5);
  Tape::current().clear();
  gradcheck([](std::vector<Variable>& v) { return layer_norm(v[0], v[1], v[2]); },
            {param({3, 4, 8}, 6), param({8}, 7), param({8}, 8)}, 1e-2, 3e-2);
  CHECK_THROWS_AS(layer_norm(param({2, 8}, 9), param({7}, 10), param({7}, 11)), Error);
  Tape::current().clear();  // the gradcheck's last forward stays recorded; later cases start from an empty tape
}

TEST_CASE("transformer ops keep for backward only what the policy reports: inputs packed, row statistics exact") {
  const PolicySet division(parse_policy("division:B=8,Q=2"));
  Variable x, g, b;
  {
    MemTagScope tag(MemTag::Param);  // weights, and a leaf input kept by reference like a parameter
    g = param({64}, 12);
    b = param({64}, 13);
  }
  x = param({4, 32, 64}, 14);  // (batch, tokens, width)
  CacheStats::global().reset();
  CacheStats::global().set_enabled(true);
  const int64_t before = memory_stats().total.current;
  Variable y;
  {
    ActivationCacheScope scope(division);
    MemTagScope tag(MemTag::Activation);
    y = layer_norm(gelu(x), g, b);
  }
  const int64_t held = memory_stats().total.current - before - static_cast<int64_t>(y.data().nbytes());
  int64_t reported = 0;
  bool gelu_lossy = false, ln_lossy = false, stats_exact = false;
  for (const auto& e : CacheStats::global().entries()) {
    reported += e.bytes_packed;
    // A (B, T, D) map is one plane per sample pooled along the tokens (docs/policies.md): 8.0x here.
    gelu_lossy = gelu_lossy || (e.op == "gelu.input" && e.lossy && e.bytes_packed * 4 < e.bytes_raw);
    ln_lossy = ln_lossy || (e.op == "layer_norm.normalized" && e.lossy && e.bytes_packed * 4 < e.bytes_raw);
    stats_exact = stats_exact || (e.op == "layer_norm.rstd" && !e.lossy && e.bytes_packed == 4 * 4 * 32);
  }
  CHECK(gelu_lossy);
  CHECK(ln_lossy);
  CHECK(stats_exact);
  CHECK(held == reported);  // nothing a backward needs is held outside the policy's report
  backward(y, Tensor::full(y.shape(), 1.f));
  CHECK(x.grad().defined());
  CHECK(g.grad().defined());
}

namespace {
std::vector<double> softmax_ref(const std::vector<float>& x, int64_t rows, int64_t d, double scale) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j < d; ++j) mx = std::max(mx, static_cast<double>(x[r * d + j]));
    for (int64_t j = 0; j < d; ++j) sum += std::exp(scale * (x[r * d + j] - mx));
    for (int64_t j = 0; j < d; ++j) y[r * d + j] = std::exp(scale * (x[r * d + j] - mx)) / sum;
  }
  return y;
}
}  // namespace

TEST_CASE("softmax: rows of softmax(scale·x) against double, large inputs do not overflow, and gradcheck") {
  const Variable x = param({2, 3, 5, 17}, 30, 3.f);
  for (const float scale : {1.f, 0.125f}) {
    CAPTURE(scale);
    const auto y = softmax(x, scale).data().to_vector();
    const auto ref = softmax_ref(x.data().to_vector(), 30, 17, scale);
    double worst = 0;
    for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::fabs(y[i] - ref[i]));
    CHECK(worst < 1e-6);
    Tape::current().clear();
    gradcheck([&](std::vector<Variable>& v) { return softmax(v[0], scale); }, {param({3, 4, 9}, 31)}, 1e-2, 2e-2);
  }
  const auto big = ops::softmax_forward(Tensor::from_vector({1000.f, 999.f, -1000.f}, {1, 3}), 1.f).to_vector();
  CHECK(big[0] == doctest::Approx(1 / (1 + std::exp(-1.0))).epsilon(1e-6));
  CHECK(big[2] == 0.f);
}

TEST_CASE("matmul: the four transpose cases against the reference GEMM loop, and gradcheck of both operands") {
  const int64_t batch = 6, M = 5, N = 7, K = 4;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      const Variable a = param(ta ? Shape{2, 3, K, M} : Shape{2, 3, M, K}, 40);
      const Variable b = param(tb ? Shape{2, 3, N, K} : Shape{2, 3, K, N}, 41);
      const Tensor c = matmul(a, b, ta, tb).data();
      CHECK(c.shape() == Shape{2, 3, M, N});
      std::vector<float> ref(static_cast<size_t>(batch * M * N));
      cpu::gemm_batched_ref(ta, tb, batch, M, N, K, a.data().data<float>(), b.data().data<float>(), ref.data());
      const auto got = c.to_vector();
      double worst = 0;
      for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(got[i] - ref[i])));
      CHECK(worst < 1e-5);
      Tape::current().clear();
      gradcheck([&](std::vector<Variable>& v) { return matmul(v[0], v[1], ta, tb); },
                {param(a.shape(), 42), param(b.shape(), 43)}, 1e-2, 2e-2);
    }
  }
  // One matrix (fewer than threads: the per-matrix loop threads the gemm itself); every path of gemm_batched
  // is compared with the spec in tests/test_cpu_conv.cpp.
  const Tensor a = param({1, 33, 20}, 44).data(), b = param({1, 20, 9}, 45).data();
  std::vector<float> ref(33 * 9);
  cpu::gemm_batched_ref(false, false, 1, 33, 9, 20, a.data<float>(), b.data<float>(), ref.data());
  const auto got = ops::matmul(a, b, false, false).to_vector();
  for (size_t i = 0; i < ref.size(); ++i) CHECK(got[i] == doctest::Approx(ref[i]).epsilon(1e-5));
  CHECK_THROWS_AS(ops::matmul(a, a, false, false), Error);  // inner sizes 20 vs 33
}

TEST_CASE("strided copies between layouts: the fast loop equals the element-at-a-time reference") {
  PhiloxStream rng(50);
  const Tensor x = Tensor::randn({3, 4, 5, 6}, rng);
  const std::vector<std::vector<int64_t>> orders = {{0, 2, 1, 3}, {3, 2, 1, 0}, {1, 0, 3, 2}, {0, 1, 3, 2}};
  for (const auto& order : orders) {
    const Tensor view = x.permute(order);
    const Tensor fast = view.contiguous();
    cpu::StridedCopy c;
    c.ndim = 4;
    for (int k = 0; k < 4; ++k) {
      c.shape[k] = view.shape()[k];
      c.src_strides[k] = view.strides()[k];
      c.dst_strides[k] = fast.strides()[k];
    }
    std::vector<float> ref(static_cast<size_t>(x.numel()));
    cpu::strided_copy_ref(ref.data(), view.raw_data(), c);
    CHECK(fast.to_vector() == ref);
    // and one value by hand: element (i0..i3) of the view is x at the permuted index
    CHECK(fast.at({1, 2, 3, 0}) == x.permute(order).at({1, 2, 3, 0}));
  }
  // 1- and 2-byte elements, and a strided destination (a slice of a bigger tensor)
  Tensor bytes = Tensor::empty({4, 6}, DType::U8);
  for (int i = 0; i < 24; ++i) bytes.data<uint8_t>()[i] = static_cast<uint8_t>(i * 7);
  const Tensor bt = bytes.permute({1, 0}).contiguous();
  CHECK(bt.data<uint8_t>()[1] == bytes.data<uint8_t>()[6]);
  Tensor wide = Tensor::zeros({4, 10});
  wide.slice(1, 2, 8).copy_(x.reshape({4, 90}).slice(1, 0, 6));
  CHECK(wide.at({3, 2}) == x.reshape({4, 90}).at({3, 0}));
  CHECK(wide.at({3, 8}) == 0.f);
}

TEST_CASE("strided copies: coalesce_dims keeps the element mapping and merges what both layouts run across") {
  PhiloxStream rng(51);
  const Tensor x = Tensor::randn({2, 1, 5, 3, 4}, rng);
  // Views of every kind a model copies: permutes, slices, a size-1 dim, a broadcast (stride 0).
  std::vector<Tensor> views = {x, x.permute({2, 0, 1, 4, 3}), x.permute({0, 1, 2, 4, 3}), x.slice(2, 1, 4),
                               x.reshape({10, 12}).slice(1, 2, 10), x.permute({3, 1, 0, 2, 4}).slice(0, 1, 3)};
  for (size_t v = 0; v < views.size(); ++v) {
    CAPTURE(v);
    const Tensor& view = views[v];
    cpu::StridedCopy c;
    c.ndim = static_cast<int>(view.dim());
    const Tensor dense = Tensor::empty(view.shape());
    for (int k = 0; k < c.ndim; ++k) {
      c.shape[k] = view.shape()[k];
      c.src_strides[k] = view.strides()[k];
      c.dst_strides[k] = dense.strides()[k];
    }
    const cpu::StridedCopy m = cpu::coalesce_dims(c);
    CHECK(m.ndim <= c.ndim);
    std::vector<float> want(static_cast<size_t>(view.numel())), got(want.size(), -1.f);
    cpu::strided_copy_ref(want.data(), view.raw_data(), c);
    cpu::strided_copy_ref(got.data(), view.raw_data(), m);
    CHECK(got == want);
  }
  // A contiguous copy becomes one run; a transpose of the last two dims keeps both; the size-1 dim goes.
  cpu::StridedCopy c;
  c.ndim = 3;
  const int64_t shape[3] = {3, 4, 5}, dense[3] = {20, 5, 1}, swapped[3] = {20, 1, 4};
  for (int k = 0; k < 3; ++k) {
    c.shape[k] = shape[k];
    c.dst_strides[k] = c.src_strides[k] = dense[k];
  }
  CHECK(cpu::coalesce_dims(c).ndim == 1);
  CHECK(cpu::coalesce_dims(c).shape[0] == 60);
  for (int k = 0; k < 3; ++k) c.src_strides[k] = swapped[k];
  CHECK(cpu::coalesce_dims(c).ndim == 3);
  c.shape[0] = 1;
  CHECK(cpu::coalesce_dims(c).ndim == 2);
}

TEST_CASE("shape ops: reshape, permute, split (one part unused), concat, add_rows and expand_rows gradcheck") {
  gradcheck([](std::vector<Variable>& v) { return permute(reshape(v[0], {2, 3, 4}), {2, 0, 1}); },
            {param({6, 4}, 60)});
  gradcheck([](std::vector<Variable>& v) {
    const auto parts = split(v[0], -1, {2, 3, 1});
    return concat({parts[2], parts[0]}, 1);  // parts[1] reaches no loss: its gradient is zero
  }, {param({3, 6}, 61)});
  gradcheck([](std::vector<Variable>& v) { return concat({v[0], v[1]}, 1); }, {param({2, 1, 4}, 62), param({2, 3, 4}, 63)});
  gradcheck([](std::vector<Variable>& v) { return add_rows(v[0], v[1]); }, {param({3, 5, 4}, 64), param({1, 5, 4}, 65)});
  gradcheck([](std::vector<Variable>& v) { return expand_rows(v[0], 4); }, {param({1, 2, 3}, 66)});
  CHECK_THROWS_AS(split(param({3, 6}, 67), 1, {2, 3}), Error);
  CHECK_THROWS_AS(concat({param({2, 3}, 68), param({3, 3}, 69)}, 1), Error);
  CHECK_THROWS_AS(add_rows(param({3, 4}, 70), param({2, 4}, 71)), Error);
}

TEST_CASE("drop_path zeroes whole samples with probability p, scales the rest, and backward reuses the draw") {
  const Variable x(Tensor::full({4000, 3}, 1.f), true);
  const Variable y = drop_path(x, 0.25f, true, 7, 0);
  const auto v = y.data().to_vector();
  int64_t dropped = 0;
  for (int64_t n = 0; n < 4000; ++n) {
    CHECK((v[n * 3] == 0.f || v[n * 3] == doctest::Approx(1 / 0.75f)));
    CHECK(v[n * 3] == v[n * 3 + 2]);  // one decision per sample
    dropped += v[n * 3] == 0.f;
  }
  CHECK(std::abs(static_cast<double>(dropped) / 4000 - 0.25) < 0.03);
  backward(y, Tensor::full(y.shape(), 1.f));
  CHECK(x.grad().to_vector() == v);  // d/dx of x·s is s, the same per-sample draw
  const Variable z(Tensor::full({8, 3}, 2.f), true);
  CHECK(drop_path(z, 0.25f, false, 7, 0).data().to_vector() == z.data().to_vector());  // eval: identity
  CHECK_THROWS_AS(drop_path(z, 1.f, true, 7, 0), Error);
}

TEST_CASE("linear on a (B, T, D) token map equals linear on its B·T rows, and gradcheck") {
  const Variable x = param({2, 5, 6}, 80), w = param({4, 6}, 81), b = param({4}, 82);
  const Tensor y3 = linear(x, w, b).data();
  const Tensor y2 = linear(Variable(x.data().reshape({10, 6})), w, b).data();
  CHECK(y3.shape() == Shape{2, 5, 4});
  CHECK(y3.to_vector() == y2.to_vector());
  Tape::current().clear();
  gradcheck([](std::vector<Variable>& v) { return linear(v[0], v[1], v[2]); },
            {param({2, 3, 6}, 83), param({4, 6}, 84), param({4}, 85)});
}

TEST_CASE("attention keeps its softmax output once: the softmax and the following matmul share one pack") {
  const PolicySet division(parse_policy("division:B=8,Q=2"));
  const Variable q = param({2, 3, 16, 8}, 90), k = param({2, 3, 16, 8}, 91), v = param({2, 3, 16, 8}, 92);
  CacheStats::global().reset();
  CacheStats::global().set_enabled(true);
  const int64_t before = memory_stats().total.current;
  Variable out;
  {
    ActivationCacheScope scope(division);
    MemTagScope tag(MemTag::Activation);
    out = matmul(softmax(matmul(q, k, false, true), 0.25f), v);
  }
  const int64_t held = memory_stats().total.current - before - static_cast<int64_t>(out.data().nbytes());
  int64_t reported = 0, softmax_bytes = 0;
  bool q_row = false, attn_shared = false;
  for (const auto& e : CacheStats::global().entries()) {
    reported += e.bytes_packed;
    if (e.op == "softmax.output") softmax_bytes += e.bytes_packed;
    // Both matmuls' first operands (q, then the softmax output) share one save path and get a row each: q's
    // pack, and the shared softmax pack listed with zero bytes, as it is held once.
    q_row = q_row || (e.op == "matmul.lhs" && e.packs == 1 && e.policy == "division:B=8,Q=2" &&
                      e.shape == Shape{2, 3, 16, 8} &&
                      e.bytes_packed == static_cast<int64_t>(division.default_policy().expected_bytes(e.shape)));
    attn_shared = attn_shared || (e.op == "matmul.lhs" && e.packs == 1 && e.policy == "division:B=8,Q=2 (shared)" &&
                                  e.shape == Shape{2, 3, 16, 16} && e.bytes_packed == 0);
  }
  CHECK(softmax_bytes > 0);
  CHECK(q_row);
  CHECK(attn_shared);
  CHECK(held == reported);
  backward(out, Tensor::full(out.shape(), 1.f));
  CHECK(q.grad().defined());
  CHECK(k.grad().defined());
  CHECK(v.grad().defined());
}

TEST_CASE("a save of a tensor already kept exact shares that keep, at every compute precision") {
  // '*/softmax/*=exact' keeps the probabilities exact; attn·v's save of them, under the default lossy policy,
  // must share that keep (f32, or the bf16/fp16 copy that is exact at those precisions), not pack a copy.
  const PolicySet rules = parse_policy_set("division:B=8,Q=2|*/softmax/*=exact");
  const SaveInfo softmax_out{"softmax", "output", true, "blocks.0.attn", kProbabilityBits};
  const SaveInfo product_lhs{"matmul", "lhs", true, "blocks.0.attn"};
  for (const Precision precision : {Precision::F32, Precision::BF16, Precision::F16}) {
    const std::string name = precision_name(precision);
    CAPTURE(name);
    PrecisionScope at(precision);
    ActivationCacheScope scope(rules);
    CacheStats::global().reset();
    CacheStats::global().set_enabled(true);
    Tensor probabilities;
    {
      MemTagScope tag(MemTag::Activation);
      probabilities = param({2, 3, 16, 16}, 95).data();
    }
    const SavedTensor kept(probabilities, softmax_out), read_again(probabilities, product_lhs);
    const auto entries = CacheStats::global().entries();
    REQUIRE(entries.size() == 2);
    CHECK(entries[0].op == "softmax.output");
    CHECK(entries[0].bytes_packed == (precision == Precision::F32 ? 4 : 2) * probabilities.numel());
    CHECK(entries[1].op == "matmul.lhs");
    CHECK(entries[1].policy == entries[0].policy + " (shared)");
    CHECK(entries[1].bytes_packed == 0);
    const Tensor a = read_again.unpack(), b = kept.unpack();
    REQUIRE(a.shape() == b.shape());
    CHECK(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
    end_pack_step();
  }
}

TEST_CASE("slice with a step, roll and gather_rows: values by hand and gradcheck") {
  const Variable x(Tensor::from_vector({0, 1, 2, 3, 4, 5}, {1, 6}), true);
  CHECK(slice(x, 1, 1, 6, 2).data().to_vector() == std::vector<float>{1, 3, 5});
  CHECK(roll(x, 2, 1).data().to_vector() == std::vector<float>{4, 5, 0, 1, 2, 3});
  CHECK(roll(x, -1, 1).data().to_vector() == std::vector<float>{1, 2, 3, 4, 5, 0});
  CHECK(roll(x, 6, 1).data().to_vector() == x.data().to_vector());
  Tape::current().clear();
  gradcheck([](std::vector<Variable>& v) { return slice(slice(v[0], 1, 0, 5, 2), 2, 1, 4, 2); }, {param({2, 5, 4}, 120)});
  gradcheck([](std::vector<Variable>& v) { return roll(roll(v[0], -2, 1), 3, 2); }, {param({2, 5, 4}, 121)});
  Tensor index = Tensor::empty({5}, DType::I64);
  const int64_t rows[] = {2, 0, 2, 1, 2};
  for (int i = 0; i < 5; ++i) index.data<int64_t>()[i] = rows[i];
  const Variable table = param({3, 4}, 122);
  const Tensor got = gather_rows(table, index).data();
  CHECK(got.at({0, 1}) == table.data().at({2, 1}));
  CHECK(got.at({3, 2}) == table.data().at({1, 2}));
  Tape::current().clear();
  gradcheck([&](std::vector<Variable>& v) { return gather_rows(v[0], index); }, {param({3, 4}, 123)});
  index.data<int64_t>()[4] = 3;
  CHECK_THROWS_AS(gather_rows(table, index), Error);  // outside the table
}

TEST_CASE("gelu: the oneDNN fast path equals the spec loop to a few f32 ulps, tails and odd lengths included") {
  // The spec loop calls libm's erff/tanhf/expf per element; the fast path evaluates vector polynomials, so
  // they are compared with a tolerance: 4e-6 of max(1, |value|), a few ulps of the larger of the two.
  PhiloxStream rng(141);
  const int64_t n = 100003;  // not a multiple of any vector width
  Tensor x = Tensor::randn({n}, rng, 0.f, 3.f);
  const Tensor dy = Tensor::randn({n}, rng);
  float* xs = x.data<float>();
  for (int64_t i = 0; i < 2001; ++i) xs[i] = -12.f + 0.012f * static_cast<float>(i);  // a sweep through both tails
  xs[2001] = 0.f;
  xs[2002] = -0.f;
  xs[2003] = 40.f;
  xs[2004] = -40.f;
  for (const bool tanh_form : {false, true}) {
    CAPTURE(tanh_form);
    std::vector<float> fast(n), ref(n), dfast(n), dref(n);
    cpu::gelu_forward(fast.data(), xs, n, tanh_form);
    cpu::gelu_forward_ref(ref.data(), xs, n, tanh_form);
    cpu::gelu_backward(dfast.data(), dy.data<float>(), xs, n, tanh_form);
    cpu::gelu_backward_ref(dref.data(), dy.data<float>(), xs, n, tanh_form);
    double worst = 0, dworst = 0;
    for (int64_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::fabs(fast[i] - ref[i]) / std::max(1.0, std::fabs(static_cast<double>(ref[i]))));
      dworst = std::max(dworst, std::fabs(dfast[i] - dref[i]) / std::max(1.0, std::fabs(static_cast<double>(dref[i]))));
    }
    MESSAGE("gelu fast vs spec, tanh form ", tanh_form, ": worst forward ", worst, ", backward ", dworst);
    CHECK(worst < 4e-6);
    CHECK(dworst < 4e-6);
    CHECK(fast[2003] == 40.f);  // the tails saturate: gelu(x) = x far right, 0 far left
    CHECK(fast[2004] == 0.f);
  }
}

TEST_CASE("LayerNorm backward and column sums: the chunked loops give the spec loops' bits") {
  PhiloxStream rng(142);
  for (const int64_t d : {192, 50, 7}) {  // whole chunks, a ragged last chunk, less than one chunk
    CAPTURE(d);
    const int64_t rows = 1000;
    const Tensor dy = Tensor::randn({rows, d}, rng), xhat = Tensor::randn({rows, d}, rng),
                 g = Tensor::randn({d}, rng), rstd = Tensor::randn({rows}, rng, 1.f, 0.1f);
    std::vector<float> dx1(rows * d), dx2(rows * d), dg1(d), dg2(d), db1(d), db2(d);
    cpu::layernorm_backward(dx1.data(), dg1.data(), db1.data(), dy.data<float>(), xhat.data<float>(), g.data<float>(),
                            rstd.data<float>(), rows, d);
    cpu::layernorm_backward_ref(dx2.data(), dg2.data(), db2.data(), dy.data<float>(), xhat.data<float>(),
                                g.data<float>(), rstd.data<float>(), rows, d);
    CHECK(dx1 == dx2);
    CHECK(dg1 == dg2);
    CHECK(db1 == db2);
    // column_sums adds in f32 in the spec's order (row chunks of token_math::kColumnChunk, 1000 rows: a
    // partial last chunk): the bits of the spec's walk down each column, and within the error bound of that
    // order, (chunk length + chunk count)·u·Σ|x|, of the exact sum
    std::vector<float> sums(d);
    cpu::column_sums(sums.data(), dy.data<float>(), rows, d);
    for (int64_t j = 0; j < d; ++j) {
      CHECK(sums[j] == token_math::column_sum(dy.data<float>(), j, rows, d));
      double exact = 0, magnitude = 0;
      for (int64_t r = 0; r < rows; ++r) {
        exact += dy.data<float>()[r * d + j];
        magnitude += std::abs(dy.data<float>()[r * d + j]);
      }
      const double steps = double(token_math::kColumnChunk + rows / token_math::kColumnChunk + 1);
      CHECK(std::abs(sums[j] - exact) <= steps * 0.5 * FLT_EPSILON * magnitude);
    }
  }
}

TEST_CASE("LayerNorm backward refuses an empty input, as the forward does") {
  const Tensor g = Tensor::full({4}, 1.f), rstd = Tensor::full({0}, 1.f);
  Tensor dgamma, dbeta;
  const Tensor empty = Tensor::zeros({0, 4});
  CHECK_THROWS_WITH_AS(ops::layernorm_backward(empty, empty, g, rstd, &dgamma, &dbeta),
                       doctest::Contains("layer_norm_backward: input"), Error);
  const Tensor no_features = Tensor::zeros({3, 0});
  CHECK_THROWS_WITH_AS(ops::layernorm_backward(no_features, no_features, Tensor::full({0}, 1.f), Tensor::full({3}, 1.f), &dgamma,
                                               &dbeta),
                       doctest::Contains("layer_norm_backward: input"), Error);
}

TEST_CASE("softmax and LayerNorm forward: the oneDNN fast paths equal the spec loops to f32 rounding") {
  PhiloxStream rng(140);
  const int64_t rows = 300, d = 50;
  const Tensor x = Tensor::randn({rows, d}, rng, 0.f, 4.f), dy = Tensor::randn({rows, d}, rng);
  for (const float scale : {1.f, 0.125f}) {
    CAPTURE(scale);
    std::vector<float> fast(rows * d), ref(rows * d), dfast(rows * d), dref(rows * d);
    cpu::softmax_forward(fast.data(), x.data<float>(), rows, d, scale);
    cpu::softmax_forward_ref(ref.data(), x.data<float>(), rows, d, scale);
    cpu::softmax_backward(dfast.data(), dy.data<float>(), ref.data(), rows, d, scale);
    cpu::softmax_backward_ref(dref.data(), dy.data<float>(), ref.data(), rows, d, scale);
    double worst = 0, dworst = 0;
    for (size_t i = 0; i < fast.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(fast[i] - ref[i])));
      dworst = std::max(dworst, static_cast<double>(std::fabs(dfast[i] - dref[i])));
    }
    CHECK(worst < 1e-6);
    CHECK(dworst < 1e-6);
  }
  const int64_t D = 192;
  const Tensor xs = Tensor::randn({rows, D}, rng, 3.f, 2.f), g = Tensor::randn({D}, rng), b = Tensor::randn({D}, rng);
  std::vector<float> y1(rows * D), y2(rows * D), h1(rows * D), h2(rows * D), m1(rows), m2(rows), r1(rows), r2(rows);
  cpu::layernorm_forward(y1.data(), h1.data(), m1.data(), r1.data(), xs.data<float>(), g.data<float>(), b.data<float>(),
                         rows, D, 1e-6f);
  cpu::layernorm_forward_ref(y2.data(), h2.data(), m2.data(), r2.data(), xs.data<float>(), g.data<float>(),
                             b.data<float>(), rows, D, 1e-6f);
  double worst = 0;
  for (size_t i = 0; i < y1.size(); ++i)
    worst = std::max({worst, static_cast<double>(std::fabs(y1[i] - y2[i])), static_cast<double>(std::fabs(h1[i] - h2[i]))});
  CHECK(worst < 2e-5);
  for (int64_t r = 0; r < rows; ++r) {
    CHECK(m1[r] == doctest::Approx(m2[r]).epsilon(1e-5));
    CHECK(r1[r] == doctest::Approx(r2[r]).epsilon(1e-5));
  }
  std::vector<float> y3(rows * D);  // without the x̂ output: the same y
  cpu::layernorm_forward(y3.data(), nullptr, m1.data(), r1.data(), xs.data<float>(), g.data<float>(), b.data<float>(), rows,
                         D, 1e-6f);
  CHECK(y3 == y1);
}
