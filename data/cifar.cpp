// CIFAR-10 / CIFAR-100 binary reader (see data/cifar.h): locates the files, validates every size
// before allocating, then streams records through one reused chunk buffer into the MemTag::Data
// tensors. Every error message names the offending file. Tested in tests/test_data_cifar.cpp.
#include "actlab/data/cifar.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "actlab/core/error.h"

namespace actlab {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kChannels = 3;
constexpr int64_t kSide = 32;
constexpr int64_t kPixelBytes = kChannels * kSide * kSide;  // 3072, already (C,H,W) on disk
// Records read per call. Reading a whole file at once would need a 150 MB staging buffer for
// CIFAR-100's train.bin; a reused ~6 MB chunk reads as fast and keeps first-touch page faults
// (expensive on VMs) to one chunk.
constexpr int64_t kChunkRecords = 2048;

// What differs between the two distributions.
struct CifarFormat {
  const char* family;      // data set name prefix, "cifar10"
  const char* title;       // for messages, "CIFAR-10"
  const char* archive;     // the official archive, "cifar-10-binary.tar.gz"
  const char* subfolder;   // the folder the archive unpacks to
  const char* script_arg;  // scripts/get-cifar.sh argument
  int64_t label_bytes;     // label bytes before the pixels of each record
  std::vector<std::string> train_files;
  std::vector<std::string> test_files;
  int64_t record_bytes() const { return label_bytes + kPixelBytes; }
};

const CifarFormat& cifar_format(int which) {
  static const CifarFormat cifar10{"cifar10",
                                   "CIFAR-10",
                                   "cifar-10-binary.tar.gz",
                                   "cifar-10-batches-bin",
                                   "cifar10",
                                   1,
                                   {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                    "data_batch_4.bin", "data_batch_5.bin"},
                                   {"test_batch.bin"}};
  static const CifarFormat cifar100{"cifar100",         "CIFAR-100", "cifar-100-binary.tar.gz",
                                    "cifar-100-binary", "cifar100",  2,
                                    {"train.bin"},      {"test.bin"}};
  ACTLAB_CHECK(which == 10 || which == 100, "CIFAR variant must be 10 or 100, got ", which);
  return which == 10 ? cifar10 : cifar100;
}

std::vector<std::string> missing_in(const fs::path& folder, const std::vector<std::string>& files) {
  std::vector<std::string> missing;
  std::error_code ec;
  for (const std::string& f : files)
    if (!fs::is_regular_file(folder / f, ec)) missing.push_back(f);
  return missing;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The folder holding every file of `files`: `dir` itself, else its archive subfolder.
fs::path locate(const std::string& dir, const CifarFormat& format,
                const std::vector<std::string>& files, const char* split) {
  const fs::path candidates[2] = {fs::path(dir), fs::path(dir) / format.subfolder};
  std::vector<std::string> missing[2];
  for (int i = 0; i < 2; ++i) {
    missing[i] = missing_in(candidates[i], files);
    if (missing[i].empty()) return candidates[i];
  }
  // Report the candidate that came closer (the folder itself on a tie).
  const int best = missing[1].size() < missing[0].size() ? 1 : 0;
  ACTLAB_FAIL(format.title, " ", split, " files not found: ", candidates[best].string(), " lacks ",
              join(missing[best]), " (also looked in ", candidates[1 - best].string(),
              "). Expected ", join(format.train_files), " (train) and ", join(format.test_files),
              " (test) from ", format.archive, ": run scripts/get-cifar.sh ", format.script_arg,
              " ", dir);
}

// Size of `path` in whole records; Error when empty or not a whole number of records.
int64_t count_records(const fs::path& path, const CifarFormat& format) {
  std::error_code ec;
  const uint64_t bytes = fs::file_size(path, ec);
  ACTLAB_CHECK(!ec, path.string(), ": cannot read its size: ", ec.message());
  const uint64_t record = static_cast<uint64_t>(format.record_bytes());
  ACTLAB_CHECK(bytes > 0, path.string(), ": empty file");
  ACTLAB_CHECK(bytes % record == 0, path.string(), ": ", bytes, " bytes is not a whole number of ",
               record, "-byte ", format.title, " records (", format.label_bytes, " label byte",
               format.label_bytes > 1 ? "s" : "", " + ", kPixelBytes, " pixels): ", bytes / record,
               " records and ", bytes % record, " bytes over; the file is truncated or oversized");
  return static_cast<int64_t>(bytes / record);
}

// Streams the `records` records of `path` into images/labels (already offset to this file's first
// record). label_offset selects the label byte that becomes the class; every label byte of the
// record is checked against its range first.
void read_records(uint8_t* images, int64_t* labels, const fs::path& path, int64_t records,
                  const CifarFormat& format, int64_t label_offset, std::vector<uint8_t>& chunk) {
  // CIFAR-10: [label < 10]. CIFAR-100: [coarse < 20, fine < 100].
  const int64_t label_limits[2] = {format.label_bytes == 1 ? 10 : 20, 100};
  const char* label_names[2] = {format.label_bytes == 1 ? "label" : "coarse label", "fine label"};
  const int64_t record_bytes = format.record_bytes();
  std::ifstream in(path, std::ios::binary);
  ACTLAB_CHECK(in.is_open(), path.string(), ": cannot open: ", std::strerror(errno));
  for (int64_t first = 0; first < records; first += kChunkRecords) {
    const int64_t n = std::min(kChunkRecords, records - first);
    in.read(reinterpret_cast<char*>(chunk.data()), static_cast<std::streamsize>(n * record_bytes));
    ACTLAB_CHECK(in.gcount() == n * record_bytes, path.string(), ": read error at byte ",
                 first * record_bytes + in.gcount(), " of ", records * record_bytes,
                 " (did the file change while loading?)");
    const uint8_t* base = chunk.data();
    for (int64_t r = 0; r < n; ++r) {
      const uint8_t* rec = base + r * record_bytes;
      for (int64_t k = 0; k < format.label_bytes; ++k)
        ACTLAB_CHECK(rec[k] < label_limits[k], path.string(), ": record ", first + r, " has ",
                     label_names[k], " ", int{rec[k]}, ", must be < ", label_limits[k]);
      labels[first + r] = rec[label_offset];
    }
    uint8_t* dst = images + first * kPixelBytes;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(dst + r * kPixelBytes, base + r * record_bytes + format.label_bytes,
                  static_cast<size_t>(kPixelBytes));
  }
}

InMemoryImageDataset load_cifar(const std::string& dir, int which, bool train, bool coarse) {
  const CifarFormat& format = cifar_format(which);
  const std::vector<std::string>& files = train ? format.train_files : format.test_files;
  const fs::path folder = locate(dir, format, files, train ? "train" : "test");
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (const std::string& f : files) {  // every size is checked before anything is allocated
    counts.push_back(count_records(folder / f, format));
    total += counts.back();
  }
  Tensor images = Tensor::empty_tagged({total, kChannels, kSide, kSide}, MemTag::Data, DType::U8);
  Tensor labels = Tensor::empty_tagged({total}, MemTag::Data, DType::I64);
  std::vector<uint8_t> chunk(static_cast<size_t>(kChunkRecords * format.record_bytes()));
  // CIFAR-100 records start with the coarse label, then the fine one.
  const int64_t label_offset = which == 100 && !coarse ? 1 : 0;
  int64_t offset = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    read_records(images.data<uint8_t>() + offset * kPixelBytes, labels.data<int64_t>() + offset,
                 folder / files[i], counts[i], format, label_offset, chunk);
    offset += counts[i];
  }
  const int64_t num_classes = cifar_spec(which, coarse).num_classes;
  const std::string name =
      std::string(format.family) + (train ? "/train" : "/test") + (coarse ? "-coarse" : "");
  return InMemoryImageDataset(name, std::move(images), std::move(labels), num_classes);
}

}  // namespace

