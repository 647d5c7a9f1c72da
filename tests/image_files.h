// Image files written by the data suites (tests/test_data_folder.cpp, tests/test_data_stream.cpp):
// an (h, w, c) interleaved image as stb reads and writes it, a pattern that differs per id, and
// PNG/JPEG/text writers (Debian's stb_image_write) that create the folders on the way.
#pragma once
#include <stb_image_write.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>

namespace actlab::testing {

using Bytes = std::vector<uint8_t>;

struct Hwc {
  int h, w, c;
  Bytes px;
  uint8_t& at(int y, int x, int ch) { return px[(static_cast<size_t>(y) * w + x) * c + ch]; }
};

inline Hwc pattern_image(int h, int w, int c, int id) {
  Hwc img{h, w, c, Bytes(static_cast<size_t>(h) * w * c)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int ch = 0; ch < c; ++ch)
        img.at(y, x, ch) = static_cast<uint8_t>(id * 40 + y * 9 + x * 5 + ch * 71);
  return img;
}

// An (h, w, 3) image whose left half (x < w/2) is colour a and right half colour b: the resize
// tests work out by hand where the edge lands.
inline Hwc two_halves(int h, int w, const uint8_t a[3], const uint8_t b[3]) {
  Hwc img{h, w, 3, Bytes(static_cast<size_t>(h) * w * 3)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) img.at(y, x, c) = x < w / 2 ? a[c] : b[c];
  return img;
}

inline void write_png(const std::filesystem::path& path, const Hwc& img) {
  std::filesystem::create_directories(path.parent_path());
  REQUIRE(stbi_write_png(path.c_str(), img.w, img.h, img.c, img.px.data(), img.w * img.c) != 0);
}

inline void write_jpg(const std::filesystem::path& path, const Hwc& img) {
  std::filesystem::create_directories(path.parent_path());
  REQUIRE(stbi_write_jpg(path.c_str(), img.w, img.h, img.c, img.px.data(), 95) != 0);
}

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

}  // namespace actlab::testing
