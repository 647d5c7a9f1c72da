// Fuzz target: the run configuration as text (train/config_file.h). Byte 0 picks the reader:
// even: a config file (apply_config_file: `key = value` lines, comments, per-key range checks);
// odd: the JSON configuration stored in checkpoints (config_from_json). Whatever is accepted must
// round-trip through JSON, and a configuration read from a file also through config_to_text (the
// `<log>.config.txt` format; JSON strings may hold newlines, which that format cannot, so JSON input is
// only held to the JSON round trip). Seeds: fuzz/corpus/config
// (fuzz/make_seeds.cpp). Replayed by the fuzz_replay_config test.
#include "fuzz/fuzz_util.h"
#include "actlab/train/config_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using actlab::fuzz::Scratch;
  const Scratch& s = Scratch::get();
  try {
    actlab::TrainConfig c;
    if (data[0] % 2 == 0) {
      actlab::apply_config_file(c, s.write("run.conf", data + 1, size - 1));
    } else {
      c = actlab::config_from_json(std::string(reinterpret_cast<const char*>(data + 1), size - 1));
    }
    const std::string json = actlab::config_to_json(c);
    if (actlab::config_to_json(actlab::config_from_json(json)) != json) __builtin_trap();
    if (data[0] % 2 == 0) {
      const std::string text = actlab::config_to_text(c);
      actlab::TrainConfig again;
      actlab::apply_config_file(again, s.write("again.conf", reinterpret_cast<const uint8_t*>(text.data()), text.size()));
      if (actlab::config_to_text(again) != text) __builtin_trap();
    }
  } catch (const actlab::Error& e) {
    actlab::fuzz::expected(e);
  }
  return 0;
}
