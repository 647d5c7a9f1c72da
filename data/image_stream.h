// The streaming image folder: the file list of an image-folder tree (data/image_folder.h's layout
// rules and split) held in memory, each image decoded only when the loader reads it, so a folder of
// any size costs a path per image plus what the loader keeps in flight. Training reads draw
// RandomResizedCrop from (seed, epoch, index); evaluation reads are the in-memory loader's resize +
// centre crop, byte for byte. Tested in tests/test_data_stream.cpp.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actlab/data/dataset.h"
#include "actlab/data/image_folder.h"
#include "actlab/data/transforms.h"

namespace actlab {

// Thread safety: read() and read_sample() only read the file list and may run on any number of
// loader threads at once. Each call holds one decoded file (at most kMaxImagePixels x channels
// bytes, outside the tracking allocator) until it returns.
class StreamingImageFolder final : public Dataset {
 public:
  // files: labels in [0, num_classes). options: channels, size and resize as for
  // load_image_folder. crop: set for a training split (reads with a seed then take RandomResizedCrop);
  // absent, every read is the centre crop. Throws Error on bad options or labels, and when a crop is
  // asked with ResizeMode::CropOnly (the box must be resampled).
  StreamingImageFolder(std::string name, std::vector<ImageFile> files, int64_t num_classes,
                       const ImageFolderOptions& options,
                       std::shared_ptr<const ResizedCropConfig> crop = nullptr);

  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  ImageSpec spec() const override { return spec_; }
  std::string name() const override { return name_; }
  // Decodes file `index` and resizes it to size x size (resize + centre crop, as in memory).
  int64_t read(int64_t index, uint8_t* pixels) const override;
  // With a crop config: draw_resized_crop(seed, epoch, index) on the decoded file, then
  // resize_box_to_square. Without: read().
  int64_t read_sample(int64_t index, uint64_t seed, int64_t epoch, uint8_t* pixels) const override;

  const ImageFile& file(int64_t index) const;

 private:
  std::string name_;
  std::vector<ImageFile> files_;
  ImageFolderOptions options_;
  std::shared_ptr<const ResizedCropConfig> crop_;
  ImageSpec spec_;
};

struct StreamingImageFolderSplits {
  std::shared_ptr<StreamingImageFolder> train;  // RandomResizedCrop when train_crop was given
  std::shared_ptr<StreamingImageFolder> test;   // centre crop; may be empty
  std::vector<std::string> class_names;
  std::vector<std::string> warnings;
  uint64_t fingerprint = 0;  // ImageFolderList::fingerprint
};

// list_image_folder's splits as streaming data sets named "<root folder name>/train" and "/test".
// Nothing is decoded here, so a corrupt file is found when it is read. test_resize_shorter: the test
// split's shorter side before its centre crop (ImageFolderOptions::resize_shorter; 0: options' own).
StreamingImageFolderSplits open_streaming_image_folder(
    const std::string& root, const ImageFolderOptions& options,
    std::shared_ptr<const ResizedCropConfig> train_crop = nullptr, int64_t test_resize_shorter = 0);

// Normalization constants of a data set too large to decode whole: channel_mean_std over
// min(max_samples, size) images at evenly spaced indices (i * size / count), read with read() on
// all OpenMP threads (the result does not depend on their number). The first failing read's Error
// is rethrown.
std::pair<std::vector<float>, std::vector<float>> sampled_channel_mean_std(const Dataset& data,
                                                                           int64_t max_samples);

}  // namespace actlab
