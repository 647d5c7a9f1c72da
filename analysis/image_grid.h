// Grids of small float maps as PNG pictures (actlab-inspect's Fig. 3(a) panels): tiles normalized per
// tile or per shared group, grey for ordinary maps and a symmetric blue–white–red map for signed ones
// (HFC), nearest-neighbour upscaling so 7×7 maps stay visible, optional row/column labels, and an
// atomic PNG writer (stb_image_write from libstb). Tested in tests/test_inspect.cpp ("image_grid: ...").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace actlab {

// Gray: lo → black, hi → white over the tile's (or its group's) [min, max]; a constant range is mid grey.
// Diverging: −s → blue, 0 → white, +s → red with s = max |v| over the tile or group (0 stays white).
enum class Colormap { Gray, Diverging };

struct GridTile {
  std::vector<float> values;  // height·width, row-major; empty: a blank (background) cell
  int64_t height = 0, width = 0;
  Colormap colormap = Colormap::Gray;
  int scale_group = -1;  // tiles sharing a group >= 0 share one range (same colormap required); -1: own range
  int64_t upscale = 0;   // magnification of this tile; 0: the grid's (lets a 28×28 image sit beside 7×7 maps)
};
// A tile copied from one H×W plane.
GridTile make_tile(const float* plane, int64_t height, int64_t width, Colormap colormap = Colormap::Gray,
                   int scale_group = -1);

struct ImageGrid {
  int64_t rows = 0, cols = 0;
  std::vector<GridTile> tiles;          // rows·cols, row-major
  std::vector<std::string> row_labels;  // empty, or one per row (drawn left of the row, ASCII)
  std::vector<std::string> col_labels;  // empty, or one per column (drawn above it)
  int64_t padding = 2;                  // background pixels around every cell
  int64_t upscale = 1;                  // every tile pixel becomes upscale × upscale pixels (unless the tile says)
  int64_t text_scale = 2;               // label glyph magnification (stb_easy_font pixels)
};

struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> pixels;  // width·height·3, row-major RGB
};

// Lays out the grid: column c is as wide as its widest tile, row r as tall as its tallest (after
// upscaling); smaller tiles sit in the top-left of their cell. Throws Error on inconsistent input.
RgbImage render_grid(const ImageGrid& grid);
// The PNG file bytes of `image`.
std::string encode_png(const RgbImage& image);
// Writes the PNG to `path` atomically (temp file, fsync, rename): readers never see half a picture.
void write_png(const std::string& path, const RgbImage& image);

}  // namespace actlab
