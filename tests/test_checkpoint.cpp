// Checkpoints: safetensors round trips, refusal of corrupt or foreign files,
// atomic writes, and the central promise: a run stopped (at an epoch boundary or mid-epoch) and
// resumed in fresh objects ends with bit-identical weights to an uninterrupted run.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "actlab/autograd/functions.h"
#include "actlab/core/allocator.h"
#include "actlab/io/files.h"
#include "actlab/layers/optim/adamw.h"
#include "actlab/layers/optim/sgd.h"
#include "actlab/models/registry.h"
#include "tests/error_of.h"
#include "actlab/train/checkpoint.h"
#include "actlab/train/config_file.h"
#include "actlab/train/trainer.h"

using namespace actlab;
using actlab::testing::error_of;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the temp dir, removed with its contents when the test ends.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("actlab_ckpt_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// One optimizer step of a model on a fixed batch, so parameters, BN statistics and the optimizer's state
// are all non-trivial.
void one_step(Module& model, Optimizer& opt, uint64_t seed) {
  PhiloxStream rng(seed, 7);
  const Tensor x = Tensor::randn({4, 1, 28, 28}, rng);
  Tensor y = Tensor::empty({4}, DType::I64);
  for (int i = 0; i < 4; ++i) y.data<int64_t>()[i] = i;
  Variable loss = cross_entropy(model(Variable(x)), y);
  opt.zero_grad();
  backward(loss);
  opt.step();
}

TrainConfig tiny_run(const std::string& policy, const std::string& save_dir) {
  TrainConfig c;
  c.model = "resnet20";
  c.dataset = "synthetic";
  c.synthetic_size = 256;
  c.batch_size = 32;  // 8 steps per epoch
  c.epochs = 3;
  c.lr = 0.05;
  c.threads = 1;  // any fixed count is deterministic (tests/cli/resume.sh runs 2); 1 avoids OpenMP spin-waits on a busy machine
  c.seed = 3;
  c.policy = policy;
  c.quiet = true;
  c.save_dir = save_dir;
  return c;
}

}  // namespace

TEST_CASE("checkpoint: save then load into a fresh model gives identical tensors and metadata") {
  const int64_t live_at_start = memory_stats().total.current;
  TempDir dir("roundtrip");
  {
    seed_init(1);
    auto model = make_model({"resnet20", 1, 10, 28});
    Sgd opt(model->parameters(), {0.1f, 0.9f, 0.f, 5e-4f, false});
    one_step(*model, opt, 1);
    TrainState st;
    st.model = "resnet20";
    st.epoch = 2;
    st.step_in_epoch = 5;
    st.global_step = 21;
    st.pack_step = 21;
    st.seed = 9;
    st.loss_sum = 1.0 / 3.0;  // must round-trip exactly
    st.correct = 17;
    st.seen = 160;
    st.best_acc = 12.5;
    st.lr_schedule = "cosine";
    st.config_json = "{\"model\":\"resnet20\"}";
    save_checkpoint(dir.file("a.safetensors"), *model, opt, st);

    seed_init(2);  // different initial weights: everything must come from the file
    auto fresh = make_model({"resnet20", 1, 10, 28});
    Sgd fresh_opt(fresh->parameters(), {0.1f, 0.9f, 0.f, 5e-4f, false});
    const SafetensorsFile file = read_safetensors(dir.file("a.safetensors"));
    restore_checkpoint(file, *fresh, &fresh_opt);
    const auto pa = model->named_parameters(), pb = fresh->named_parameters();
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      CAPTURE(pa[i].first);
      CHECK(same_bits(pa[i].second.data(), pb[i].second.data()));
      CHECK(same_bits(opt.momentum_buffers()[i], fresh_opt.momentum_buffers()[i]));
    }
    const auto ba = model->named_buffers(), bb = fresh->named_buffers();
    for (size_t i = 0; i < ba.size(); ++i) CHECK(same_bits(ba[i].second, bb[i].second));
    CHECK(fresh_opt.steps() == opt.steps());
    const TrainState back = checkpoint_state(file);
    CHECK(back.epoch == 2);
    CHECK(back.step_in_epoch == 5);
    CHECK(back.global_step == 21);
    CHECK(back.seed == 9);
    CHECK(back.loss_sum == st.loss_sum);
    CHECK(back.correct == 17);
    CHECK(back.seen == 160);
    CHECK(back.best_acc == 12.5);
    CHECK(back.config_json == st.config_json);
    CHECK(file.tensors.size() == pa.size() * 2 + ba.size());  // parameters, momentum, BN statistics
    // Layout: 8-byte aligned data section, tensors named the torchvision way.
    const std::string bytes = read_bytes(dir.file("a.safetensors"));
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    CHECK((8 + n) % 8 == 0);
    CHECK(bytes[8] == '{');
    CHECK(bytes.find("\"layer1.0.conv1.weight\"") != std::string::npos);
    CHECK(bytes.find("\"optim.momentum.fc.bias\"") != std::string::npos);
  }
  CHECK(memory_stats().total.current == live_at_start);
}

