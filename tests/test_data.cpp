// Tests for data/: IDX reading (raw, gzip, every malformed case), InMemoryImageDataset, the synthetic
// data set, transforms (crop/flip/normalize against hand-built images) and the DataLoader (coverage,
// determinism, error propagation, shutdown, memory). Run: actlab_tests -tc='data:*'
#include <doctest/doctest.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "actlab/core/allocator.h"
#include "temp_dir.h"
#include "actlab/data/dataloader.h"
#include "actlab/data/dataset.h"
#include "actlab/data/idx.h"
#include "actlab/data/transforms.h"
#include "tests/prerequisite.h"

using namespace actlab;
namespace fs = std::filesystem;

namespace {

using actlab::testing::TempDir;

using Bytes = std::vector<uint8_t>;

void put_be32(Bytes& b, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<uint8_t>(v >> shift));
}

uint8_t test_pixel(int64_t image, int64_t j) {
  return static_cast<uint8_t>((image * 31 + j * 7) & 255);
}

Bytes idx_images(uint32_t count, uint32_t rows, uint32_t cols) {
  Bytes b;
  put_be32(b, 0x00000803);
  put_be32(b, count);
  put_be32(b, rows);
  put_be32(b, cols);
  for (int64_t i = 0; i < count; ++i)
    for (int64_t j = 0; j < int64_t{rows} * cols; ++j) b.push_back(test_pixel(i, j));
  return b;
}

