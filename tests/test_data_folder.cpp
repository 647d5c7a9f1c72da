// Tests for data/image_folder: trees of PNG/JPEG files written here with stb_image_write are
// decoded back (exact pixels for PNG, close for JPEG, grey <-> RGB), the resize/crop kernel is
// checked on images whose result is worked out by hand, the split is stratified and deterministic,
// and every bad tree is an Error naming the culprit. Run: actlab_tests -tc='data: image folder*'
#include <doctest/doctest.h>

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
#include "image_files.h"
#include "temp_dir.h"
#include "actlab/data/image_folder.h"
#include "actlab/data/transforms.h"

using namespace actlab;
namespace fs = std::filesystem;

namespace {

using actlab::testing::TempDir;

using actlab::testing::Bytes;
using actlab::testing::Hwc;
using actlab::testing::pattern_image;
using actlab::testing::two_halves;
using actlab::testing::write_jpg;
using actlab::testing::write_png;
using actlab::testing::write_text;

std::string folder_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Image i of ds (C,H,W) equals `img` (H,W,C) exactly.
bool image_equals(const InMemoryImageDataset& ds, int64_t i, const Hwc& img) {
  const uint8_t* p = ds.image_data(i);
  for (int ch = 0; ch < img.c; ++ch)
    for (int y = 0; y < img.h; ++y)
      for (int x = 0; x < img.w; ++x)
        if (p[(ch * img.h + y) * img.w + x] !=
            img.px[(static_cast<size_t>(y) * img.w + x) * img.c + ch])
          return false;
  return true;
}

int64_t folder_live_bytes() { return memory_stats().total.current; }

ImageFolderOptions crop_only(int64_t channels, int64_t size) {
  ImageFolderOptions o;
  o.channels = channels;
  o.size = size;
  o.resize = ResizeMode::CropOnly;
  return o;
}

}  // namespace

TEST_CASE("data: image folder train/test layout decodes PNGs exactly, classes sorted") {
  const int64_t before = folder_live_bytes();
  {
    TempDir root;
    // Classes created out of order; each train class has two images, named out of order.
    const char* classes[3] = {"zebra", "ant", "mouse"};
    for (int k = 0; k < 3; ++k) {
      write_png(root / "train" / classes[k] / "b.png", pattern_image(6, 6, 3, 2 * k + 1));
      write_png(root / "train" / classes[k] / "a.PNG", pattern_image(6, 6, 3, 2 * k));
    }
    write_png(root / "test/zebra/x.png", pattern_image(6, 6, 3, 9));
    write_png(root / "test/ant/y.png", pattern_image(6, 6, 3, 8));
    write_text(root / "train/ant/notes.txt", "not an image");
    write_text(root / "train/ant/.DS_Store", "hidden");
    const int64_t data_before = memory_stats()[MemTag::Data].current;
    const ImageFolderData data = load_image_folder(root.str(), crop_only(3, 6));
    CHECK(memory_stats()[MemTag::Data].current - data_before == 8 * 3 * 36 + 8 * 8);
    CHECK(data.class_names == std::vector<std::string>{"ant", "mouse", "zebra"});
    REQUIRE(data.train.size() == 6);
    CHECK(data.train.spec().num_classes == 3);
    CHECK(data.test.spec().num_classes == 3);
    CHECK(data.train.name() == fs::path(root.str()).filename().string() + "/train");
    // Ordered by class, then file name: ant/a (id 2), ant/b (3), mouse/a (4), mouse/b (5), ...
    const int ids[6] = {2, 3, 4, 5, 0, 1};
    for (int64_t i = 0; i < 6; ++i) {
      CHECK(data.train.labels().data<int64_t>()[i] == i / 2);
      CHECK(image_equals(data.train, i, pattern_image(6, 6, 3, ids[i])));
    }
    REQUIRE(data.test.size() == 2);
    CHECK(data.test.get(0).label == 0);  // ant
    CHECK(data.test.get(1).label == 2);  // zebra keeps train's index
    CHECK(image_equals(data.test, 1, pattern_image(6, 6, 3, 9)));
    REQUIRE(data.warnings.size() == 1);
    CHECK(has(data.warnings[0], "ignored 1 entry"));
    CHECK(has(data.warnings[0], "notes.txt"));
  }
  CHECK(folder_live_bytes() == before);
}

