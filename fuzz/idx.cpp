// Fuzz target: the IDX reader (data/idx.h) on an images file and a labels file, raw or gzip.
// Input: u16 little-endian length L of the images file, L bytes of it, then the labels file.
// Seeds: fuzz/corpus/idx (written by fuzz/make_seeds.cpp). Replayed by the fuzz_replay_idx test.
#include <algorithm>

#include "actlab/data/idx.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using actlab::fuzz::Scratch;
  const size_t images_len = std::min<size_t>(actlab::fuzz::take_u32(data, std::min<size_t>(size, 2), 0),
                                             size > 2 ? size - 2 : 0);
  const size_t labels_at = std::min(size, 2 + images_len);
  const Scratch& s = Scratch::get();
  const std::string images = s.write("images-idx3-ubyte", data + std::min<size_t>(size, 2), images_len);
  const std::string labels = s.write("labels-idx1-ubyte", data + labels_at, size - labels_at);
  try {
    const actlab::InMemoryImageDataset d = actlab::load_idx_dataset(images, labels, 10);
    // A loaded data set must be self-consistent: every sample readable, every label in range.
    std::vector<uint8_t> pixels(static_cast<size_t>(d.spec().channels * d.spec().height * d.spec().width));
    for (int64_t i = 0; i < d.size(); ++i) {
      const int64_t label = d.read(i, pixels.data());
      if (label < 0 || label >= 10) __builtin_trap();
    }
  } catch (const actlab::Error& e) {
    actlab::fuzz::expected(e);
  }
  return 0;
}
