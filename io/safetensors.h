// Safetensors files (the weight format PyTorch's `safetensors` package opens): a u64 LE header length
// N, N bytes of UTF-8 JSON (space-padded to 8-byte alignment), then the tensors' raw little-endian bytes
// packed in header order with offsets relative to the data. Written atomically (io/files.h) with an
// FNV-1a 64 checksum of the data in the metadata; read back with every size, offset and dtype checked.
// Tested in tests/test_checkpoint.cpp and fuzzed by fuzz/safetensors.cpp.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "actlab/core/tensor.h"

namespace actlab {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::vector<std::pair<std::string, std::string>>;

struct SafetensorsFile {
  NamedTensors tensors;  // CPU, contiguous, in the file's header order
  Metadata metadata;     // "__metadata__" including the "checksum" and "data_bytes" entries written here
  const std::string* find_metadata(const std::string& key) const;
  const std::string& metadata_value(const std::string& key) const;  // throws Error naming a missing key
};

// Writes `tensors` (any dtype, any device; copied to CPU contiguous) packed in the given order, plus
// `metadata` and three entries added here: "checksum" (FNV-1a 64 of the data section, 16 hex digits),
// "data_bytes", and "metadata_checksum" (FNV-1a 64 of the other entries, sorted by key: a flipped bit in a
// checkpoint's stored configuration would otherwise change the resumed recipe without a word). Writes `<path>.tmp.<pid>`, fsyncs it, then renames it over `path`; on any
// failure the temp file is removed, an existing `path` is untouched and one Error says what failed.
void write_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata);
// The three entries write_safetensors adds itself ("checksum", "data_bytes", "metadata_checksum"): a caller
// that writes a file's metadata back leaves them out.
bool is_writer_metadata_key(const std::string& key);
// Reads and checks a file: header length vs file size, header JSON, every dtype/shape/offset (in
// bounds, exactly numel·size bytes, no overlap, no gap), total size, and the checksums ("corrupt
// checkpoint"; a file without "metadata_checksum", an older writer's or another program's, has its data
// checked only). Throws Error naming the file and the first problem; for a directory (a save directory
// given for its checkpoint), the .safetensors files in it.
SafetensorsFile read_safetensors(const std::string& path);
// The metadata alone, from the header (the tensors are neither read nor checked): enough to tell what
// wrote a file, at the cost of its header. Error as read_safetensors for a file without a well-formed one.
Metadata read_safetensors_metadata(const std::string& path);

}  // namespace actlab
