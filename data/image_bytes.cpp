// Pre-decode checks of image bytes (see data/image_bytes.h).
#include "actlab/data/image_bytes.h"

#include <stb_image.h>
#include <zlib.h>

#include <climits>
#include <cstring>

namespace actlab {
namespace {

bool starts_with(const uint8_t* d, size_t n, const char* sig, size_t len) {
  return n >= len && std::memcmp(d, sig, len) == 0;
}

// Follows the JPEG marker structure the way stb_image 2.27 reads it and checks every DHT table it
// would build. Reads past the end return 0, as stb's do; whatever else is wrong stb reports itself.
class JpegScan {
 public:
  JpegScan(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  std::string problem() {
    for (size_t i = 2; i < n_;) {  // after SOI; bytes that are not 0xFF are entropy-coded data
      if (d_[i++] != 0xFF) continue;
      while (i < n_ && d_[i] == 0xFF) ++i;  // fill bytes
      if (i >= n_) break;
      const uint8_t marker = d_[i++];
      if (marker == 0x00 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) continue;  // no length
      if (marker == 0xD9) break;  // EOI
      if (marker != 0xC4) {  // any other segment: skip its declared length (SOS: its header only)
        i += (byte(i) << 8 | byte(i + 1));
        continue;
      }
      // DHT: tables of (class/id byte, 16 code counts, the codes) until the length is used up.
      long left = static_cast<long>(byte(i) << 8 | byte(i + 1)) - 2;
      i += 2;
      while (left > 0) {
        ++i;  // table class and id
        long codes = 0;
        for (int k = 0; k < 16; ++k) codes += byte(i++);
        if (codes > 256)
          return "corrupt JPEG: a Huffman table declares " + std::to_string(codes) + " codes (at most 256)";
        i += static_cast<size_t>(codes);
        left -= 17 + codes;
      }
      if (left < 0) break;  // stb stops here with "bad DHT header"
    }
    return "";
  }
 private:
  size_t byte(size_t at) const { return at < n_ ? d_[at] : 0; }
  const uint8_t* d_;
  size_t n_;
};

uint32_t big_endian32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3];
}

// stb reserves a PNG's IDAT buffer from the chunk's declared length before reading it, so an
// 84-byte file claiming a 1.38 GB chunk costs a 1.38 GB allocation (found by fuzz/image_folder.cpp,
// as a timeout under ASan). A chunk can never be longer than what is left of the file. stb checks
// neither the chunks' CRCs nor zlib's Adler-32, so a flipped byte decoded into wrong pixels without a
// word (found by a review; libpng and PIL refuse such files): every chunk's CRC-32 is checked here.
std::string png_problem(const uint8_t* d, size_t n) {
  for (size_t i = 8; i + 8 <= n;) {  // chunk: length (4, big endian), type (4), data, CRC (4)
    const uint64_t length = big_endian32(d + i);
    const size_t left = n - i - 8;
    if (length > left)
      return "corrupt PNG: a chunk declares " + std::to_string(length) + " bytes, the file has " +
             std::to_string(left) + " left";
    const std::string type(reinterpret_cast<const char*>(d + i + 4), 4);
#ifndef ACTLAB_FUZZING  // libFuzzer's mutations would almost never get past a CRC to stb's decoder
    if (length + 4 <= left) {  // a CRC-less last chunk is stb's to refuse
      const uint32_t crc = static_cast<uint32_t>(::crc32_z(0L, d + i + 4, static_cast<size_t>(4 + length)));
      if (crc != big_endian32(d + i + 8 + length))
        return "corrupt PNG: the CRC of its " + type + " chunk does not match its bytes";
    }
#endif
    if (type == "IEND") break;
    i += 8 + static_cast<size_t>(length) + 4;
  }
  return "";
}

uint32_t little_endian32(const uint8_t* p) {
  return uint32_t{p[3]} << 24 | uint32_t{p[2]} << 16 | uint32_t{p[1]} << 8 | p[0];
}

// stb decodes a BMP whose pixel rows stop early as if the missing rows were black, and does not mind a
// header-only file (a 64-byte file declaring 4000x4000 came back as 48 MB of zeros, found by a probe): an
// uncompressed BMP must hold every row its header declares. Compressed (RLE, JPEG/PNG-in-BMP) ones have no
// fixed size and are left to stb.
std::string bmp_problem(const uint8_t* d, size_t n) {
  if (n < 26) return "truncated BMP: " + std::to_string(n) + " bytes, shorter than its headers";
  const uint64_t offset = little_endian32(d + 10), header = little_endian32(d + 14);
  int64_t width = 0, height = 0;
  uint32_t bpp = 0, compression = 0;
  if (header == 12) {  // BITMAPCOREHEADER: 16-bit sizes, no compression
    width = d[18] | d[19] << 8;
    height = d[20] | d[21] << 8;
    bpp = d[24] | (n > 25 ? d[25] << 8 : 0);
  } else {
    if (n < 34) return "truncated BMP: " + std::to_string(n) + " bytes, shorter than its headers";
    width = static_cast<int32_t>(little_endian32(d + 18));
    height = static_cast<int32_t>(little_endian32(d + 22));  // negative: rows stored top-down
    bpp = d[28] | d[29] << 8;
    compression = little_endian32(d + 30);
  }
  // BI_RGB and the bit-field layouts store plain rows; anything else (RLE, embedded JPEG/PNG) is stb's.
  if (compression != 0 && compression != 3 && compression != 6) return "";
  if (width <= 0 || height == 0 || bpp == 0 || bpp > 32) return "";  // stb refuses these itself
  // Rows are padded to 4 bytes, but the last row's padding holds no pixel: stb decodes a file without it.
  const uint64_t row = (static_cast<uint64_t>(width) * bpp + 31) / 32 * 4, rows = height < 0 ? -height : height;
  const uint64_t need = offset + row * (rows - 1) + (static_cast<uint64_t>(width) * bpp + 7) / 8;
  if (need > n)
    return "truncated BMP: its " + std::to_string(width) + "x" + std::to_string(rows) +
           " pixels need " + std::to_string(need) + " bytes, the file has " + std::to_string(n);
  return "";
}

}  // namespace

std::string image_bytes_problem(const uint8_t* data, size_t size) {
  const bool png = starts_with(data, size, "\x89PNG\r\n\x1a\n", 8);
  const bool jpeg = starts_with(data, size, "\xff\xd8\xff", 3);
  const bool bmp = starts_with(data, size, "BM", 2);
  if (!png && !jpeg && !bmp) return "not a PNG, JPEG or BMP file (checked by its first bytes, not its name)";
  const std::string p = jpeg ? JpegScan(data, size).problem() : png ? png_problem(data, size) : bmp_problem(data, size);
  if (!p.empty()) return p;
  if (size > static_cast<size_t>(INT_MAX)) return "file larger than 2 GiB";
  int width = 0, height = 0, channels = 0;
  if (stbi_info_from_memory(data, static_cast<int>(size), &width, &height, &channels) &&
      static_cast<int64_t>(width) * height > kMaxImagePixels)
    return "image of " + std::to_string(width) + "x" + std::to_string(height) + " pixels, more than the " +
           std::to_string(kMaxImagePixels) + " this loader decodes";
  return "";
}

}  // namespace actlab
