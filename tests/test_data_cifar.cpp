// Tests for data/cifar: CIFAR-10 / CIFAR-100 binary files written here with a few records are read
// back exactly (CHW pixels, labels, fine vs coarse, archive subfolders), and every malformed input
// is an Error naming the file; plus reflect padding and the CIFAR rows of data/transforms.
// Run: actlab_tests -tc='data: cifar*'
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <tuple>
#include <string>
#include <vector>

#include <sys/wait.h>

#include "actlab/core/allocator.h"
#include "temp_dir.h"
#include "actlab/data/cifar.h"
#include "actlab/data/dataloader.h"
#include "actlab/data/transforms.h"
#include "actlab/train/data_splits.h"
#include "actlab/train/trainer.h"
#include "tests/run_command.h"

using namespace actlab;
namespace fs = std::filesystem;

namespace {

using actlab::testing::TempDir;

using Bytes = std::vector<uint8_t>;
constexpr int64_t kPixels = 3 * 32 * 32;

// Pixel j (0..3071, plane-major as on disk) of record `r` of file `file`: varies with all three.
uint8_t cifar_pixel(int file, int64_t r, int64_t j) {
  return static_cast<uint8_t>((file * 101 + r * 13 + j * 7 + j / 1024) & 255);
}

// A record: the label bytes, then 3072 pixels.
void append_record(Bytes& b, const Bytes& label_bytes, int file, int64_t r) {
  b.insert(b.end(), label_bytes.begin(), label_bytes.end());
  for (int64_t j = 0; j < kPixels; ++j) b.push_back(cifar_pixel(file, r, j));
}

void write_file(const fs::path& path, const Bytes& b) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// CIFAR-10 label of record r of file f, and a file of n such records.
uint8_t label10(int f, int64_t r) { return static_cast<uint8_t>((f * 3 + r) % 10); }
Bytes cifar10_file(int f, int64_t n) {
  Bytes b;
  for (int64_t r = 0; r < n; ++r) append_record(b, {label10(f, r)}, f, r);
  return b;
}

// CIFAR-100: coarse and fine labels chosen to differ.
uint8_t coarse100(int f, int64_t r) { return static_cast<uint8_t>((f + 5 * r) % 20); }
uint8_t fine100(int f, int64_t r) { return static_cast<uint8_t>((f * 7 + 37 * r) % 100); }
Bytes cifar100_file(int f, int64_t n) {
  Bytes b;
  for (int64_t r = 0; r < n; ++r) append_record(b, {coarse100(f, r), fine100(f, r)}, f, r);
  return b;
}

// The CIFAR-10 file set in `dir`: batch k (1..5) holds counts[k-1] records, the test batch 3.
const int64_t kBatchRecords[5] = {3, 2, 1, 2, 4};
void write_cifar10(const fs::path& dir) {
  for (int k = 1; k <= 5; ++k)
    write_file(dir / ("data_batch_" + std::to_string(k) + ".bin"),
               cifar10_file(k, kBatchRecords[k - 1]));
  write_file(dir / "test_batch.bin", cifar10_file(0, 3));
}

void write_cifar100(const fs::path& dir) {
  write_file(dir / "train.bin", cifar100_file(1, 5));
  write_file(dir / "test.bin", cifar100_file(2, 2));
}

std::string cifar_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Image i of `ds` equals record r of file f, read with the on-disk plane layout: (c,y,x) is pixel
// c*1024 + y*32 + x.
bool image_is_record(const InMemoryImageDataset& ds, int64_t i, int f, int64_t r) {
  const uint8_t* img = ds.image_data(i);
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < 32; ++y)
      for (int64_t x = 0; x < 32; ++x)
        if (img[(c * 32 + y) * 32 + x] != cifar_pixel(f, r, c * 1024 + y * 32 + x)) return false;
  return true;
}

int64_t cifar_live_bytes() { return memory_stats().total.current; }

}  // namespace

