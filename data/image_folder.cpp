// Image-folder loader (see data/image_folder.h): folder scanning and layout checks, the per-class
// Philox split, stb_image decoding of one file (of bytes data/image_bytes.h has checked), the
// parallel up-front decoding and the separable resize/crop kernel.
// stb's implementations come from libstb.so (Debian), so STB_IMAGE_IMPLEMENTATION is not defined.
// Tested in tests/test_data_folder.cpp.
#include "actlab/data/image_folder.h"

#include <stb_image.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "actlab/core/error.h"
#include "actlab/core/philox.h"
#include "actlab/data/image_bytes.h"
#include "actlab/io/checksum.h"

namespace actlab {
namespace {

namespace fs = std::filesystem;

// Split draws use their own Philox stream family (top bits 0x6), apart from shuffling and
// augmentation; the low bits carry the class index.
constexpr uint64_t kSplitStreamTag = 0x6000000000000000ull;

bool is_hidden(const fs::path& p) { return p.filename().string().rfind('.', 0) == 0; }

bool has_image_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".bmp";
}

// Sorted entries of `dir` accepted by `keep`; the rest (dot files excepted, which are skipped
// silently) are counted in one warning line that names `what_kept`.
std::vector<std::string> list_entries(const fs::path& dir, bool (*keep)(const fs::directory_entry&),
                                      const char* what_kept, std::vector<std::string>& warnings) {
  std::vector<std::string> kept;
  std::string example;
  int64_t ignored = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (is_hidden(it->path())) continue;
    if (keep(*it)) {
      kept.push_back(it->path().filename().string());
    } else if (ignored++ == 0) {
      example = it->path().filename().string();
    }
  }
  ACTLAB_CHECK(!ec, dir.string(), ": cannot list: ", ec.message());
  if (ignored > 0)
    warnings.push_back(dir.string() + ": ignored " + std::to_string(ignored) + " entr" +
                       (ignored == 1 ? "y" : "ies") + " that " + (ignored == 1 ? "is" : "are") +
                       " not " + what_kept + " (e.g. " + example + ")");
  std::sort(kept.begin(), kept.end());  // byte order, as Python's sorted() on str
  return kept;
}

std::vector<std::string> list_class_folders(const fs::path& dir,
                                            std::vector<std::string>& warnings) {
  std::vector<std::string> classes = list_entries(
      dir,
      [](const fs::directory_entry& e) {
        std::error_code ec;
        return e.is_directory(ec);
      },
      "class folders", warnings);
  ACTLAB_CHECK(!classes.empty(), dir.string(),
               ": no class folders (expected <class>/<image> subfolders)");
  return classes;
}

// The image files of one class folder, sorted by name; Error when there are none.
std::vector<std::string> list_images(const fs::path& folder, std::vector<std::string>& warnings) {
  const std::vector<std::string> names = list_entries(
      folder,
      [](const fs::directory_entry& e) {
        std::error_code ec;
        const bool image_name = has_image_extension(e.path());
        // An image's name on a link to nothing is a missing image, not "an entry that is not an image".
        ACTLAB_CHECK(!image_name || !e.is_symlink(ec) || e.exists(ec), e.path().string(),
                     ": broken symbolic link (its target does not exist)");
        return e.is_regular_file(ec) && image_name;
      },
      ".png/.jpg/.jpeg/.bmp files", warnings);
  ACTLAB_CHECK(!names.empty(), folder.string(),
               ": empty class folder (no .png/.jpg/.jpeg/.bmp files)");
  std::vector<std::string> paths;
  for (const std::string& n : names) paths.push_back((folder / n).string());
  return paths;
}

// Source taps of one output axis: output pixel o reads index[k] with weight[k] for k in
// [begin[o], begin[o+1]). `offset` is the crop's first pixel in the resized axis of length
// `resized_len`.
struct AxisTaps {
  std::vector<int64_t> begin{0};
  std::vector<int64_t> index;
  std::vector<float> weight;
  void add(int64_t i, double w) { index.push_back(i), weight.push_back(static_cast<float>(w)); }
  void close() { begin.push_back(static_cast<int64_t>(index.size())); }
};

