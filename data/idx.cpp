// IDX (MNIST / Fashion-MNIST) reader: streaming read (raw or gzip) straight into the
// MemTag::Data tensors, header validation. Every error message starts with the offending file's path.
// Tested in tests/test_data.cpp.
#include "actlab/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

namespace actlab {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kImagesMagic = 0x00000803;  // u8 data, 3 dims
constexpr uint32_t kLabelsMagic = 0x00000801;  // u8 data, 1 dim
constexpr size_t kImagesHeaderBytes = 16;      // magic, count, rows, cols
constexpr size_t kLabelsHeaderBytes = 8;       // magic, count

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

// A sequential reader over one IDX file, raw or gzip (1f 8b magic). Reading goes straight into the
// caller's memory: on VMs where first-touch page faults are expensive, one 47 MB intermediate copy
// costs more than the decompression itself.
class IdxFile {
 public:
  explicit IdxFile(const std::string& path) : path_(path) {
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    if (!fs::exists(status)) ACTLAB_FAIL(path, ": not found");
    ACTLAB_CHECK(fs::is_regular_file(status), path, ": not a regular file");
    file_size_ = fs::file_size(path, ec);
    ACTLAB_CHECK(!ec, path, ": cannot read its size: ", ec.message());
    ACTLAB_CHECK(file_size_ > 0, path, ": empty file");
    raw_.open(path, std::ios::binary);
    ACTLAB_CHECK(raw_.is_open(), path, ": cannot open: ", std::strerror(errno));
    unsigned char magic[2] = {0, 0};
    raw_.read(reinterpret_cast<char*>(magic), 2);
    if (raw_.gcount() == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
      // ISIZE, the last 4 bytes (little endian): decompressed size mod 2^32 of the last member.
      unsigned char tail[4] = {0, 0, 0, 0};
      raw_.seekg(-4, std::ios::end);
      raw_.read(reinterpret_cast<char*>(tail), 4);
      gzip_isize_ = uint32_t{tail[0]} | uint32_t{tail[1]} << 8 | uint32_t{tail[2]} << 16 |
                    uint32_t{tail[3]} << 24;
      raw_.close();
      gz_.reset(gzopen(path.c_str(), "rb"));
      ACTLAB_CHECK(gz_ != nullptr, path, ": cannot open: ", std::strerror(errno));
      gzbuffer(gz_.get(), 1u << 17);
    } else {
      raw_.clear();
      raw_.seekg(0);
    }
  }

  bool compressed() const { return gz_ != nullptr; }
  uint64_t file_size() const { return file_size_; }
  uint32_t gzip_isize() const { return gzip_isize_; }

  // Reads up to n bytes into dst; fewer only at the end of the data. Throws on a damaged gzip stream
  // (bad header or block, CRC mismatch, cut-off data: zlib reports each through gzread or gzerror).
  size_t read(uint8_t* dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      const size_t want = std::min<size_t>(n - done, size_t{1} << 30);
      size_t got = 0;
      if (gz_) {
        const int r = gzread(gz_.get(), dst + done, static_cast<unsigned>(want));
        int errnum = Z_OK;
        const char* msg = gzerror(gz_.get(), &errnum);
        // zlib reports a bad CRC or length only at the end of the read that decompressed the member, so
        // the damage lies somewhere past the bytes already returned, not at that offset.
        ACTLAB_CHECK(r >= 0 && errnum == Z_OK, path_, ": corrupt gzip stream (found reading past decompressed byte ",
                     consumed_ + done, "): ", msg ? msg : "unknown zlib error");
        got = static_cast<size_t>(r);
      } else {
        raw_.read(reinterpret_cast<char*>(dst + done), static_cast<std::streamsize>(want));
        got = static_cast<size_t>(raw_.gcount());
        ACTLAB_CHECK(got == want || raw_.eof(), path_, ": read error at byte ", consumed_ + done);
      }
      done += got;
      if (got < want) break;
    }
    consumed_ += done;
    return done;
  }

  // Reads and discards the rest of the data; returns how many bytes that was.
  uint64_t count_rest() {
    std::vector<uint8_t> scratch(size_t{1} << 16);
    uint64_t total = 0;
    for (size_t got; (got = read(scratch.data(), scratch.size())) > 0;) total += got;
    return total;
  }

