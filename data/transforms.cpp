// Normalization table, per-sample random choices and the fused crop/flip/normalize image kernel
// (see data/transforms.h). Tested in tests/test_data.cpp and tests/test_data_cifar.cpp (reflect).
#include "actlab/data/transforms.h"

#include <algorithm>
#include <cmath>

#include "actlab/core/error.h"
#include "actlab/core/philox.h"

namespace actlab {
namespace {

// The one table of normalization constants (pixel statistics of each training set in [0,1]).
constexpr ChannelStats kChannelStats[] = {
    {"fashion-mnist", 1, {0.2860f, 0.f, 0.f}, {0.3530f, 1.f, 1.f}},
    {"mnist", 1, {0.1307f, 0.f, 0.f}, {0.3081f, 1.f, 1.f}},
    {"cifar10", 3, {0.4914f, 0.4822f, 0.4465f}, {0.2023f, 0.1994f, 0.2010f}},
    // CIFAR-100 as the official DIVISION CIFAR-100 training scripts normalize, written there in grey
    // levels (mean 125.3, 123.0, 113.9; std 63.0, 62.1, 66.7).
    {"cifar100", 3, {125.3f / 255.f, 123.0f / 255.f, 113.9f / 255.f},
     {63.0f / 255.f, 62.1f / 255.f, 66.7f / 255.f}},
};

// Augmentation draws live in their own Philox stream family (top bits 0xA) so they never overlap
// the loader's shuffle streams or any other user of the run seed.
constexpr uint64_t kAugmentStreamTag = 0xA000000000000000ull;

// RandomResizedCrop draws: a stream family of their own (top bits 0xB), apart from the flip draws
// of draw_augment (0xA), which a streamed training split takes as well.
constexpr uint64_t kResizedCropStreamTag = 0xB000000000000000ull;

std::string family_of(const std::string& dataset_name) {
  return dataset_name.substr(0, dataset_name.find('/'));
}

// Uniform integer in [0, n) from 32 random bits by multiply-shift; bias <= n / 2^32 (negligible for
// crop offsets of a few pixels, and it keeps exactly one draw per choice).
int64_t bits_below(uint32_t bits, int64_t n) {
  return static_cast<int64_t>((static_cast<uint64_t>(bits) * static_cast<uint64_t>(n)) >> 32);
}

// Mirrors index i into [0, n) without repeating the edge (-1 -> 1, n -> n-2); valid for
// -n < i < 2n-1, which pad < n guarantees.
int64_t reflect_index(int64_t i, int64_t n) {
  if (i < 0) return -i;
  if (i >= n) return 2 * (n - 1) - i;
  return i;
}

}  // namespace

const ChannelStats& channel_stats(const std::string& dataset_name) {
  const std::string family = family_of(dataset_name);
  std::string known;
  for (const ChannelStats& s : kChannelStats) {
    if (family == s.dataset) return s;
    known += known.empty() ? s.dataset : std::string(", ") + s.dataset;
  }
  ACTLAB_FAIL("no normalization constants for data set '", dataset_name, "' (known: ", known, ")");
}

TransformConfig default_transforms(const std::string& dataset_name, bool train) {
  const ChannelStats& s = channel_stats(dataset_name);
  TransformConfig config;
  config.mean.assign(s.mean, s.mean + s.channels);
  config.std.assign(s.std, s.std + s.channels);
  const std::string family = family_of(dataset_name);
  if (train && (family == "cifar10" || family == "cifar100")) {
    config.crop_padding = 4;
    config.horizontal_flip = true;
    // The reference CIFAR-100 pipeline is Pad(4, reflect) -> flip -> RandomCrop(32); flipping
    // before or after a crop whose offsets are uniform and symmetric gives the same distribution.
    if (family == "cifar100") config.pad_mode = PadMode::Reflect;
  }
  return config;
}

void validate_transforms(const TransformConfig& config, int64_t channels) {
  ACTLAB_CHECK(config.crop_padding >= 0, "crop padding must be >= 0, got ", config.crop_padding);
  ACTLAB_CHECK(config.mean.size() == config.std.size(), "normalization has ", config.mean.size(),
               " means but ", config.std.size(), " stds");
  ACTLAB_CHECK(config.mean.empty() || static_cast<int64_t>(config.mean.size()) == channels,
               "normalization has ", config.mean.size(), " channels, images have ", channels);
  for (size_t c = 0; c < config.std.size(); ++c)
    ACTLAB_CHECK(config.std[c] > 0.f, "normalization std[", c, "] must be > 0, got ",
                 config.std[c]);
}

SampleAugment draw_augment(const TransformConfig& config, uint64_t seed, uint64_t epoch,
                           uint64_t sample_index) {
  const uint64_t stream = kAugmentStreamTag ^ epoch;
  const uint64_t first = 4 * sample_index;  // one Philox block per sample: draws k = 0, 1, 2
  const int64_t pad = config.crop_padding;
  SampleAugment a;
  a.crop_y = pad;
  a.crop_x = pad;
  if (pad > 0) {
    a.crop_y = bits_below(philox_bits(seed, stream, first + 0), 2 * pad + 1);
    a.crop_x = bits_below(philox_bits(seed, stream, first + 1), 2 * pad + 1);
  }
  if (config.horizontal_flip) a.flip = philox_bits(seed, stream, first + 2) >> 31;
  return a;
}

CropBox draw_resized_crop(const ResizedCropConfig& config, uint64_t seed, uint64_t epoch,
                          uint64_t sample_index, int64_t height, int64_t width) {
  ACTLAB_CHECK(config.scale_min > 0 && config.scale_min <= config.scale_max && config.scale_max <= 1 &&
                   config.ratio_min > 0 && config.ratio_min <= config.ratio_max &&
                   config.attempts >= 0 && config.attempts <= kMaxResizedCropAttempts,
               "RandomResizedCrop needs 0 < scale_min <= scale_max <= 1, 0 < ratio_min <= ratio_max and 0..",
               kMaxResizedCropAttempts, " attempts; got scale (", config.scale_min, ", ", config.scale_max,
               "), ratio (", config.ratio_min, ", ", config.ratio_max, "), ", config.attempts, " attempts");
  ACTLAB_CHECK(height >= 1 && width >= 1, "RandomResizedCrop of a ", width, "x", height, " image");
  const uint64_t stream = kResizedCropStreamTag ^ epoch;
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double log_lo = std::log(config.ratio_min), log_hi = std::log(config.ratio_max);
  auto uniform = [&](uint64_t index, double lo, double hi) {  // [lo, hi) from 32 bits
    return lo + (hi - lo) * (static_cast<double>(philox_bits(seed, stream, index)) * 0x1p-32);
  };
  for (int k = 0; k < config.attempts; ++k) {
    const uint64_t first = 64 * sample_index + 4 * static_cast<uint64_t>(k);
    const double target = area * uniform(first + 0, config.scale_min, config.scale_max);
    const double ratio = std::exp(uniform(first + 1, log_lo, log_hi));
    // nearbyint rounds half to even in the default rounding mode, as Python's round().
    const int64_t w = static_cast<int64_t>(std::nearbyint(std::sqrt(target * ratio)));
    const int64_t h = static_cast<int64_t>(std::nearbyint(std::sqrt(target / ratio)));
    if (w < 1 || w > width || h < 1 || h > height) continue;
    return CropBox{bits_below(philox_bits(seed, stream, first + 2), height - h + 1),
                   bits_below(philox_bits(seed, stream, first + 3), width - w + 1), h, w};
  }
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < config.ratio_min) {
    h = std::clamp<int64_t>(static_cast<int64_t>(std::nearbyint(width / config.ratio_min)), 1, height);
  } else if (in_ratio > config.ratio_max) {
    w = std::clamp<int64_t>(static_cast<int64_t>(std::nearbyint(height * config.ratio_max)), 1, width);
  }
  return CropBox{(height - h) / 2, (width - w) / 2, h, w};
}

