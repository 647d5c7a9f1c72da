// Checks of an image file's bytes before stb_image decodes them (data/image_folder.cpp). stb sniffs
// the format from the content, so a file named .png may reach any of its ten decoders; Debian 12
// ships stb_image 2.27, whose JPEG reader trusts Huffman table sizes (a DHT segment declaring more
// than 256 codes overflows its tables: found by fuzz/image_folder.cpp, fixed upstream in 2.28) and
// sizes buffers from lengths the file declares.
// Tested in tests/test_image_bytes.cpp and by replaying fuzz/crashes/image_folder/.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace actlab {

// Largest image (width x height) handed to the decoder: a 60-byte PNG may declare 10000 x 10000
// RGB pixels (stb itself refuses only above 2^30 bytes), and stb allocates the output before it
// notices that the data is missing.
constexpr int64_t kMaxImagePixels = int64_t{1} << 26;  // 67 megapixels, e.g. 8192 x 8192

// "" when the bytes may go to stb_image, else why not (one sentence, no path): the signature is
// not PNG, JPEG or BMP (the formats the image-folder loader documents); a JPEG Huffman table
// declares more than 256 codes; a PNG chunk declares more bytes than the file has left, or its CRC-32
// does not match its bytes; the header
// declares more than kMaxImagePixels pixels.
std::string image_bytes_problem(const uint8_t* data, size_t size);

}  // namespace actlab