TEST_CASE("data: cifar10 files round-trip exactly, in batch order") {
  const int64_t before = cifar_live_bytes();
  {
    TempDir dir;
    write_cifar10(dir / "");
    CHECK(cifar_files_present(dir.str(), 10));
    CHECK_FALSE(cifar_files_present(dir.str(), 100));
    const int64_t data_before = memory_stats()[MemTag::Data].current;
    const InMemoryImageDataset train = load_cifar10(dir.str(), /*train=*/true);
    CHECK(train.name() == "cifar10/train");
    REQUIRE(train.size() == 12);
    CHECK((train.spec().channels == 3 && train.spec().height == 32 && train.spec().width == 32));
    CHECK(train.spec().num_classes == 10);
    // Images and labels are the only allocations, both tagged Data.
    CHECK(memory_stats()[MemTag::Data].current - data_before == 12 * kPixels + 12 * 8);
    int64_t i = 0;
    for (int f = 1; f <= 5; ++f) {
      for (int64_t r = 0; r < kBatchRecords[f - 1]; ++r, ++i) {
        CHECK(image_is_record(train, i, f, r));
        CHECK(train.labels().data<int64_t>()[i] == label10(f, r));
      }
    }
    const InMemoryImageDataset test = load_cifar10(dir.str(), /*train=*/false);
    CHECK(test.name() == "cifar10/test");
    REQUIRE(test.size() == 3);
    for (int64_t r = 0; r < 3; ++r) {
      CHECK(image_is_record(test, r, 0, r));
      CHECK(test.get(r).label == label10(0, r));
    }
  }
  CHECK(cifar_live_bytes() == before);
}

TEST_CASE("data: cifar100 fine and coarse labels") {
  const int64_t before = cifar_live_bytes();
  {
    TempDir dir;
    write_cifar100(dir / "");
    CHECK(cifar_files_present(dir.str(), 100));
    CHECK_FALSE(cifar_files_present(dir.str(), 10));
    const InMemoryImageDataset fine = load_cifar100(dir.str(), /*train=*/true);
    const InMemoryImageDataset coarse = load_cifar100(dir.str(), /*train=*/true, /*coarse=*/true);
    CHECK(fine.name() == "cifar100/train");
    CHECK(coarse.name() == "cifar100/train-coarse");
    CHECK(fine.spec().num_classes == 100);
    CHECK(coarse.spec().num_classes == 20);
    REQUIRE(fine.size() == 5);
    REQUIRE(coarse.size() == 5);
    for (int64_t r = 0; r < 5; ++r) {
      CHECK(image_is_record(fine, r, 1, r));
      CHECK(image_is_record(coarse, r, 1, r));
      CHECK(fine.labels().data<int64_t>()[r] == fine100(1, r));
      CHECK(coarse.labels().data<int64_t>()[r] == coarse100(1, r));
    }
    const InMemoryImageDataset test = load_cifar100(dir.str(), /*train=*/false);
    REQUIRE(test.size() == 2);
    CHECK(image_is_record(test, 1, 2, 1));
    CHECK(test.get(1).label == fine100(2, 1));
  }
  CHECK(cifar_live_bytes() == before);
}

TEST_CASE("data: the spec known without reading the data is the one loading gives (--summary needs no data)") {
  TempDir ten, hundred;
  write_cifar10(ten / "");
  write_cifar100(hundred / "");
  TrainConfig c;
  for (const auto& [dataset, dir, coarse] : {std::make_tuple("cifar10", ten.str(), false),
                                             std::make_tuple("cifar100", hundred.str(), false),
                                             std::make_tuple("cifar100", hundred.str(), true),
                                             std::make_tuple("synthetic", std::string(), false)}) {
    c.dataset = dataset;
    c.data_dir = dir;
    c.cifar100_coarse = coarse;
    INFO(dataset, coarse ? " coarse" : "");
    const std::optional<ImageSpec> known = known_data_spec(c);
    REQUIRE(known.has_value());
    const ImageSpec loaded = load_data(c).train->spec();
    CHECK(known->channels == loaded.channels);
    CHECK(known->height == loaded.height);
    CHECK(known->width == loaded.width);
    CHECK(known->num_classes == loaded.num_classes);
  }
  c.dataset = "fashion-mnist";  // an IDX file's header holds its shape: no spec without it
  CHECK_FALSE(known_data_spec(c).has_value());
  // CIFAR that is not there yet: --summary prints the layer table all the same.
  c.dataset = "cifar10";
  c.data_dir = (ten / "absent").string();
  c.model = "resnet20";
  c.summary_only = true;
  CHECK_NOTHROW(train(c));
  c.summary_only = false;
  CHECK_THROWS(load_data(c));
}