TEST_CASE("checkpoint: corrupt, truncated, garbage and foreign files are refused with a clear error") {
  TempDir dir("corrupt");
  seed_init(0);
  auto model = make_model({"resnet20", 1, 10, 28});
  Sgd opt(model->parameters(), {0.1f, 0.9f, 0.f, 5e-4f, false});
  one_step(*model, opt, 2);
  TrainState st;
  st.model = "resnet20";
  st.config_json = "{}";
  const std::string good = dir.file("good.safetensors");
  save_checkpoint(good, *model, opt, st);
  const std::string bytes = read_bytes(good);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);

  std::string flipped = bytes;
  flipped[8 + header_len + 1000] ^= 0x01;
  write_bytes(dir.file("flip.safetensors"), flipped);
  CHECK(error_of([&] { read_safetensors(dir.file("flip.safetensors")); }).find("corrupt checkpoint") !=
        std::string::npos);

  write_bytes(dir.file("trunc.safetensors"), bytes.substr(0, bytes.size() - 100));
  CHECK(error_of([&] { read_safetensors(dir.file("trunc.safetensors")); }).find("truncated") != std::string::npos);
  write_bytes(dir.file("short.safetensors"), bytes.substr(0, 5));
  CHECK(error_of([&] { read_safetensors(dir.file("short.safetensors")); }).find("truncated") != std::string::npos);

  std::string garbage = bytes;
  garbage.replace(8, 12, "{\"oops\": [1,");
  write_bytes(dir.file("garbage.safetensors"), garbage);
  CHECK(error_of([&] { read_safetensors(dir.file("garbage.safetensors")); }).find("header") != std::string::npos);
  write_bytes(dir.file("huge.safetensors"), std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10));
  CHECK(error_of([&] { read_safetensors(dir.file("huge.safetensors")); }).find("header length") != std::string::npos);

  // A directory (a save directory given for its checkpoint) is named as one, with the files to give instead.
  const std::string expected = "checkpoint '" + dir.path.string() +
                               "' is a directory; give the .safetensors file in it, e.g. " + dir.file("flip.safetensors") + " or " + dir.file("garbage.safetensors") + " or " +
                               dir.file("good.safetensors");  // the first three, sorted
  CHECK(error_of([&] { read_safetensors(dir.path.string()); }).find(expected) != std::string::npos);
  TempDir empty("empty");
  CHECK(error_of([&] { read_safetensors(empty.path.string()); })
            .find("is a directory; give the .safetensors file in it (it holds none)") != std::string::npos);

  // Overlapping offsets (a hand-made file): the second tensor starts inside the first.
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  std::string overlap(8, '\0');
  const uint64_t hl = header.size();
  std::memcpy(&overlap[0], &hl, 8);
  write_bytes(dir.file("overlap.safetensors"), overlap + header + std::string(12, '\0'));
  CHECK(error_of([&] { read_safetensors(dir.file("overlap.safetensors")); }).find("overlap") != std::string::npos);

  // Another model (3 input channels): the first mismatching tensor is named; nothing is copied.
  const SafetensorsFile file = read_safetensors(good);
  auto rgb = make_model({"resnet20", 3, 10, 32});
  const Tensor before = rgb->named_parameters()[1].second.data().contiguous();
  const Tensor before_copy = Tensor::empty(before.shape());
  std::memcpy(before_copy.raw_data(), before.raw_data(), before.nbytes());
  const std::string mismatch = error_of([&] { restore_checkpoint(file, *rgb, nullptr); });
  CHECK(mismatch.find("'conv1.weight'") != std::string::npos);
  CHECK(same_bits(rgb->named_parameters()[1].second.data(), before_copy));
  auto deeper = make_model({"resnet56", 1, 10, 28});
  CHECK(error_of([&] { restore_checkpoint(file, *deeper, nullptr); }).find("layer1.3.conv1.weight") !=
        std::string::npos);
}

