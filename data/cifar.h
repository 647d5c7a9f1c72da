// Reader for the binary CIFAR-10 and CIFAR-100 distributions (cifar-10-binary.tar.gz,
// cifar-100-binary.tar.gz; scripts/get-cifar.sh fetches them). Records are copied straight into
// MemTag::Data tensors; every malformed input is one actlab::Error naming the file.
// Tested in tests/test_data_cifar.cpp.
#pragma once
#include <string>

#include "actlab/data/dataset.h"

namespace actlab {

// File layout (both: 32x32 RGB, pixels stored as 1024 R, then 1024 G, then 1024 B bytes, each plane
// row-major, i.e. already (C,H,W)):
//   CIFAR-10:  data_batch_1.bin .. data_batch_5.bin (train), test_batch.bin (test);
//              record = 1 label byte (0..9) + 3072 pixel bytes = 3073 bytes, 10000 per file.
//   CIFAR-100: train.bin (50000 records), test.bin (10000);
//              record = coarse label (0..19) + fine label (0..99) + 3072 pixel bytes = 3074 bytes.
// `dir` may hold the files itself or the archive's folder (cifar-10-batches-bin/ or
// cifar-100-binary/); the files themselves are preferred when both exist.
//
// Returns images (N,3,32,32) u8 and labels (N) i64, in file order (train: batch 1 first), named
// "cifar10/train", "cifar10/test", "cifar100/train", "cifar100/test" (coarse:
// "cifar100/train-coarse",
// ...), so channel_stats() and default_transforms() find the CIFAR constants.
// Any positive whole number of records per file is accepted (tests use a few); Error when a file is
// missing (listing what was expected and pointing to scripts/get-cifar.sh), empty, not a whole
// number of records (truncated or oversized), or holds a label out of range (naming the record
// index).
InMemoryImageDataset load_cifar10(const std::string& dir, bool train);
// Fine labels (100 classes) by default; coarse = true gives the 20 superclasses.
InMemoryImageDataset load_cifar100(const std::string& dir, bool train, bool coarse = false);

// The shape and class count of CIFAR-`which` (10 or 100; coarse: CIFAR-100's 20 superclasses), which every
// load gives, known without reading a file (actlab-train --summary needs no data for them).
ImageSpec cifar_spec(int which, bool coarse = false);

// True when `dir` (or its archive subfolder) holds every train and test file of CIFAR-`which`
// (10 or 100; Error otherwise): lets apps fall back to another data set with a message.
bool cifar_files_present(const std::string& dir, int which);

// Where scripts/get-cifar.sh unpacks by default and the trainer looks without --data-dir:
// $ACTLAB_CIFAR_DIR when set and non-empty, else $XDG_CACHE_HOME/actlab/cifar, else
// $HOME/.cache/actlab/cifar (a per-user cache: the data can be fetched again, and it stays out of the
// source tree, where git would see 170 MB of untracked files). `scripts/get-cifar.sh where` prints
// the same path; tests/test_data_cifar.cpp checks that the two agree.
std::string default_cifar_dir();

}  // namespace actlab