PixelAffine make_pixel_affine(const TransformConfig& config, int64_t channels) {
  validate_transforms(config, channels);
  PixelAffine affine;
  affine.scale.assign(static_cast<size_t>(channels), 1.f / 255.f);
  affine.shift.assign(static_cast<size_t>(channels), 0.f);
  affine.pad_mode = config.pad_mode;
  for (size_t c = 0; c < config.mean.size(); ++c) {
    affine.scale[c] = 1.f / (255.f * config.std[c]);
    affine.shift[c] = -config.mean[c] / config.std[c];
  }
  return affine;
}

void transform_image(float* out, const uint8_t* src, int64_t channels, int64_t height,
                     int64_t width, int64_t pad, const SampleAugment& a,
                     const PixelAffine& affine) {
  const bool reflect = affine.pad_mode == PadMode::Reflect;
  ACTLAB_CHECK(!reflect || (pad < height && pad < width), "reflect padding ", pad,
               " needs images larger than the padding, got ", height, "x", width);
  const int64_t dy = a.crop_y - pad;  // source row = y + dy
  const int64_t dx = a.crop_x - pad;  // source col = xs + dx
  // Output columns whose source column lies inside the image; the rest read the padding.
  // No flip: sx = x + dx. Flip: sx = W-1-x + dx = mirror - x.
  const int64_t mirror = width - 1 + dx;
  const int64_t x_begin = std::clamp<int64_t>(a.flip ? dx : -dx, 0, width);
  const int64_t x_end = std::clamp<int64_t>(a.flip ? width + dx : width - dx, x_begin, width);
  for (int64_t c = 0; c < channels; ++c) {
    const float scale = affine.scale[c];
    const float shift = affine.shift[c];  // = the value of a zero-padding pixel (0 * scale + shift)
    for (int64_t y = 0; y < height; ++y) {
      float* o = out + (c * height + y) * width;
      int64_t sy = y + dy;
      if (sy < 0 || sy >= height) {
        if (!reflect) {
          std::fill(o, o + width, shift);
          continue;
        }
        sy = reflect_index(sy, height);
      }
      const uint8_t* s = src + (c * height + sy) * width;
      if (reflect) {  // at most pad columns on each side: a scalar loop is fine
        auto mirrored = [&](int64_t x) {
          const int64_t sx = reflect_index(a.flip ? mirror - x : x + dx, width);
          return static_cast<float>(s[sx]) * scale + shift;
        };
        for (int64_t x = 0; x < x_begin; ++x) o[x] = mirrored(x);
        for (int64_t x = x_end; x < width; ++x) o[x] = mirrored(x);
      } else {
        std::fill(o, o + x_begin, shift);
        std::fill(o + x_end, o + width, shift);
      }
      if (a.flip) {
        for (int64_t x = x_begin; x < x_end; ++x)
          o[x] = static_cast<float>(s[mirror - x]) * scale + shift;
      } else {
        for (int64_t x = x_begin; x < x_end; ++x)
          o[x] = static_cast<float>(s[x + dx]) * scale + shift;
      }
    }
  }
}

}  // namespace actlab