TEST_CASE("safetensors: what the reader refuses the writer refuses, before writing") {
  TempDir dir("st_refused");
  const std::string path = dir.file("x.safetensors");
  CHECK_THROWS_WITH_AS(write_safetensors(path, {{"a", Tensor::zeros({1})}, {"a", Tensor::zeros({2})}}, {}),
                       doctest::Contains("'a' given twice"), Error);
  CHECK_THROWS_WITH_AS(write_safetensors(path, {{"a", Tensor::zeros({1})}}, {{"checksum", "0000"}}),
                       doctest::Contains("'checksum' is the writer's own"), Error);
  CHECK_THROWS_WITH_AS(write_safetensors(path, {{"a", Tensor::zeros({1})}}, {{"k", "1"}, {"k", "2"}}),
                       doctest::Contains("'k' given twice"), Error);
  CHECK_FALSE(std::filesystem::exists(path));
  write_safetensors(path, {{"a", Tensor::zeros({1})}, {"b", Tensor::zeros({2})}}, {{"k", "1"}});
  CHECK(read_safetensors(path).tensors.size() == 2);
}

// The data checksum covers the tensors; a flipped bit in a stored configuration ("lr": "0.1" -> "0.3")
// would change a resumed recipe without a word, so the metadata has a checksum of its own. A file without
// one (an older writer's, another program's) reads as before.
TEST_CASE("safetensors: a flipped bit in the metadata is a corrupt checkpoint") {
  TempDir dir("st_meta");
  const std::string path = dir.file("m.safetensors");
  write_safetensors(path, {{"a", Tensor::zeros({4})}}, {{"config", "{\"lr\":\"0.1\"}"}, {"epoch", "3"}});
  CHECK(read_safetensors(path).metadata_value("config") == "{\"lr\":\"0.1\"}");
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = bytes.find("0.1");
  REQUIRE(at != std::string::npos);
  const auto write_with = [&](char c, const std::string& name) {
    std::string b = bytes;
    b[at + 2] = c;
    std::ofstream(dir.file(name), std::ios::binary) << b;
    return dir.file(name);
  };
  CHECK(error_of([&] { read_safetensors(write_with('3', "flip.safetensors")); }).find("its metadata") != std::string::npos);
  // The same file without the metadata checksum: the data checksum alone, and it reads.
  std::string old = bytes;
  const size_t key = old.find("\"metadata_checksum\"");
  REQUIRE(key != std::string::npos);
  old.replace(key + 1, 8, "xetadata");  // an entry of another name, of the same length
  std::ofstream(dir.file("old.safetensors"), std::ios::binary) << old;
  CHECK(read_safetensors(dir.file("old.safetensors")).metadata_value("epoch") == "3");
}

TEST_CASE("checkpoint: a failed write leaves the previous file untouched and no temp file") {
  TempDir dir("atomic");
  seed_init(0);
  auto model = make_model({"mlp", 1, 10, 8});
  Sgd opt(model->parameters(), {0.1f, 0.9f, 0.f, 5e-4f, false});
  TrainState st;
  st.config_json = "{}";
  CHECK(error_of([&] { save_checkpoint(dir.file("no/such/dir/last.safetensors"), *model, opt, st); })
            .find("cannot create") != std::string::npos);
  // The target is a directory: refused before anything is written.
  fs::create_directories(dir.path / "last.safetensors" / "keep");
  CHECK(error_of([&] { save_checkpoint(dir.file("last.safetensors"), *model, opt, st); })
            .find("exists and is not a regular file") != std::string::npos);
  CHECK(fs::is_directory(dir.path / "last.safetensors" / "keep"));
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) entries += e.path().filename() == "last.safetensors" ? 0 : 1;
  CHECK(entries == 0);  // the temp file was removed
}