TEST_CASE("data: an image folder's fingerprint is pinned, for every spelling of its root") {
  // Checkpoints store it (train/data_splits.h) and refuse to resume on another value, so a change to how
  // it is computed would turn every saved folder run away. The value is what the first version (paths
  // made relative with fs::path::lexically_relative) gave for this tree; only names and labels count.
  TempDir dir;
  const fs::path root = dir.path() / "root";
  for (const char* f : {"train/cat/a.png", "train/dog/b.png", "train/dog/c.jpg", "test/cat/d.png", "test/dog/e.png"}) {
    fs::create_directories((root / f).parent_path());
    write_text(root / f, "");  // listing opens no file
  }
  for (const std::string& spelling : {root.string(), root.string() + "/", root.string() + "//", root.string() + "/./"}) {
    CAPTURE(spelling);
    CHECK(list_image_folder(spelling, {}).fingerprint == 0x22ba2abd73beec39ull);
  }
  write_text(root / "train/cat/f.png", "");  // one more file: another value
  CHECK(list_image_folder(root.string(), {}).fingerprint != 0x22ba2abd73beec39ull);
}

TEST_CASE("data: image folder grey and RGB conversion, JPEG") {
  TempDir root;
  Hwc grey = pattern_image(5, 5, 1, 1);
  Hwc rgb{5, 5, 3, Bytes(75)};
  for (int y = 0; y < 5; ++y)
    for (int x = 0; x < 5; ++x) {
      const uint8_t v = static_cast<uint8_t>(40 * y + x);
      rgb.at(y, x, 0) = rgb.at(y, x, 1) = rgb.at(y, x, 2) = v;  // grey content stored as RGB
    }
  rgb.at(0, 0, 0) = 255, rgb.at(0, 0, 1) = 0, rgb.at(0, 0, 2) = 0;  // one pure red pixel
  write_png(root / "train/a/grey.png", grey);
  write_png(root / "train/b/rgb.png", rgb);
  Hwc flat_rgb{16, 16, 3, Bytes(16 * 16 * 3)};
  for (size_t i = 0; i < flat_rgb.px.size(); ++i)
    flat_rgb.px[i] = i % 3 == 0 ? 200 : i % 3 == 1 ? 90 : 30;
  Hwc flat_grey{16, 16, 1, Bytes(256, 120)};
  write_jpg(root / "test/a/flat.jpg", flat_rgb);
  write_jpg(root / "test/b/flat.JPEG", flat_grey);

  SUBCASE("RGB output: grey replicated, colour kept") {
    const ImageFolderData data = load_image_folder(root.str(), crop_only(3, 5));
    const Example g = data.train.get(0);
    for (int c = 0; c < 3; ++c)
      for (int i = 0; i < 25; ++i) REQUIRE(g.pixels[c * 25 + i] == grey.px[i]);
    CHECK(image_equals(data.train, 1, rgb));
    const Example jpg = data.test.get(0);  // a lossy flat colour: close, not exact
    for (int i = 0; i < 25; ++i) {
      CHECK(std::abs(jpg.pixels[i] - 200) <= 4);
      CHECK(std::abs(jpg.pixels[25 + i] - 90) <= 4);
      CHECK(std::abs(jpg.pixels[50 + i] - 30) <= 4);
    }
    CHECK(std::abs(data.test.get(1).pixels[70] - 120) <= 2);
  }
  SUBCASE("grey output: luma of RGB, grey kept") {
    const ImageFolderData data = load_image_folder(root.str(), crop_only(1, 5));
    CHECK(image_equals(data.train, 0, grey));
    const Example g = data.train.get(1);
    for (int i = 1; i < 25; ++i) REQUIRE(g.pixels[i] == rgb.px[3 * i]);  // r = g = b: itself
    CHECK(std::abs(g.pixels[0] - 76) <= 2);  // pure red: luma 0.299 * 255
    // Luma of (200, 90, 30) is about 117.
    CHECK(std::abs(data.test.get(0).pixels[0] - 117) <= 5);
  }
}

