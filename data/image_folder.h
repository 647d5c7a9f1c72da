// Image-folder data sets: a tree of class folders holding PNG/JPEG/BMP files, decoded with
// stb_image (Debian libstb-dev) up front, in parallel, into in-memory u8 data sets of one geometry.
// Owns the layout rules, the deterministic stratified split, the decoding of one file and the
// resize/crop to a square; data/image_stream.h reads the same file list on demand instead. Tested
// in tests/test_data_folder.cpp (the crop-box resampling in tests/test_data_stream.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actlab/data/dataset.h"
#include "actlab/data/transforms.h"

namespace actlab {

// How an image of any size becomes size x size:
//   Bilinear / Area: scale so that the shorter side is `size` (or ImageFolderOptions::resize_shorter;
//     per-axis scale = resized/original length, the resized longer side truncated, as torchvision's
//     Resize computes it), then cut the centred size x size window (top = (resized_h - size) / 2
//     rounded half to even, as torchvision's center_crop, likewise left). Both use pixel centres at (i + 0.5):
//     Bilinear interpolates the 2x2 nearest source pixels (PyTorch align_corners=False, no
//     antialiasing: aliases when shrinking a lot); Area averages every source pixel the output
//     pixel's footprint covers, weighted by the covered fraction (the right choice for shrinking;
//     when enlarging the footprint is under one pixel and Area falls back to Bilinear, as OpenCV's
//     INTER_AREA does).
//   CropOnly: no resampling, just the centred size x size window; smaller images are an Error.
enum class ResizeMode { Area, Bilinear, CropOnly };

struct ImageFolderOptions {
  int64_t channels = 3;  // 1: grayscale (stb's luma), 3: RGB (grey images replicated)
  int64_t size = 32;     // output images are (channels, size, size)
  ResizeMode resize = ResizeMode::Area;
  // Single-tree layout only: the share of each class's images (sorted by file name, then shuffled
  // by Philox(split_seed)) that goes to the test split: round(test_fraction * n), at most n - 1,
  // so every class keeps a training image. Must be in [0, 1).
  double test_fraction = 0.2;
  uint64_t split_seed = 0;
  // Bilinear / Area: the shorter side before the centred size x size crop; 0: size (the whole shorter
  // side). torchvision's ImageNet evaluation, Resize(256) + CenterCrop(224), is size·256/224.
  int64_t resize_shorter = 0;
};

struct ImageFolderData {
  InMemoryImageDataset train;            // named "<root folder name>/train"
  InMemoryImageDataset test;             // named "<root folder name>/test"; may be empty
  std::vector<std::string> class_names;  // label k = class_names[k], sorted by byte order
  // One line per folder in which entries were skipped (other extensions, subfolders, dot files):
  // "<folder>: ignored 2 entries that are not .png/.jpg/.jpeg/.bmp files (e.g. notes.txt)".
  std::vector<std::string> warnings;
  uint64_t fingerprint = 0;  // ImageFolderList::fingerprint
};

struct ImageFile {
  std::string path;
  int64_t label = 0;
};

// The files of a tree, before any is decoded: the part both loaders share.
struct ImageFolderList {
  std::vector<ImageFile> train, test;    // each ordered by class, then file name
  std::vector<std::string> class_names;  // as ImageFolderData::class_names
  std::vector<std::string> warnings;     // as ImageFolderData::warnings
  std::string name;                      // the root folder's own name, also for "root/" or "."
  // FNV-1a over both splits' files in order (each one's path under the root and its label): what a
  // checkpoint remembers to recognise the tree (train/data_splits.h). Names only: no file is opened.
  uint64_t fingerprint = 0;
};

// Layouts (detected by whether root/train is a directory):
//   split:  root/train/<class>/<image>, root/test/<class>/<image> (root/val/ when there is no test/,
//           ImageNet's layout); every test class must exist in train (the label set is train's); a
//           train class may be absent from test. Either layout needs at least 2 classes.
//   single: root/<class>/<image>, split per class by options.test_fraction / split_seed.
// Images are the files directly inside each class folder whose extension is .png/.jpg/.jpeg/.bmp
// (any case); names starting with '.' are skipped everywhere. Within a split, samples are ordered
// by class, then file name. Tensors are tagged MemTag::Data; decoding runs on all OpenMP threads
// and its result does not depend on their number. Errors: root missing or without class folders; a
// class folder without images (named); a test class not in train (named); a file stb cannot decode
// (named, with stb_failure_reason()); bad options.
ImageFolderData load_image_folder(const std::string& root, const ImageFolderOptions& options = {});

// The layout rules and split of load_image_folder without the decoding; the same errors except
// those of decoding. Checks options as load_image_folder does.
ImageFolderList list_image_folder(const std::string& root, const ImageFolderOptions& options = {});

// One decoded file: pixels (height, width, channels) u8 interleaved, as stb_image returns them.
struct DecodedImage {
  std::unique_ptr<uint8_t, void (*)(void*)> pixels{nullptr, nullptr};
  int64_t height = 0, width = 0, channels = 0;
};
// Reads `path` and decodes it to `channels` (1 or 3) channels. Throws Error starting with the path:
// "<path>: cannot read the file", "<path>: cannot decode image (<why>)" (data/image_bytes.h's checks,
// then stb_failure_reason()).
DecodedImage decode_image_file(const std::string& path, int64_t channels);

// decode_image_file, then resize_to_square per options (channels, size, resize): out is
// (channels, size, size) u8. Also an Error naming the file when CropOnly meets a smaller image.
void decode_to_square(uint8_t* out, const std::string& path, const ImageFolderOptions& options);

// Resamples one decoded image to size x size per `mode` (see ResizeMode).
// out: (C, size, size) u8; src: (H, W, C) u8 interleaved as stb_image returns it (never aliases
// out). Throws Error for CropOnly when H or W < size.
void resize_to_square(uint8_t* out, const uint8_t* src, int64_t height, int64_t width,
                      int64_t channels, int64_t size, ResizeMode mode, int64_t shorter = 0);

// Resamples the window `box` of one decoded image to size x size (RandomResizedCrop's second half):
// per axis scale = size / box length, pixel centres at (i + 0.5), taps clamped to the box, as
// Bilinear / Area above. out: (C, size, size) u8; src: (H, W, C) u8, never aliases out. Throws Error
// for CropOnly (it does not resample) and for a box outside the image.
void resize_box_to_square(uint8_t* out, const uint8_t* src, int64_t height, int64_t width,
                          int64_t channels, const CropBox& box, int64_t size, ResizeMode mode);

// Per-channel mean and standard deviation of a data set's pixels scaled to [0,1] (population std
// over all N*H*W values of a channel): normalization constants for data sets outside the table in
// data/transforms.h. Returns {mean[0..C), std[0..C)}; a channel that never varies gets std 1.
std::pair<std::vector<float>, std::vector<float>> channel_mean_std(
    const InMemoryImageDataset& data);

}  // namespace actlab
