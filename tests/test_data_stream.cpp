// Tests for data/image_stream (the streaming image folder), RandomResizedCrop (data/transforms.h,
// data/image_folder.h) and the DataLoader's worker threads: streamed centre crops equal the
// in-memory loader's bytes, crop boxes follow torchvision's rules, batches are bit-identical for
// any number of workers and per-rank shards are the global batch's rows, the queue never holds
// more than its bound, and a corrupt, truncated or vanished file is one Error naming it.
// Trees of PNGs are written here. Run: actlab_tests -tc='data: stream*'
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "actlab/core/allocator.h"
#include "actlab/data/dataloader.h"
#include "actlab/data/image_folder.h"
#include "actlab/data/image_stream.h"
#include "actlab/train/trainer.h"
#include "error_of.h"
#include "image_files.h"
#include "temp_dir.h"

using namespace actlab;
using namespace actlab::testing;
namespace fs = std::filesystem;

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Three classes of RGB PNGs of assorted sizes (landscape, portrait, square), n_per_class each.
void write_tree(const fs::path& root, int n_per_class) {
  const char* classes[3] = {"cat", "dog", "emu"};
  for (int k = 0; k < 3; ++k)
    for (int i = 0; i < n_per_class; ++i) {
      const int id = k * n_per_class + i;
      write_png(root / "train" / classes[k] / ("img" + std::to_string(i) + ".png"),
                pattern_image(12 + (id % 5) * 3, 12 + (id % 3) * 7, 3, id));
    }
  for (int k = 0; k < 3; ++k) write_png(root / "test" / classes[k] / "t.png", pattern_image(14, 20, 3, 50 + k));
}

ImageFolderOptions options(int64_t size) {
  ImageFolderOptions o;
  o.channels = 3;
  o.size = size;
  return o;
}

// Every batch of `epochs` epochs, images then labels, as raw bytes.
std::vector<Bytes> all_batches(DataLoader& loader, int epochs) {
  std::vector<Bytes> out;
  for (int e = 0; e < epochs; ++e) {
    loader.start_epoch(e);
    Batch b;
    while (loader.next(b)) {
      const size_t ib = static_cast<size_t>(b.images.numel()) * sizeof(float);
      const size_t lb = static_cast<size_t>(b.labels.numel()) * sizeof(int64_t);
      Bytes bytes(ib + lb);
      std::memcpy(bytes.data(), b.images.data<float>(), ib);
      std::memcpy(bytes.data() + ib, b.labels.data<int64_t>(), lb);
      out.push_back(std::move(bytes));
    }
  }
  return out;
}

TransformConfig flip_and_normalize() {
  TransformConfig t;
  t.horizontal_flip = true;
  t.mean = {0.5f, 0.4f, 0.3f};
  t.std = {0.2f, 0.25f, 0.3f};
  return t;
}

}  // namespace

TEST_CASE("data: stream centre crops equal the in-memory folder's bytes") {
  TempDir root;
  write_tree(root.path(), 4);
  const ImageFolderData memory = load_image_folder(root.str(), options(8));
  const StreamingImageFolderSplits stream = open_streaming_image_folder(root.str(), options(8));
  CHECK(stream.class_names == memory.class_names);
  REQUIRE(stream.train->size() == memory.train.size());
  REQUIRE(stream.test->size() == memory.test.size());
  CHECK(stream.train->name() == memory.train.name());
  CHECK(stream.train->spec().image_bytes() == memory.train.spec().image_bytes());
  for (int64_t i = 0; i < memory.train.size(); ++i) {
    const Example s = stream.train->get(i), m = memory.train.get(i);
    CHECK(s.label == m.label);
    CHECK(s.pixels == m.pixels);
  }
  // Without a crop config, a read with a seed is the centre crop too.
  Bytes px(static_cast<size_t>(stream.test->spec().image_bytes()));
  CHECK(stream.test->read_sample(1, 7, 3, px.data()) == memory.test.get(1).label);
  CHECK(px == memory.test.get(1).pixels);
  // Normalization from all samples equals the in-memory statistics.
  const auto sampled = sampled_channel_mean_std(*stream.train, 1000);
  const auto whole = channel_mean_std(memory.train);
  CHECK(sampled.first == whole.first);
  CHECK(sampled.second == whole.second);
}