TEST_CASE("data: image folder resize and crop on hand-worked images") {
  SUBCASE("two colours, shorter side scaled, centre crop") {
    // 8 x 16 (h x w): left half (x < 8) colour A, right half colour B. Size 4: scale 1/2, resized
    // 4 x 8, centre crop columns 2..5 = source columns 4..11: two columns of A, then two of B.
    const uint8_t A[3] = {250, 10, 60}, B[3] = {0, 130, 255};
    const Hwc img = two_halves(8, 16, A, B);
    for (ResizeMode mode : {ResizeMode::Area, ResizeMode::Bilinear}) {
      Bytes out(3 * 16, 1);
      resize_to_square(out.data(), img.px.data(), 8, 16, 3, 4, mode);
      for (int c = 0; c < 3; ++c)
        for (int y = 0; y < 4; ++y)
          for (int x = 0; x < 4; ++x) REQUIRE(out[(c * 4 + y) * 4 + x] == (x < 2 ? A[c] : B[c]));
    }
    // Crop only: the centred 4 x 4 window of the 8 x 16 image is columns 6..9, rows 2..5.
    Bytes out(3 * 16);
    resize_to_square(out.data(), img.px.data(), 8, 16, 3, 4, ResizeMode::CropOnly);
    for (int x = 0; x < 4; ++x) CHECK(out[(0 * 4 + 3) * 4 + x] == (x < 2 ? A[0] : B[0]));
  }
  SUBCASE("area averaging weighs covered fractions") {
    // 3 x 3 -> 2 x 2: each output pixel covers 1.5 x 1.5 source pixels, weights (1, 0.5) / 1.5
    // or (0.5, 1) / 1.5 per axis:
    //   out(0,0) = (p00 + p01/2 + p10/2 + p11/4) / 2.25 = (90 + 90 + 18 + 0) / 2.25 = 88
    //   out(0,1) = (p01/2 + p02 + p11/4 + p12/2) / 2.25 = 90 / 2.25 = 40
    //   out(1,0) = (p10/2 + p11/4 + p20 + p21/2) / 2.25 = 18 / 2.25 = 8, out(1,1) = 0.
    const Bytes src = {90, 180, 0, 36, 0, 0, 0, 0, 0};
    Bytes out(4);
    resize_to_square(out.data(), src.data(), 3, 3, 1, 2, ResizeMode::Area);
    CHECK(out == Bytes{88, 40, 8, 0});
  }
  SUBCASE("bilinear enlarging interpolates between pixel centres") {
    // 1 x 2 -> shorter side 2: resized 2 x 4. Row [0, 200] sampled at x' = (x + 0.5)/2 - 0.5 =
    // -0.25 (clamped to 0), 0.25, 0.75, 1.25 (clamped to 1): [0, 50, 150, 200]; crop columns 1..2.
    const Bytes src = {0, 200};
    Bytes out(4);
    for (ResizeMode mode : {ResizeMode::Bilinear, ResizeMode::Area}) {  // Area enlarges bilinearly
      resize_to_square(out.data(), src.data(), 1, 2, 1, 2, mode);
      CHECK(out == Bytes{50, 150, 50, 150});
    }
  }
  SUBCASE("torchvision's geometry: the longer side truncated, the crop offset rounded half to even") {
    // 3 x 4 -> shorter side 2: int(2 * 4 / 3) = 2 columns (rounding would give 3), sampled at
    // x' = (x + 0.5) * 4/2 - 0.5 = 0.5, 2.5 of the row [0, 60, 120, 180]: 30 and 150.
    const Bytes src = {0, 60, 120, 180, 0, 60, 120, 180, 0, 60, 120, 180};
    Bytes out(4);
    resize_to_square(out.data(), src.data(), 3, 4, 1, 2, ResizeMode::Bilinear);
    CHECK(out == Bytes{30, 150, 30, 150});
    // Centre crop 1 of 4 columns: round(3 / 2) = 2 (half to even), as torchvision's CenterCrop.
    Bytes one(1);
    resize_to_square(one.data(), src.data(), 1, 4, 1, 1, ResizeMode::CropOnly);
    CHECK(one[0] == 120);
    // The shorter side resized past the crop first (Resize(256) + CenterCrop(224) in small): 2 x 4 with
    // shorter side 3 -> 3 x 6, crop 2 x 2 at offset round(1/2) = 0 rows and round(4/2) = 2 columns.
    const Bytes ramp = {0, 40, 80, 120, 0, 40, 80, 120};
    Bytes crop(4);
    resize_to_square(crop.data(), ramp.data(), 2, 4, 1, 2, ResizeMode::Bilinear, 3);
    // columns 2, 3 of 6 sample x' = (x + 0.5) * 4/6 - 0.5 = 1.1667, 1.8333: 46.67 -> 47, 73.33 -> 73
    CHECK(crop == Bytes{47, 73, 47, 73});
    CHECK(has(folder_error([&] { resize_to_square(crop.data(), ramp.data(), 2, 4, 1, 2, ResizeMode::Bilinear, 1); }),
              "below the 2 crop"));
  }
  SUBCASE("crop-only needs a large enough image") {
    Bytes out(9);
    const Bytes src(4, 0);
    CHECK(has(folder_error([&] {
                resize_to_square(out.data(), src.data(), 2, 2, 1, 3, ResizeMode::CropOnly);
              }),
              "centre crop of 3x3 from a smaller 2x2 image"));
  }
}

