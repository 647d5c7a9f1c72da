// Image transforms applied while the loader assembles a batch: u8 -> f32 in [0,1], random crop from a
// zero- or reflect-padded image, horizontal flip, per-channel normalization; plus the table of
// per-data-set normalization constants. Randomness is a pure function of (seed, epoch, sample
// index), so a batch's bytes do not depend on threads or on batch composition. Tested in
// tests/test_data.cpp (reflect padding and the CIFAR table in tests/test_data_cifar.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace actlab {

// Per-channel mean/std of a data set's pixels in [0,1] (the values the literature normalizes with).
struct ChannelStats {
  const char* dataset;  // "fashion-mnist", "mnist", "cifar10", "cifar100"
  int channels;
  float mean[3];
  float std[3];
};
// The table entry for a data set family; a name such as "fashion-mnist/train" matches
// "fashion-mnist" (the part before '/'). Throws Error listing the known names otherwise.
const ChannelStats& channel_stats(const std::string& dataset_name);

// How the crop window reads outside the image.
//   Zero:    pixel value 0, i.e. -mean/std after normalization (torchvision
//            RandomCrop(size, padding)), the default.
//   Reflect: mirror without repeating the edge, index -1 -> 1 and W -> W-2 (torchvision
//            Pad(p, padding_mode='reflect'), numpy 'reflect'); needs crop_padding < H and < W.
enum class PadMode { Zero, Reflect };

struct TransformConfig {
  // Random crop of the original H x W from the image padded by crop_padding on every side:
  // offsets dy, dx uniform in [0, 2*crop_padding]. 0 disables cropping.
  int64_t crop_padding = 0;
  PadMode pad_mode = PadMode::Zero;
  bool horizontal_flip = false;  // flip with probability 0.5 (after the crop)
  // Per-channel normalization (x - mean) / std applied to x in [0,1]; both empty = none, otherwise
  // both must have one entry per channel and std > 0.
  std::vector<float> mean;
  std::vector<float> std;
};

// Normalization from the table, with the usual augmentation when `train`: crop padding 4 plus flip
// for CIFAR-sized (32x32) data sets (zero padding for CIFAR-10, reflect padding for CIFAR-100, as
// in the DIVISION training scripts), none for the MNIST family.
TransformConfig default_transforms(const std::string& dataset_name, bool train);

// Throws Error unless `config` is usable for images with `channels` channels.
void validate_transforms(const TransformConfig& config, int64_t channels);

// One sample's random choices.
struct SampleAugment {
  int64_t crop_y = 0;  // top of the crop window in padded coordinates, in [0, 2*pad]
  int64_t crop_x = 0;
  bool flip = false;
};

// The choices for dataset sample `sample_index` in `epoch`: Philox(seed, stream(epoch), 4*index + k).
// With crop_padding == 0, crop_y = crop_x = pad (identity); without flip, flip is false.
SampleAugment draw_augment(const TransformConfig& config, uint64_t seed, uint64_t epoch,
                           uint64_t sample_index);

// A window of an image, in source pixels.
struct CropBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
};

// RandomResizedCrop as torchvision documents it: a box of a random share of the image's area (scale)
// and random aspect ratio w/h (log-uniform in ratio), tried `attempts` times until it fits, else the
// centre crop of the whole image clamped to the ratio range. Resampling the box to the output size is
// data/image_folder.h's resize_box_to_square.
struct ResizedCropConfig {
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
  int attempts = 10;  // at most kMaxResizedCropAttempts
};
constexpr int kMaxResizedCropAttempts = 16;

// The box for dataset sample `sample_index` in `epoch` of a height x width image: attempt k draws
// Philox(seed, resized-crop stream(epoch), 64*index + 4k + {0: area, 1: ratio, 2: top, 3: left}), so
// the box is a function of (seed, epoch, index, image size) only. Per attempt (torchvision's
// get_params): area = H*W*U(scale), ratio = exp(U(log ratio_min, log ratio_max)),
// w = round(sqrt(area*ratio)), h = round(sqrt(area/ratio)) (round half to even, as Python), accepted
// when 0 < w <= W and 0 < h <= H, then top ~ U{0..H-h}, left ~ U{0..W-w}. Fallback: W/H below
// ratio_min: w = W, h = round(W/ratio_min); above ratio_max: h = H, w = round(H*ratio_max); else the
// whole image; centred (top = (H-h)/2, left = (W-w)/2). Throws Error on a bad config or H, W < 1.
CropBox draw_resized_crop(const ResizedCropConfig& config, uint64_t seed, uint64_t epoch,
                          uint64_t sample_index, int64_t height, int64_t width);

// What transform_image needs from a TransformConfig, precomputed once: the affine map from u8 to
// the normalized float, out = px * scale[c] + shift[c], with scale = 1/(255 std), shift =
// -mean/std (scale = 1/255, shift = 0 without normalization), and the padding mode.
struct PixelAffine {
  std::vector<float> scale;
  std::vector<float> shift;
  PadMode pad_mode = PadMode::Zero;
};
PixelAffine make_pixel_affine(const TransformConfig& config, int64_t channels);

// out: (C,H,W) f32; src: (C,H,W) u8 (never aliases out). With pad = config.crop_padding:
//   out[c,y,x] = P(c, y + a.crop_y - pad, xs + a.crop_x - pad) * scale[c] + shift[c],
//   xs = a.flip ? W-1-x : x, and P = src inside the image; outside it, 0 (PadMode::Zero) or src at
//   the mirrored index (PadMode::Reflect, affine.pad_mode). Reflect throws Error unless pad < H, W.
void transform_image(float* out, const uint8_t* src, int64_t channels, int64_t height,
                     int64_t width, int64_t pad, const SampleAugment& a, const PixelAffine& affine);

}  // namespace actlab
