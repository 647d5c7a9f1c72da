// Image grids: per-tile/per-group ranges, colormaps, layout, labels rasterized from stb_easy_font's
// quads, PNG encoding with stb_image_write. libstb.so (Debian libstb-dev) carries the stb_image_write
// implementation (stbi_write_png_to_func is exported), so STB_IMAGE_WRITE_IMPLEMENTATION is not defined;
// stb_easy_font is header-only with static functions.
#include "actlab/analysis/image_grid.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "actlab/core/error.h"
#include "actlab/io/files.h"

#include <stb_image_write.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include <stb_easy_font.h>
#pragma GCC diagnostic pop

namespace actlab {
namespace {

constexpr uint8_t kBackground = 200;  // light grey: white is the diverging map's zero
constexpr uint8_t kInk = 0;

struct Range {
  float lo = INFINITY, hi = -INFINITY;  // Gray: [min, max]; Diverging: lo unused, hi = max |v|
};

void widen(Range& r, const GridTile& t) {
  for (float v : t.values) {
    if (!std::isfinite(v)) continue;
    if (t.colormap == Colormap::Gray) {
      r.lo = std::min(r.lo, v);
      r.hi = std::max(r.hi, v);
    } else {
      r.hi = std::max(r.hi, std::fabs(v));
    }
  }
}

void color_of(uint8_t* rgb, float v, Colormap map, const Range& r) {
  if (!std::isfinite(v)) {  // flag NaN/inf loudly instead of hiding them in the scale
    rgb[0] = 255, rgb[1] = 0, rgb[2] = 255;
    return;
  }
  if (map == Colormap::Gray) {
    const float span = r.hi - r.lo;
    const float t = span > 0 ? (v - r.lo) / span : 0.5f;
    rgb[0] = rgb[1] = rgb[2] = static_cast<uint8_t>(std::lround(255.f * std::clamp(t, 0.f, 1.f)));
    return;
  }
  const float t = r.hi > 0 ? std::clamp(v / r.hi, -1.f, 1.f) : 0.f;
  // White to red (178,24,43) for t > 0, white to blue (33,102,172) for t < 0 (ColorBrewer RdBu ends).
  const float a = std::fabs(t);
  const float end[3] = {t > 0 ? 178.f : 33.f, t > 0 ? 24.f : 102.f, t > 0 ? 43.f : 172.f};
  for (int c = 0; c < 3; ++c) rgb[c] = static_cast<uint8_t>(std::lround(255.f + a * (end[c] - 255.f)));
}

// Text extent in image pixels.
int64_t text_width(const std::string& s, int64_t scale) {
  std::string copy = s;
  return s.empty() ? 0 : stb_easy_font_width(copy.data()) * scale;
}
int64_t text_height(int64_t scale) { return 8 * scale; }  // stb_easy_font glyphs: 7 rows + descent

// Fills the quads stb_easy_font produces for `s` at (x, y), magnified by `scale`, clipped to the image.
void draw_text(RgbImage& img, const std::string& s, int64_t x, int64_t y, int64_t scale) {
  if (s.empty()) return;
  std::string text = s;
  std::vector<char> vertices(300 * (s.size() + 4));  // ~270 bytes per character (stb_easy_font docs)
  const int quads = stb_easy_font_print(0.f, 0.f, text.data(), nullptr, vertices.data(),
                                        static_cast<int>(vertices.size()));
  for (int q = 0; q < quads; ++q) {
    float x0 = INFINITY, y0 = INFINITY, x1 = -INFINITY, y1 = -INFINITY;
    for (int k = 0; k < 4; ++k) {  // vertex: x, y, z floats + 4 colour bytes = 16 bytes
      const float* v = reinterpret_cast<const float*>(vertices.data() + (q * 4 + k) * 16);
      x0 = std::min(x0, v[0]), x1 = std::max(x1, v[0]);
      y0 = std::min(y0, v[1]), y1 = std::max(y1, v[1]);
    }
    const int64_t px0 = x + static_cast<int64_t>(std::lround(x0 * scale)), px1 = x + std::lround(x1 * scale);
    const int64_t py0 = y + static_cast<int64_t>(std::lround(y0 * scale)), py1 = y + std::lround(y1 * scale);
    for (int64_t py = std::max<int64_t>(py0, 0); py < std::min(py1, img.height); ++py)
      for (int64_t px = std::max<int64_t>(px0, 0); px < std::min(px1, img.width); ++px)
        for (int c = 0; c < 3; ++c) img.pixels[(py * img.width + px) * 3 + c] = kInk;
  }
}

int64_t tile_upscale(const GridTile& t, const ImageGrid& g) { return t.upscale > 0 ? t.upscale : g.upscale; }

void check_grid(const ImageGrid& g) {
  ACTLAB_CHECK(g.rows >= 1 && g.cols >= 1, "image grid: needs at least 1x1 cells, got ", g.rows, "x", g.cols);
  ACTLAB_CHECK(static_cast<int64_t>(g.tiles.size()) == g.rows * g.cols, "image grid: ", g.rows, "x", g.cols,
               " cells but ", g.tiles.size(), " tiles");
  ACTLAB_CHECK(g.row_labels.empty() || static_cast<int64_t>(g.row_labels.size()) == g.rows, "image grid: ",
               g.row_labels.size(), " row labels for ", g.rows, " rows");
  ACTLAB_CHECK(g.col_labels.empty() || static_cast<int64_t>(g.col_labels.size()) == g.cols, "image grid: ",
               g.col_labels.size(), " column labels for ", g.cols, " columns");
  ACTLAB_CHECK(g.padding >= 0 && g.upscale >= 1 && g.upscale <= 256 && g.text_scale >= 1,
               "image grid: bad padding ", g.padding, ", upscale ", g.upscale, " or text scale ", g.text_scale);
  for (const auto& t : g.tiles) {
    ACTLAB_CHECK(t.values.empty() || (t.height >= 1 && t.width >= 1 &&
                                      static_cast<int64_t>(t.values.size()) == t.height * t.width),
                 "image grid: a ", t.height, "x", t.width, " tile holds ", t.values.size(), " values");
    ACTLAB_CHECK(t.upscale >= 0 && t.upscale <= 256, "image grid: bad tile upscale ", t.upscale);
  }
}

}  // namespace

GridTile make_tile(const float* plane, int64_t height, int64_t width, Colormap colormap, int scale_group) {
  GridTile t;
  t.values.assign(plane, plane + height * width);
  t.height = height;
  t.width = width;
  t.colormap = colormap;
  t.scale_group = scale_group;
  return t;
}

RgbImage render_grid(const ImageGrid& g) {
  check_grid(g);
  // Ranges: shared per group, own per ungrouped tile.
  std::map<int, std::pair<Range, Colormap>> groups;
  for (const auto& t : g.tiles) {
    if (t.values.empty() || t.scale_group < 0) continue;
    auto it = groups.find(t.scale_group);
    if (it == groups.end()) it = groups.emplace(t.scale_group, std::make_pair(Range{}, t.colormap)).first;
    ACTLAB_CHECK(it->second.second == t.colormap, "image grid: scale group ", t.scale_group, " mixes colormaps");
    widen(it->second.first, t);
  }
  // Layout.
  std::vector<int64_t> col_w(g.cols, 0), row_h(g.rows, 0);
  for (int64_t r = 0; r < g.rows; ++r)
    for (int64_t c = 0; c < g.cols; ++c) {
      const GridTile& t = g.tiles[r * g.cols + c];
      if (t.values.empty()) continue;
      col_w[c] = std::max(col_w[c], t.width * tile_upscale(t, g));
      row_h[r] = std::max(row_h[r], t.height * tile_upscale(t, g));
    }
  int64_t label_w = 0, header_h = 0;
  for (const auto& s : g.row_labels) label_w = std::max(label_w, text_width(s, g.text_scale) + 2 * g.padding);
  if (!g.col_labels.empty()) header_h = text_height(g.text_scale) + g.padding;
  std::vector<int64_t> col_x(g.cols), row_y(g.rows);
  int64_t x = label_w + g.padding, y = header_h + g.padding;
  for (int64_t c = 0; c < g.cols; ++c) col_x[c] = x, x += col_w[c] + g.padding;
  for (int64_t r = 0; r < g.rows; ++r) row_y[r] = y, y += row_h[r] + g.padding;
  RgbImage img;
  img.width = x;
  img.height = y;
  ACTLAB_CHECK(img.width * img.height <= (int64_t{1} << 28), "image grid: ", img.width, "x", img.height,
               " pixels is too large (lower the upscale)");
  img.pixels.assign(static_cast<size_t>(img.width * img.height * 3), kBackground);
  // Tiles.
  for (int64_t r = 0; r < g.rows; ++r)
    for (int64_t c = 0; c < g.cols; ++c) {
      const GridTile& t = g.tiles[r * g.cols + c];
      if (t.values.empty()) continue;
      Range own;
      if (t.scale_group < 0) widen(own, t);
      const Range& range = t.scale_group < 0 ? own : groups.at(t.scale_group).first;
      const int64_t up = tile_upscale(t, g);
      for (int64_t i = 0; i < t.height * up; ++i)
        for (int64_t j = 0; j < t.width * up; ++j) {
          uint8_t* px = &img.pixels[((row_y[r] + i) * img.width + col_x[c] + j) * 3];
          color_of(px, t.values[(i / up) * t.width + j / up], t.colormap, range);
        }
    }
  // Labels.
  for (int64_t r = 0; r < static_cast<int64_t>(g.row_labels.size()); ++r)
    draw_text(img, g.row_labels[r], g.padding, row_y[r] + std::max<int64_t>(0, (row_h[r] - text_height(g.text_scale)) / 2),
              g.text_scale);
  for (int64_t c = 0; c < static_cast<int64_t>(g.col_labels.size()); ++c)
    draw_text(img, g.col_labels[c], col_x[c], g.padding / 2 + 1, g.text_scale);
  return img;
}

std::string encode_png(const RgbImage& image) {
  ACTLAB_CHECK(image.width >= 1 && image.height >= 1 &&
                   image.pixels.size() == static_cast<size_t>(image.width * image.height * 3),
               "encode_png: ", image.width, "x", image.height, " image with ", image.pixels.size(), " bytes");
  std::string bytes;
  auto append = [](void* context, void* data, int size) {
    static_cast<std::string*>(context)->append(static_cast<const char*>(data), static_cast<size_t>(size));
  };
  const int ok = stbi_write_png_to_func(append, &bytes, static_cast<int>(image.width), static_cast<int>(image.height),
                                        3, image.pixels.data(), static_cast<int>(image.width * 3));
  ACTLAB_CHECK(ok != 0 && !bytes.empty(), "encode_png: stb_image_write failed for a ", image.width, "x",
               image.height, " image");
  return bytes;
}

void write_png(const std::string& path, const RgbImage& image) { write_text_atomic(path, encode_png(image)); }

}  // namespace actlab
