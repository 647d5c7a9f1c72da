// load_data (train/data_splits.h): the train/test splits a TrainConfig names, with their normalization
// and augmentation, optionally cut to N samples (the first N; a folder's spread over its classes).
// Tested through tests/test_train.cpp and the data suites (tests/test_data*.cpp).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "actlab/data/cifar.h"
#include "actlab/data/idx.h"
#include "actlab/data/image_folder.h"
#include "actlab/data/image_stream.h"
#include "actlab/io/checksum.h"
#include "actlab/train/data_splits.h"

namespace actlab {
namespace {

// A view of `limit` samples of another data set: its first ones, or with `spread` ones evenly spaced over it
// (sample i is base sample ⌊i·n/limit⌋). An image folder lists its files class by class, so its first N
// would be one class; spread keeps every class's share. The IDX and CIFAR files are in no class order, and
// their first N is what --train-limit has always meant there.
class SubsetDataset final : public Dataset {
 public:
  SubsetDataset(std::shared_ptr<Dataset> base, int64_t limit, bool spread)
      : base_(std::move(base)), limit_(std::min(limit, base_->size())), spread_(spread) {}
  int64_t size() const override { return limit_; }
  ImageSpec spec() const override { return base_->spec(); }
  std::string name() const override { return base_->name(); }
  int64_t read(int64_t index, uint8_t* pixels) const override { return base_->read(base_index(index), pixels); }
  int64_t read_sample(int64_t index, uint64_t seed, int64_t epoch, uint8_t* pixels) const override {
    return base_->read_sample(base_index(index), seed, epoch, pixels);
  }
  int64_t base_index(int64_t index) const {
    ACTLAB_CHECK(index >= 0 && index < limit_, "sample ", index, " out of range [0,", limit_, ")");
    if (!spread_) return index;
    // In 128 bits: index·n overflows int64 only past 3·10^9 samples each way, but costs nothing to rule out.
    return static_cast<int64_t>(static_cast<__int128>(index) * base_->size() / limit_);
  }
 private:
  std::shared_ptr<Dataset> base_;
  int64_t limit_;
  bool spread_;
};

// --dataset synthetic: Fashion-MNIST's shape (a stand-in for it), generated.
constexpr ImageSpec kSyntheticSpec{1, 28, 28, 10};

// A streamed folder's normalization comes from this many training images (evenly spaced): decoding
// them all would cost the up-front pass streaming avoids, and with 512 the standard error of each mean
// is at most std / sqrt(512), under 5 % of a std.
constexpr int64_t kStreamStatsSamples = 512;

// How an identity names a folder's files' hash (ImageFolderList::fingerprint) and an IDX or CIFAR data set's
// contents' hash (contents_hash); same_data_identity reads them.
constexpr const char* kFilesPart = ", files ";
constexpr const char* kContentsPart = ", contents ";

// What of an IDX or CIFAR split's bytes its identity hashes: every label and the pixels of this many images,
// evenly spaced (all of a smaller split). Every pixel would cost a pass over CIFAR's 150 MB at each start;
// the labels alone tell two copies of one size apart (MNIST where Fashion-MNIST was), the sampled images a
// copy re-encoded or cut short. (A folder's pixels depend on --image-size and on how the resampler was
// compiled, so its identity stays its names and labels; synthetic data is its --seed and size.)
constexpr int64_t kIdentityImages = 256;

// FNV-1a over the split's labels and sampled images, continuing h.
uint64_t contents_hash(const InMemoryImageDataset& split, uint64_t h) {
  const int64_t n = split.size();
  h = fnv1a64(split.labels().data<int64_t>(), static_cast<size_t>(n) * sizeof(int64_t), h);
  const int64_t picks = std::min(n, kIdentityImages);
  for (int64_t k = 0; k < picks; ++k)
    h = fnv1a64(split.image_data(k * n / picks), static_cast<size_t>(split.spec().image_bytes()), h);
  return h;
}

// The image-folder and IDX readers need stb_image and zlib, which the minimal GPU-check build
// (ACTLAB_GPU_CHECK, docs/cuda.md) leaves out: there those data sets are one clear error.
#ifndef ACTLAB_MINIMAL_BUILD
void load_folder_splits(const TrainConfig& c, DataSplits& d) {
  ACTLAB_CHECK(!c.data_dir.empty(), "--dataset folder needs --data-dir ROOT (ROOT/train/<class>/*.png|jpg ...)");
  ImageFolderOptions o;
  o.channels = c.image_channels;
  o.size = c.image_size;
  o.test_fraction = c.test_fraction;
  // Not --seed: runs of several seeds (a grid's) must be scored on one test set. The split is fixed.
  o.split_seed = 0;
  std::pair<std::vector<float>, std::vector<float>> stats;
  std::vector<std::string> warnings;
  std::vector<std::string> class_names;
  uint64_t files = 0;
  if (c.stream) {
    // torchvision's ImageNet recipe: training reads RandomResizedCrop boxes, and evaluation is Resize(256) +
    // CenterCrop(224) at this size (the shorter side to size·256/224, then the centred crop). Without
    // augmentation both splits are the plain centre crop, as in memory.
    StreamingImageFolderSplits f = open_streaming_image_folder(
        c.data_dir, o, c.augment ? std::make_shared<const ResizedCropConfig>() : nullptr,
        c.augment ? c.image_size * 256 / 224 : 0);
    warnings = std::move(f.warnings);
    class_names = f.class_names;
    files = f.fingerprint;
    stats = sampled_channel_mean_std(*f.train, kStreamStatsSamples);  // read(): centre crops
    d.train = f.train;
    d.test = f.test;
  } else {
    ImageFolderData f = load_image_folder(c.data_dir, o);
    warnings = std::move(f.warnings);
    class_names = f.class_names;
    files = f.fingerprint;
    stats = channel_mean_std(f.train);
    d.train = std::make_shared<InMemoryImageDataset>(f.train);
    d.test = std::make_shared<InMemoryImageDataset>(f.test);
  }
  for (const auto& w : warnings) std::fprintf(stderr, "actlab-train: warning: %s\n", w.c_str());
  std::string names;
  for (const auto& name : class_names) names += name + '\n';
  char hash[64];
  std::snprintf(hash, sizeof hash, "class names %016llx%s%016llx",
                static_cast<unsigned long long>(fnv1a64(names.data(), names.size())), kFilesPart,
                static_cast<unsigned long long>(files));
  d.identity = hash;
  d.note = "image folder " + c.data_dir + " (" + std::to_string(class_names.size()) + " classes" +
           (c.stream ? ", streamed by " + std::to_string(data_workers(c)) +
                           (data_workers(c) == 1 ? " data worker" : " data workers")
                     : "") +
           ")";
  d.train_transforms.mean = d.test_transforms.mean = stats.first;
  d.train_transforms.std = d.test_transforms.std = stats.second;
  if (c.augment) {
    // Streamed: the data set's reads take the RandomResizedCrop; the loader adds the flip.
    d.train_transforms.crop_padding = c.stream ? 0 : c.image_size / 8;
    d.train_transforms.horizontal_flip = true;
  }
}

void load_idx_splits(const TrainConfig& c, DataSplits& d) {
  const bool fashion = c.dataset == "fashion-mnist";
  const std::string dir = !c.data_dir.empty() ? c.data_dir : fashion ? default_fashion_mnist_dir()
                                                                     : std::string("data/mnist");
  ACTLAB_CHECK(std::filesystem::is_directory(dir), c.dataset, " data directory '", dir, "' not found",
               fashion && c.data_dir.empty()
                   ? " (install Debian's dataset-fashion-mnist package: scripts/setup.sh does)"
                   : " (pass --data-dir)");
  d.train = std::make_shared<InMemoryImageDataset>(fashion ? load_fashion_mnist(dir, true) : load_mnist(dir, true));
  d.test = std::make_shared<InMemoryImageDataset>(fashion ? load_fashion_mnist(dir, false) : load_mnist(dir, false));
  d.note = c.dataset + " from " + dir;
}
#else
void load_folder_splits(const TrainConfig& c, DataSplits&) {
  ACTLAB_FAIL("--dataset ", c.dataset, " is not available in the minimal GPU-check build (no stb_image); use synthetic or cifar10/100");
}
void load_idx_splits(const TrainConfig& c, DataSplits&) {
  ACTLAB_FAIL("--dataset ", c.dataset, " is not available in the minimal GPU-check build (no zlib); use synthetic or cifar10/100");
}
#endif

}  // namespace

bool same_data_identity(const std::string& stored, const std::string& now) {
  if (stored == now) return true;
  // Checkpoints written before the contents' hash, or the files' hash of a folder, was part of the identity:
  // compare what they have (the parts end the identity, the newer last).
  std::string comparable = now;
  for (const char* part : {kContentsPart, kFilesPart}) {
    const size_t at = comparable.rfind(part);
    if (at == std::string::npos || stored.find(part) != std::string::npos) continue;
    comparable.resize(at);
    if (stored == comparable) return true;
  }
  return false;
}

int data_workers(const TrainConfig& c) {
  if (c.data_workers > 0) return static_cast<int>(c.data_workers);
  if (!c.stream) return 1;
  return static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency() / 2, 1u, 8u));
}

