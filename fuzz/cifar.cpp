// Fuzz target: the CIFAR-10 / CIFAR-100 binary readers (data/cifar.h).
// Input: one mode byte (bit 0: CIFAR-100, bit 1: coarse labels, bit 2: the file sits in the
// archive's subfolder), then the test-split file (test_batch.bin or test.bin).
// Seeds: fuzz/corpus/cifar (fuzz/make_seeds.cpp). Replayed by the fuzz_replay_cifar test.
#include "actlab/data/cifar.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using actlab::fuzz::Scratch;
  const bool hundred = data[0] & 1, coarse = data[0] & 2, subfolder = data[0] & 4;
  const Scratch& s = Scratch::get();
  s.clear();
  const std::string folder = subfolder ? (hundred ? "cifar-100-binary/" : "cifar-10-batches-bin/") : "";
  s.write(folder + (hundred ? "test.bin" : "test_batch.bin"), data + 1, size - 1);
  try {
    const actlab::InMemoryImageDataset d = hundred ? actlab::load_cifar100(s.dir().string(), false, coarse)
                                                   : actlab::load_cifar10(s.dir().string(), false);
    const int64_t classes = hundred ? (coarse ? 20 : 100) : 10;
    std::vector<uint8_t> pixels(static_cast<size_t>(d.spec().image_bytes()));
    for (int64_t i = 0; i < d.size(); ++i) {
      const int64_t label = d.read(i, pixels.data());
      if (label < 0 || label >= classes || d.spec().num_classes != classes) __builtin_trap();
    }
  } catch (const actlab::Error& e) {
    actlab::fuzz::expected(e);
  }
  return 0;
}
