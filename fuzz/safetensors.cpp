// Fuzz target: checkpoint loading (train/checkpoint.h): read_safetensors (header length, JSON
// header, dtypes, shapes, offsets, checksum), then checkpoint_state, the stored configuration
// (config_from_json) and restore_checkpoint into a small model with an SGD optimizer, the path
// `actlab-train --resume FILE` takes. Input: the file. Seeds: fuzz/corpus/safetensors
// (fuzz/make_seeds.cpp). Replayed by the fuzz_replay_safetensors test.
#include "fuzz/fuzz_util.h"
#include "fuzz/tiny_model.h"
#include "actlab/layers/optim/sgd.h"
#include "actlab/train/checkpoint.h"
#include "actlab/train/config_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using actlab::fuzz::Scratch;
  const std::string path = Scratch::get().write("checkpoint.safetensors", data, size);
  try {
    const actlab::SafetensorsFile file = actlab::read_safetensors(path);
    for (const auto& t : file.tensors)
      if (t.second.nbytes() != static_cast<size_t>(t.second.numel()) * actlab::dtype_size(t.second.dtype()))
        __builtin_trap();
    try {
      const actlab::TrainState st = actlab::checkpoint_state(file);
      (void)actlab::config_from_json(st.config_json);
    } catch (const actlab::Error& e) {
      actlab::fuzz::expected(e);
    }
    auto model = actlab::fuzz::make_tiny_model();
    actlab::Sgd opt(model->parameters(), actlab::SgdOptions{});
    actlab::restore_checkpoint(file, *model, &opt);
  } catch (const actlab::Error& e) {
    actlab::fuzz::expected(e);
  }
  return 0;
}