TEST_CASE("data: stream RandomResizedCrop boxes follow torchvision's rules") {
  const ResizedCropConfig rrc;
  std::set<std::vector<int64_t>> distinct;
  int whole_image = 0;
  for (uint64_t i = 0; i < 2000; ++i) {
    const CropBox b = draw_resized_crop(rrc, 5, 0, i, 60, 80);
    REQUIRE(b.height >= 1);
    REQUIRE(b.width >= 1);
    REQUIRE(b.top >= 0);
    REQUIRE(b.left >= 0);
    REQUIRE(b.top + b.height <= 60);
    REQUIRE(b.left + b.width <= 80);
    // Rounding w and h to whole pixels moves each by at most 0.5, so the area share stays above
    // 0.08 less a little and log(w/h) within log(4/3) + 0.5/w + 0.5/h.
    const double area = static_cast<double>(b.height) * b.width / (60.0 * 80.0);
    const double log_ratio = std::log(static_cast<double>(b.width) / b.height);
    CHECK(area >= 0.07);
    CHECK(std::abs(log_ratio) <= std::log(4.0 / 3.0) + 0.5 / b.width + 0.5 / b.height + 1e-12);
    whole_image += b.height == 60 && b.width == 80;
    distinct.insert({b.top, b.left, b.height, b.width});
    const CropBox again = draw_resized_crop(rrc, 5, 0, i, 60, 80);
    REQUIRE((again.top == b.top && again.left == b.left && again.height == b.height && again.width == b.width));
  }
  CHECK(distinct.size() > 1500);  // the boxes vary
  CHECK(whole_image < 40);
  const CropBox e0 = draw_resized_crop(rrc, 5, 0, 3, 60, 80), e1 = draw_resized_crop(rrc, 5, 1, 3, 60, 80);
  CHECK((e0.top != e1.top || e0.left != e1.left || e0.height != e1.height || e0.width != e1.width));

  SUBCASE("fallback: the centre crop clamped to the ratio range") {
    ResizedCropConfig none = rrc;
    none.attempts = 0;
    const CropBox square = draw_resized_crop(none, 1, 0, 0, 10, 10);  // ratio 1 is inside: whole image
    CHECK((square.top == 0 && square.left == 0 && square.height == 10 && square.width == 10));
    // 30 x 10 (h x w): w/h = 1/3 < 3/4, so w = 10, h = round(10 / 0.75) = 13, top = (30 - 13) / 2 = 8.
    const CropBox tall = draw_resized_crop(none, 1, 0, 0, 30, 10);
    CHECK((tall.top == 8 && tall.left == 0 && tall.height == 13 && tall.width == 10));
    // 1 x 100: every attempt of the default config fails (h >= 1 needs w <= 1.33), and the fallback
    // is h = 1, w = round(4/3) = 1, left = 49.
    const CropBox thin = draw_resized_crop(rrc, 1, 0, 0, 1, 100);
    CHECK((thin.top == 0 && thin.left == 49 && thin.height == 1 && thin.width == 1));
  }
  SUBCASE("bad configs are errors") {
    ResizedCropConfig bad = rrc;
    bad.scale_min = 0;
    CHECK(has(error_of([&] { draw_resized_crop(bad, 0, 0, 0, 4, 4); }), "RandomResizedCrop needs"));
    bad = rrc;
    bad.attempts = kMaxResizedCropAttempts + 1;
    CHECK(has(error_of([&] { draw_resized_crop(bad, 0, 0, 0, 4, 4); }), "attempts"));
  }
}