// The source span is [src_begin, src_begin + src_len): the whole axis for resize_to_square, the
// crop box for resize_box_to_square (src_begin 0 keeps the former's arithmetic unchanged).
AxisTaps make_taps(int64_t src_begin, int64_t src_len, int64_t resized_len, int64_t offset,
                   int64_t out_len, ResizeMode mode) {
  const double scale = static_cast<double>(resized_len) / static_cast<double>(src_len);
  const double begin = static_cast<double>(src_begin);
  const int64_t src_end = src_begin + src_len;
  AxisTaps taps;
  for (int64_t o = 0; o < out_len; ++o) {
    const int64_t r = o + offset;  // pixel of the resized axis
    if (mode == ResizeMode::CropOnly) {
      taps.add(src_begin + r, 1.0);
    } else if (mode == ResizeMode::Area && scale < 1.0) {
      // Footprint [lo, hi) in source pixels; each source pixel weighs its covered length.
      const double lo = begin + r / scale, hi = begin + (r + 1) / scale;
      const int64_t last = std::min<int64_t>(static_cast<int64_t>(std::ceil(hi)), src_end) - 1;
      for (int64_t i = static_cast<int64_t>(std::floor(lo)); i <= last; ++i) {
        const double covered = std::min(hi, i + 1.0) - std::max(lo, static_cast<double>(i));
        if (covered > 0.0) taps.add(i, covered / (hi - lo));
      }
    } else {  // bilinear between the pixel centres around (r + 0.5) / scale - 0.5
      const double centre =
          std::clamp(begin + (r + 0.5) / scale - 0.5, begin, static_cast<double>(src_end - 1));
      const int64_t i0 = static_cast<int64_t>(centre);
      const double frac = centre - static_cast<double>(i0);
      taps.add(i0, 1.0 - frac);
      taps.add(std::min(i0 + 1, src_end - 1), frac);
    }
    taps.close();
  }
  return taps;
}

// The separable resampling both resize functions share. out: (C, size, size) u8; src: (H, W, C)
// u8 of row length `width`; ty / tx: `size` output pixels each.
void resample(uint8_t* out, const uint8_t* src, int64_t width, int64_t channels, int64_t size,
              const AxisTaps& ty, const AxisTaps& tx) {
  // Horizontal pass over the source rows the vertical taps touch (a contiguous range, since taps
  // are monotonic): rows (row_count, size, C) f32, then the vertical pass writes (C, size, size).
  const int64_t row_lo = ty.index.front(), row_count = ty.index.back() - row_lo + 1;
  std::vector<float> rows(static_cast<size_t>(row_count * size * channels), 0.f);
  for (int64_t y = 0; y < row_count; ++y) {
    const uint8_t* s = src + (row_lo + y) * width * channels;
    float* r = rows.data() + y * size * channels;
    for (int64_t x = 0; x < size; ++x)
      for (int64_t k = tx.begin[x]; k < tx.begin[x + 1]; ++k)
        for (int64_t c = 0; c < channels; ++c)
          r[x * channels + c] += tx.weight[k] * static_cast<float>(s[tx.index[k] * channels + c]);
  }
  for (int64_t y = 0; y < size; ++y) {
    for (int64_t x = 0; x < size; ++x) {
      for (int64_t c = 0; c < channels; ++c) {
        float v = 0.f;
        for (int64_t k = ty.begin[y]; k < ty.begin[y + 1]; ++k)
          v += ty.weight[k] * rows[((ty.index[k] - row_lo) * size + x) * channels + c];
        out[(c * size + y) * size + x] = static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
      }
    }
  }
}

void free_stb_pixels(void* p) { stbi_image_free(p); }

