// The streaming image folder (see data/image_stream.h): per-read decoding, the RandomResizedCrop
// read and the sampled normalization constants. Tested in tests/test_data_stream.cpp.
#include "actlab/data/image_stream.h"

#include <algorithm>
#include <exception>

#include "actlab/core/error.h"

namespace actlab {

StreamingImageFolder::StreamingImageFolder(std::string name, std::vector<ImageFile> files,
                                           int64_t num_classes, const ImageFolderOptions& options,
                                           std::shared_ptr<const ResizedCropConfig> crop)
    : name_(std::move(name)), files_(std::move(files)), options_(options), crop_(std::move(crop)) {
  ACTLAB_CHECK(options.channels == 1 || options.channels == 3, name_,
               ": image channels must be 1 or 3, got ", options.channels);
  ACTLAB_CHECK(options.size >= 1, name_, ": image size must be >= 1, got ", options.size);
  ACTLAB_CHECK(num_classes >= 1, name_, ": num_classes must be >= 1, got ", num_classes);
  ACTLAB_CHECK(!crop_ || options.resize != ResizeMode::CropOnly, name_,
               ": RandomResizedCrop resamples its box; choose Area or Bilinear, not CropOnly");
  for (const ImageFile& f : files_)
    ACTLAB_CHECK(f.label >= 0 && f.label < num_classes, name_, ": ", f.path, " has label ", f.label,
                 ", outside [0, ", num_classes, ")");
  if (crop_) draw_resized_crop(*crop_, 0, 0, 0, 1, 1);  // checks the config now, not at a read
  spec_ = ImageSpec{options.channels, options.size, options.size, num_classes};
}

const ImageFile& StreamingImageFolder::file(int64_t index) const {
  ACTLAB_CHECK(index >= 0 && index < size(), name_, ": index ", index, " out of range [0, ", size(),
               ")");
  return files_[static_cast<size_t>(index)];
}

int64_t StreamingImageFolder::read(int64_t index, uint8_t* pixels) const {
  const ImageFile& f = file(index);
  decode_to_square(pixels, f.path, options_);
  return f.label;
}

int64_t StreamingImageFolder::read_sample(int64_t index, uint64_t seed, int64_t epoch,
                                          uint8_t* pixels) const {
  if (!crop_) return read(index, pixels);
  const ImageFile& f = file(index);
  const DecodedImage image = decode_image_file(f.path, options_.channels);
  const CropBox box = draw_resized_crop(*crop_, seed, static_cast<uint64_t>(epoch),
                                        static_cast<uint64_t>(index), image.height, image.width);
  resize_box_to_square(pixels, image.pixels.get(), image.height, image.width, options_.channels,
                       box, options_.size, options_.resize);
  return f.label;
}

StreamingImageFolderSplits open_streaming_image_folder(
    const std::string& root, const ImageFolderOptions& options,
    std::shared_ptr<const ResizedCropConfig> train_crop, int64_t test_resize_shorter) {
  ImageFolderList list = list_image_folder(root, options);
  ImageFolderOptions test_options = options;
  if (test_resize_shorter > 0) test_options.resize_shorter = test_resize_shorter;
  const int64_t num_classes = static_cast<int64_t>(list.class_names.size());
  StreamingImageFolderSplits splits;
  splits.train = std::make_shared<StreamingImageFolder>(list.name + "/train", std::move(list.train),
                                                        num_classes, options, std::move(train_crop));
  splits.test = std::make_shared<StreamingImageFolder>(list.name + "/test", std::move(list.test),
                                                       num_classes, test_options);
  splits.class_names = std::move(list.class_names);
  splits.warnings = std::move(list.warnings);
  splits.fingerprint = list.fingerprint;
  return splits;
}

std::pair<std::vector<float>, std::vector<float>> sampled_channel_mean_std(const Dataset& data,
                                                                           int64_t max_samples) {
  ACTLAB_CHECK(max_samples >= 1, "sampled channel statistics need max_samples >= 1, got ",
               max_samples);
  const ImageSpec spec = data.spec();
  const int64_t n = data.size(), count = std::min(n, max_samples);
  ACTLAB_CHECK(count > 0, data.name(), ": cannot compute channel statistics of an empty data set");
  Tensor images = Tensor::empty_tagged({count, spec.channels, spec.height, spec.width},
                                       MemTag::Data, DType::U8);
  Tensor labels = Tensor::zeros({count}, DType::I64);  // channel_mean_std reads no labels
  uint8_t* dst = images.data<uint8_t>();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(count));
  // An exception may not leave an OpenMP loop: each is kept and the first rethrown after it.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < count; ++i) {
    try {
      data.read(i * n / count, dst + i * spec.image_bytes());
    } catch (...) {
      errors[static_cast<size_t>(i)] = std::current_exception();
    }
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return channel_mean_std(InMemoryImageDataset(data.name(), images, labels, 1));
}

}  // namespace actlab
