// The train/test splits a run's configuration names: Fashion-MNIST, MNIST, CIFAR-10/100, an image
// folder or generated data, with the data set family's transforms. In train/data_splits.cpp; tested in
// tests/test_train.cpp and tests/test_data*.cpp.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "actlab/data/dataset.h"
#include "actlab/data/transforms.h"
#include "actlab/train/config.h"

namespace actlab {

// Loads the train/test splits named by the config (or throws Error saying what is missing and how to
// get it). In train/data_splits.cpp.
struct DataSplits {
  std::shared_ptr<Dataset> train, test;
  std::string note;
  std::string family;                 // normalization / augmentation family ("cifar10", ...)
  TransformConfig train_transforms;   // the family's standard training augmentation + normalization
  TransformConfig test_transforms;    // normalization only
  // What a resumed run must find again (train/trainer.cpp): the splits' sizes before --train-limit and
  // --test-limit, the classes and, for a folder, a hash of the class names and one of the file names with
  // their labels, so that a folder that gained files, renamed a class (shifting every label after it) or
  // had files renamed or moved between classes or splits is not resumed as if it were the same; for IDX and
  // CIFAR data a hash of every label and 256 evenly spaced images per split, so that another copy of the
  // same sizes (MNIST under Fashion-MNIST's name, another rank's other copy) is not taken for it either. A
  // folder's file replaced under its own name is not seen (its resized pixels depend on --image-size and
  // the build, so they are not hashed).
  std::string identity;
};
// Whether a checkpoint's stored identity names the data `now` names; one stored before identities had the
// contents' hash, or folders' the files' hash, is compared without them.
bool same_data_identity(const std::string& stored, const std::string& now);
DataSplits load_data(const TrainConfig& config);
// The spec of load_data's splits when it is known without reading any data (CIFAR-10/100, synthetic), so
// --summary runs before the data is fetched; nullopt for the others (their files say).
std::optional<ImageSpec> known_data_spec(const TrainConfig& config);
// Throws Error listing the data sets load_data knows unless `name` is one of them.
void check_dataset_name(const std::string& name);

// Batches each loader keeps ready ahead of the training step (DataLoader's prefetch_depth).
constexpr int kPrefetchBatches = 2;
// The loader threads a run uses: --data-workers, or when 0: 1 for data held in memory (a copy and a
// transform per image), and for --stream half the hardware threads, 1 to 8 (decoding is the cost,
// and the other half trains).
int data_workers(const TrainConfig& config);

}  // namespace actlab