// Decodes every file into a (N, C, size, size) u8 data set tagged MemTag::Data.
InMemoryImageDataset decode_all(const std::string& name, const std::vector<ImageFile>& files,
                                int64_t num_classes, const ImageFolderOptions& options) {
  const int64_t n = static_cast<int64_t>(files.size());
  const int64_t image_bytes = options.channels * options.size * options.size;
  Tensor images = Tensor::empty_tagged({n, options.channels, options.size, options.size},
                                       MemTag::Data, DType::U8);
  Tensor labels = Tensor::empty_tagged({n}, MemTag::Data, DType::I64);
  uint8_t* dst = images.data<uint8_t>();
  std::vector<std::pair<std::string, std::string>> errors(files.size());  // message, " [file:line]"
  // Dynamic schedule: decode time varies with file size and format. Errors are collected, not
  // thrown, because an exception may not leave an OpenMP loop.
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t i = 0; i < n; ++i) {
    try {
      decode_to_square(dst + i * image_bytes, files[i].path, options);
    } catch (const Error& e) {
      errors[i] = {e.message(), e.where()};
    } catch (const std::exception& e) {
      errors[i] = {files[i].path + ": " + e.what(), ""};
    }
  }
  int64_t failed = 0;
  const std::pair<std::string, std::string>* first = nullptr;
  for (const auto& e : errors) {
    if (e.first.empty()) continue;
    if (failed++ == 0) first = &e;
  }
  // The count goes with the first message, before the place that found it.
  if (failed > 0)
    throw Error(first->first + (failed > 1 ? " (and " + std::to_string(failed - 1) + " more files failed)" : ""),
                first->second);
  for (int64_t i = 0; i < n; ++i) labels.data<int64_t>()[i] = files[i].label;
  return InMemoryImageDataset(name, std::move(images), std::move(labels), num_classes);
}

// Shuffles each class's sorted files with its own Philox stream and moves the first
// round(test_fraction * n) (at most n - 1) to `test`; both stay sorted by file name.
void split_class(std::vector<std::string> paths, int64_t label, const ImageFolderOptions& options,
                 std::vector<ImageFile>& train, std::vector<ImageFile>& test) {
  const int64_t n = static_cast<int64_t>(paths.size());
  const int64_t n_test = std::min<int64_t>(std::llround(options.test_fraction * n), n - 1);
  PhiloxStream rng(options.split_seed, kSplitStreamTag ^ static_cast<uint64_t>(label));
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(paths[i], paths[static_cast<int64_t>(rng.next_below(static_cast<uint64_t>(i) + 1))]);
  std::sort(paths.begin(), paths.begin() + n_test);
  std::sort(paths.begin() + n_test, paths.end());
  for (int64_t i = 0; i < n; ++i) (i < n_test ? test : train).push_back({paths[i], label});
}

}  // namespace

namespace {
// torchvision's center_crop offset: round((resized - size) / 2) with Python's round, half to even.
int64_t centred_offset(int64_t resized, int64_t size) {
  const int64_t d = resized - size, half = d / 2;
  return d % 2 == 0 || half % 2 == 0 ? half : half + 1;
}
}  // namespace

void resize_to_square(uint8_t* out, const uint8_t* src, int64_t height, int64_t width,
                      int64_t channels, int64_t size, ResizeMode mode, int64_t shorter) {
  ACTLAB_CHECK(height >= 1 && width >= 1 && channels >= 1 && size >= 1, "resize of a ", width, "x",
               height, "x", channels, " image to ", size, "x", size, ": sizes must be >= 1");
  if (shorter == 0) shorter = size;
  ACTLAB_CHECK(shorter >= size, "resize of the shorter side to ", shorter, " is below the ", size, " crop");
  int64_t resized_h = height, resized_w = width;
  if (mode == ResizeMode::CropOnly) {
    ACTLAB_CHECK(height >= size && width >= size, "centre crop of ", size, "x", size,
                 " from a smaller ", width, "x", height, " image");
  } else if (height <= width) {  // torchvision: new_long = int(new_short * long / short)
    resized_h = shorter;
    resized_w = std::max<int64_t>(shorter, static_cast<int64_t>(static_cast<double>(shorter) * width / height));
  } else {
    resized_w = shorter;
    resized_h = std::max<int64_t>(shorter, static_cast<int64_t>(static_cast<double>(shorter) * height / width));
  }
  resample(out, src, width, channels, size,
           make_taps(0, height, resized_h, centred_offset(resized_h, size), size, mode),
           make_taps(0, width, resized_w, centred_offset(resized_w, size), size, mode));
}