TEST_CASE("atomic writes follow links and write devices in place instead of replacing them") {
  TempDir dir("atomic_links");
  const fs::path target = dir.path / "target.txt";
  write_text_atomic(target.string(), "old");
  fs::create_symlink(target, dir.path / "link.txt");
  write_text_atomic((dir.path / "link.txt").string(), "new");
  CHECK(fs::is_symlink(dir.path / "link.txt"));  // the link stays a link
  std::ifstream in(target);
  CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == "new");
  // A link to a file not there yet (relative, through a second link) creates that file and stays a link;
  // one into a directory that does not exist is refused before any write.
  fs::create_symlink("later.txt", dir.path / "dangling.txt");
  fs::create_symlink("dangling.txt", dir.path / "chain.txt");
  check_writable((dir.path / "chain.txt").string(), false, "output");
  // Before the write the links already name later.txt: two outputs on them are one file (resolved_path used
  // to stop at a dangling link, and the second write destroyed the first).
  CHECK(resolved_path((dir.path / "chain.txt").string()) == resolved_path((dir.path / "later.txt").string()));
  CHECK(error_of([&] {
          check_distinct_outputs({{(dir.path / "later.txt").string(), "--out"}, {(dir.path / "chain.txt").string(), "--csv"}});
        }).find("--out and --csv name the same file") != std::string::npos);
  write_text_atomic((dir.path / "chain.txt").string(), "made");
  CHECK(fs::is_symlink(dir.path / "dangling.txt"));
  CHECK(fs::is_symlink(dir.path / "chain.txt"));
  std::ifstream later(dir.path / "later.txt");
  CHECK(std::string(std::istreambuf_iterator<char>(later), {}) == "made");
  fs::create_symlink(dir.path / "no" / "dir.txt", dir.path / "nowhere.txt");
  CHECK(resolved_path((dir.path / "nowhere.txt").string()) == resolved_path((dir.path / "no" / "dir.txt").string()));
  CHECK(error_of([&] { check_writable((dir.path / "nowhere.txt").string(), true, "output"); }).find("does not exist") !=
        std::string::npos);
  CHECK(fs::is_symlink(dir.path / "nowhere.txt"));
  // /dev/full: the write fails with ENOSPC and the device node is still a device afterwards.
  CHECK(error_of([] { write_text_atomic("/dev/full", "x"); }).find("No space left on device") != std::string::npos);
  CHECK(fs::is_character_file("/dev/full"));
  write_text_atomic("/dev/null", "discarded");
  CHECK(fs::is_character_file("/dev/null"));
}

TEST_CASE("outputs: a program replaces without --overwrite only nothing, an empty file or its own earlier output") {
  namespace fs = std::filesystem;
  TempDir dir("replaceable");
  const std::string start = "model,batch,";
  const auto at = [&](const char* name) { return (dir.path / name).string(); };
  CHECK(replaceable_output(at("none.csv"), start));
  write_text_atomic(at("empty.csv"), "");
  CHECK(replaceable_output(at("empty.csv"), start));
  write_text_atomic(at("own.csv"), start + "policy\nmlp,4,exact\n");
  CHECK(replaceable_output(at("own.csv"), start));
  write_text_atomic(at("user.csv"), "name,score\n");
  CHECK_FALSE(replaceable_output(at("user.csv"), start));
  write_text_atomic(at("short.csv"), "model");  // a prefix of the start is not the start
  CHECK_FALSE(replaceable_output(at("short.csv"), start));
  fs::create_symlink("user.csv", dir.path / "to-user.csv");  // judged by what it points to
  CHECK_FALSE(replaceable_output(at("to-user.csv"), start));
  fs::create_symlink("later.csv", dir.path / "dangling.csv");
  CHECK(replaceable_output(at("dangling.csv"), start));
  CHECK(replaceable_output("/dev/null", start));  // written in place; nothing there to lose
  fs::create_directory(dir.path / "sub");         // check_writable names a directory as such
  CHECK(replaceable_output(at("sub"), start));
  CHECK(error_of([&] { check_writable(at("sub"), replaceable_output(at("sub"), start), "--csv file"); })
            .find("is a directory") != std::string::npos);
  // The predicate form: `own` is asked only about a non-empty regular file.
  int asked = 0;
  const auto own = [&](const std::string&) { return ++asked, true; };
  CHECK(replaceable_output(at("empty.csv"), own));
  CHECK(replaceable_output(at("none.csv"), own));
  CHECK(asked == 0);
  CHECK(replaceable_output(at("user.csv"), own));
  CHECK(asked == 1);
}

