// Small transformer configurations shared by the suites that build one (tests/test_vit.cpp and the CUDA
// suite, which the GPU-check build compiles without the others): a few seconds of CPU work each.
#pragma once
#include "actlab/models/swin.h"
#include "actlab/models/vit.h"

namespace actlab::testing {

inline VitConfig small_vit(float drop_path = 0.f) {
  VitConfig c;
  c.image_size = 8;
  c.patch = 4;
  c.in_channels = 2;
  c.num_classes = 3;
  c.dim = 8;
  c.depth = 2;
  c.heads = 2;
  c.mlp_ratio = 2;
  c.drop_path = drop_path;
  return c;
}
// Stage 1: an 8x8 map in 2x2 windows of 4x4, the second block shifted by 2; stage 2: one 4x4 window.
inline SwinConfig small_swin(int64_t in_channels) {
  SwinConfig c;
  c.image_size = 16;
  c.patch = 2;
  c.in_channels = in_channels;
  c.num_classes = 3;
  c.embed_dim = 4;
  c.depths = {2, 2};
  c.heads = {1, 2};
  c.window = 4;
  c.drop_path = 0.f;
  return c;
}

}  // namespace actlab::testing
