// Data-pipeline throughput: IDX load time, then images/s of the DataLoader (one background thread)
// over full epochs of Fashion-MNIST train at batch 128, with and without augmentation. Falls back to
// a synthetic 60000x1x28x28 set (saying so) when the Debian package is absent. Then the streamed
// image folder's decode rate (img/s, 1 and 2 workers) on a generated tree of ImageNet-sized JPEGs,
// with RandomResizedCrop to 224 (training) and resize + centre crop (evaluation). Last, what the byte
// checks every streamed read runs first (data/image_bytes.h: a PNG's chunk CRCs) cost beside the decode.
// Usage: bench_data [--epochs 3] [--jpegs 256] (--help). Results: bench/RESULTS_data.md.
#include <stb_image.h>
#include <stb_image_write.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <signal.h>
#include <unistd.h>

#include "actlab/core/error.h"
#include "actlab/core/philox.h"
#include "actlab/data/dataloader.h"
#include "actlab/data/idx.h"
#include "actlab/data/image_bytes.h"
#include "actlab/data/image_stream.h"
#include "actlab/train/cli.h"

namespace {

// The generated image trees live in the temp directory under this prefix and the process id. An exception
// removes them (ImageTree's destructor); a kill cannot, so each run first removes the trees of bench_data
// processes that no longer exist, and says so.
const char* const kTreePrefix = "actlab_bench_";

struct ImageTree {
  std::filesystem::path root;
  explicit ImageTree(const std::string& kind)
      : root(std::filesystem::temp_directory_path() / (kTreePrefix + kind + "_" + std::to_string(::getpid()))) {}
  ~ImageTree() {
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
};

void remove_trees_of_killed_runs() {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::temp_directory_path(), ec)) {
    const std::string name = e.path().filename().string();
    const size_t underscore = name.rfind('_');
    if (name.rfind(kTreePrefix, 0) != 0 || underscore == std::string::npos || !e.is_directory(ec)) continue;
    const std::string digits = name.substr(underscore + 1);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    std::filesystem::remove_all(e.path(), ec);
    if (!ec) std::printf("removed %s, left by a bench_data run that was killed\n", e.path().c_str());
  }
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median images/s over `epochs` epochs; the consumer only reads one float per batch, so this is the
// producer's ceiling.
double loader_images_per_s(const actlab::Dataset& ds, const actlab::TransformConfig& cfg,
                           int epochs, int64_t batch = 128, int workers = 1) {
  actlab::DataLoader loader(ds, batch, /*shuffle=*/true, /*seed=*/1, /*drop_last=*/false, cfg, 2,
                            workers);
  std::vector<double> rates;
  volatile float sink = 0.f;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const Clock::time_point t0 = Clock::now();
    loader.start_epoch(epoch);
    actlab::Batch batch;
    int64_t images = 0;
    while (loader.next(batch)) {
      sink = sink + batch.images.data<float>()[0];
      images += batch.labels.size(0);
    }
    rates.push_back(static_cast<double>(images) / seconds_since(t0));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

// A tree of `n` images in 10 class folders, 500 x 375 (ImageNet's most common size): smooth colour
// gradients plus Philox noise, so a quality-90 JPEG is about the size of an ImageNet photo's. `ext` is
// "jpg" or "png".
std::vector<std::string> write_image_tree(const std::filesystem::path& root, int n, const std::string& ext) {
  const int w = 500, h = 375;
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  std::vector<std::string> files;
  for (int i = 0; i < n; ++i) {
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c) {
          const uint32_t noise = actlab::philox_bits(7, static_cast<uint64_t>(i), (y * w + x) * 3 + c) & 63;
          px[(static_cast<size_t>(y) * w + x) * 3 + c] =
              static_cast<uint8_t>((x * (c + 1) + y * (3 - c) + i * 17) / 4 % 192 + noise);
        }
    const std::filesystem::path dir = root / ("class" + std::to_string(i % 10));
    std::filesystem::create_directories(dir);
    const std::string file = (dir / ("img" + std::to_string(i) + "." + ext)).string();
    const int ok = ext == "png" ? stbi_write_png(file.c_str(), w, h, 3, px.data(), w * 3)
                                : stbi_write_jpg(file.c_str(), w, h, 3, px.data(), 90);
    if (ok == 0) throw std::runtime_error("cannot write " + file);
    files.push_back(file);
  }
  return files;
}

// Per image, in memory (no file reads): the byte checks a streamed read runs before stb (for a PNG, one
// CRC-32 pass over every chunk) against stb's decode of the same bytes. Median ms over `epochs` passes.
void byte_check_table(int epochs, int images) {
  const ImageTree tree("check");
  const std::filesystem::path& root = tree.root;
  std::printf("\nbyte checks before the decode: %d images 500x375 per format, in memory\n", images);
  std::printf("\n| format | KiB per file | check, ms/image | decode, ms/image | check / decode |\n|---|---|---|---|---|\n");
  for (const std::string ext : {"png", "jpg"}) {
    std::vector<std::vector<uint8_t>> bytes;
    size_t total = 0;
    for (const std::string& f : write_image_tree(root, images, ext)) {
      std::ifstream in(f, std::ios::binary);
      bytes.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      total += bytes.back().size();
    }
    std::vector<double> check, decode;
    for (int e = 0; e < epochs; ++e) {
      Clock::time_point t0 = Clock::now();
      for (const auto& b : bytes)
        if (!actlab::image_bytes_problem(b.data(), b.size()).empty())
          throw std::runtime_error("a generated " + ext + " failed its byte check");
      check.push_back(seconds_since(t0) * 1e3 / images);
      t0 = Clock::now();
      for (const auto& b : bytes) {
        int w = 0, h = 0, c = 0;
        stbi_uc* px = stbi_load_from_memory(b.data(), static_cast<int>(b.size()), &w, &h, &c, 3);
        if (px == nullptr) throw std::runtime_error("stb could not decode a generated " + ext);
        stbi_image_free(px);
      }
      decode.push_back(seconds_since(t0) * 1e3 / images);
    }
    std::sort(check.begin(), check.end());
    std::sort(decode.begin(), decode.end());
    const double c = check[check.size() / 2], d = decode[decode.size() / 2];
    std::printf("| %s | %.0f | %.3f | %.3f | %.1f %% |\n", ext.c_str(), static_cast<double>(total) / images / 1024.0, c,
                d, 100.0 * c / d);
    std::filesystem::remove_all(root);
  }
}

// The streamed folder's images/s for 1 and 2 loader workers, training and evaluation reads.
void stream_decode_table(int epochs, int jpegs) {
  const ImageTree tree("stream");
  const std::filesystem::path& root = tree.root;
  write_image_tree(root, jpegs, "jpg");
  uintmax_t bytes = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root))
    if (e.is_regular_file()) bytes += e.file_size();
  actlab::ImageFolderOptions o;
  o.size = 224;
  o.test_fraction = 0.5;
  const actlab::StreamingImageFolderSplits f = actlab::open_streaming_image_folder(
      root.string(), o, std::make_shared<const actlab::ResizedCropConfig>());
  std::printf("\nstreamed folder: %d JPEGs 500x375 (%.0f KiB each), to 224x224, batch 32\n", jpegs,
              static_cast<double>(bytes) / jpegs / 1024.0);
  std::printf("\n| reads | loader workers | images/s (median of %d epochs) |\n|---|---|---|\n", epochs);
  actlab::TransformConfig flip;
  flip.horizontal_flip = true;
  for (int workers : {1, 2})
    std::printf("| train: RandomResizedCrop + flip (%lld images) | %d | %.0f |\n",
                static_cast<long long>(f.train->size()), workers,
                loader_images_per_s(*f.train, flip, epochs, 32, workers));
  for (int workers : {1, 2})
    std::printf("| test: resize + centre crop (%lld images) | %d | %.0f |\n",
                static_cast<long long>(f.test->size()), workers,
                loader_images_per_s(*f.test, {}, epochs, 32, workers));
}

}  // namespace