TEST_CASE("checkpoint: temp files of killed writers are removed, a live writer's are kept") {
  TempDir dir("stale");
  const pid_t child = ::fork();  // a process that existed and is gone: its pid names a dead writer
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  const std::string dead = std::to_string(child), alive = std::to_string(::getppid());
  for (const std::string& name :
       std::vector<std::string>{"last.safetensors.tmp." + dead, "best.safetensors.tmp." + dead,
                                "last.safetensors.tmp." + alive, "last.safetensors", "notes.tmp." + dead, ".tmp.1"})
    std::ofstream(dir.file(name)) << "x";
  const std::vector<std::string> removed =
      remove_stale_temp_files({dir.file("last.safetensors"), dir.file("best.safetensors"), ""});
  CHECK(removed.size() == 2);
  CHECK(!fs::exists(dir.file("last.safetensors.tmp." + dead)));
  CHECK(!fs::exists(dir.file("best.safetensors.tmp." + dead)));
  // A live writer's temp file, the checkpoint itself and other people's files (whatever their names) stay.
  for (const std::string& kept :
       std::vector<std::string>{"last.safetensors.tmp." + alive, "last.safetensors", "notes.tmp." + dead, ".tmp.1"})
    CHECK_MESSAGE(fs::exists(dir.file(kept)), kept);
  CHECK(remove_stale_temp_files({dir.file("no-such-dir/last.safetensors")}).empty());
  // Any output written atomically, wherever it is: an exported weights file's temp (a probe's kill left 2.6 MB).
  std::ofstream(dir.file("w.safetensors.tmp." + dead)) << "x";
  CHECK(remove_stale_temp_files({dir.file("w.safetensors")}).size() == 1);
  CHECK(!fs::exists(dir.file("w.safetensors.tmp." + dead)));
}

