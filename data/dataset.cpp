// Dataset helpers, InMemoryImageDataset and the synthetic data set (see data/dataset.h).
// Tested in tests/test_data.cpp.
#include "actlab/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "actlab/core/philox.h"

namespace actlab {

Example Dataset::get(int64_t index) const {
  Example ex;
  ex.pixels.resize(static_cast<size_t>(spec().image_bytes()));
  ex.label = read(index, ex.pixels.data());
  return ex;
}

InMemoryImageDataset::InMemoryImageDataset(std::string name, Tensor images, Tensor labels,
                                           int64_t num_classes)
    : name_(std::move(name)), images_(std::move(images)), labels_(std::move(labels)) {
  ACTLAB_CHECK(images_.defined() && images_.dim() == 4 && images_.dtype() == DType::U8,
               name_, ": images must be a (N,C,H,W) u8 tensor, got ",
               images_.defined() ? images_.str() : std::string("an undefined tensor"));
  ACTLAB_CHECK(labels_.defined() && labels_.dim() == 1 && labels_.dtype() == DType::I64,
               name_, ": labels must be a (N) i64 tensor, got ",
               labels_.defined() ? labels_.str() : std::string("an undefined tensor"));
  ACTLAB_CHECK(images_.is_contiguous() && labels_.is_contiguous() && images_.device().is_cpu() &&
                   labels_.device().is_cpu(),
               name_, ": images and labels must be contiguous CPU tensors");
  ACTLAB_CHECK(images_.size(0) == labels_.size(0), name_, ": ", images_.size(0), " images but ",
               labels_.size(0), " labels");
  ACTLAB_CHECK(num_classes >= 1, name_, ": num_classes must be >= 1, got ", num_classes);
  const int64_t* lab = labels_.data<int64_t>();
  for (int64_t i = 0; i < labels_.size(0); ++i) {
    ACTLAB_CHECK(lab[i] >= 0 && lab[i] < num_classes, name_, ": label ", lab[i], " at index ", i,
                 " is out of range [0, ", num_classes, ")");
  }
  spec_ = ImageSpec{images_.size(1), images_.size(2), images_.size(3), num_classes};
}

const uint8_t* InMemoryImageDataset::image_data(int64_t index) const {
  ACTLAB_CHECK(index >= 0 && index < size(), name_, ": index ", index, " out of range [0, ", size(),
               ")");
  return images_.data<uint8_t>() + index * spec_.image_bytes();
}

int64_t InMemoryImageDataset::read(int64_t index, uint8_t* pixels) const {
  std::memcpy(pixels, image_data(index), static_cast<size_t>(spec_.image_bytes()));
  return labels_.data<int64_t>()[index];
}

namespace {

// Philox streams of the synthetic generator, kept apart so changing one part never shifts another.
constexpr uint64_t kSynthPrototypeStream = 1;
constexpr uint64_t kSynthLabelStream = 2;
constexpr uint64_t kSynthNoiseStream = 3;

// prototypes: (classes, C, H, W) grey levels in [128-70, 128+70]: a plane wave per (class, channel)
// with integer frequencies 1..3 along each axis and a random phase.
std::vector<float> synthetic_prototypes(int64_t classes, int64_t C, int64_t H, int64_t W,
                                        uint64_t seed) {
  const double two_pi = 6.283185307179586;
  std::vector<float> proto(static_cast<size_t>(classes * C * H * W));
  PhiloxStream rng(seed, kSynthPrototypeStream);
  for (int64_t plane = 0; plane < classes * C; ++plane) {
    const double fy = 1 + static_cast<double>(rng.next_below(3));
    const double fx = 1 + static_cast<double>(rng.next_below(3));
    const double phase = two_pi * rng.next_uniform();
    float* p = proto.data() + plane * H * W;
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x)
        p[y * W + x] = static_cast<float>(
            128.0 + 70.0 * std::sin(two_pi * (fy * y / H + fx * x / W) + phase));
  }
  return proto;
}

}  // namespace

InMemoryImageDataset make_synthetic_dataset(int64_t n, int64_t channels, int64_t height,
                                            int64_t width, int64_t num_classes, uint64_t seed,
                                            int noise_amplitude) {
  ACTLAB_CHECK(n >= 1 && channels >= 1 && height >= 1 && width >= 1 && num_classes >= 1,
               "synthetic data set: sizes must be >= 1, got n=", n, " C=", channels, " H=", height,
               " W=", width, " classes=", num_classes);
  ACTLAB_CHECK(noise_amplitude >= 0 && noise_amplitude <= 127,
               "synthetic data set: noise_amplitude must be in [0, 127], got ", noise_amplitude);
  const int64_t image_bytes = channels * height * width;
  const std::vector<float> proto = synthetic_prototypes(num_classes, channels, height, width, seed);
  Tensor images = Tensor::empty_tagged({n, channels, height, width}, MemTag::Data, DType::U8);
  Tensor labels = Tensor::empty_tagged({n}, MemTag::Data, DType::I64);
  uint8_t* img = images.data<uint8_t>();
  int64_t* lab = labels.data<int64_t>();
  const int span = 2 * noise_amplitude + 1;

#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    // One draw per sample keeps each label a pure function of (seed, i).
    const uint32_t bits = philox_bits(seed, kSynthLabelStream, static_cast<uint64_t>(i));
    const int64_t label = static_cast<int64_t>((static_cast<uint64_t>(bits) * num_classes) >> 32);
    lab[i] = label;
    const float* p = proto.data() + label * image_bytes;
    uint8_t* out = img + i * image_bytes;
    // Noise: 16 bytes per Philox block; block b of sample i has counter (i * blocks + b, stream).
    const int64_t blocks = (image_bytes + 15) / 16;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint64_t ctr = static_cast<uint64_t>(i * blocks + b);
      const Philox4 r = philox4x32_10(
          Philox4{{static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32),
                   static_cast<uint32_t>(kSynthNoiseStream), 0u}},
          static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
      const int64_t end = std::min<int64_t>(16, image_bytes - b * 16);
      for (int64_t t = 0; t < end; ++t) {
        const uint32_t byte = (r.v[t >> 2] >> (8 * (t & 3))) & 0xFFu;
        const int noise =
            static_cast<int>((byte * static_cast<uint32_t>(span)) >> 8) - noise_amplitude;
        const int64_t j = b * 16 + t;
        const int v = static_cast<int>(std::lround(p[j])) + noise;
        out[j] = static_cast<uint8_t>(std::clamp(v, 0, 255));
      }
    }
  }
  return InMemoryImageDataset("synthetic", std::move(images), std::move(labels), num_classes);
}

}  // namespace actlab