TEST_CASE("data: stream crop box resampling on hand-worked images") {
  // 4 x 8 (h x w): left half colour A, right half colour B. The box of the right half, to 2 x 2:
  // all B, for both resampling modes.
  const uint8_t A[3] = {250, 10, 60}, B[3] = {0, 130, 255};
  const Hwc img = two_halves(4, 8, A, B);
  for (ResizeMode mode : {ResizeMode::Area, ResizeMode::Bilinear}) {
    Bytes out(3 * 4, 1);
    resize_box_to_square(out.data(), img.px.data(), 4, 8, 3, CropBox{0, 4, 4, 4}, 2, mode);
    for (int c = 0; c < 3; ++c)
      for (int i = 0; i < 4; ++i) REQUIRE(out[c * 4 + i] == B[c]);
  }
  // A box of the whole of a square image is resize_to_square, bit for bit.
  const Hwc sq = pattern_image(9, 9, 3, 2);
  for (ResizeMode mode : {ResizeMode::Area, ResizeMode::Bilinear}) {
    for (int64_t size : {4, 9, 13}) {
      Bytes a(static_cast<size_t>(3 * size * size)), b(a.size());
      resize_to_square(a.data(), sq.px.data(), 9, 9, 3, size, mode);
      resize_box_to_square(b.data(), sq.px.data(), 9, 9, 3, CropBox{0, 0, 9, 9}, size, mode);
      CHECK(a == b);
    }
  }
  Bytes out(4);
  CHECK(has(error_of([&] {
              resize_box_to_square(out.data(), img.px.data(), 4, 8, 3, CropBox{1, 6, 4, 4}, 2, ResizeMode::Area);
            }),
            "does not fit a 8x4 image"));
  CHECK(has(error_of([&] {
              resize_box_to_square(out.data(), img.px.data(), 4, 8, 3, CropBox{0, 0, 4, 4}, 2, ResizeMode::CropOnly);
            }),
            "CropOnly does not resample"));
}

TEST_CASE("data: stream batches are bit-identical for any number of workers") {
  TempDir root;
  write_tree(root.path(), 7);  // 21 training images: batches of 4 leave a tail of 1
  const StreamingImageFolderSplits f =
      open_streaming_image_folder(root.str(), options(10), std::make_shared<const ResizedCropConfig>());
  std::vector<Bytes> one;
  {
    DataLoader loader(*f.train, 4, true, 11, false, flip_and_normalize(), 2, 1);
    one = all_batches(loader, 2);
  }
  REQUIRE(one.size() == 12);
  for (int workers : {2, 3, 8}) {
    DataLoader loader(*f.train, 4, true, 11, false, flip_and_normalize(), 2, workers);
    CHECK(loader.workers() == workers);
    CHECK(all_batches(loader, 2) == one);
  }
  {  // Starting at batch 2 (a resumed run) gives the epoch's later batches, unchanged.
    DataLoader loader(*f.train, 4, true, 11, false, flip_and_normalize(), 2, 2);
    loader.start_epoch(1, 2);
    Batch b;
    for (size_t k = 8; k < one.size(); ++k) {
      REQUIRE(loader.next(b));
      CHECK(b.index == static_cast<int64_t>(k) - 6);
      CHECK(std::memcmp(b.images.data<float>(), one[k].data(), static_cast<size_t>(b.images.numel()) * 4) == 0);
    }
    CHECK_FALSE(loader.next(b));
    CHECK(has(error_of([&] { loader.start_epoch(0, 7); }), "first batch 7 is outside the epoch's [0, 6] batches"));
  }
  // The crops are drawn per epoch: epoch 1 is not epoch 0 again, and another seed differs.
  CHECK(std::vector<Bytes>(one.begin(), one.begin() + 6) != std::vector<Bytes>(one.begin() + 6, one.end()));
  {
    DataLoader other(*f.train, 4, true, 12, false, flip_and_normalize(), 2, 2);
    CHECK(all_batches(other, 1) != std::vector<Bytes>(one.begin(), one.begin() + 6));
  }
  // A row of a batch is read_sample of its sample: the draw knows nothing of batches or threads.
  DataLoader loader(*f.train, 4, true, 11, false, {}, 2, 3);
  const std::vector<int64_t> order = loader.epoch_order(1);
  loader.start_epoch(1);
  Batch b;
  REQUIRE(loader.next(b));
  Bytes px(static_cast<size_t>(f.train->spec().image_bytes()));
  f.train->read_sample(order[2], 11, 1, px.data());
  const float* row = b.images.data<float>() + 2 * px.size();
  for (size_t j = 0; j < px.size(); ++j) REQUIRE(row[j] == static_cast<float>(px[j]) * (1.f / 255.f));
}