TEST_CASE("checkpoint: AdamW moments and counts round-trip, and a checkpoint of the other optimizer is refused") {
  TempDir dir("adamw");
  seed_init(1);
  auto model = make_model({"resnet20", 1, 10, 28});
  const AdamwOptions options{1e-3f, 0.9f, 0.999f, 1e-8f, 0.05f};
  AdamW opt(model->parameters(), options);
  one_step(*model, opt, 1);
  one_step(*model, opt, 2);
  TrainState st;
  st.model = "resnet20";
  save_checkpoint(dir.file("adamw.safetensors"), *model, opt, st);
  const SafetensorsFile file = read_safetensors(dir.file("adamw.safetensors"));
  CHECK(file.metadata_value("optimizer") == "adamw");
  const auto pa = model->named_parameters();
  CHECK(file.tensors.size() == pa.size() * 3 + model->named_buffers().size());  // + both moments

  seed_init(2);
  auto fresh = make_model({"resnet20", 1, 10, 28});
  AdamW fresh_opt(fresh->parameters(), options);
  restore_checkpoint(file, *fresh, &fresh_opt);
  CHECK(fresh_opt.counters() == opt.counters());
  CHECK(fresh_opt.updates().front() == 2);
  CHECK(fresh_opt.steps() == 2);
  for (size_t k = 0; k < 2; ++k)
    for (size_t i = 0; i < pa.size(); ++i) {
      CAPTURE(pa[i].first);
      CHECK(same_bits(opt.state_slots()[k].buffers->at(i), fresh_opt.state_slots()[k].buffers->at(i)));
      CHECK(fresh_opt.state_slots()[k].buffers->at(i).storage()->tag() == MemTag::OptimState);
    }
  const Tensor saved_first = pa.front().second.data().clone();
  // The next step continues the same way in both.
  one_step(*model, opt, 3);
  one_step(*fresh, fresh_opt, 3);
  const auto pb = fresh->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) CHECK(same_bits(pa[i].second.data(), pb[i].second.data()));

  // SGD cannot take AdamW's state, nor AdamW SGD's; a refused file changes nothing. Evaluation (no
  // optimizer) reads either.
  auto sgd_model = make_model({"resnet20", 1, 10, 28});
  const std::vector<float> before = sgd_model->named_parameters().front().second.data().to_vector();
  Sgd sgd(sgd_model->parameters(), {});
  CHECK(error_of([&] { restore_checkpoint(file, *sgd_model, &sgd); }).find("trained with optimizer 'adamw'") !=
        std::string::npos);
  CHECK(sgd_model->named_parameters().front().second.data().to_vector() == before);
  restore_checkpoint(file, *sgd_model, nullptr);
  CHECK(same_bits(sgd_model->named_parameters().front().second.data(), saved_first));
  one_step(*sgd_model, sgd, 4);
  save_checkpoint(dir.file("sgd.safetensors"), *sgd_model, sgd, st);
  SafetensorsFile sgd_file = read_safetensors(dir.file("sgd.safetensors"));
  CHECK(error_of([&] { restore_checkpoint(sgd_file, *fresh, &fresh_opt); }).find("trained with optimizer 'sgd'") !=
        std::string::npos);
  CHECK(fresh_opt.counters() == opt.counters());
  // A checkpoint from before the optimizer was recorded is SGD's.
  Metadata old_meta;
  for (const auto& m : sgd_file.metadata)
    if (m.first != "optimizer" && m.first != "optimizer_counters" && !is_writer_metadata_key(m.first))
      old_meta.push_back(m);
  write_safetensors(dir.file("old.safetensors"), sgd_file.tensors, old_meta);
  Sgd sgd2(sgd_model->parameters(), {});
  restore_checkpoint(read_safetensors(dir.file("old.safetensors")), *sgd_model, &sgd2);
  CHECK(same_bits(sgd2.momentum_buffers().front(), sgd.momentum_buffers().front()));
  // State of a slot the optimizer does not keep is named.
  NamedTensors extra = file.tensors;
  extra.emplace_back("optim.velocity.fc.bias", file.tensors.front().second);
  Metadata meta;
  for (const auto& m : file.metadata)
    if (!is_writer_metadata_key(m.first)) meta.push_back(m);
  write_safetensors(dir.file("extra.safetensors"), extra, meta);
  CHECK(error_of([&] { restore_checkpoint(read_safetensors(dir.file("extra.safetensors")), *fresh, &fresh_opt); })
            .find("optimizer state 'optim.velocity.fc.bias'") != std::string::npos);
}