 private:
  std::string path_;
  uint64_t file_size_ = 0;
  uint32_t gzip_isize_ = 0;
  uint64_t consumed_ = 0;
  std::ifstream raw_;
  std::unique_ptr<gzFile_s, GzCloser> gz_;
};

void fail_payload_size(const std::string& path, uint64_t payload, uint64_t expected,
                       const std::string& what) {
  ACTLAB_CHECK(payload >= expected, path, ": truncated: header says ", what, " (", expected,
               " bytes) but only ", payload, " bytes follow");
  ACTLAB_FAIL(path, ": trailing bytes: header says ", what, " (", expected, " bytes) but ", payload,
              " bytes follow (", payload - expected, " extra)");
}

// Checks, before anything is allocated, that the payload after the header can hold `expected`
// bytes: exact for raw files; for gzip, a mismatch with the ISIZE trailer triggers a counting pass so
// a corrupt header never drives a huge allocation. Multi-member gzip files may disagree with ISIZE
// yet be right; then the file is reopened at the payload.
void precheck_payload(std::unique_ptr<IdxFile>& file, const std::string& path, size_t header_bytes,
                      uint64_t expected, const std::string& what) {
  if (!file->compressed()) {
    const uint64_t payload = file->file_size() - header_bytes;
    if (payload != expected) fail_payload_size(path, payload, expected, what);
    return;
  }
  if (static_cast<uint32_t>(header_bytes + expected) == file->gzip_isize()) return;
  const uint64_t payload = file->count_rest();
  if (payload != expected) fail_payload_size(path, payload, expected, what);
  file = std::make_unique<IdxFile>(path);
  std::vector<uint8_t> header(header_bytes);
  file->read(header.data(), header_bytes);
}

// Reads exactly `expected` payload bytes into dst, then insists that nothing follows.
void read_payload(IdxFile& file, const std::string& path, uint8_t* dst, uint64_t expected,
                  const std::string& what) {
  const uint64_t got = file.read(dst, static_cast<size_t>(expected));
  if (got < expected) fail_payload_size(path, got, expected, what);
  const uint64_t extra = file.count_rest();
  if (extra > 0) fail_payload_size(path, expected + extra, expected, what);
}

// Reads the header (header_bytes) and checks the magic first, so a swapped images/labels pair is
// reported as such rather than as a short header.
std::vector<uint8_t> read_header(IdxFile& file, const std::string& path, size_t header_bytes,
                                 uint32_t expected, const char* kind) {
  std::vector<uint8_t> header(header_bytes);
  const size_t got = file.read(header.data(), header_bytes);
  ACTLAB_CHECK(got >= 4, path, ": truncated header: ", got, " bytes, an ", kind, " file needs ",
               header_bytes);
  const uint32_t magic = read_be32(header.data());
  ACTLAB_CHECK(magic == expected, path, ": bad magic ", hex32(magic), ", expected ",
               hex32(expected), " (", kind, ")",
               magic == kImagesMagic ? ": this is an images file"
               : magic == kLabelsMagic ? ": this is a labels file" : "");
  ACTLAB_CHECK(got == header_bytes, path, ": truncated header: ", got, " bytes, an ", kind,
               " file needs ", header_bytes);
  return header;
}

// Returns (count,1,rows,cols) u8 images tagged MemTag::Data.
Tensor read_idx_images(const std::string& path) {
  auto file = std::make_unique<IdxFile>(path);
  const std::vector<uint8_t> header =
      read_header(*file, path, kImagesHeaderBytes, kImagesMagic, "idx3-ubyte images");
  const uint64_t count = read_be32(&header[4]);
  const uint64_t rows = read_be32(&header[8]);
  const uint64_t cols = read_be32(&header[12]);
  ACTLAB_CHECK(count > 0 && rows > 0 && cols > 0, path, ": header has a zero size: ", count,
               " images of ", rows, "x", cols);
  // count, rows, cols < 2^32 each, so rows*cols fits in 64 bits; check the last product.
  const uint64_t image_bytes = rows * cols;
  ACTLAB_CHECK(count <= UINT64_MAX / image_bytes, path, ": header sizes overflow: ", count,
               " images of ", rows, "x", cols);
  const std::string what = std::to_string(count) + " images of " + std::to_string(rows) + "x" +
                           std::to_string(cols);
  precheck_payload(file, path, kImagesHeaderBytes, count * image_bytes, what);
  Tensor images = Tensor::empty_tagged(
      {static_cast<int64_t>(count), 1, static_cast<int64_t>(rows), static_cast<int64_t>(cols)},
      MemTag::Data, DType::U8);
  read_payload(*file, path, images.data<uint8_t>(), count * image_bytes, what);
  return images;
}