Bytes idx_labels(const std::vector<uint8_t>& labels) {
  Bytes b;
  put_be32(b, 0x00000801);
  put_be32(b, static_cast<uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

std::vector<uint8_t> test_labels(int n) {
  std::vector<uint8_t> l;
  for (int i = 0; i < n; ++i) l.push_back(static_cast<uint8_t>((i * 3) % 10));
  return l;
}

void write_raw(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

void write_gz(const std::string& path, const Bytes& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  gzclose(f);
}

Bytes read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The message of the actlab::Error that f throws ("<no error>" if none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

void check_error_names(const std::string& msg, const std::string& file,
                       const std::string& keyword) {
  INFO("message: ", msg);
  CHECK(msg.find(file) != std::string::npos);
  CHECK(msg.find(keyword) != std::string::npos);
}

// Sample i has pixels (i & 255, i >> 8, 7, 9) in a (1,2,2) image and label i % 5, so a batch without
// transforms reveals which samples it holds. Throws on read(throw_at) when throw_at >= 0.
class IndexDataset : public Dataset {
 public:
  explicit IndexDataset(int64_t n, int64_t throw_at = -1) : n_(n), throw_at_(throw_at) {}
  int64_t size() const override { return n_; }
  ImageSpec spec() const override { return {1, 2, 2, 5}; }
  std::string name() const override { return "index"; }
  int64_t read(int64_t i, uint8_t* px) const override {
    ACTLAB_CHECK(i != throw_at_, "simulated read failure at sample ", i);
    px[0] = static_cast<uint8_t>(i & 255);
    px[1] = static_cast<uint8_t>(i >> 8);
    px[2] = 7;
    px[3] = 9;
    return i % 5;
  }
 private:
  int64_t n_, throw_at_;
};

int64_t decode_index(const float* image) {
  return std::lround(image[0] * 255.f) + 256 * std::lround(image[1] * 255.f);
}

// Every batch of one epoch, in order.
std::vector<Batch> run_epoch(DataLoader& loader, int64_t epoch) {
  loader.start_epoch(epoch);
  std::vector<Batch> batches;
  Batch b;
  while (loader.next(b)) batches.push_back(b);
  return batches;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::equal(static_cast<const uint8_t*>(a.raw_data()),
                    static_cast<const uint8_t*>(a.raw_data()) + a.nbytes(),
                    static_cast<const uint8_t*>(b.raw_data()));
}

int64_t live_bytes() { return memory_stats().total.current; }

}  // namespace

TEST_CASE("data: IDX files round-trip exactly, raw and gzip") {
  const int64_t before = live_bytes();
  {
    TempDir dir;
    const Bytes images = idx_images(7, 5, 4);
    const Bytes labels = idx_labels(test_labels(7));
    write_raw(dir.file("raw-images"), images);
    write_raw(dir.file("raw-labels"), labels);
    write_gz(dir.file("gz-images.gz"), images);
    write_gz(dir.file("gz-labels.gz"), labels);
    REQUIRE(read_raw(dir.file("gz-images.gz"))[0] == 0x1f);  // really compressed
    for (const std::string prefix : {"raw", "gz"}) {
      CAPTURE(prefix);
      const std::string ext = prefix == "gz" ? ".gz" : "";
      const InMemoryImageDataset ds = load_idx_dataset(dir.file(prefix + "-images" + ext),
                                                       dir.file(prefix + "-labels" + ext));
      REQUIRE(ds.size() == 7);
      CHECK(ds.spec().channels == 1);
      CHECK(ds.spec().height == 5);
      CHECK(ds.spec().width == 4);
      CHECK(ds.spec().num_classes == 10);
      CHECK(ds.images().storage()->tag() == MemTag::Data);
      CHECK(ds.labels().storage()->tag() == MemTag::Data);
      for (int64_t i = 0; i < 7; ++i) {
        const Example ex = ds.get(i);
        CHECK(ex.label == (i * 3) % 10);
        for (int64_t j = 0; j < 20; ++j) CHECK(ex.pixels[j] == test_pixel(i, j));
      }
    }
    // Standard names: load_mnist finds t10k-*.gz when the raw files are absent.
    write_gz(dir.file("t10k-images-idx3-ubyte.gz"), images);
    write_gz(dir.file("t10k-labels-idx1-ubyte.gz"), labels);
    const InMemoryImageDataset test = load_mnist(dir.file(""), /*train=*/false);
    CHECK(test.name() == "mnist/test");
    CHECK(test.size() == 7);
    const std::string msg = error_of([&] { load_fashion_mnist(dir.file(""), /*train=*/true); });
    check_error_names(msg, "train-images-idx3-ubyte", "not found");
    CHECK_FALSE(idx_files_present(dir.file("")));
  }
  CHECK(live_bytes() == before);
}

TEST_CASE("data: malformed IDX files raise one error naming the file") {
  TempDir dir;
  const Bytes images = idx_images(6, 3, 3);
  const Bytes labels = idx_labels(test_labels(6));
  const std::string good_images = dir.file("good-images");
  const std::string good_labels = dir.file("good-labels");
  write_raw(good_images, images);
  write_raw(good_labels, labels);
  const std::string bad = dir.file("bad-file");
  auto load_bad_images = [&](const Bytes& b) {
    write_raw(bad, b);
    return error_of([&] { load_idx_dataset(bad, good_labels); });
  };
  auto load_bad_labels = [&](const Bytes& b) {
    write_raw(bad, b);
    return error_of([&] { load_idx_dataset(good_images, bad); });
  };

  SUBCASE("truncated images") {
    const std::string msg = load_bad_images(Bytes(images.begin(), images.end() - 5));
    check_error_names(msg, bad, "truncated");
    CHECK(msg.find("6 images of 3x3 (54 bytes) but only 49 bytes follow") != std::string::npos);
  }
  SUBCASE("truncated labels") {
    check_error_names(load_bad_labels(Bytes(labels.begin(), labels.end() - 1)), bad, "truncated");
  }
  SUBCASE("truncated header") {
    check_error_names(load_bad_images(Bytes(images.begin(), images.begin() + 10)), bad, "header");
  }
  SUBCASE("trailing bytes") {
    Bytes longer = images;
    longer.push_back(0);
    longer.push_back(0);
    check_error_names(load_bad_images(longer), bad, "2 extra");
    Bytes longer_labels = labels;
    longer_labels.push_back(1);
    check_error_names(load_bad_labels(longer_labels), bad, "trailing");
  }
  SUBCASE("wrong magic") {
    const std::string msg = error_of([&] { load_idx_dataset(good_labels, good_images); });
    check_error_names(msg, good_labels, "bad magic 0x00000801");
    CHECK(msg.find("labels file") != std::string::npos);
    Bytes wrong = images;
    wrong[3] = 0x02;
    check_error_names(load_bad_images(wrong), bad, "bad magic 0x00000802");
  }
  SUBCASE("zero dimension") {
    Bytes zero = idx_images(6, 3, 3);
    zero[11] = 0;  // rows = 0
    check_error_names(load_bad_images(zero), bad, "zero size");
  }
  SUBCASE("count mismatch") {
    const std::string msg = load_bad_labels(idx_labels(test_labels(5)));
    check_error_names(msg, good_images, "6 images");
    CHECK(msg.find(bad) != std::string::npos);
  }
  SUBCASE("label out of range") {
    std::vector<uint8_t> l = test_labels(6);
    l[4] = 10;
    check_error_names(load_bad_labels(idx_labels(l)), bad, "label 10 at index 4");
    l[4] = 3;  // 3 is fine for 10 classes but not for 3
    write_raw(bad, idx_labels(l));
    check_error_names(error_of([&] { load_idx_dataset(good_images, bad, 3); }), bad,
                      "out of range");
  }
  SUBCASE("missing file") {
    const std::string missing = dir.file("no-such-file");
    check_error_names(error_of([&] { load_idx_dataset(missing, good_labels); }), missing,
                      "not found");
    check_error_names(error_of([&] { load_idx_dataset(good_images, missing); }), missing,
                      "not found");
  }
  SUBCASE("empty file") { check_error_names(load_bad_images(Bytes{}), bad, "empty"); }
  SUBCASE("corrupt gzip") {
    const std::string gz = dir.file("images.gz");
    write_gz(gz, images);
    Bytes compressed = read_raw(gz);
    Bytes bad_crc = compressed;
    bad_crc[bad_crc.size() - 8] ^= 0xFF;  // the CRC-32 in the gzip trailer
    write_raw(gz, bad_crc);
    check_error_names(error_of([&] { load_idx_dataset(gz, good_labels); }), gz, "corrupt gzip");
    write_raw(gz, Bytes(compressed.begin(), compressed.begin() + compressed.size() / 2));
    check_error_names(error_of([&] { load_idx_dataset(gz, good_labels); }), gz, "corrupt gzip");
    Bytes bad_method = compressed;
    bad_method[2] = 0x07;  // compression method must be 8 (deflate)
    write_raw(gz, bad_method);
    check_error_names(error_of([&] { load_idx_dataset(gz, good_labels); }), gz, "corrupt gzip");
  }
  SUBCASE("multi-member gzip reads whole") {
    // Two gzip members back to back (cat a.gz b.gz): the trailer's size covers only the second.
    const std::string gz = dir.file("two-members.gz");
    write_gz(dir.file("first.gz"), Bytes(images.begin(), images.begin() + 30));
    write_gz(dir.file("second.gz"), Bytes(images.begin() + 30, images.end()));
    Bytes joined = read_raw(dir.file("first.gz"));
    const Bytes second = read_raw(dir.file("second.gz"));
    joined.insert(joined.end(), second.begin(), second.end());
    write_raw(gz, joined);
    const InMemoryImageDataset ds = load_idx_dataset(gz, good_labels);
    REQUIRE(ds.size() == 6);
    CHECK(ds.get(5).pixels[8] == test_pixel(5, 8));
  }
  SUBCASE("gzip payload is size-checked too") {
    const std::string gz = dir.file("short.gz");
    write_gz(gz, Bytes(images.begin(), images.end() - 9));
    check_error_names(error_of([&] { load_idx_dataset(gz, good_labels); }), gz, "truncated");
  }
}

TEST_CASE("data: InMemoryImageDataset validates its tensors") {
  const int64_t before = live_bytes();
  {
    Tensor images = Tensor::empty_tagged({3, 1, 2, 2}, MemTag::Data, DType::U8);
    Tensor labels = Tensor::empty_tagged({3}, MemTag::Data, DType::I64);
    std::fill(images.data<uint8_t>(), images.data<uint8_t>() + 12, uint8_t{5});
    labels.data<int64_t>()[0] = 0;
    labels.data<int64_t>()[1] = 1;
    labels.data<int64_t>()[2] = 4;
    CHECK(error_of([&] { InMemoryImageDataset("toy", images, labels, 4); })
              .find("toy: label 4 at index 2 is out of range [0, 4)") != std::string::npos);
    const InMemoryImageDataset ds("toy", images, labels, 5);
    CHECK(ds.get(2).label == 4);
    CHECK(error_of([&] { ds.get(3); }).find("index 3 out of range") != std::string::npos);
    CHECK(error_of([&] { InMemoryImageDataset("toy", labels, labels, 5); }).find("(N,C,H,W) u8") !=
          std::string::npos);
  }
  CHECK(live_bytes() == before);
}

TEST_CASE("data: synthetic data set is deterministic and learnable") {
  const InMemoryImageDataset a = make_synthetic_dataset(400, 2, 8, 8, 4, 11);
  const InMemoryImageDataset b = make_synthetic_dataset(400, 2, 8, 8, 4, 11);
  const InMemoryImageDataset c = make_synthetic_dataset(400, 2, 8, 8, 4, 12);
  CHECK(same_bytes(a.images(), b.images()));
  CHECK(same_bytes(a.labels(), b.labels()));
  CHECK_FALSE(same_bytes(a.images(), c.images()));
  // Nearest class mean, fitted on the first half, classifies the second half.
  const int64_t d = a.spec().image_bytes();
  std::vector<double> mean(4 * d, 0.0);
  std::vector<int> count(4, 0);
  for (int64_t i = 0; i < 200; ++i) {
    const Example ex = a.get(i);
    ++count[ex.label];
    for (int64_t j = 0; j < d; ++j) mean[ex.label * d + j] += ex.pixels[j];
  }
  for (int k = 0; k < 4; ++k) {
    REQUIRE(count[k] > 20);  // labels are spread over all classes
    for (int64_t j = 0; j < d; ++j) mean[k * d + j] /= count[k];
  }
  int correct = 0;
  for (int64_t i = 200; i < 400; ++i) {
    const Example ex = a.get(i);
    int best = 0;
    double best_dist = 1e300;
    for (int k = 0; k < 4; ++k) {
      double dist = 0;
      for (int64_t j = 0; j < d; ++j) dist += std::pow(ex.pixels[j] - mean[k * d + j], 2);
      if (dist < best_dist) best_dist = dist, best = k;
    }
    correct += best == ex.label;
  }
  CHECK(correct >= 190);
}

TEST_CASE("data: crop with zero padding, flip and normalize move the right pixels") {
  // src (C=2,H=3,W=4): value 10*(c*12 + y*4 + x) + 5, all distinct and non-zero.
  const int64_t C = 2, H = 3, W = 4;
  std::vector<uint8_t> src(C * H * W);
  for (int64_t i = 0; i < C * H * W; ++i) src[i] = static_cast<uint8_t>(10 * i + 5);
  auto px = [&](int64_t c, int64_t y, int64_t x) { return src[(c * H + y) * W + x] / 255.f; };
  std::vector<float> out(C * H * W);
  TransformConfig plain;
  plain.crop_padding = 2;
  const PixelAffine unit = make_pixel_affine(plain, C);

  SUBCASE("crop window down-right of centre shifts content up-left") {
    transform_image(out.data(), src.data(), C, H, W, 2, SampleAugment{3, 4, false}, unit);
    // dy = +1, dx = +2: out[y][x] = src[y+1][x+2]; the rest is zero padding.
    CHECK(out[0] == doctest::Approx(px(0, 1, 2)));
    CHECK(out[1] == doctest::Approx(px(0, 1, 3)));
    CHECK(out[2] == 0.f);
    CHECK(out[3] == 0.f);
    CHECK(out[1 * W + 0] == doctest::Approx(px(0, 2, 2)));
    for (int64_t x = 0; x < W; ++x) CHECK(out[2 * W + x] == 0.f);  // row 2 reads padded row 3
    CHECK(out[H * W + 1] == doctest::Approx(px(1, 1, 3)));        // channel 1 shifts alike
  }
  SUBCASE("crop window up-left shifts content down-right") {
    transform_image(out.data(), src.data(), C, H, W, 2, SampleAugment{0, 1, false}, unit);
    // dy = -2, dx = -1: out[y][x] = src[y-2][x-1].
    for (int64_t x = 0; x < W; ++x) CHECK(out[x] == 0.f);
    CHECK(out[2 * W + 0] == 0.f);
    CHECK(out[2 * W + 1] == doctest::Approx(px(0, 0, 0)));
    CHECK(out[2 * W + 3] == doctest::Approx(px(0, 0, 2)));
  }
  SUBCASE("centred window is the identity; flip mirrors columns") {
    transform_image(out.data(), src.data(), C, H, W, 2, SampleAugment{2, 2, false}, unit);
    for (int64_t i = 0; i < C * H * W; ++i) CHECK(out[i] == doctest::Approx(src[i] / 255.f));
    transform_image(out.data(), src.data(), C, H, W, 0, SampleAugment{0, 0, true}, unit);
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x)
          CHECK(out[(c * H + y) * W + x] == doctest::Approx(px(c, y, W - 1 - x)));
  }
  SUBCASE("flip after crop") {
    transform_image(out.data(), src.data(), C, H, W, 2, SampleAugment{2, 3, true}, unit);
    // The crop (dx = +1) gives row [s1 s2 s3 0]; flipped: [0 s3 s2 s1].
    CHECK(out[0] == 0.f);
    CHECK(out[1] == doctest::Approx(px(0, 0, 3)));
    CHECK(out[3] == doctest::Approx(px(0, 0, 1)));
  }
  SUBCASE("normalize, including the padding value") {
    TransformConfig norm;
    norm.crop_padding = 1;
    norm.mean = {0.5f, 0.25f};
    norm.std = {0.25f, 0.5f};
    const PixelAffine affine = make_pixel_affine(norm, C);
    transform_image(out.data(), src.data(), C, H, W, 1, SampleAugment{1, 0, false}, affine);
    CHECK(out[0] == doctest::Approx((0.f - 0.5f) / 0.25f));            // padding column
    CHECK(out[1] == doctest::Approx((px(0, 0, 0) - 0.5f) / 0.25f).epsilon(1e-6));
    CHECK(out[H * W + 2] == doctest::Approx((px(1, 0, 1) - 0.25f) / 0.5f).epsilon(1e-6));
  }
}

TEST_CASE("data: augmentation draws and normalization table") {
  TransformConfig cfg;
  cfg.crop_padding = 4;
  cfg.horizontal_flip = true;
  std::set<int64_t> offsets;
  int flips = 0;
  for (uint64_t i = 0; i < 4000; ++i) {
    const SampleAugment a = draw_augment(cfg, 5, 0, i);
    REQUIRE(a.crop_y >= 0);
    REQUIRE(a.crop_y <= 8);
    REQUIRE(a.crop_x >= 0);
    REQUIRE(a.crop_x <= 8);
    offsets.insert(a.crop_y);
    flips += a.flip;
  }
  CHECK(offsets.size() == 9);
  CHECK(flips > 1800);
  CHECK(flips < 2200);
  const SampleAugment x = draw_augment(cfg, 5, 3, 77), y = draw_augment(cfg, 5, 3, 77);
  CHECK((x.crop_y == y.crop_y && x.crop_x == y.crop_x && x.flip == y.flip));
  const SampleAugment none = draw_augment(TransformConfig{}, 5, 3, 77);
  CHECK((none.crop_y == 0 && none.crop_x == 0 && !none.flip));

  CHECK(channel_stats("fashion-mnist/train").mean[0] == doctest::Approx(0.2860f));
  CHECK(channel_stats("cifar10").std[2] == doctest::Approx(0.2010f));
  CHECK(error_of([] { channel_stats("imagenet"); }).find("known: fashion-mnist") !=
        std::string::npos);
  const TransformConfig cifar = default_transforms("cifar10/train", true);
  CHECK((cifar.crop_padding == 4 && cifar.horizontal_flip && cifar.mean.size() == 3));
  CHECK(default_transforms("mnist/train", true).crop_padding == 0);
  TransformConfig wrong;
  wrong.mean = {0.5f};
  wrong.std = {0.5f};
  CHECK(error_of([&] { validate_transforms(wrong, 3); }).find("1 channels, images have 3") !=
        std::string::npos);
}

TEST_CASE("data: DataLoader visits every sample exactly once per epoch") {
  const int64_t before = live_bytes();
  const int64_t data_before = memory_stats()[MemTag::Data].current;
  {
    const IndexDataset ds(103);
    for (const bool drop_last : {false, true}) {
      CAPTURE(drop_last);
      DataLoader loader(ds, 10, /*shuffle=*/true, 42, drop_last);
      CHECK(loader.num_batches() == (drop_last ? 10 : 11));
      const std::vector<Batch> batches = run_epoch(loader, 0);
      REQUIRE(static_cast<int64_t>(batches.size()) == loader.num_batches());
      const std::vector<int64_t> order = loader.epoch_order(0);
      std::set<int64_t> seen;
      int64_t position = 0;
      for (const Batch& b : batches) {
        CHECK(b.index == position / 10);
        CHECK(b.images.shape() == Shape{b.labels.size(0), 1, 2, 2});
        CHECK(b.images.storage()->tag() == MemTag::Data);
        for (int64_t i = 0; i < b.labels.size(0); ++i, ++position) {
          const int64_t sample = decode_index(b.images.data<float>() + 4 * i);
          CHECK(sample == order[position]);
          CHECK(b.labels.data<int64_t>()[i] == sample % 5);
          seen.insert(sample);
        }
      }
      CHECK(static_cast<int64_t>(seen.size()) == (drop_last ? 100 : 103));
      if (!drop_last) CHECK(batches.back().labels.size(0) == 3);
      Batch extra;
      CHECK_FALSE(loader.next(extra));  // stays at the end
    }
    DataLoader ordered(ds, 32, /*shuffle=*/false, 42);
    const std::vector<Batch> batches = run_epoch(ordered, 5);
    CHECK(decode_index(batches[1].images.data<float>()) == 32);
  }
  CHECK(live_bytes() == before);
  CHECK(memory_stats()[MemTag::Data].current == data_before);
}

TEST_CASE("data: DataLoader is deterministic for a seed, keyed by sample") {
  const InMemoryImageDataset ds = make_synthetic_dataset(70, 3, 8, 8, 4, 3);
  TransformConfig cfg;
  cfg.crop_padding = 2;
  cfg.horizontal_flip = true;
  cfg.mean = {0.5f, 0.4f, 0.3f};
  cfg.std = {0.2f, 0.3f, 0.4f};
  DataLoader a(ds, 16, true, 9, false, cfg, /*prefetch_depth=*/1);
  DataLoader b(ds, 16, true, 9, false, cfg, /*prefetch_depth=*/4);
  for (int64_t epoch : {0, 1}) {
    const std::vector<Batch> ba = run_epoch(a, epoch), bb = run_epoch(b, epoch);
    REQUIRE(ba.size() == bb.size());
    for (size_t i = 0; i < ba.size(); ++i) {
      CHECK(same_bytes(ba[i].images, bb[i].images));
      CHECK(same_bytes(ba[i].labels, bb[i].labels));
    }
  }
  CHECK(a.epoch_order(0) != a.epoch_order(1));
  DataLoader other_seed(ds, 16, true, 10, false, cfg);
  CHECK(other_seed.epoch_order(0) != a.epoch_order(0));

  // Each image is transform_image of its sample with draw_augment(seed, epoch, sample).
  const std::vector<Batch> batches = run_epoch(a, 2);
  const std::vector<int64_t> order = a.epoch_order(2);
  const PixelAffine affine = make_pixel_affine(cfg, 3);
  std::vector<float> expect(3 * 8 * 8);
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t sample = order[16 + i];
    transform_image(expect.data(), ds.image_data(sample), 3, 8, 8, 2,
                    draw_augment(cfg, 9, 2, sample), affine);
    CHECK(std::equal(expect.begin(), expect.end(), batches[1].images.data<float>() + i * 192));
    CHECK(batches[1].labels.data<int64_t>()[i] == ds.labels().data<int64_t>()[sample]);
  }
}

TEST_CASE("data: DataLoader rejects bad arguments") {
  const IndexDataset ds(50);
  CHECK(error_of([&] { DataLoader(ds, 0, true, 1); }).find("batch size must be >= 1, got 0") !=
        std::string::npos);
  check_error_names(error_of([&] { DataLoader(ds, 64, true, 1, /*drop_last=*/true); }), "64",
                    "no batches");
  CHECK(DataLoader(ds, 64, true, 1, /*drop_last=*/false).num_batches() == 1);
  CHECK(error_of([&] { DataLoader(ds, 8, true, 1, false, {}, 0); }).find("prefetch depth") !=
        std::string::npos);
  TransformConfig rgb;
  rgb.mean = {0.1f, 0.2f, 0.3f};
  rgb.std = {1.f, 1.f, 1.f};
  CHECK(error_of([&] { DataLoader(ds, 8, true, 1, false, rgb); }).find("3 channels") !=
        std::string::npos);
  DataLoader loader(ds, 8, true, 1);
  Batch b;
  CHECK(error_of([&] { loader.next(b); }).find("before start_epoch") != std::string::npos);
  CHECK(error_of([&] { loader.start_epoch(-1); }).find("epoch must be >= 0") != std::string::npos);
}

TEST_CASE("data: DataLoader carries worker exceptions to the consumer") {
  const int64_t before = live_bytes();
  {
    const IndexDataset ds(100, /*throw_at=*/37);
    DataLoader loader(ds, 10, /*shuffle=*/false, 1);
    for (int round = 0; round < 2; ++round) {  // a new epoch after a failure works the same way
      loader.start_epoch(round);
      Batch b;
      int delivered = 0;
      std::string msg;
      try {
        while (loader.next(b)) ++delivered;
      } catch (const Error& e) {
        msg = e.what();
      }
      CHECK(delivered == 3);  // batches 0..2 precede sample 37
      CHECK(msg.find("simulated read failure at sample 37") != std::string::npos);
      CHECK_FALSE(loader.next(b));
    }
  }
  CHECK(live_bytes() == before);
}

TEST_CASE("data: DataLoader shuts down cleanly mid-epoch") {
  const int64_t before = live_bytes();
  {
    const InMemoryImageDataset ds = make_synthetic_dataset(500, 1, 16, 16, 10, 1);
    const int64_t with_dataset = live_bytes();
    {
      DataLoader untouched(ds, 8, true, 1);
      untouched.start_epoch(0);  // destroyed while the worker waits on a full queue
    }
    {
      DataLoader partial(ds, 8, true, 1, false, {}, 3);
      partial.start_epoch(0);
      Batch b;
      REQUIRE(partial.next(b));
      partial.start_epoch(1);  // abandons epoch 0
      REQUIRE(partial.next(b));
      CHECK(b.index == 0);
      CHECK(same_bytes(b.labels, run_epoch(partial, 1).front().labels));
    }
    { DataLoader never_started(ds, 8, true, 1); }
    CHECK(live_bytes() == with_dataset);
  }
  CHECK(live_bytes() == before);
}

TEST_CASE("data: Fashion-MNIST from Debian's dataset-fashion-mnist package") {
  const char* previous = std::getenv("ACTLAB_FASHION_MNIST_DIR");
  const std::string saved = previous ? previous : "";
  setenv("ACTLAB_FASHION_MNIST_DIR", "/elsewhere", 1);
  CHECK(default_fashion_mnist_dir() == "/elsewhere");
  if (previous) setenv("ACTLAB_FASHION_MNIST_DIR", saved.c_str(), 1);
  else unsetenv("ACTLAB_FASHION_MNIST_DIR");

  const std::string dir = default_fashion_mnist_dir();
  if (!testing::have_prerequisite(idx_files_present(dir), "no Fashion-MNIST IDX files in " + dir +
                                      " (install Debian's dataset-fashion-mnist or set ACTLAB_FASHION_MNIST_DIR)"))
    return;
  const InMemoryImageDataset train = load_fashion_mnist(dir, true);
  const InMemoryImageDataset test = load_fashion_mnist(dir, false);
  CHECK(train.size() == 60000);
  CHECK(test.size() == 10000);
  for (const InMemoryImageDataset* ds : {&train, &test}) {
    const ImageSpec s = ds->spec();
    CHECK((s.channels == 1 && s.height == 28 && s.width == 28 && s.num_classes == 10));
    std::vector<int64_t> per_class(10, 0);
    for (int64_t i = 0; i < ds->size(); ++i) ++per_class[ds->labels().data<int64_t>()[i]];
    for (int64_t k = 0; k < 10; ++k) CHECK(per_class[k] == ds->size() / 10);  // balanced splits
  }
  CHECK(train.name() == "fashion-mnist/train");
}