std::optional<ImageSpec> known_data_spec(const TrainConfig& c) {
  check_dataset_name(c.dataset);
  if (c.dataset == "synthetic") return kSyntheticSpec;
  if (c.dataset == "cifar10" || c.dataset == "cifar100") return cifar_spec(c.dataset == "cifar10" ? 10 : 100, c.cifar100_coarse);
  return std::nullopt;
}

void check_dataset_name(const std::string& name) {
  ACTLAB_CHECK(name == "fashion-mnist" || name == "mnist" || name == "cifar10" || name == "cifar100" ||
                   name == "folder" || name == "synthetic",
               "unknown data set '", name, "'; available: fashion-mnist, mnist, cifar10, cifar100, folder, synthetic");
}

DataSplits load_data(const TrainConfig& c) {
  check_dataset_name(c.dataset);
  DataSplits d;
  d.family = c.dataset;
  if (c.dataset == "synthetic") {
    const ImageSpec& k = kSyntheticSpec;
    d.train = std::make_shared<InMemoryImageDataset>(
        make_synthetic_dataset(c.synthetic_size, k.channels, k.height, k.width, k.num_classes, c.seed));
    d.test = std::make_shared<InMemoryImageDataset>(make_synthetic_dataset(
        std::max<int64_t>(1, c.synthetic_size / 4), k.channels, k.height, k.width, k.num_classes, c.seed + 1));
    d.note = "synthetic 1x28x28, 10 classes (generated)";
    d.family = "fashion-mnist";
  } else if (c.dataset == "folder") {
    load_folder_splits(c, d);
  } else if (c.dataset == "cifar10" || c.dataset == "cifar100") {
    const std::string dir = c.data_dir.empty() ? default_cifar_dir() : c.data_dir;
    const bool ten = c.dataset == "cifar10";
    d.train = std::make_shared<InMemoryImageDataset>(ten ? load_cifar10(dir, true)
                                                         : load_cifar100(dir, true, c.cifar100_coarse));
    d.test = std::make_shared<InMemoryImageDataset>(ten ? load_cifar10(dir, false)
                                                        : load_cifar100(dir, false, c.cifar100_coarse));
    d.note = c.dataset + " from " + dir;
  } else {
    load_idx_splits(c, d);
  }
  if (c.dataset != "folder") {
    d.train_transforms = default_transforms(d.family, c.augment);
    d.test_transforms = default_transforms(d.family, false);
    if (c.dataset == "synthetic") d.train_transforms.crop_padding = 0;
  }
  ACTLAB_CHECK(d.test->size() > 0, "the test split of ", d.note, " is empty");
  d.identity = std::to_string(d.train->size()) + " training and " + std::to_string(d.test->size()) + " test images, " +
               std::to_string(d.train->spec().num_classes) + " classes" + (d.identity.empty() ? "" : ", " + d.identity);
  const auto train_split = std::dynamic_pointer_cast<InMemoryImageDataset>(d.train);
  const auto test_split = std::dynamic_pointer_cast<InMemoryImageDataset>(d.test);
  if (c.dataset != "folder" && c.dataset != "synthetic" && train_split && test_split) {
    const uint64_t nothing = fnv1a64(nullptr, 0);  // FNV's offset basis
    const uint64_t contents = contents_hash(*test_split, contents_hash(*train_split, nothing));
    char hash[48];
    std::snprintf(hash, sizeof hash, "%s%016llx", kContentsPart, static_cast<unsigned long long>(contents));
    d.identity += hash;
  }
  const bool spread = c.dataset == "folder";
  if (c.train_limit > 0) d.train = std::make_shared<SubsetDataset>(d.train, c.train_limit, spread);
  if (c.test_limit > 0) d.test = std::make_shared<SubsetDataset>(d.test, c.test_limit, spread);
  return d;
}

}  // namespace actlab