TEST_CASE("resume: stopped after epoch 1 or mid-epoch 2, resumed in fresh objects, ends bit-identical") {
  struct Case {
    std::string policy;
    std::vector<int64_t> stop_after;  // global steps (8 per epoch): the end of epoch 1 and/or inside epoch 2
    std::string optimizer = "sgd";
  };
  const int64_t steps_per_epoch = 8;  // 256 samples / batch 32
  for (const Case& k : {Case{"exact", {8, 12}}, Case{"division:B=8,Q=2", {12}}, Case{"exact", {12}, "adamw"}}) {
    CAPTURE(k.policy);
    CAPTURE(k.optimizer);
    TempDir full("full"), part("part");
    TrainConfig base = tiny_run(k.policy, full.path.string());
    base.optimizer = k.optimizer;
    if (k.optimizer == "adamw") base.lr = 1e-3;
    train(base);
    for (const int64_t stop_after : k.stop_after) {
      CAPTURE(stop_after);
      TrainConfig first = base;
      first.save_dir = part.path.string();
      first.stop_after_steps = stop_after;
      first.overwrite = true;
      const TrainSummary s1 = train(first);
      REQUIRE(s1.interrupted);
      CHECK(s1.stop_epoch == 2);
      CHECK(s1.stop_step == stop_after - steps_per_epoch);
      // The stopped epoch's wall time so far travels in the checkpoint, and its row after the resume counts it:
      // set to 1000 s here, so a row that counted only this process's part could not pass.
      SafetensorsFile stopped = read_safetensors(part.file("last.safetensors"));
      CHECK((s1.stop_step == 0 ? checkpoint_state(stopped).epoch_wall_s == 0 : checkpoint_state(stopped).epoch_wall_s > 0));
      Metadata meta;
      for (const auto& [key, value] : stopped.metadata)
        if (!is_writer_metadata_key(key)) meta.emplace_back(key, key == "epoch_wall_s" && s1.stop_step > 0 ? "1000" : value);
      write_safetensors(part.file("last.safetensors"), stopped.tensors, meta);
      const double before = s1.stop_step > 0 ? 1000 : 0;
      TrainConfig second = base;  // a fresh model, optimizer, loaders and schedule
      second.save_dir = part.path.string();
      second.resume = part.file("last.safetensors");
      const TrainSummary s2 = train(second);
      REQUIRE(!s2.interrupted);
      REQUIRE(!s2.epochs.empty());
      CHECK(s2.epochs.front().wall_s >= before);
      CHECK(s2.steps == 3 * steps_per_epoch);
      const SafetensorsFile a = read_safetensors(full.file("last.safetensors"));
      const SafetensorsFile b = read_safetensors(part.file("last.safetensors"));
      REQUIRE(a.tensors.size() == b.tensors.size());
      int differing = 0;
      for (size_t i = 0; i < a.tensors.size(); ++i) {
        CHECK(a.tensors[i].first == b.tensors[i].first);
        differing += same_bits(a.tensors[i].second, b.tensors[i].second) ? 0 : 1;
      }
      CHECK(differing == 0);
      CHECK(a.metadata_value("checksum") == b.metadata_value("checksum"));
      CHECK(checkpoint_state(b).global_step == 3 * steps_per_epoch);
    }
  }
}

TEST_CASE("resume: incompatible configurations are refused - eval-only reports the saved model") {
  TempDir dir("compat");
  TrainConfig c = tiny_run("exact", dir.path.string());
  c.epochs = 1;
  c.export_weights = dir.file("weights.safetensors");
  const TrainSummary s = train(c);
  TrainConfig other = c;
  other.resume = dir.file("last.safetensors");
  other.epochs = 2;
  other.batch_size = 64;
  CHECK(error_of([&] { train(other); }).find("batch-size") != std::string::npos);
  other = c;
  other.resume = dir.file("last.safetensors");
  CHECK(error_of([&] { train(other); }).find("raise --epochs") != std::string::npos);
  other.eval_only = true;
  const TrainSummary ev = train(other);
  CHECK(ev.final_test_acc == s.final_test_acc);
  CHECK(ev.final_test_loss == s.final_test_loss);
  // An evaluation trains on nothing: a batch larger than the training split is no error (it was: "drop_last").
  TrainConfig weights = c;
  weights.save_dir = weights.export_weights = "";
  weights.eval_only = true;
  weights.init_weights = c.export_weights;
  weights.batch_size = 4 * c.synthetic_size;
  CHECK(train(weights).final_test_acc == s.final_test_acc);
  // A fresh run into a save dir that holds a checkpoint must not clobber it.
  CHECK(error_of([&] { train(c); }).find("already exists") != std::string::npos);
}

TEST_CASE("a stop request ends the run after the current step and records the signal") {
  TempDir dir("signal");
  TrainConfig c = tiny_run("exact", dir.path.string());
  request_stop(SIGTERM);
  const TrainSummary s = train(c);
  request_stop(0);
  CHECK(s.interrupted);
  CHECK(s.stop_signal == SIGTERM);
  CHECK(s.stop_epoch == 1);
  CHECK(s.stop_step == 0);
  CHECK(s.stop_checkpoint == dir.file("last.safetensors"));
  CHECK(checkpoint_state(read_safetensors(s.stop_checkpoint)).global_step == 0);
}