TEST_CASE("data: cifar archive subfolders are found") {
  TempDir dir;
  write_cifar10(dir / "cifar-10-batches-bin");
  write_cifar100(dir / "cifar-100-binary");
  CHECK(cifar_files_present(dir.str(), 10));
  CHECK(cifar_files_present(dir.str(), 100));
  const InMemoryImageDataset c10 = load_cifar10(dir.str(), false);
  REQUIRE(c10.size() == 3);
  CHECK(image_is_record(c10, 2, 0, 2));
  const InMemoryImageDataset c100 = load_cifar100(dir.str(), true, true);
  REQUIRE(c100.size() == 5);
  CHECK(c100.get(4).label == coarse100(1, 4));
  // Files directly in the folder win over the subfolder.
  write_file(dir / "test_batch.bin", cifar10_file(7, 1));
  const InMemoryImageDataset direct = load_cifar10(dir.str(), false);
  REQUIRE(direct.size() == 1);
  CHECK(image_is_record(direct, 0, 7, 0));
  CHECK(cifar_error([] { cifar_files_present("/tmp", 11); }).find("10 or 100") !=
        std::string::npos);
}

TEST_CASE("data: cifar malformed files are errors naming the file") {
  const int64_t before = cifar_live_bytes();
  {
    TempDir dir;
    write_cifar10(dir / "");
    write_cifar100(dir / "");
    const std::string batch3 = (dir / "data_batch_3.bin").string();

    SUBCASE("truncated record") {
      Bytes b = cifar10_file(3, 2);
      b.resize(b.size() - 5);  // 6141 bytes
      write_file(batch3, b);
      const std::string msg = cifar_error([&] { load_cifar10(dir.str(), true); });
      CHECK(contains(msg, batch3));
      CHECK(contains(msg, "6141 bytes"));
      CHECK(contains(msg, "3073-byte"));
      CHECK(contains(msg, "1 records and 3068 bytes over"));
    }
    SUBCASE("oversized: a byte too many") {
      Bytes b = cifar100_file(1, 2);
      b.push_back(0);
      write_file(dir / "train.bin", b);
      const std::string msg = cifar_error([&] { load_cifar100(dir.str(), true); });
      CHECK(contains(msg, (dir / "train.bin").string()));
      CHECK(contains(msg, "6149 bytes"));
      CHECK(contains(msg, "3074-byte"));
      CHECK(contains(msg, "2 records and 1 bytes over"));
    }
    SUBCASE("empty file") {
      write_file(batch3, {});
      CHECK(contains(cifar_error([&] { load_cifar10(dir.str(), true); }), batch3 + ": empty"));
    }
    SUBCASE("CIFAR-10 label out of range") {
      Bytes b = cifar10_file(3, 3);
      b[1 * 3073] = 10;  // record 1
      write_file(batch3, b);
      const std::string msg = cifar_error([&] { load_cifar10(dir.str(), true); });
      CHECK(contains(msg, batch3));
      CHECK(contains(msg, "record 1 has label 10, must be < 10"));
    }
    SUBCASE("CIFAR-100 coarse and fine labels out of range, whichever is used") {
      Bytes b = cifar100_file(2, 2);
      b[1 * 3074] = 20;  // coarse label of record 1
      write_file(dir / "test.bin", b);
      const std::string msg = cifar_error([&] { load_cifar100(dir.str(), false); });
      CHECK(contains(msg, (dir / "test.bin").string()));
      CHECK(contains(msg, "record 1 has coarse label 20, must be < 20"));
      b[1 * 3074] = 0;
      b[0 * 3074 + 1] = 100;  // fine label of record 0
      write_file(dir / "test.bin", b);
      CHECK(contains(cifar_error([&] { load_cifar100(dir.str(), false, true); }),
                     "record 0 has fine label 100, must be < 100"));
    }
    SUBCASE("missing files") {
      fs::remove(batch3);
      fs::remove(dir / "data_batch_5.bin");
      CHECK_FALSE(cifar_files_present(dir.str(), 10));
      const std::string msg = cifar_error([&] { load_cifar10(dir.str(), true); });
      CHECK(contains(msg, "lacks data_batch_3.bin, data_batch_5.bin"));
      CHECK(contains(msg, "cifar-10-batches-bin"));
      CHECK(contains(msg, "scripts/get-cifar.sh cifar10"));
      // The test split needs only its own file.
      CHECK(load_cifar10(dir.str(), false).size() == 3);
      const std::string none =
          cifar_error([&] { load_cifar100((dir / "nowhere").string(), true); });
      CHECK(contains(none, "lacks train.bin"));
      CHECK(contains(none, "cifar-100-binary.tar.gz"));
    }
  }
  CHECK(cifar_live_bytes() == before);
}

