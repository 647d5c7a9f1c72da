// Reader for the IDX format of MNIST and Fashion-MNIST (idx3-ubyte images, idx1-ubyte labels), raw
// or gzip-compressed (detected by the 1f 8b magic, read with zlib). Every malformed input is one
// actlab::Error that names the file and the problem. Tested in tests/test_data.cpp.
#pragma once
#include <string>

#include "actlab/data/dataset.h"

namespace actlab {

// Loads an images file (magic 0x00000803: count, rows, cols, then count*rows*cols u8 pixels) and a
// labels file (magic 0x00000801: count, then count u8 labels) into an InMemoryImageDataset of shape
// (count, 1, rows, cols), tensors tagged MemTag::Data. Checks: file exists and is readable, magic,
// non-zero dims, payload size == header (truncated and trailing bytes both rejected), equal counts,
// every label < num_classes. `name` defaults to the images file name.
InMemoryImageDataset load_idx_dataset(const std::string& images_path,
                                      const std::string& labels_path, int64_t num_classes = 10,
                                      const std::string& name = "");

// The standard file names inside `dir`: train-images-idx3-ubyte / train-labels-idx1-ubyte (train)
// or t10k-images-idx3-ubyte / t10k-labels-idx1-ubyte (test), each raw or with ".gz" (raw preferred
// when both exist). Names the data set "fashion-mnist/train", "mnist/test", ...
InMemoryImageDataset load_fashion_mnist(const std::string& dir, bool train);
InMemoryImageDataset load_mnist(const std::string& dir, bool train);

// Where Debian's dataset-fashion-mnist package installs the files (/usr/share/datasets/fashion-mnist),
// unless the environment variable ACTLAB_FASHION_MNIST_DIR names another directory.
std::string default_fashion_mnist_dir();

// True when `dir` holds both train and test files (raw or gzip): lets tests and apps fall back to
// make_synthetic_dataset with a message instead of failing.
bool idx_files_present(const std::string& dir);

}  // namespace actlab