void resize_box_to_square(uint8_t* out, const uint8_t* src, int64_t height, int64_t width,
                          int64_t channels, const CropBox& box, int64_t size, ResizeMode mode) {
  ACTLAB_CHECK(mode != ResizeMode::CropOnly,
               "a crop box is resampled to the output size; CropOnly does not resample");
  ACTLAB_CHECK(channels >= 1 && size >= 1 && box.height >= 1 && box.width >= 1 && box.top >= 0 &&
                   box.left >= 0 && box.top + box.height <= height && box.left + box.width <= width,
               "crop box ", box.width, "x", box.height, " at (", box.left, ", ", box.top,
               ") does not fit a ", width, "x", height, " image");
  resample(out, src, width, channels, size, make_taps(box.top, box.height, size, 0, size, mode),
           make_taps(box.left, box.width, size, 0, size, mode));
}

DecodedImage decode_image_file(const std::string& path, int64_t channels) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  ACTLAB_CHECK(in.is_open() && !in.bad(), path, ": cannot read the file");
  const std::string problem = image_bytes_problem(bytes.data(), bytes.size());
  ACTLAB_CHECK(problem.empty(), path, ": cannot decode image (", problem, ")");
  int width = 0, height = 0, channels_in_file = 0;
  DecodedImage image;
  image.pixels = {stbi_load_from_memory(bytes.data(), static_cast<int>(bytes.size()), &width,
                                        &height, &channels_in_file, static_cast<int>(channels)),
                  free_stb_pixels};
  if (!image.pixels) {
    const char* reason = stbi_failure_reason();
    ACTLAB_FAIL(path, ": cannot decode image (stb_image: ",
                reason != nullptr && reason[0] != '\0' ? reason : "unknown reason", ")");
  }
  image.height = height;
  image.width = width;
  image.channels = channels;
  return image;
}

void decode_to_square(uint8_t* out, const std::string& path, const ImageFolderOptions& options) {
  const DecodedImage image = decode_image_file(path, options.channels);
  ACTLAB_CHECK(options.resize != ResizeMode::CropOnly ||
                   (image.width >= options.size && image.height >= options.size),
               path, ": image is ", image.width, "x", image.height, ", smaller than the ",
               options.size, "x", options.size, " centre crop (choose a resizing mode)");
  resize_to_square(out, image.pixels.get(), image.height, image.width, options.channels,
                   options.size, options.resize, options.resize_shorter);
}