ImageSpec cifar_spec(int which, bool coarse) {
  ACTLAB_CHECK(which == 10 || which == 100, "CIFAR comes as 10 or 100, got ", which);
  return {kChannels, kSide, kSide, which == 10 ? 10 : coarse ? 20 : 100};
}

InMemoryImageDataset load_cifar10(const std::string& dir, bool train) {
  return load_cifar(dir, 10, train, /*coarse=*/false);
}

InMemoryImageDataset load_cifar100(const std::string& dir, bool train, bool coarse) {
  return load_cifar(dir, 100, train, coarse);
}

bool cifar_files_present(const std::string& dir, int which) {
  const CifarFormat& format = cifar_format(which);
  for (const fs::path& folder : {fs::path(dir), fs::path(dir) / format.subfolder}) {
    if (missing_in(folder, format.train_files).empty() &&
        missing_in(folder, format.test_files).empty())
      return true;
  }
  return false;
}

std::string default_cifar_dir() {
  const auto set = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && v[0] != '\0' ? std::string(v) : std::string();
  };
  if (!set("ACTLAB_CIFAR_DIR").empty()) return set("ACTLAB_CIFAR_DIR");
  if (!set("XDG_CACHE_HOME").empty()) return set("XDG_CACHE_HOME") + "/actlab/cifar";
  ACTLAB_CHECK(!set("HOME").empty(), "neither ACTLAB_CIFAR_DIR, XDG_CACHE_HOME nor HOME is set: pass --data-dir");
  return set("HOME") + "/.cache/actlab/cifar";
}

}  // namespace actlab