int main(int argc, char** argv) {
  actlab::FlagParser flags("bench_data",
                           "Data-pipeline throughput: Fashion-MNIST's load time and loader images/s, then the streamed\n"
                           "image folder's JPEG decode rate (bench/RESULTS_data.md).");
  flags.add("epochs", "int", "3", "epochs per configuration, median reported");
  flags.add("jpegs", "int", "256", "generated 500x375 JPEGs for the image-folder table (at least 20)");
  try {
    if (!flags.parse(argc, argv)) {
      std::printf("%s", flags.help().c_str());
      return 0;
    }
    const int epochs = static_cast<int>(flags.get_int("epochs")), jpegs = static_cast<int>(flags.get_int("jpegs"));
    ACTLAB_CHECK(epochs >= 1, "--epochs must be >= 1, got ", epochs);
    ACTLAB_CHECK(jpegs >= 20, "--jpegs must be >= 20 (half train, half test), got ", jpegs);
    remove_trees_of_killed_runs();
    const std::string dir = actlab::default_fashion_mnist_dir();
    std::unique_ptr<actlab::InMemoryImageDataset> ds;
    const Clock::time_point t0 = Clock::now();
    if (actlab::idx_files_present(dir)) {
      ds = std::make_unique<actlab::InMemoryImageDataset>(actlab::load_fashion_mnist(dir, true));
    } else {
      std::printf("NOTE: no Fashion-MNIST in %s; using a synthetic 60000x1x28x28 set\n",
                  dir.c_str());
      ds = std::make_unique<actlab::InMemoryImageDataset>(
          actlab::make_synthetic_dataset(60000, 1, 28, 28, 10, 1));
    }
    const double load_s = seconds_since(t0);
    std::printf("data set: %s, %lld examples, loaded in %.3f s\n", ds->name().c_str(),
                static_cast<long long>(ds->size()), load_s);

    actlab::TransformConfig plain = actlab::default_transforms("fashion-mnist", false);
    actlab::TransformConfig augmented = plain;
    augmented.crop_padding = 4;
    augmented.horizontal_flip = true;
    std::printf("\n| transforms | batch | loader threads | images/s (median of %d epochs) |\n",
                epochs);
    std::printf("|---|---|---|---|\n");
    std::printf("| normalize | 128 | 1 | %.0f |\n", loader_images_per_s(*ds, plain, epochs));
    std::printf("| crop pad 4 + flip + normalize | 128 | 1 | %.0f |\n",
                loader_images_per_s(*ds, augmented, epochs));
    stream_decode_table(epochs, jpegs);
    byte_check_table(epochs, std::min(jpegs, 64));
    return 0;
  } catch (const std::exception& e) {
    return actlab::report_error("bench_data", e);
  }
}