TEST_CASE("data: stream per-rank shards are rows of the global batch") {
  TempDir root;
  write_tree(root.path(), 6);  // 18 images
  const StreamingImageFolderSplits f =
      open_streaming_image_folder(root.str(), options(8), std::make_shared<const ResizedCropConfig>());
  DataLoader global(*f.train, 4, true, 3, true, flip_and_normalize(), 2, 2);
  DataLoader rank0(*f.train, 2, true, 3, true, flip_and_normalize(), 2, 1);
  DataLoader rank1(*f.train, 2, true, 3, true, flip_and_normalize(), 2, 3);
  rank0.shard(0, 2);
  rank1.shard(1, 2);
  REQUIRE(rank0.num_batches() == global.num_batches());
  const int64_t image_floats = f.train->spec().image_bytes();
  for (int64_t epoch : {0, 1}) {
    global.start_epoch(epoch);
    rank0.start_epoch(epoch);
    rank1.start_epoch(epoch);
    Batch g, r[2];
    while (global.next(g)) {
      REQUIRE(rank0.next(r[0]));
      REQUIRE(rank1.next(r[1]));
      // Global row 2i + rank is row i of that rank's batch (shard_order: order[rank + i*world]).
      for (int64_t i = 0; i < 2; ++i)
        for (int rank = 0; rank < 2; ++rank) {
          REQUIRE(r[rank].labels.data<int64_t>()[i] == g.labels.data<int64_t>()[2 * i + rank]);
          REQUIRE(std::memcmp(r[rank].images.data<float>() + i * image_floats,
                              g.images.data<float>() + (2 * i + rank) * image_floats,
                              static_cast<size_t>(image_floats) * sizeof(float)) == 0);
        }
    }
    CHECK_FALSE(rank0.next(r[0]));
    CHECK_FALSE(rank1.next(r[1]));
  }
}

TEST_CASE("data: stream loader's queue and bytes stay within their bound") {
  TempDir root;
  write_tree(root.path(), 8);  // 24 images, 12 batches of 2
  const StreamingImageFolderSplits f =
      open_streaming_image_folder(root.str(), options(16), std::make_shared<const ResizedCropConfig>());
  const int depth = 2;
  DataLoader loader(*f.train, 2, true, 1, true, flip_and_normalize(), depth, 3);
  const int64_t batch_bytes = 2 * (3 * 16 * 16 * 4 + 8);
  CHECK(loader.max_bytes_held() == (depth + 1) * batch_bytes + 3 * 3 * 16 * 16);
  const int64_t data_before = memory_stats()[MemTag::Data].current;
  reset_peak();
  loader.start_epoch(0);
  Batch b;
  int64_t seen = 0;
  while (loader.next(b)) {
    ++seen;
    // A slow consumer: the workers fill the queue and must then wait.
    std::this_thread::sleep_for(std::chrono::milliseconds(15));
    REQUIRE(loader.queue_peak() <= depth);
  }
  CHECK(seen == 12);
  CHECK(loader.queue_peak() == depth);  // the bound was reached, so the check above could fail
  // The consumer's own batch comes on top of what the loader holds.
  CHECK(memory_stats()[MemTag::Data].peak - data_before <= loader.max_bytes_held() + batch_bytes);
}

TEST_CASE("data: stream names the corrupt, truncated or vanished file") {
  TempDir root;
  write_tree(root.path(), 3);
  const fs::path garbage = root / "train/dog/img1.png";
  write_text(garbage, "this is not a PNG file at all");
  const fs::path truncated = root / "train/emu/img2.png";
  fs::resize_file(truncated, fs::file_size(truncated) / 2);
  const StreamingImageFolderSplits f =
      open_streaming_image_folder(root.str(), options(8), std::make_shared<const ResizedCropConfig>());
  auto first_error = [&](int workers) {
    DataLoader loader(*f.train, 3, false, 0, false, {}, 2, workers);
    loader.start_epoch(0);
    Batch b;
    int64_t batches = 0;
    const std::string msg = error_of([&] {
      while (loader.next(b)) ++batches;
    });
    CHECK(batches == 1);  // cat's three images come first, then the batch holding dog/img1.png
    return msg;
  };
  const std::string msg = first_error(1);
  CHECK(has(msg, garbage.string() + ": cannot decode image (not a PNG, JPEG or BMP file"));
  CHECK(msg.find('\n') == std::string::npos);
  CHECK(first_error(3) == msg);  // the same file named, whichever worker met it
  // The truncated PNG, read on its own.
  Bytes px(static_cast<size_t>(f.train->spec().image_bytes()));
  const std::string cut = error_of([&] { f.train->read_sample(8, 0, 0, px.data()); });
  CHECK(has(cut, truncated.string() + ": cannot decode image ("));
  // A file removed after the listing.
  fs::remove(root / "train/cat/img0.png");
  CHECK(has(error_of([&] { f.train->read(0, px.data()); }),
            (root / "train/cat/img0.png").string() + ": cannot read the file"));
}