TEST_CASE("data: image folder single tree split is stratified and deterministic") {
  TempDir root;
  // Grey 3 x 3 images whose pixels all equal a unique id; class a has 10, class b 7.
  const int counts[2] = {10, 7};
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < counts[k]; ++i) {
      const int id = 100 * k + i + 1;
      write_png(root / (k == 0 ? "a" : "b") / ("img" + std::to_string(i) + ".png"),
                Hwc{3, 3, 1, Bytes(9, static_cast<uint8_t>(id))});
    }
  auto load = [&](uint64_t seed, double fraction) {
    ImageFolderOptions o = crop_only(1, 3);
    o.split_seed = seed;
    o.test_fraction = fraction;
    return load_image_folder(root.str(), o);
  };
  // The ids of a split, as (label, id) pairs, checking the image is its id everywhere.
  auto members = [](const InMemoryImageDataset& ds) {
    std::vector<std::pair<int64_t, int>> out;
    for (int64_t i = 0; i < ds.size(); ++i) {
      const Example ex = ds.get(i);
      REQUIRE(std::all_of(ex.pixels.begin(), ex.pixels.end(),
                          [&](uint8_t p) { return p == ex.pixels[0]; }));
      REQUIRE(ex.pixels[0] / 100 == ex.label);  // the class folder's images carry its label
      out.emplace_back(ex.label, ex.pixels[0]);
    }
    return out;
  };
  const ImageFolderData one = load(7, 0.3), again = load(7, 0.3), other = load(8, 0.3);
  const auto train = members(one.train), test = members(one.test);
  // round(0.3 * 10) = 3 and round(0.3 * 7) = 2 test images.
  CHECK(std::count_if(test.begin(), test.end(), [](auto m) { return m.first == 0; }) == 3);
  CHECK(std::count_if(test.begin(), test.end(), [](auto m) { return m.first == 1; }) == 2);
  CHECK(train.size() == 12);
  std::set<int> all;
  for (const auto& m : train) all.insert(m.second);
  for (const auto& m : test) all.insert(m.second);
  CHECK(all.size() == 17);  // disjoint, and together every image
  CHECK(members(again.train) == train);
  CHECK(members(again.test) == test);
  CHECK(members(other.test) != test);
  CHECK(std::is_sorted(test.begin(), test.end()));  // class, then file name (ids follow names here)
  CHECK(load(7, 0.0).test.size() == 0);
  // A one-image class keeps its image for training even at a large fraction.
  write_png(root / "c/only.png", Hwc{3, 3, 1, Bytes(9, 201)});
  const ImageFolderData most = load(1, 0.9);
  CHECK(members(most.train).back() == std::pair<int64_t, int>{2, 201});
}

