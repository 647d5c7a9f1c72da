// Training checkpoints as safetensors files (the format PyTorch's `safetensors` package opens): a
// minimal strict JSON reader/writer for the header, an atomic writer (temp file, fsync, rename) and
// a checking reader (sizes, offsets, dtypes, FNV-1a 64 checksum), and the mapping of a model +
// SGD optimizer + loop position onto tensors and metadata. Tested in tests/test_checkpoint.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "layers/module.h"
#include "layers/optim/sgd.h"

namespace actlab {

// ---- JSON: just what a safetensors header and a flat configuration need.
// Numbers: integers are Kind::Int (exact int64; what safetensors offsets and shapes must be), numbers
// with a fraction or exponent Kind::Number (a double; a header that needs an Int rejects them). Strings
// with the standard escapes, objects with keys in file order, arrays, true/false/null; nesting depth
// <= 16. Errors name the byte offset.
struct JsonValue {
  enum class Kind { Null, Bool, Int, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;  // Int and Number: the value as a double
  std::string string;
  std::vector<JsonValue> items;                            // Array
  std::vector<std::pair<std::string, JsonValue>> members;  // Object, in file order
  const JsonValue* find(const std::string& key) const;     // Object member or nullptr
};
// Parses one JSON value; only whitespace may follow it. `what` prefixes every error message.
JsonValue parse_json(const std::string& text, const std::string& what = "JSON");
// "text" with ", \ and control characters escaped. Throws Error when s is not valid UTF-8.
std::string json_quote(const std::string& s);

// ---- safetensors files.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::vector<std::pair<std::string, std::string>>;

struct SafetensorsFile {
  NamedTensors tensors;  // CPU, contiguous, in the file's header order
  Metadata metadata;     // "__metadata__" including the "checksum" and "data_bytes" entries written here
  const std::string* find_metadata(const std::string& key) const;
  const std::string& metadata_value(const std::string& key) const;  // throws Error naming a missing key
};

// Writes `tensors` (any dtype, any device; copied to CPU contiguous) packed in the given order, plus
// `metadata` and two entries added here: "checksum" (FNV-1a 64 of the data section, 16 hex digits)
// and "data_bytes". Writes `<path>.tmp.<pid>`, fsyncs it, then renames it over `path`; on any
// failure the temp file is removed, an existing `path` is untouched and one Error says what failed.
void write_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata);
// Writes `text` to `path` the same way (temp file, fsync, rename): readers never see half a file.
void write_text_atomic(const std::string& path, const std::string& text);
// Removes the checkpoint temp files (`last.safetensors.tmp.<pid>`, `best.safetensors.tmp.<pid>`) in `dir`
// left by a writer that was killed mid-write (SIGKILL, power loss: no chance to unlink): regular files of
// this user whose process no longer exists. Anything else, a live writer's file included, is kept.
// Returns the paths removed. The checkpoints beside them were never touched (the rename did not happen).
// NOTE: "no longer exists" is judged in this PID namespace; do not share a --save-dir across containers.
std::vector<std::string> remove_stale_temp_files(const std::string& dir);
// Reads and checks a file: header length vs file size, header JSON, every dtype/shape/offset (in
// bounds, exactly numel·size bytes, no overlap, no gap), total size, and the checksum ("corrupt
// checkpoint"). Throws Error naming the file and the first problem.
SafetensorsFile read_safetensors(const std::string& path);
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);

// ---- training checkpoints: model parameters and buffers under their torchvision names, SGD
// momentum buffers as "optim.momentum.<parameter name>", and the loop position as metadata.
struct TrainState {
  std::string model;          // model name (make_model)
  int64_t epoch = 0;          // epochs fully completed
  int64_t step_in_epoch = 0;  // 0: saved at an epoch boundary; k > 0: saved after step k of epoch+1
  int64_t global_step = 0;    // optimizer steps taken in the whole run
  uint64_t pack_step = 0;     // stochastic-rounding stream counter to continue from
  uint64_t seed = 0;
  int64_t optimizer_steps = 0;
  double loss_sum = 0;        // running sums of the unfinished epoch (step_in_epoch > 0)
  int64_t correct = 0, seen = 0;
  double best_acc = -1;       // best test accuracy so far (-1: none evaluated)
  std::string lr_schedule;    // description of the schedule and the rate at global_step
  std::string config_json;    // the full effective run configuration (config_file.h)
};

// Saves model + optimizer + state atomically (write_safetensors).
void save_checkpoint(const std::string& path, const Module& model, Sgd& opt, const TrainState& state);
// Parses the loop state from a checkpoint's metadata (format version checked).
TrainState checkpoint_state(const SafetensorsFile& file);
// Copies the file's tensors into `model` (parameters and buffers) and `opt` (momentum buffers and
// step count; opt may be nullptr for evaluation). Every model tensor must be present with the same
// dtype and shape and no other tensor may be: Error names the first mismatching tensor.
void restore_checkpoint(const SafetensorsFile& file, Module& model, Sgd* opt);

}  // namespace actlab