TEST_CASE("data: stream through actlab-train's configuration: splits, transforms, same run for any workers") {
  TempDir root;
  write_tree(root.path(), 8);
  TrainConfig c;
  c.dataset = "folder";
  c.data_dir = root.str();
  c.stream = true;
  c.image_size = 8;
  c.model = "mlp";
  c.batch_size = 4;
  c.threads = 1;
  c.quiet = true;
  CHECK_NOTHROW(validate(c));
  const DataSplits d = load_data(c);
  CHECK(dynamic_cast<const StreamingImageFolder*>(d.train.get()) != nullptr);
  CHECK(dynamic_cast<const StreamingImageFolder*>(d.test.get()) != nullptr);
  CHECK(has(d.note, "streamed"));
  CHECK(d.train_transforms.crop_padding == 0);  // the crop is the data set's RandomResizedCrop
  CHECK(d.train_transforms.horizontal_flip);
  {  // test images: torchvision's ImageNet evaluation, the shorter side to 8·256/224 = 9, then the 8 x 8 centre
    const auto& test = dynamic_cast<const StreamingImageFolder&>(*d.test);
    ImageFolderOptions o = options(8);
    o.resize_shorter = 9;
    Bytes want(static_cast<size_t>(3 * 8 * 8)), got(want.size());
    decode_to_square(want.data(), test.file(0).path, o);
    test.read(0, got.data());
    CHECK(got == want);
    o.resize_shorter = 0;
    decode_to_square(want.data(), test.file(0).path, o);
    CHECK(got != want);
  }
  CHECK(d.train_transforms.mean.size() == 3);
  CHECK(data_workers(c) >= 1);
  c.data_workers = 1;
  const TrainSummary one = train(c);
  c.data_workers = 3;
  const TrainSummary three = train(c);
  REQUIRE(one.epochs.size() == 1);
  REQUIRE(three.epochs.size() == 1);
  CHECK(std::isfinite(one.epochs[0].train_loss));
  CHECK(one.epochs[0].train_loss == three.epochs[0].train_loss);  // bit for bit
  CHECK(one.final_test_loss == three.final_test_loss);

  TrainConfig wrong;
  wrong.stream = true;  // fashion-mnist
  CHECK(has(error_of([&] { validate(wrong); }), "--stream needs --dataset folder"));
  wrong = TrainConfig();
  wrong.data_workers = -1;
  CHECK(has(error_of([&] { validate(wrong); }), "--data-workers must be in [0, 256]"));
}