TEST_CASE("data: cifar reflect padding mirrors without repeating the edge") {
  // src (C=1,H=3,W=4): row y = [10y+1, 10y+2, 10y+3, 10y+4].
  const int64_t H = 3, W = 4;
  std::vector<uint8_t> src(H * W);
  for (int64_t y = 0; y < H; ++y)
    for (int64_t x = 0; x < W; ++x) src[y * W + x] = static_cast<uint8_t>(10 * y + x + 1);
  TransformConfig cfg;
  cfg.crop_padding = 2;
  cfg.pad_mode = PadMode::Reflect;
  const PixelAffine affine = make_pixel_affine(cfg, 1);
  CHECK(affine.pad_mode == PadMode::Reflect);
  std::vector<float> out(H * W);
  auto grey = [&](int64_t i) { return std::lround(out[i] * 255.f); };

  SUBCASE("hand-worked windows") {
    // Padded row 0 (reflect, pad 2): [3 2 | 1 2 3 4 | 3 2]; padded rows: [r2 r1 | r0 r1 r2 | r1
    // r0].
    transform_image(out.data(), src.data(), 1, H, W, 2, SampleAugment{0, 0, false}, affine);
    // Window at (0,0): rows r2 r1 r0, columns [3 2 1 2].
    CHECK(std::vector<long>{grey(0), grey(1), grey(2), grey(3)} ==
          std::vector<long>{23, 22, 21, 22});
    CHECK(grey(2 * W + 0) == 3);
    transform_image(out.data(), src.data(), 1, H, W, 2, SampleAugment{4, 4, false}, affine);
    // Window at (4,4): rows r2 r1 r0 (padded rows 4..6), columns [3 4 3 2].
    CHECK(std::vector<long>{grey(0), grey(1), grey(2), grey(3)} ==
          std::vector<long>{23, 24, 23, 22});
    CHECK(grey(2 * W + 3) == 2);
    transform_image(out.data(), src.data(), 1, H, W, 2, SampleAugment{2, 3, true}, affine);
    // Window at (2,3): columns [2 3 4 3], flipped: [3 4 3 2].
    CHECK(std::vector<long>{grey(0), grey(1), grey(2), grey(3)} == std::vector<long>{3, 4, 3, 2});
  }
  SUBCASE("every window and flip matches an explicitly padded image") {
    const int64_t P = 2, PH = H + 2 * P, PW = W + 2 * P;
    std::vector<uint8_t> padded(PH * PW);  // built by mirroring coordinates one step at a time
    for (int64_t y = 0; y < PH; ++y) {
      for (int64_t x = 0; x < PW; ++x) {
        int64_t sy = y - P, sx = x - P;
        while (sy < 0 || sy >= H) sy = sy < 0 ? -sy : 2 * H - 2 - sy;
        while (sx < 0 || sx >= W) sx = sx < 0 ? -sx : 2 * W - 2 - sx;
        padded[y * PW + x] = src[sy * W + sx];
      }
    }
    for (int64_t cy = 0; cy <= 2 * P; ++cy)
      for (int64_t cx = 0; cx <= 2 * P; ++cx)
        for (bool flip : {false, true}) {
          transform_image(out.data(), src.data(), 1, H, W, P, SampleAugment{cy, cx, flip}, affine);
          for (int64_t y = 0; y < H; ++y)
            for (int64_t x = 0; x < W; ++x) {
              const int64_t wx = flip ? W - 1 - x : x;
              REQUIRE(grey(y * W + x) == padded[(y + cy) * PW + wx + cx]);
            }
        }
  }
  SUBCASE("padding must be smaller than the image") {
    CHECK(contains(cifar_error([&] {
                     transform_image(out.data(), src.data(), 1, H, W, 3, SampleAugment{}, affine);
                   }),
                   "reflect padding 3 needs images larger than the padding, got 3x4"));
  }
}

TEST_CASE("data: cifar transforms defaults and the loader's reflect padding") {
  // The constants of the official DIVISION training scripts (data/transforms.cpp's table).
  const ChannelStats& c10 = channel_stats("cifar10/train");
  CHECK(c10.mean[0] == doctest::Approx(0.4914f));
  CHECK(c10.std[1] == doctest::Approx(0.1994f));
  const ChannelStats& c100 = channel_stats("cifar100/train-coarse");
  CHECK(c100.mean[0] == doctest::Approx(125.3 / 255));
  CHECK(c100.mean[2] == doctest::Approx(113.9 / 255));
  CHECK(c100.std[0] == doctest::Approx(63.0 / 255));
  CHECK(c100.std[2] == doctest::Approx(66.7 / 255));
  const TransformConfig t10 = default_transforms("cifar10/train", true);
  const TransformConfig t100 = default_transforms("cifar100/train", true);
  CHECK(t10.pad_mode == PadMode::Zero);
  CHECK((t100.pad_mode == PadMode::Reflect && t100.crop_padding == 4 && t100.horizontal_flip));
  CHECK(default_transforms("cifar100/test", false).crop_padding == 0);

  // The DataLoader applies the config's padding mode: each batch image is transform_image with
  // reflect padding of its sample.
  const InMemoryImageDataset ds = make_synthetic_dataset(6, 3, 8, 8, 2, 4);
  DataLoader loader(ds, 6, /*shuffle=*/false, /*seed=*/9, false, t100);
  const PixelAffine affine = make_pixel_affine(t100, 3);
  loader.start_epoch(1);
  Batch batch;
  REQUIRE(loader.next(batch));
  std::vector<float> expect(3 * 8 * 8);
  for (int64_t i = 0; i < 6; ++i) {
    transform_image(expect.data(), ds.image_data(i), 3, 8, 8, 4, draw_augment(t100, 9, 1, i),
                    affine);
    CHECK(std::memcmp(expect.data(), batch.images.data<float>() + i * 192, 192 * sizeof(float)) ==
          0);
  }
}

