// The Dataset interface (size, image geometry, one labelled u8 image per index), the in-memory image
// data set that every file-format loader (IDX, CIFAR binary, image folder) produces, and a learnable
// synthetic data set for tests and machines without Fashion-MNIST.
// Tested in tests/test_data.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "actlab/core/tensor.h"

namespace actlab {

// Geometry shared by every image of a data set.
struct ImageSpec {
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t num_classes = 0;
  int64_t image_bytes() const { return channels * height * width; }  // one u8 (C,H,W) image
};

// One sample, owned: used by tests and inspection tools. The loader uses Dataset::read instead,
// which copies straight into its staging buffer.
struct Example {
  std::vector<uint8_t> pixels;  // (C,H,W) u8, row-major
  int64_t label = 0;            // in [0, num_classes)
};

// A finite, indexable set of labelled u8 images with one geometry.
// Thread safety: read() and the accessors are const and must be safe to call from the loader's
// background thread while other threads call const members too.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual ImageSpec spec() const = 0;
  virtual std::string name() const = 0;  // "fashion-mnist/train", "synthetic", ...
  // Copies image `index` into `pixels` (spec().image_bytes() bytes, (C,H,W) order) and returns its
  // label. index must be in [0, size()); implementations throw Error otherwise.
  virtual int64_t read(int64_t index, uint8_t* pixels) const = 0;
  // read() for a loader that knows the run's seed and the epoch. A data set that draws its images
  // as it reads them (data/image_stream.h: RandomResizedCrop of the file's pixels) draws from
  // (seed, epoch, index) only, so a batch's bytes do not depend on which thread read it; the
  // default is read().
  virtual int64_t read_sample(int64_t index, uint64_t seed, int64_t epoch, uint8_t* pixels) const {
    (void)seed, (void)epoch;
    return read(index, pixels);
  }

  Example get(int64_t index) const;  // read() into a fresh Example
};

// Images and labels held in memory: images (N,C,H,W) u8, labels (N) i64, both contiguous and tagged
// MemTag::Data by the loaders. Copying the object is shallow (the tensors share storage).
class InMemoryImageDataset : public Dataset {
 public:
  // Validates shapes/dtypes and that every label is in [0, num_classes); throws Error naming `name`.
  InMemoryImageDataset(std::string name, Tensor images, Tensor labels, int64_t num_classes);

  int64_t size() const override { return images_.size(0); }
  ImageSpec spec() const override { return spec_; }
  std::string name() const override { return name_; }
  int64_t read(int64_t index, uint8_t* pixels) const override;

  const Tensor& images() const { return images_; }  // (N,C,H,W) u8
  const Tensor& labels() const { return labels_; }  // (N) i64
  const uint8_t* image_data(int64_t index) const;   // pointer into images(), C*H*W bytes

 private:
  std::string name_;
  Tensor images_;
  Tensor labels_;
  ImageSpec spec_;
};

// A learnable toy data set: each class k has a fixed random sinusoidal prototype per channel; a
// sample is its class prototype plus uniform noise of +-noise_amplitude grey levels, clamped to
// [0,255]. Labels are drawn uniformly. Deterministic for (n, C, H, W, classes, seed). A linear
// classifier separates the classes well for noise_amplitude <= ~60.
InMemoryImageDataset make_synthetic_dataset(int64_t n, int64_t channels, int64_t height,
                                            int64_t width, int64_t num_classes, uint64_t seed,
                                            int noise_amplitude = 40);

}  // namespace actlab