TEST_CASE("data: image folder bad trees are errors naming the culprit") {
  TempDir root;
  const Hwc img = pattern_image(4, 4, 3, 0);
  write_png(root / "train/cat/1.png", img);
  write_png(root / "train/dog/1.png", img);
  write_png(root / "test/cat/1.png", img);
  const ImageFolderOptions opts = crop_only(3, 4);

  SUBCASE("undecodable file") {
    write_text(root / "train/dog/broken.png", "this is not a PNG file at all");
    const std::string msg = folder_error([&] { load_image_folder(root.str(), opts); });
    CHECK(has(msg, (root / "train/dog/broken.png").string()));
    CHECK(has(msg, "cannot decode image (not a PNG, JPEG or BMP file"));  // refused before stb runs
  }
  SUBCASE("an image's name on a broken link") {
    fs::create_symlink("gone.png", root / "train/dog/2.png");
    const std::string msg = folder_error([&] { load_image_folder(root.str(), opts); });
    CHECK(has(msg, (root / "train/dog/2.png").string() + ": broken symbolic link"));
  }
  SUBCASE("empty class folder") {
    fs::create_directories(root / "train/emu");
    write_text(root / "train/emu/readme.md", "no images here");
    CHECK(has(folder_error([&] { load_image_folder(root.str(), opts); }),
              (root / "train/emu").string() + ": empty class folder"));
  }
  SUBCASE("test class missing in train") {
    write_png(root / "test/cow/1.png", img);
    CHECK(has(folder_error([&] { load_image_folder(root.str(), opts); }),
              "class 'cow' has no folder in"));
  }
  SUBCASE("no class folders, no test folder, no root") {
    TempDir flat;
    write_png(flat / "loose.png", img);
    CHECK(has(folder_error([&] { load_image_folder(flat.str(), opts); }), "no class folders"));
    // ImageNet's layout: val/ stands for test/ when there is no test/.
    const size_t test_images = load_image_folder(root.str(), opts).test.size();
    fs::rename(root / "test", root / "val");
    CHECK(load_image_folder(root.str(), opts).test.size() == test_images);
    fs::remove_all(root / "val");
    CHECK(has(folder_error([&] { load_image_folder(root.str(), opts); }), "no test/ (or val/) folder"));
    // One class is no classifier.
    TempDir one;
    write_png(one / "cat/1.png", img);
    write_png(one / "cat/2.png", img);
    CHECK(has(folder_error([&] { load_image_folder(one.str(), opts); }), "1 class folder (cat); a classifier needs at least 2"));
    CHECK(has(folder_error([&] { load_image_folder((root / "missing").string(), opts); }),
              "not a directory"));
  }
  SUBCASE("image smaller than the crop, bad options") {
    CHECK(has(folder_error([&] { load_image_folder(root.str(), crop_only(3, 5)); }),
              "1.png: image is 4x4, smaller than the 5x5 centre crop"));
    CHECK(has(folder_error([&] { load_image_folder(root.str(), crop_only(2, 4)); }),
              "channels must be 1 or 3, got 2"));
    ImageFolderOptions o = opts;
    o.test_fraction = 1.0;
    CHECK(has(folder_error([&] { load_image_folder(root.str(), o); }), "test_fraction"));
  }
}

TEST_CASE("data: image folder channel statistics") {
  // Channel 0: half the pixels 0, half 255 -> mean 0.5, std 0.5. Channel 1: all 51 -> mean 0.2 and std 1,
  // not 0, which the transforms refuse (a folder of pure-colour images was refused for a normalization the
  // user never set).
  Tensor images = Tensor::empty_tagged({2, 2, 2, 2}, MemTag::Data, DType::U8);
  uint8_t* p = images.data<uint8_t>();
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 4; ++i) {
      p[(n * 2 + 0) * 4 + i] = n == 0 ? 0 : 255;
      p[(n * 2 + 1) * 4 + i] = 51;
    }
  Tensor labels = Tensor::zeros({2}, DType::I64);
  const InMemoryImageDataset ds("stats", images, labels, 1);
  const auto [mean, stdev] = channel_mean_std(ds);
  CHECK(mean[0] == doctest::Approx(0.5));
  CHECK(stdev[0] == doctest::Approx(0.5));
  CHECK(mean[1] == doctest::Approx(0.2));
  CHECK(stdev[1] == 1.f);
  TransformConfig t;
  t.mean = mean;
  t.std = stdev;
  CHECK_NOTHROW(validate_transforms(t, 2));
}