namespace {
// The value of an environment variable, restored when the scope ends.
struct EnvScope {
  std::string name, old;
  bool had;
  EnvScope(const char* n, const char* value) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    if (value) ::setenv(n, value, 1);
    else ::unsetenv(n);
  }
  ~EnvScope() {
    if (had) ::setenv(name.c_str(), old.c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

// scripts/get-cifar.sh ARGS, its output (stdout and stderr) and exit status.
std::pair<std::string, int> get_cifar(const std::string& args) {
  testing::CommandOutput o =
      testing::run_command(std::string("bash ") + ACTLAB_SOURCE_DIR + "/scripts/get-cifar.sh " + args);
  if (!o.text.empty() && o.text.back() == '\n') o.text.pop_back();
  return {o.text, o.rc};
}

std::string script_default_dir() {
  const auto [out, rc] = get_cifar("where");
  REQUIRE(rc == 0);
  return out;
}
}  // namespace

TEST_CASE("data: scripts/get-cifar.sh takes only whole files as a data set already in place") {
  // An unpack cut short leaves the files there but short: the script must fetch again, not say "already in"
  // (offline here: the download from a missing mirror fails, with the advice of what to put where).
  TempDir dir;
  const fs::path folder = dir / "cifar-10-batches-bin";
  fs::create_directories(folder);
  const std::vector<std::string> files = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                          "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"};
  for (const auto& f : files) {
    std::ofstream(folder / f).close();
    fs::resize_file(folder / f, 30730000);  // 10000 records of 3073 bytes, sparse
  }
  EnvScope mirror("ACTLAB_CIFAR_URL", ("file://" + dir.str() + "/no-mirror").c_str());
  auto [out, rc] = get_cifar("cifar10 '" + dir.str() + "'");
  CHECK(rc == 0);
  CHECK(out.find("CIFAR-10 already in") != std::string::npos);
  fs::resize_file(folder / "test_batch.bin", 22511);  // cut mid-record, as a killed tar leaves it
  std::tie(out, rc) = get_cifar("cifar10 '" + dir.str() + "'");
  CHECK(rc == 1);
  CHECK(out.find("already in") == std::string::npos);
  CHECK(out.find("cannot download") != std::string::npos);
  fs::resize_file(folder / "test_batch.bin", 3073 * 5000);  // cut on a record boundary: readable, but short
  std::tie(out, rc) = get_cifar("cifar10 '" + dir.str() + "'");
  CHECK(rc == 1);
  CHECK(out.find("already in") == std::string::npos);
}

TEST_CASE("data: the default CIFAR directory is the per-user cache that scripts/get-cifar.sh fills") {
  EnvScope cifar("ACTLAB_CIFAR_DIR", nullptr), xdg("XDG_CACHE_HOME", nullptr), home("HOME", "/home/someone");
  CHECK(default_cifar_dir() == "/home/someone/.cache/actlab/cifar");
  CHECK(script_default_dir() == default_cifar_dir());
  {
    EnvScope x("XDG_CACHE_HOME", "/var/cache/u");
    CHECK(default_cifar_dir() == "/var/cache/u/actlab/cifar");
    CHECK(script_default_dir() == default_cifar_dir());
    EnvScope c("ACTLAB_CIFAR_DIR", "/data/cifar");
    CHECK(default_cifar_dir() == "/data/cifar");
    CHECK(script_default_dir() == default_cifar_dir());
  }
  // Never inside the source tree, whatever the working directory.
  CHECK(default_cifar_dir().rfind(ACTLAB_SOURCE_DIR, 0) != 0);
}
