// The pre-decode image checks (data/image_bytes.h): real PNG/JPEG/BMP files pass; other formats,
// a BMP cut short of its rows, a JPEG Huffman table with more than 256 codes (heap overflow in Debian's stb_image 2.27, found by
// fuzzing), a PNG chunk longer than the file or with a wrong CRC and a header declaring a huge image are refused
// before stb_image sees them.
#include <doctest/doctest.h>

#include <stb_image_write.h>

#include <string>
#include <vector>

#include <zlib.h>

#include "actlab/data/image_bytes.h"

using namespace actlab;

namespace {

using Bytes = std::vector<uint8_t>;

void append(void* context, void* data, int size) {
  auto* b = static_cast<Bytes*>(context);
  b->insert(b->end(), static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
}
std::string problem(const Bytes& b) { return image_bytes_problem(b.data(), b.size()); }
bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
void be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

TEST_CASE("image bytes: PNG, JPEG and BMP from a real encoder pass, other formats are refused") {
  const int w = 9, h = 6;
  std::vector<uint8_t> rgb(w * h * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 7);
  Bytes png, jpg, bmp, tga;
  REQUIRE(stbi_write_png_to_func(append, &png, w, h, 3, rgb.data(), w * 3));
  REQUIRE(stbi_write_jpg_to_func(append, &jpg, w, h, 3, rgb.data(), 90));
  REQUIRE(stbi_write_bmp_to_func(append, &bmp, w, h, 3, rgb.data()));
  REQUIRE(stbi_write_tga_to_func(append, &tga, w, h, 3, rgb.data()));
  CHECK(problem(png) == "");
  CHECK(problem(jpg) == "");
  CHECK(problem(bmp) == "");
  CHECK(contains(problem(tga), "not a PNG, JPEG or BMP file"));  // stb would decode it
  const std::string gif = "GIF89a\x01\x00\x01\x00";
  CHECK(contains(problem(Bytes(gif.begin(), gif.end())), "not a PNG, JPEG or BMP file"));
  CHECK(contains(problem(Bytes()), "not a PNG, JPEG or BMP file"));
}

TEST_CASE("image bytes: a BMP shorter than its declared rows is refused, a whole one passes") {
  // stb decodes the missing rows of a cut BMP as black, and a header-only file as an image of zeros.
  const int w = 9, h = 6;
  std::vector<uint8_t> rgb(w * h * 3, 100);
  Bytes bmp;
  REQUIRE(stbi_write_bmp_to_func(append, &bmp, w, h, 3, rgb.data()));
  const size_t row = (w * 24 + 31) / 32 * 4;  // 28 bytes: rows are padded to 4
  REQUIRE(bmp.size() >= 54 + row * h);         // the headers, then every row
  CHECK(problem(bmp) == "");
  // The last row's padding holds no pixel (9 pixels of 3 bytes: 27 of its 28 bytes), so a file without it
  // is whole, as stb decodes it; one byte more cut off is not.
  CHECK(problem(Bytes(bmp.begin(), bmp.end() - 1)) == "");
  for (const size_t cut : {bmp.size() - 2, size_t{54} + row * 2, size_t{54}, size_t{30}, size_t{20}}) {
    CAPTURE(cut);
    CHECK(contains(problem(Bytes(bmp.begin(), bmp.begin() + static_cast<long>(cut))), "truncated BMP"));
  }
  CHECK(contains(problem(Bytes(bmp.begin(), bmp.end() - 2)), "9x6 pixels need"));
  // A top-down BMP (negative height) needs as many rows.
  Bytes top_down = bmp;
  const uint32_t minus_h = static_cast<uint32_t>(-h);
  for (int k = 0; k < 4; ++k) top_down[22 + k] = static_cast<uint8_t>(minus_h >> (8 * k));
  CHECK(problem(top_down) == "");
  CHECK(contains(problem(Bytes(top_down.begin(), top_down.end() - 5)), "truncated BMP"));
  // Extra bytes after the rows are harmless, as stb reads them.
  Bytes longer = bmp;
  longer.insert(longer.end(), 7, 0);
  CHECK(problem(longer) == "");
}

TEST_CASE("image bytes: a JPEG Huffman table of more than 256 codes is refused, wherever it sits") {
  // SOI, an APP0 segment to skip, then DHT: class/id, 16 counts of 17 (272 codes), the codes.
  Bytes jpeg = {0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x04, 'J', 'F', 0xFF, 0xC4};
  const uint32_t length = 2 + 17 + 272;
  jpeg.push_back(static_cast<uint8_t>(length >> 8));
  jpeg.push_back(static_cast<uint8_t>(length));
  jpeg.push_back(0x10);
  for (int k = 0; k < 16; ++k) jpeg.push_back(17);
  jpeg.insert(jpeg.end(), 272, 0x01);
  CHECK(problem(jpeg) == "corrupt JPEG: a Huffman table declares 272 codes (at most 256)");
  // 256 codes is the legal maximum; a table cut short by the end of the file still counts.
  Bytes ok(jpeg.begin(), jpeg.begin() + 12);
  ok.push_back(0x00);
  for (int k = 0; k < 16; ++k) ok.push_back(k == 0 ? 0 : k < 15 ? 18 : 4);  // 14*18 + 4 = 256
  CHECK(problem(ok) == "");
  Bytes cut(jpeg.begin(), jpeg.begin() + 30);  // the counts, none of the codes
  CHECK(contains(problem(cut), "declares"));
  // After a scan (entropy-coded bytes with a stuffed 0xFF00 and a restart marker), a second DHT.
  Bytes later = {0xFF, 0xD8, 0xFF, 0xDA, 0x00, 0x02, 0x12, 0xFF, 0x00, 0x34, 0xFF, 0xD3, 0x56};
  later.insert(later.end(), jpeg.begin() + 8, jpeg.end());
  CHECK(contains(problem(later), "declares 272 codes"));
}

// Signature + IHDR chunk of an 8-bit RGB PNG, its CRC-32 computed as a PNG writer does.
Bytes png_header(uint32_t width, uint32_t height) {
  Bytes png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  be32(png, 13);
  for (const char c : std::string("IHDR")) png.push_back(static_cast<uint8_t>(c));
  be32(png, width);
  be32(png, height);
  png.insert(png.end(), {8, 2, 0, 0, 0});
  be32(png, static_cast<uint32_t>(crc32(0L, png.data() + 12, 17)));
  return png;
}

}  // namespace

TEST_CASE("image bytes: a PNG declaring 10000 x 10000 pixels or a chunk longer than the file is refused") {
  CHECK(contains(problem(png_header(10000, 10000)), "image of 10000x10000 pixels, more than the 67108864"));
  // An 84-byte file whose IDAT claims 1.38 GB: stb would reserve that much before reading it.
  Bytes idat = png_header(7, 5);
  be32(idat, 0x52444154u);
  for (const char c : std::string("IDAT")) idat.push_back(static_cast<uint8_t>(c));
  idat.insert(idat.end(), 20, 0x5a);
  CHECK(problem(idat) == "corrupt PNG: a chunk declares 1380204884 bytes, the file has 20 left");
}

TEST_CASE("image bytes: a PNG whose chunk CRC does not match its bytes is refused (stb would decode it)") {
  Bytes png;
  const uint8_t pixels[4 * 4 * 3] = {10, 20, 30};
  stbi_write_png_to_func(append, &png, 4, 4, 3, pixels, 4 * 3);
  REQUIRE(problem(png).empty());
  // The first byte of IDAT's data: the header, then IDAT's length and type.
  size_t idat = 8;
  while (std::string(png.begin() + static_cast<long>(idat) + 4, png.begin() + static_cast<long>(idat) + 8) != "IDAT")
    idat += 12 + (uint32_t{png[idat]} << 24 | uint32_t{png[idat + 1]} << 16 | uint32_t{png[idat + 2]} << 8 | png[idat + 3]);
  png[idat + 8] ^= 0x01;
  CHECK(problem(png) == "corrupt PNG: the CRC of its IDAT chunk does not match its bytes");
  png[idat + 8] ^= 0x01;
  png[png.size() - 1] ^= 0x80;  // IEND's own CRC
  CHECK(problem(png) == "corrupt PNG: the CRC of its IEND chunk does not match its bytes");
}