TEST_CASE("data: a folder's limits keep every class, its split ignores --seed, and a changed folder is not resumed") {
  TempDir root;
  write_tree(root.path(), 8);  // 3 classes of 8 training images, listed class by class
  TrainConfig c;
  c.dataset = "folder";
  c.data_dir = root.str();
  c.image_size = 8;
  c.model = "mlp";
  c.batch_size = 4;
  c.threads = 1;
  c.quiet = true;
  c.train_limit = 6;
  c.test_limit = 3;
  for (const bool stream : {false, true}) {
    CAPTURE(stream);
    c.stream = stream;
    const DataSplits d = load_data(c);
    REQUIRE(d.train->size() == 6);
    std::set<int64_t> labels;
    std::vector<uint8_t> pixels(static_cast<size_t>(3 * 8 * 8));
    for (int64_t i = 0; i < d.train->size(); ++i) labels.insert(d.train->read(i, pixels.data()));
    CHECK(labels == std::set<int64_t>{0, 1, 2});  // not six images of the first class
    labels.clear();
    for (int64_t i = 0; i < d.test->size(); ++i) labels.insert(d.test->read(i, pixels.data()));
    CHECK(labels.size() == 3);
  }
  c.stream = false;
  c.train_limit = c.test_limit = 0;

  // One tree with a held-out share: the same test images whatever --seed is.
  TempDir single;
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < 10; ++i)
      write_png(single.path() / (k == 0 ? "a" : "b") / ("img" + std::to_string(i) + ".png"),
                Hwc{3, 3, 1, Bytes(9, static_cast<uint8_t>(100 * k + i + 1))});
  TrainConfig s = c;
  s.data_dir = single.str();
  s.image_channels = 1;
  s.image_size = 3;
  s.test_fraction = 0.3;
  auto test_ids = [&](uint64_t seed) {
    s.seed = seed;
    const DataSplits d = load_data(s);
    std::vector<int> ids;
    uint8_t px[9];
    for (int64_t i = 0; i < d.test->size(); ++i) {
      d.test->read(i, px);
      ids.push_back(px[0]);
    }
    return ids;
  };
  const std::vector<int> seed0 = test_ids(0);
  CHECK(seed0.size() == 6);
  CHECK(test_ids(5) == seed0);

  // Resuming on a folder that changed (one more image; a class renamed, which shifts the labels) is refused.
  TempDir runs;
  c.epochs = 2;
  c.save_dir = (runs.path() / "ckpt").string();
  c.stop_after_steps = 3;
  REQUIRE(train(c).interrupted);
  const DataSplits before = load_data(c);
  TrainConfig resumed = c;
  resumed.save_dir.clear();
  resumed.stop_after_steps = 0;
  resumed.resume = (runs.path() / "ckpt" / "last.safetensors").string();
  write_png(root.path() / "train" / "emu" / "extra.png", pattern_image(12, 12, 3, 99));
  CHECK(has(error_of([&] { train(resumed); }), "(the data must be the same)"));
  fs::remove(root.path() / "train" / "emu" / "extra.png");
  fs::rename(root.path() / "train" / "cat", root.path() / "train" / "zebra");
  fs::rename(root.path() / "test" / "cat", root.path() / "test" / "zebra");
  CHECK(load_data(c).identity != before.identity);  // the same counts, other class names
  CHECK(has(error_of([&] { train(resumed); }), "(the data must be the same)"));
  fs::rename(root.path() / "train" / "zebra", root.path() / "train" / "cat");
  fs::rename(root.path() / "test" / "zebra", root.path() / "test" / "cat");
  // The same counts and class names, one image moved from emu to cat: its label changed.
  fs::rename(root.path() / "train" / "emu" / "img0.png", root.path() / "train" / "cat" / "moved.png");
  CHECK(load_data(c).identity != before.identity);
  CHECK(has(error_of([&] { train(resumed); }), "(the data must be the same)"));
  fs::rename(root.path() / "train" / "cat" / "moved.png", root.path() / "train" / "emu" / "img0.png");
  CHECK(load_data(c).identity == before.identity);
  for (const char* tail : {"/", "/./", "//"}) {  // the same folder however its root is spelled
    TrainConfig spelled = c;
    spelled.data_dir += tail;
    CHECK(load_data(spelled).identity == before.identity);
  }
  CHECK(train(resumed).epochs.size() == 2);  // the same folder again: resumed to the end

  // A checkpoint from before the files' hash was part of the identity is compared on what it stored.
  const size_t files = before.identity.rfind(", files ");
  REQUIRE(files != std::string::npos);
  CHECK(same_data_identity(before.identity.substr(0, files), before.identity));
  CHECK(!same_data_identity(before.identity.substr(0, files - 1), before.identity));
  CHECK(!same_data_identity(before.identity.substr(0, files) + ", files 0000000000000000", before.identity));
  // A folder's pixels are not hashed: they depend on --image-size (which a resume may change, with a
  // note) and on how the resampler was compiled.
  CHECK(before.identity.find(", contents ") == std::string::npos);
}

