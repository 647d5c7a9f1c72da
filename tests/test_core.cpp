// Tests of core/: Philox, bf16, Tensor views and copies, the tracking allocator.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "actlab/core/bf16.h"
#include "actlab/core/ops.h"
#include "actlab/core/philox.h"
#include "actlab/core/tensor.h"

using namespace actlab;

TEST_CASE("philox4x32-10 matches the published known-answer vectors") {
  // Salmon et al. (SC'11) / Random123 kat_vectors for philox4x32_10.
  Philox4 zero = philox4x32_10(Philox4{{0, 0, 0, 0}}, 0, 0);
  CHECK(zero.v[0] == 0x6627e8d5u);
  CHECK(zero.v[1] == 0xe169c58du);
  CHECK(zero.v[2] == 0xbc57ac4cu);
  CHECK(zero.v[3] == 0x9b00dbd8u);
  Philox4 ones = philox4x32_10(Philox4{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  CHECK(ones.v[0] == 0x408f276du);
  CHECK(ones.v[1] == 0x41c83b0eu);
  CHECK(ones.v[2] == 0xa20bc7c6u);
  CHECK(ones.v[3] == 0x6d5451fdu);
}

TEST_CASE("philox streams are uniform, reproducible and independent") {
  double sum = 0, sum2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double u = philox_uniform(7, 3, static_cast<uint64_t>(i));
    CHECK_MESSAGE((u >= 0.0 && u < 1.0), "draw ", i, " = ", u);
    sum += u;
    sum2 += u * u;
  }
  const double mean = sum / n, var = sum2 / n - mean * mean;
  CHECK(std::abs(mean - 0.5) < 0.005);
  CHECK(std::abs(var - 1.0 / 12.0) < 0.002);
  CHECK(philox_bits(1, 2, 3) == philox_bits(1, 2, 3));
  CHECK(philox_bits(1, 2, 3) != philox_bits(1, 3, 3));
  CHECK(philox_bits(1, 2, 3) != philox_bits(2, 2, 3));
  PhiloxStream s(5, 1);
  const uint32_t a = s.next_bits();
  CHECK(a == philox_bits(5, 1, 0));
  CHECK(s.offset() == 1);
  int hits[7] = {0};
  for (int i = 0; i < 7000; ++i) hits[s.next_below(7)]++;
  for (int h : hits) CHECK(std::abs(h - 1000) < 150);
}

TEST_CASE("bf16 rounds to nearest even and keeps specials") {
  CHECK(round_bf16(1.0f) == 1.0f);
  CHECK(round_bf16(1.0f + std::ldexp(1.0f, -8)) == 1.0f);                          // tie -> even (down)
  CHECK(round_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 1.0f + std::ldexp(1.0f, -6));  // tie -> even (up)
  CHECK(round_bf16(1.0f + std::ldexp(1.0f, -7)) == 1.0f + std::ldexp(1.0f, -7));    // representable
  CHECK(round_bf16(-2.5f) == -2.5f);
  CHECK(std::isinf(round_bf16(INFINITY)));
  CHECK(std::isnan(round_bf16(NAN)));
  for (float x : {0.1f, -3.7f, 123.456f, 1e-20f}) CHECK(std::abs(round_bf16(x) - x) <= std::abs(x) * std::ldexp(1.0f, -8));
}

TEST_CASE("tensor views share storage and index correctly") {
  PhiloxStream rng(1);
  Tensor t = Tensor::rand({2, 3, 4}, rng);
  Tensor s = t.slice(2, 1, 4, 2);  // columns 1, 3
  CHECK(s.shape() == Shape{2, 3, 2});
  CHECK(!s.is_contiguous());
  CHECK(s.at({1, 2, 1}) == t.at({1, 2, 3}));
  Tensor p = t.permute({2, 0, 1});
  CHECK(p.at({3, 1, 2}) == t.at({1, 2, 3}));
  Tensor c = p.contiguous();
  CHECK(c.is_contiguous());
  CHECK(c.at({3, 1, 2}) == t.at({1, 2, 3}));
  CHECK(t.select(1, 2).at({1, 0}) == t.at({1, 2, 0}));
  Tensor v = t.view({6, -1});
  CHECK(v.shape() == Shape{6, 4});
  CHECK(v.storage() == t.storage());
  CHECK_THROWS_AS(t.view({5, -1}), Error);
  CHECK_THROWS_AS(s.view({12}), Error);
  const uint64_t version = t.storage()->version();
  s.fill_(7.f);
  CHECK(t.storage()->version() > version);
  CHECK(t.at({0, 0, 1}) == 7.f);
  CHECK(t.at({0, 0, 0}) != 7.f);
}

TEST_CASE("a shape's element count: zero with any zero extent, and refused past a 64-bit count") {
  CHECK(shape_numel({}) == 1);
  CHECK(shape_numel({2, 3, 4}) == 24);
  // The zero decides, wherever it stands: the extents before it may not be refused as an overflow.
  CHECK(shape_numel({int64_t{1} << 40, 0, 3}) == 0);
  CHECK(shape_numel({3, int64_t{1} << 62, 0, 2}) == 0);
  CHECK_THROWS_WITH_AS(shape_numel({int64_t{1} << 40, int64_t{1} << 40}), doctest::Contains("more elements than a 64-bit count"),
                       Error);
}

TEST_CASE("view refuses a negative size other than the one inferred -1") {
  const Tensor t = Tensor::zeros({2, 3});
  CHECK(t.view({3, -1}).shape() == Shape{3, 2});
  CHECK_THROWS_WITH_AS(t.view({-2, -3}), doctest::Contains("negative size -2"), Error);
  CHECK_THROWS_WITH_AS(t.view({-1, -6}), doctest::Contains("negative size -6"), Error);
}

TEST_CASE("an out-of-range dim and an empty linear are refused naming what was asked") {
  const Tensor t = Tensor::zeros({2, 3});
  CHECK(t.size(-2) == 2);
  CHECK_THROWS_WITH_AS(t.size(-3), doctest::Contains("dim -3 out of range"), Error);  // said "dim -1"
  CHECK_THROWS_WITH_AS(t.size(2), doctest::Contains("2 dims: -2 .. 1"), Error);
  // No features in or out: the GEMM's leading dimensions would be 0 ("gemm: lda 0 < 0" before).
  CHECK_THROWS_WITH_AS(ops::linear_forward(Tensor::zeros({4, 0}), Tensor::zeros({5, 0}), Tensor()),
                       doctest::Contains("no input features"), Error);
  CHECK_THROWS_WITH_AS(ops::linear_forward(Tensor::zeros({4, 3}), Tensor::zeros({0, 3}), Tensor()),
                       doctest::Contains("no output features"), Error);
  // A float outside an integer type's range has no conversion (undefined behaviour): refused.
  Tensor bytes = Tensor::zeros({3}, DType::U8);
  CHECK(bytes.fill_(255.f).data<uint8_t>()[2] == 255);
  CHECK_THROWS_WITH_AS(bytes.fill_(300.f), doctest::Contains("fill_: 300 does not fit u8"), Error);
  CHECK_THROWS_WITH_AS(bytes.fill_(NAN), doctest::Contains("does not fit"), Error);
  CHECK_THROWS_WITH_AS(Tensor::zeros({2}, DType::I32).fill_(3e9f), doctest::Contains("does not fit"), Error);
  CHECK(bytes.data<uint8_t>()[0] == 255);  // nothing written
}

TEST_CASE("randn has the requested moments and is reproducible") {
  PhiloxStream a(3), b(3);
  Tensor x = Tensor::randn({100000}, a, 1.5f, 2.0f);
  Tensor y = Tensor::randn({100000}, b, 1.5f, 2.0f);
  const auto xv = x.to_vector(), yv = y.to_vector();
  CHECK(xv == yv);
  double m = 0, m2 = 0;
  for (float v : xv) { m += v; m2 += v * v; }
  m /= xv.size();
  const double sd = std::sqrt(m2 / xv.size() - m * m);
  CHECK(std::abs(m - 1.5) < 0.03);
  CHECK(std::abs(sd - 2.0) < 0.03);
}

TEST_CASE("the allocator accounts every byte by tag, peak and limit") {
  const MemoryStats base = memory_stats();
  reset_peak();
  {
    MemTagScope tag(MemTag::Workspace);
    Tensor a = Tensor::empty({1024});
    Tensor b = Tensor::empty_tagged({256}, MemTag::Grad);
    const MemoryStats s = memory_stats();
    CHECK(s[MemTag::Workspace].current - base[MemTag::Workspace].current == 4096);
    CHECK(s[MemTag::Grad].current - base[MemTag::Grad].current == 1024);
    CHECK(s.total.current - base.total.current == 5120);
    CHECK(s[MemTag::Workspace].alloc_count == base[MemTag::Workspace].alloc_count + 1);
  }
  const MemoryStats after = memory_stats();
  CHECK(after.total.current == base.total.current);
  CHECK(after.total.peak >= base.total.current + 5120);
  reset_peak();
  CHECK(memory_stats().total.peak == base.total.current);

  set_memory_limit(Device::cpu(), base.total.current + 1000);
  try {
    Tensor big = Tensor::empty({1000});
    FAIL("allocation over the limit did not throw");
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    CHECK(msg.find("out of memory") != std::string::npos);
    CHECK(msg.find("activation_packed") != std::string::npos);  // the stats table
    CHECK(msg.find("division") != std::string::npos);           // the hint
  }
  try {  // the data set is held whole: its hint is about its size, not the batch
    Tensor images = Tensor::empty_tagged({4000}, MemTag::Data, DType::U8);
    FAIL("allocation over the limit did not throw");
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    CHECK(msg.find("(data)") != std::string::npos);
    CHECK(msg.find("--image-size") != std::string::npos);
    CHECK(msg.find("smaller batch") == std::string::npos);
  }
  try {  // the model's own bytes: a smaller batch cannot help
    Tensor weights = Tensor::empty_tagged({4000}, MemTag::OptimState);
    FAIL("allocation over the limit did not throw");
  } catch (const OutOfMemory& e) {
    CHECK(std::string(e.what()).find("do not depend on the batch") != std::string::npos);
  }
  try {  // an operation's scratch: a compressing policy cannot shrink it (the codec already is one)
    Buffer scratch(4000);
    FAIL("allocation over the limit did not throw");
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    CHECK(msg.find("(workspace)") != std::string::npos);
    CHECK(msg.find("scratch space") != std::string::npos);
    CHECK(msg.find("--policy") == std::string::npos);
  }
  set_memory_limit(Device::cpu(), 0);
  CHECK(memory_stats().oom_count == base.oom_count + 4);
  CHECK(memory_stats().total.current == base.total.current);
  CHECK_THROWS_WITH_AS(set_memory_limit(Device::cpu(), -5), doctest::Contains("memory limit must be >= 0"), Error);
}

TEST_CASE("retag moves bytes between tags - Buffer frees on scope exit") {
  const MemoryStats base = memory_stats();
  {
    Tensor t = Tensor::full({10}, 3.f);
    t.storage()->retag(MemTag::Param);
    CHECK(memory_stats()[MemTag::Param].current - base[MemTag::Param].current == 40);
    CHECK(t.at({9}) == 3.f);
    Buffer buf(100);
    CHECK(memory_stats()[MemTag::Workspace].current - base[MemTag::Workspace].current == 100);
    Buffer moved = std::move(buf);
    CHECK(buf.data() == nullptr);
    CHECK(moved.size() == 100);
  }
  CHECK(memory_stats().total.current == base.total.current);
}

TEST_CASE("device strings parse and bad ones are refused") {
  CHECK(Device::parse("cpu") == Device::cpu());
  CHECK(Device::parse("cuda:1") == Device::cuda(1));
  CHECK(Device::parse("cuda").str() == "cuda:0");
  CHECK_THROWS_AS(Device::parse("gpu"), Error);
  CHECK_THROWS_AS(Device::parse("cuda:x"), Error);
}

TEST_CASE("an error keeps its message and the place that found it apart, what() is the two together") {
  try {
    ACTLAB_CHECK(1 + 1 == 3, "two is ", 2);
    FAIL("the check did not throw");
  } catch (const Error& e) {
    CHECK(e.message() == "two is 2");
    CHECK(e.where().rfind(" [test_core.cpp:", 0) == 0);
    CHECK(e.where().back() == ']');
    CHECK(std::string(e.what()) == e.message() + e.where());
  }
  try {
    detail::throw_out_of_memory(__FILE__, 7, "a 3 GiB buffer");
    FAIL("nothing thrown");
  } catch (const OutOfMemory& e) {
    CHECK(e.message().rfind("a 3 GiB buffer; out of memory: ", 0) == 0);
    CHECK(e.where() == " [test_core.cpp:7]");
  }
  const Error plain("no place");
  CHECK(plain.message() == "no place");
  CHECK(plain.where().empty());
}

TEST_CASE("borrowed storage: not counted, not freed, its owner released with it, copied when retagged") {
  auto owner_alive = std::make_shared<int>(0);
  std::weak_ptr<int> watch = owner_alive;
  std::vector<float> host = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  const int64_t live = memory_stats().total.current;
  {
    Tensor t = Tensor::borrow(host.data(), {2, 3}, DType::F32, owner_alive);
    owner_alive.reset();
    CHECK(t.data<float>() == host.data());          // no copy
    CHECK(memory_stats().total.current == live);    // not the allocator's bytes
    CHECK(t.storage()->borrowed());
    CHECK(t.to_vector() == host);
    CHECK_FALSE(watch.expired());                   // the tensor keeps the owner
    Tensor u = t;
    u.storage()->retag(MemTag::Activation);         // now a tracked copy
    CHECK_FALSE(t.storage()->borrowed());
    CHECK(t.data<float>() != host.data());
    CHECK(memory_stats().total.current == live + 24);
    CHECK(t.to_vector() == host);
    CHECK(watch.expired());                         // the borrowed memory is let go at once
  }
  CHECK(memory_stats().total.current == live);
  CHECK(host[0] == 1.f);  // never freed or written by actlab
}