TEST_CASE("state dicts: an export imports back exactly, and a file that does not fit names every problem") {
  TempDir dir("state_dict");
  seed_init(2);
  auto model = make_model({"resnet20", 1, 10, 28});
  Sgd opt(model->parameters(), {0.1f, 0.9f, 0.f, 5e-4f, false});
  one_step(*model, opt, 1);
  const std::string path = dir.file("weights.safetensors");
  export_state_dict(path, *model, 7);
  const SafetensorsFile file = read_safetensors(path);
  // PyTorch's layout: parameters, buffers, num_batches_tracked per batch norm; nothing of actlab's.
  size_t tracked = 0;
  for (const auto& t : file.tensors) {
    CHECK(t.first.rfind("optim.", 0) != 0);
    if (t.first.size() > 19 && t.first.compare(t.first.size() - 19, 19, "num_batches_tracked") == 0) {
      ++tracked;
      CHECK(t.second.dtype() == DType::I64);
      CHECK(t.second.dim() == 0);
      CHECK(t.second.data<int64_t>()[0] == 7);
    }
  }
  CHECK(tracked == 19);  // ResNet-20: bn1 + 9 blocks x 2
  // --export-weights replaces an earlier export, never a checkpoint, another program's weights or other files.
  CHECK(is_exported_state_dict(path));
  CHECK(read_safetensors_metadata(path) == file.metadata);
  save_checkpoint(dir.file("ckpt.safetensors"), *model, opt, TrainState{});
  CHECK_FALSE(is_exported_state_dict(dir.file("ckpt.safetensors")));
  // PyTorch's save_file: the same format tag, none of actlab's checksum entries (a hand-made file).
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"__metadata__":{"format":"pt"}})";
  std::string torch_file(8, '\0');
  const uint64_t length = header.size();
  std::memcpy(&torch_file[0], &length, 8);
  write_text_atomic(dir.file("torch.safetensors"), torch_file + header + std::string(4, '\0'));
  REQUIRE(read_safetensors(dir.file("torch.safetensors")).tensors.size() == 1);
  CHECK_FALSE(is_exported_state_dict(dir.file("torch.safetensors")));
  write_text_atomic(dir.file("notes.txt"), "not weights");
  CHECK_FALSE(is_exported_state_dict(dir.file("notes.txt")));
  CHECK_FALSE(is_exported_state_dict(dir.file("none.safetensors")));
  CHECK(file.find_metadata("format") != nullptr);
  CHECK(file.find_metadata("config") == nullptr);

  seed_init(99);  // other weights
  auto fresh = make_model({"resnet20", 1, 10, 28});
  import_state_dict(file, *fresh, "test");
  const auto a = model->named_parameters(), b = fresh->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].second.data().to_vector() == b[i].second.data().to_vector());
  const auto ab = model->named_buffers(), bb = fresh->named_buffers();
  for (size_t i = 0; i < ab.size(); ++i) CHECK(ab[i].second.to_vector() == bb[i].second.to_vector());

  // One of each problem, all named in one error, and the model left as it was.
  NamedTensors bad;
  for (const auto& t : file.tensors) {
    if (t.first == "layer1.0.conv1.weight") continue;                                    // missing
    if (t.first == "fc.weight") bad.emplace_back(t.first, Tensor::zeros({100, 64}));      // wrong shape
    else bad.emplace_back(t.first, t.second);
  }
  bad.emplace_back("head.extra", Tensor::zeros({3}));                                     // unexpected
  write_safetensors(dir.file("bad.safetensors"), bad, {});
  seed_init(5);
  auto victim = make_model({"resnet20", 1, 10, 28});
  const auto before = victim->named_parameters().front().second.data().to_vector();
  const std::string err = error_of([&] { import_state_dict(read_safetensors(dir.file("bad.safetensors")), *victim, "bad.safetensors"); });
  CAPTURE(err);
  CHECK(err.find("bad.safetensors does not fit the model") != std::string::npos);
  CHECK(err.find("missing layer1.0.conv1.weight") != std::string::npos);
  CHECK(err.find("unexpected head.extra") != std::string::npos);
  CHECK(err.find("fc.weight: f32 (100,64) in the file, f32 (10,64) in the model") != std::string::npos);
  CHECK(victim->named_parameters().front().second.data().to_vector() == before);
}