TEST_CASE("data: IDX data sets of one size and classes differ in identity when their labels or images differ") {
  TempDir root;
  // n images of 28x28 with every pixel `pixel`, all of label `label`, in both splits.
  const auto write_idx = [&](const std::string& name, int n, uint8_t label, uint8_t pixel) {
    const fs::path dir = root.path() / name;
    fs::create_directories(dir);
    for (const char* split : {"train", "t10k"}) {
      std::ofstream images(dir / (std::string(split) + "-images-idx3-ubyte"), std::ios::binary);
      const unsigned char head[16] = {0, 0, 8, 3, 0, 0, 0, static_cast<unsigned char>(n), 0, 0, 0, 28, 0, 0, 0, 28};
      images.write(reinterpret_cast<const char*>(head), sizeof head);
      images << std::string(static_cast<size_t>(n) * 784, static_cast<char>(pixel));
      std::ofstream labels(dir / (std::string(split) + "-labels-idx1-ubyte"), std::ios::binary);
      const unsigned char lhead[8] = {0, 0, 8, 1, 0, 0, 0, static_cast<unsigned char>(n)};
      labels.write(reinterpret_cast<const char*>(lhead), sizeof lhead);
      labels << std::string(static_cast<size_t>(n), static_cast<char>(label));
    }
    TrainConfig c;
    c.dataset = "mnist";
    c.data_dir = dir.string();
    return c;
  };
  const TrainConfig a = write_idx("a", 16, 1, 0), same = write_idx("same", 16, 1, 0),
                    labels = write_idx("labels", 16, 2, 0), pixels = write_idx("pixels", 16, 1, 7);
  const std::string id = load_data(a).identity;
  CHECK(load_data(same).identity == id);  // another copy of the same bytes
  for (const TrainConfig& other : {labels, pixels}) {
    const std::string o = load_data(other).identity;
    CHECK(o != id);
    CHECK(o.substr(0, o.rfind(", contents ")) == id.substr(0, id.rfind(", contents ")));  // sizes, classes
    CHECK_FALSE(same_data_identity(id, o));
  }
  // --train-limit takes a part of the same data: the identity is the whole set's.
  TrainConfig limited = a;
  limited.train_limit = 8;
  CHECK(load_data(limited).identity == id);
  // A checkpoint from before the contents' hash is compared on what it stored.
  const size_t contents = id.rfind(", contents ");
  REQUIRE(contents != std::string::npos);
  CHECK(same_data_identity(id.substr(0, contents), id));
  CHECK_FALSE(same_data_identity(id.substr(0, contents) + ", contents 0000000000000000", id));
}

TEST_CASE("data: a streamed file that cannot be read mid-epoch leaves the state so far saved, and --resume goes on") {
  // 1024 training images: the normalization pass reads every second one (512 evenly spaced), so a corrupt
  // file at an odd index is first met by a training batch.
  TempDir root;
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < 512; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "img%04d.png", i);
      write_png(root.path() / "train" / (k == 0 ? "a" : "b") / name, Hwc{3, 3, 1, Bytes(9, static_cast<uint8_t>(i % 200))});
    }
  for (int k = 0; k < 2; ++k) write_png(root.path() / "test" / (k == 0 ? "a" : "b") / "t.png", Hwc{3, 3, 1, Bytes(9, 7)});
  const fs::path bad = root.path() / "train" / "a" / "img0001.png";  // index 1
  write_text(bad, "not a png");
  TempDir runs;
  TrainConfig c;
  c.dataset = "folder";
  c.data_dir = root.str();
  c.stream = true;
  c.image_channels = 1;
  c.image_size = 3;
  c.model = "mlp";
  c.batch_size = 64;
  c.threads = 1;
  c.data_workers = 1;
  c.quiet = true;
  c.save_dir = (runs.path() / "ckpt").string();
  const std::string e = error_of([&] { train(c); });
  CHECK(has(e, "img0001.png"));
  CHECK(has(e, "is in " + c.save_dir + "/last.safetensors (--resume it once the data reads again) ["));
  CHECK(e.back() == ']');  // the reader's [file:line] still ends the line
  REQUIRE(fs::exists(runs.path() / "ckpt" / "last.safetensors"));
  write_png(bad, Hwc{3, 3, 1, Bytes(9, 1)});
  TrainConfig resumed = c;
  resumed.save_dir.clear();
  resumed.resume = (runs.path() / "ckpt" / "last.safetensors").string();
  const TrainSummary s = train(resumed);
  CHECK(s.steps == 16);  // the epoch's 1024 / 64 steps in all, counting those before the failure
}
