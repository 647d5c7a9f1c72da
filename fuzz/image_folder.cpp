// Fuzz target: image decoding through the image-folder loader (data/image_folder.h): stb_image's
// PNG/JPEG/BMP/... decoders, then the resize/crop to a square and the data set checks.
// Input: byte 0 = options (bit 0: RGB, bits 1-2: resize mode), byte 1 = output size (1..64), then
// the image file, saved as root/cat/img.<png|jpg|bmp> and root/dog/img.<...> (a folder needs two classes;
// extension from bits 3-4 of byte 0; stb
// sniffs the format from the bytes either way). In the ACTLAB_FUZZ build stb_image is compiled in,
// instrumented (fuzz/stb_image_impl.cpp), so libFuzzer sees its branches.
// Seeds: fuzz/corpus/image_folder (fuzz/make_seeds.cpp). Replayed by the fuzz_replay_image_folder test.
#include <stb_image.h>

#include "actlab/data/image_bytes.h"
#include "actlab/data/image_folder.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // A 727-byte JPEG may declare 65287 x 242 pixels and take a second to decode (10 s under ASan):
  // valid, within the loader's limit, and the same code as a small image, so the fuzzer skips
  // images above 4 megapixels instead of timing out on them.
  // (stbi_info reads JPEG tables too: only after the loader's own pre-check has passed the bytes.)
  int width = 0, height = 0, channels = 0;
  if (size - 2 < (1u << 30) && actlab::image_bytes_problem(data + 2, size - 2).empty() &&
      stbi_info_from_memory(data + 2, static_cast<int>(size - 2), &width, &height, &channels) &&
      static_cast<int64_t>(width) * height > (int64_t{1} << 22))
    return 0;
  using actlab::fuzz::Scratch;
  actlab::ImageFolderOptions o;
  o.channels = (data[0] & 1) ? 3 : 1;
  const int mode = (data[0] >> 1) & 3;
  o.resize = mode == 0 ? actlab::ResizeMode::Area : mode == 1 ? actlab::ResizeMode::Bilinear
                                                              : actlab::ResizeMode::CropOnly;
  o.size = 1 + data[1] % 64;
  static const char* const kExtensions[] = {"png", "jpg", "bmp", "jpeg"};
  const Scratch& s = Scratch::get();
  s.clear();
  for (const char* cls : {"cat", "dog"})
    s.write(std::string("root/") + cls + "/img." + kExtensions[(data[0] >> 3) & 3], data + 2, size - 2);
  try {
    const actlab::ImageFolderData d = actlab::load_image_folder((s.dir() / "root").string(), o);
    if (d.train.size() != 2 || d.test.size() != 0 || d.train.spec().height != o.size ||
        d.train.spec().channels != o.channels)
      __builtin_trap();
  } catch (const actlab::Error& e) {
    actlab::fuzz::expected(e);
  }
  return 0;
}