// Returns (count) i64 labels tagged MemTag::Data, each checked against num_classes.
Tensor read_idx_labels(const std::string& path, int64_t num_classes) {
  auto file = std::make_unique<IdxFile>(path);
  const std::vector<uint8_t> header =
      read_header(*file, path, kLabelsHeaderBytes, kLabelsMagic, "idx1-ubyte labels");
  const uint64_t count = read_be32(&header[4]);
  ACTLAB_CHECK(count > 0, path, ": header says 0 labels");
  const std::string what = std::to_string(count) + " labels";
  precheck_payload(file, path, kLabelsHeaderBytes, count, what);
  std::vector<uint8_t> bytes(static_cast<size_t>(count));
  read_payload(*file, path, bytes.data(), count, what);
  Tensor labels = Tensor::empty_tagged({static_cast<int64_t>(count)}, MemTag::Data, DType::I64);
  int64_t* out = labels.data<int64_t>();
  for (uint64_t i = 0; i < count; ++i) {
    ACTLAB_CHECK(bytes[i] < num_classes, path, ": label ", int{bytes[i]}, " at index ", i,
                 " (byte offset ", kLabelsHeaderBytes + i, ") is out of range [0, ", num_classes,
                 ")");
    out[i] = bytes[i];
  }
  return labels;
}

// dir/base, or dir/base.gz when only the compressed file exists.
std::string resolve_idx_file(const std::string& dir, const std::string& base) {
  const fs::path raw = fs::path(dir) / base;
  fs::path gz = raw;
  gz += ".gz";
  std::error_code ec;
  if (fs::exists(raw, ec)) return raw.string();
  if (fs::exists(gz, ec)) return gz.string();
  ACTLAB_FAIL(raw.string(), ": not found (nor ", gz.filename().string(), ")");
}

InMemoryImageDataset load_standard_idx(const std::string& family, const std::string& dir,
                                       bool train) {
  const std::string prefix = train ? "train" : "t10k";
  const std::string images = resolve_idx_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels = resolve_idx_file(dir, prefix + "-labels-idx1-ubyte");
  return load_idx_dataset(images, labels, 10, family + (train ? "/train" : "/test"));
}

}  // namespace

InMemoryImageDataset load_idx_dataset(const std::string& images_path,
                                      const std::string& labels_path, int64_t num_classes,
                                      const std::string& name) {
  ACTLAB_CHECK(num_classes >= 1 && num_classes <= 256, "IDX labels are u8: num_classes must be in ",
               "[1, 256], got ", num_classes);
  Tensor images = read_idx_images(images_path);
  Tensor labels = read_idx_labels(labels_path, num_classes);
  ACTLAB_CHECK(labels.size(0) == images.size(0), images_path, ": holds ", images.size(0),
               " images but ", labels_path, " holds ", labels.size(0), " labels");
  return InMemoryImageDataset(name.empty() ? fs::path(images_path).filename().string() : name,
                              std::move(images), std::move(labels), num_classes);
}

InMemoryImageDataset load_fashion_mnist(const std::string& dir, bool train) {
  return load_standard_idx("fashion-mnist", dir, train);
}

InMemoryImageDataset load_mnist(const std::string& dir, bool train) {
  return load_standard_idx("mnist", dir, train);
}

std::string default_fashion_mnist_dir() {
  const char* env = std::getenv("ACTLAB_FASHION_MNIST_DIR");
  if (env != nullptr && env[0] != '\0') return env;
  return "/usr/share/datasets/fashion-mnist";  // Debian package dataset-fashion-mnist
}

bool idx_files_present(const std::string& dir) {
  std::error_code ec;
  for (const char* base : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    const fs::path raw = fs::path(dir) / base;
    if (!fs::exists(raw, ec) && !fs::exists(fs::path(raw.string() + ".gz"), ec)) return false;
  }
  return true;
}

}  // namespace actlab