ImageFolderList list_image_folder(const std::string& root, const ImageFolderOptions& options) {
  ACTLAB_CHECK(options.channels == 1 || options.channels == 3,
               "image folder channels must be 1 or 3, got ", options.channels);
  ACTLAB_CHECK(options.size >= 1, "image folder size must be >= 1, got ", options.size);
  ACTLAB_CHECK(options.test_fraction >= 0.0 && options.test_fraction < 1.0,
               "image folder test_fraction must be in [0, 1), got ", options.test_fraction);
  const fs::path root_path(root);
  std::error_code ec;
  ACTLAB_CHECK(fs::is_directory(root_path, ec), root, ": not a directory");
  ImageFolderList list;
  std::vector<std::string>& warnings = list.warnings;
  std::vector<std::string>& classes = list.class_names;
  if (fs::is_directory(root_path / "train", ec)) {
    // ImageNet's own layout names the held-out folder val/.
    const fs::path train_dir = root_path / "train";
    const fs::path test_dir = fs::is_directory(root_path / "test", ec) || !fs::is_directory(root_path / "val", ec)
                                  ? root_path / "test"
                                  : root_path / "val";
    ACTLAB_CHECK(fs::is_directory(test_dir, ec), root, ": has train/ but no test/ (or val/) folder (the ",
                 "split layout needs both; without train/ the class folders are split by ",
                 "test_fraction)");
    classes = list_class_folders(train_dir, warnings);
    for (size_t k = 0; k < classes.size(); ++k)
      for (std::string& p : list_images(train_dir / classes[k], warnings))
        list.train.push_back({std::move(p), static_cast<int64_t>(k)});
    for (const std::string& name : list_class_folders(test_dir, warnings)) {
      const auto it = std::lower_bound(classes.begin(), classes.end(), name);
      ACTLAB_CHECK(it != classes.end() && *it == name, (test_dir / name).string(), ": class '",
                   name, "' has no folder in ", train_dir.string());
      for (std::string& p : list_images(test_dir / name, warnings))
        list.test.push_back({std::move(p), static_cast<int64_t>(it - classes.begin())});
    }
  } else {
    classes = list_class_folders(root_path, warnings);
    for (size_t k = 0; k < classes.size(); ++k)
      split_class(list_images(root_path / classes[k], warnings), static_cast<int64_t>(k), options,
                  list.train, list.test);
  }
  ACTLAB_CHECK(classes.size() >= 2, root, ": ", classes.size(), " class folder", classes.size() == 1 ? " (" + classes[0] + ")" : "s",
               "; a classifier needs at least 2");
  const fs::path normal = fs::absolute(root_path).lexically_normal();
  list.name = (normal.has_filename() ? normal : normal.parent_path()).filename().string();
  // Every listed path is root_path / ...: its name under the root is what follows this prefix (the root and
  // one separator, however the root was spelled). Cutting it costs nothing; fs::path's lexically_relative,
  // which gives the same names, took 0.38 s of a 1.2-1.6 s listing of 320,000 files.
  std::string prefix = (root_path / "x").string();
  prefix.pop_back();
  uint64_t h = fnv1a64(nullptr, 0);
  for (const std::vector<ImageFile>* split : {&list.train, &list.test}) {
    for (const ImageFile& f : *split) {
      ACTLAB_CHECK(f.path.compare(0, prefix.size(), prefix) == 0, f.path, ": listed outside ", prefix);
      const std::string_view name = std::string_view(f.path).substr(prefix.size());
      // Length first: no file name, tabs and newlines included, can make two lists hash alike.
      const std::string line =
          std::to_string(name.size()) + ':' + std::string(name) + ':' + std::to_string(f.label) + ';';
      h = fnv1a64(line.data(), line.size(), h);
    }
    h = fnv1a64("|", 1, h);  // a file moved from train/ to test/ changes the hash
  }
  list.fingerprint = h;
  return list;
}

ImageFolderData load_image_folder(const std::string& root, const ImageFolderOptions& options) {
  ImageFolderList list = list_image_folder(root, options);
  const int64_t num_classes = static_cast<int64_t>(list.class_names.size());
  return ImageFolderData{decode_all(list.name + "/train", list.train, num_classes, options),
                         decode_all(list.name + "/test", list.test, num_classes, options),
                         std::move(list.class_names), std::move(list.warnings), list.fingerprint};
}

std::pair<std::vector<float>, std::vector<float>> channel_mean_std(
    const InMemoryImageDataset& data) {
  const ImageSpec spec = data.spec();
  const int64_t n = data.size(), plane = spec.height * spec.width;
  ACTLAB_CHECK(n > 0 && plane > 0, data.name(),
               ": cannot compute channel statistics of an empty data set");
  const uint8_t* pixels = data.images().data<uint8_t>();
  std::vector<float> mean(static_cast<size_t>(spec.channels)), stdev(mean.size());
  for (int64_t c = 0; c < spec.channels; ++c) {
    // Exact integer sums: 255^2 * 2^40 pixels still fits in int64.
    int64_t sum = 0, sum_sq = 0;
#pragma omp parallel for reduction(+ : sum, sum_sq) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* p = pixels + (i * spec.channels + c) * plane;
      for (int64_t j = 0; j < plane; ++j) sum += p[j], sum_sq += p[j] * p[j];
    }
    const double count = static_cast<double>(n * plane);
    const double m = static_cast<double>(sum) / count;
    const double var = std::max(0.0, static_cast<double>(sum_sq) / count - m * m);
    mean[c] = static_cast<float>(m / 255.0);
    // A channel with one value throughout (a folder of pure-colour smoke-test images) normalizes to 0 with
    // any divisor; 1 keeps other values of it (a test image's) at their [0, 1] scale.
    stdev[c] = var > 0 ? static_cast<float>(std::sqrt(var) / 255.0) : 1.f;
  }
  return {mean, stdev};
}

}  // namespace actlab
