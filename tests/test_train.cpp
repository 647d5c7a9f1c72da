// End to end: a ResNet learns on real Fashion-MNIST (or generated data, saying so), memory returns to
// its baseline after every step with a stable peak, and the app's flag and config checks.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <iterator>
#include <limits>
#include <fstream>
#include <set>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "actlab/autograd/functions.h"
#include "actlab/data/dataloader.h"
#include "actlab/data/idx.h"
#include "actlab/io/checksum.h"
#include "actlab/io/files.h"
#include "actlab/io/json.h"
#include "actlab/layers/optim/sgd.h"
#include "actlab/models/registry.h"
#include "actlab/train/checkpoint.h"
#include "actlab/train/cli.h"
#include "actlab/train/logging.h"
#include "actlab/train/trainer.h"
#include "tests/error_of.h"
#include "tests/temp_dir.h"

using namespace actlab;
using actlab::testing::error_of;

TEST_CASE("a ResNet-20 trains: the loss falls and memory per tag returns to baseline every step") {
  TrainConfig c;
  c.dataset = idx_files_present(default_fashion_mnist_dir()) ? "fashion-mnist" : "synthetic";
  if (c.dataset == "synthetic") MESSAGE("Fashion-MNIST not installed: training on generated data");
  c.train_limit = 2048;
  DataSplits data = load_data(c);
  DataLoader loader(*data.train, 32, true, 0, true, default_transforms("fashion-mnist", false));
  std::vector<Batch> batches;
  loader.start_epoch(0);
  Batch b;
  while (static_cast<int>(batches.size()) < 40 && loader.next(b)) batches.push_back(b);
  REQUIRE(batches.size() == 40);

  seed_init(0);
  auto model = make_model({"resnet20", 1, 10, 28});
  Sgd opt(model->parameters(), {0.05f, 0.9f, 0.f, 5e-4f, false});
  std::vector<double> losses;
  MemoryStats baseline;
  int64_t peak_step2 = 0;
  for (int step = 0; step < 40; ++step) {
    reset_peak();
    Variable loss;
    {
      MemTagScope tag(MemTag::Activation);
      loss = cross_entropy((*model)(Variable(batches[step].images)), batches[step].labels);
    }
    losses.push_back(loss.data().item());
    opt.zero_grad();
    backward(loss);
    loss = Variable();
    opt.step();
    const MemoryStats s = memory_stats();
    if (step == 0) baseline = s;
    for (int t = 0; t < kNumMemTags; ++t)
      CHECK_MESSAGE(s.by_tag[t].current == baseline.by_tag[t].current, "step ", step, " tag ",
                    mem_tag_name(static_cast<MemTag>(t)));
    if (step == 2) peak_step2 = s.total.peak;
    if (step == 20) CHECK(s.total.peak == peak_step2);
  }
  const double first = (losses[0] + losses[1] + losses[2] + losses[3] + losses[4]) / 5;
  const double last = (losses[35] + losses[36] + losses[37] + losses[38] + losses[39]) / 5;
  MESSAGE("loss over the first 5 steps ", first, ", last 5 steps ", last);
  CHECK(first > 1.9);        // starts near ln(10)
  CHECK(last < 0.75 * first);  // and clearly learns
}

TEST_CASE("train() runs a short job, logs one row per epoch and reports memory") {
  const auto dir = std::filesystem::temp_directory_path() / ("actlab_test_train_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string log = (dir / "log.csv").string();
  std::filesystem::remove(log);
  TrainConfig c;
  c.dataset = "synthetic";
  c.synthetic_size = 256;
  c.epochs = 2;
  c.batch_size = 32;
  c.lr = 0.05;
  c.log_file = log;
  c.quiet = true;
  const TrainSummary s = train(c);
  CHECK(s.epochs.size() == 2);
  CHECK(s.steps == 16);
  CHECK(s.activation_bytes > 0);
  CHECK(s.peak_bytes > s.activation_bytes);
  CHECK(s.saved_raw_bytes == s.saved_packed_bytes);  // exact policy keeps everything
  CHECK(s.median_img_per_s > 0);                     // 15 timed steps: the first is warm-up
  CHECK(rate_text(s.median_img_per_s).find(" img/s") != std::string::npos);
  std::ifstream in(log);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) ++lines;
  CHECK(lines == 3);  // header + 2 epochs
  // An existing log is never overwritten without --overwrite.
  CHECK_THROWS_WITH_AS(train(c), doctest::Contains("already exists"), Error);
  std::ifstream again(log);
  lines = 0;
  while (std::getline(again, line)) ++lines;
  CHECK(lines == 3);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a run of one step has no timed step: its rate is NaN, printed as n/a, not 0") {
  TrainConfig c;
  c.dataset = "synthetic";
  c.synthetic_size = 32;
  c.batch_size = 32;
  c.quiet = true;
  const TrainSummary s = train(c);
  REQUIRE(s.steps == 1);
  CHECK(std::isnan(s.median_img_per_s));
  CHECK(std::isnan(s.epochs.at(0).img_per_s));
  CHECK(rate_text(s.median_img_per_s) == "n/a img/s (no timed step)");
  CHECK(rate_text(12.34) == "12.3 img/s");
}

TEST_CASE("--summary-json writes the run's summary as one JSON object that matches the returned summary") {
  const auto dir = std::filesystem::temp_directory_path() / ("actlab_test_summary_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  TrainConfig c;
  c.dataset = "synthetic";
  c.synthetic_size = 128;
  c.batch_size = 32;
  c.policy = "division:B=8,Q=2";
  c.summary_json = (dir / "summary.json").string();
  c.quiet = true;
  const TrainSummary s = train(c);
  std::ifstream in(c.summary_json);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const JsonValue j = parse_json(text, "summary");
  REQUIRE(j.find("final_test_acc") != nullptr);
  CHECK(j.find("final_test_acc")->number == doctest::Approx(s.final_test_acc));
  CHECK(j.find("steps")->number == s.steps);
  CHECK(j.find("saved_packed_bytes")->number == s.saved_packed_bytes);
  CHECK(j.find("saved_raw_bytes")->number > j.find("saved_packed_bytes")->number);  // division compresses
  CHECK(j.find("interrupted")->kind == JsonValue::Kind::Bool);
  REQUIRE(j.find("epoch_rows") != nullptr);
  CHECK(j.find("epoch_rows")->items.size() == s.epochs.size());
  REQUIRE(j.find("config") != nullptr);
  // Rewritten (never appended) by the next run; the old content is replaced whole.
  c.policy = "exact";
  train(c);
  std::ifstream again(c.summary_json);
  const std::string text2((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>());
  CHECK(parse_json(text2, "summary").find("saved_raw_bytes")->number ==
        parse_json(text2, "summary").find("saved_packed_bytes")->number);
  // ...because it begins as every summary does; a JSON file of anything else is not replaced without --overwrite.
  CHECK(text2.rfind(kSummaryJsonStart, 0) == 0);
  c.summary_json = (dir / "mine.json").string();
  write_text_atomic(c.summary_json, "{\"config\": \"mine\"}\n");
  CHECK(error_of([&] { train(c); }).find("already exists; pass --overwrite") != std::string::npos);
  std::ifstream mine(c.summary_json);
  CHECK(std::string(std::istreambuf_iterator<char>(mine), {}) == "{\"config\": \"mine\"}\n");
  c.overwrite = true;
  train(c);
  std::ifstream replaced(c.summary_json);
  CHECK(std::string(std::istreambuf_iterator<char>(replaced), {}).rfind(kSummaryJsonStart, 0) == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the summary's memory figures are one step's: under acgc the saves are a part of the activation memory") {
  // AC-GC packs at 8 bits in its first step and at the widths it chose after: a summary that took the saves
  // from the first step and the activation memory from the last reported more kept than the whole step held.
  TrainConfig c;
  c.dataset = "synthetic";
  c.synthetic_size = 32;  // one step: the 8-bit one
  c.batch_size = 32;
  c.test_limit = 32;
  c.threads = 1;
  c.policy = "acgc:E=0,I=100";
  c.quiet = true;
  const TrainSummary one = train(c);
  c.synthetic_size = 128;  // four steps: the last three at the chosen widths
  const TrainSummary four = train(c);
  REQUIRE(four.steps == 4);
  CHECK(four.saved_packed_bytes < one.saved_packed_bytes);  // the last step's saves, not the first's
  CHECK(four.saved_packed_bytes <= four.activation_bytes);
  CHECK(four.saved_packed_bytes == four.saved_expected_bytes);
  // Everything else a step keeps (masks, statistics, the batch) is the same size in both runs: the whole
  // step fell by exactly what the saves fell, which holds only when both figures are of one step.
  CHECK(one.activation_bytes - four.activation_bytes == one.saved_packed_bytes - four.saved_packed_bytes);
}

TEST_CASE("flag lists: items split on their separator, one trailing separator ends the list, an empty item is refused") {
  CHECK(split_list("resnet20,resnet18", ',') == std::vector<std::string>{"resnet20", "resnet18"});
  CHECK(split_list("exact;division:B=8,Q=2;", ';') == std::vector<std::string>{"exact", "division:B=8,Q=2"});
  CHECK(split_list("", ',').empty());
  for (const char* typo : {"resnet20,,resnet18", ",resnet20", "a,,", ","})
    CHECK(error_of([&] { split_list(typo, ','); }).find("the list '" + std::string(typo) + "' has an empty item") !=
          std::string::npos);
}

TEST_CASE("--memory-limit: sizes parse, and exact storage runs out of memory under a cap that division fits") {
  CHECK(parse_byte_size("1500000", "x") == 1500000);
  CHECK(parse_byte_size("512KiB", "x") == 512 * 1024);
  CHECK(parse_byte_size("1.5GiB", "x") == int64_t{3} << 29);
  CHECK(parse_byte_size("300mb", "x") == 300 * 1048576);
  for (const char* bad : {"", "MiB", "-5MiB", "0", "12XB", "1e30GiB"})
    CHECK_THROWS_WITH_AS(parse_byte_size(bad, "--memory-limit"), doctest::Contains("is not a size"), Error);
  TrainConfig c;
  c.dataset = "synthetic";
  c.synthetic_size = 256;
  c.batch_size = 128;
  c.steps_per_epoch = 2;
  c.quiet = true;
  c.policy = "division:B=8,Q=2";
  const TrainSummary fits = train(c);
  c.policy = "exact";
  const TrainSummary exact = train(c);
  REQUIRE(exact.peak_bytes > fits.peak_bytes + (int64_t{8} << 20));
  // A cap between the two peaks: what a smaller GPU would do to the exact run.
  const int64_t cap = (exact.peak_bytes + fits.peak_bytes) / 2;
  c.memory_limit = std::to_string(cap);
  const int64_t live = memory_stats().total.current;
  CHECK_THROWS_WITH_AS(train(c), doctest::Contains("out of memory on cpu"), OutOfMemory);
  CHECK(memory_stats().total.current == live);  // the failed run released everything, its tape included
  c.policy = "division:B=8,Q=2";
  CHECK(train(c).steps == 2);
  c.memory_limit = "";
  train(c);  // the cap ended with the run that set it
}

TEST_CASE("csv_field / csv_fields: fields with commas and quotes survive a round trip") {
  const std::vector<std::string> fields = {"plain", "division:B=8,Q=2", "say \"hi\"", "", "(32,784)", "a,\"b\",c"};
  std::string line;
  for (const auto& f : fields) line += (line.empty() ? "" : ",") + csv_field(f);
  CHECK(csv_field("plain") == "plain");
  CHECK(csv_field("x,y") == "\"x,y\"");
  CHECK(csv_fields(line) == fields);
  CHECK(csv_fields(line + "\r") == fields);  // a CRLF file
}

namespace {
std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
EpochRow row_of_epoch(int64_t epoch) {
  EpochRow r;
  r.epoch = epoch;
  r.train_loss = 1.0 / static_cast<double>(epoch);
  return r;
}
}  // namespace

TEST_CASE("epoch log: a resumed run's log is cut back to its checkpoint, a row that fails is cut off") {
  testing::TempDir dir("logtrim");
  for (const std::string name : {"run.csv", "run.jsonl"}) {
    CAPTURE(name);
    const std::string log = dir.file(name);
    {
      EpochLogger logger(log);
      for (int64_t e = 1; e <= 4; ++e) logger.write(row_of_epoch(e));
    }
    const std::string four = read_all(log);
    {
      EpochLogger logger(dir.file("two." + name.substr(name.find('.') + 1)));
      logger.write(row_of_epoch(1));
      logger.write(row_of_epoch(2));
    }
    const std::string two = read_all(dir.file("two." + name.substr(name.find('.') + 1)));  // header, epochs 1-2
    REQUIRE(four.compare(0, two.size(), two) == 0);
    // A kill or a full disk left half a row behind; the resume is from epoch 2's checkpoint (best, older
    // than last): the half row and epochs 3 and 4 go, and the resumed run's epoch 3 follows epoch 2.
    { std::ofstream(log, std::ios::app) << "5,0.1,0.0"; }
    { EpochLogger logger(log, true, 2); logger.write(row_of_epoch(3)); }
    CHECK(read_all(log).compare(0, two.size(), two) == 0);
    const std::string after = read_all(log).substr(two.size());
    CHECK(after.find('\n') == after.size() - 1);  // one row, ending in its newline
    CHECK(after.rfind(name == "run.csv" ? "3," : "{\"epoch\":3,", 0) == 0);
    // Nothing past the checkpoint: the log is left as it is.
    const std::string before = read_all(log);
    { EpochLogger logger(log, true, 3); }
    CHECK(read_all(log) == before);
  }

  // A row the disk takes only part of (a file-size limit, as a nearly full disk) is cut off again.
  const std::string log = dir.file("limited.csv");
  EpochLogger logger(log);
  logger.write(row_of_epoch(1));
  const std::string one = read_all(log);
  // The error of `write` run under a file-size limit of `bytes` (SIGXFSZ ignored, so the write fails with
  // EFBIG as on a full disk), and the limit restored after it.
  const auto error_under_limit = [](size_t bytes, const std::function<void()>& write) {
    struct rlimit saved {};
    REQUIRE(getrlimit(RLIMIT_FSIZE, &saved) == 0);
    struct sigaction ignore {}, old {};
    ignore.sa_handler = SIG_IGN;
    REQUIRE(sigaction(SIGXFSZ, &ignore, &old) == 0);
    struct rlimit limited = saved;
    limited.rlim_cur = static_cast<rlim_t>(bytes);
    REQUIRE(setrlimit(RLIMIT_FSIZE, &limited) == 0);
    std::string error;
    try {
      write();
    } catch (const Error& e) {
      error = e.what();
    }
    setrlimit(RLIMIT_FSIZE, &saved);
    sigaction(SIGXFSZ, &old, nullptr);
    return error;
  };
  // Room for 10 bytes of the next row.
  CHECK(error_under_limit(one.size() + 10, [&] { logger.write(row_of_epoch(2)); }).find("writing log file") !=
        std::string::npos);
  CHECK(read_all(log) == one);
  logger.write(row_of_epoch(2));  // with room again, the next row follows the last whole one
  CHECK(read_all(log).rfind("2,", one.size()) == one.size());

  // A new log whose first row (with its header) the disk does not take is removed again, and on_open (the
  // trainer's configuration side file) has not run: a header-only log was left behind before.
  const std::string fresh = dir.file("fresh.csv");
  int opened = 0;
  EpochLogger first(fresh, false, 0, [&] { ++opened; });
  // 20 bytes: less than the header.
  CHECK(error_under_limit(20, [&] { first.write(row_of_epoch(1)); }).find("writing log file") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(fresh));
  CHECK(opened == 0);
  first.write(row_of_epoch(1));  // with room again: header and row, and on_open once
  const std::string text = read_all(fresh);
  CHECK(text.find("epoch,") == 0);
  CHECK(text.find("\n1,") == text.find('\n'));  // the first row right after the header
  CHECK(opened == 1);
  first.write(row_of_epoch(2));
  CHECK(opened == 1);
}

TEST_CASE("epoch log: a resume continues only the log its checkpoint recorded, not another run's under its name") {
  testing::TempDir dir("logmark");
  for (const std::string ext : {"csv", "jsonl"}) {
    CAPTURE(ext);
    const std::string log = dir.file("run." + ext), other = dir.file("other." + ext);
    LogMark at2, at3;
    {
      EpochLogger logger(log);
      CHECK(logger.mark().bytes == 0);  // a new log holds nothing before its first row
      for (int64_t e = 1; e <= 3; ++e) {
        logger.write(row_of_epoch(e));
        if (e == 2) at2 = logger.mark();
        if (e == 3) at3 = logger.mark();
      }
    }
    const std::string text = read_all(log);
    CHECK(at3.bytes == static_cast<int64_t>(text.size()));
    CHECK(at2.bytes < at3.bytes);
    CHECK(at2.checksum != at3.checksum);
    // Its own log continues from either checkpoint (from epoch 2's the row of epoch 3 is cut back), also
    // after a kill left half a row.
    CHECK(resumed_log_continues(log, at3));
    CHECK(resumed_log_continues(log, at2));
    { std::ofstream(log, std::ios::app) << "4,0.1"; }
    CHECK(resumed_log_continues(log, at3));
    // A resumed run's logger, before its first row, marks what the cut back will keep: epoch 2's prefix.
    CHECK(EpochLogger(log, true, 2).mark().checksum == at2.checksum);
    CHECK(read_all(log) == text + "4,0.1");  // and has not cut anything yet
    {  // another run's log under the same name: other rows up to the checkpoint's epoch
      EpochLogger logger(other);
      for (int64_t e = 1; e <= 3; ++e) {
        EpochRow r = row_of_epoch(e);
        r.train_loss += 1;
        logger.write(r);
      }
    }
    CHECK_FALSE(resumed_log_continues(other, at3));
    CHECK_FALSE(resumed_log_continues(other, at2));
    // A log shorter than the mark (cut by hand, or the first rows of another run) does not continue.
    std::filesystem::resize_file(other, static_cast<uintmax_t>(at2.bytes));
    CHECK_FALSE(resumed_log_continues(other, at3));
    // A checkpoint written before its log's first row (a stop in epoch 1) or with no log: a log with rows
    // is another run's (or holds only rows the resume would cut), a header alone is not.
    const LogMark none = EpochLogger("").mark();
    CHECK(none.bytes == 0);
    CHECK_FALSE(resumed_log_continues(log, none));
    {
      const std::string later = dir.file("later." + ext);
      EpochLogger logger(later);
      logger.write(row_of_epoch(3));
      CHECK_FALSE(resumed_log_continues(later, none));
      if (ext == "csv") {
        const std::string header = read_all(later).substr(0, read_all(later).find('\n') + 1);
        std::ofstream(dir.file("header.csv")) << header;
        CHECK(resumed_log_continues(dir.file("header.csv"), none));
        // A row a kill cut short is no row: the resume cuts it off.
        std::ofstream(dir.file("half.csv")) << header << "1,0.09";
        CHECK(resumed_log_continues(dir.file("half.csv"), none));
      }
    }
    // No file or an empty one starts afresh; checkpoints from before the mark cannot tell an epoch log.
    CHECK(resumed_log_continues(dir.file("absent." + ext), at3));
    { std::ofstream(dir.file("empty." + ext)); }
    CHECK(resumed_log_continues(dir.file("empty." + ext), at3));
    CHECK(resumed_log_continues(other, LogMark{}));
  }
  // Not a log at all: never continued, whatever the checkpoint recorded.
  { std::ofstream(dir.file("notes.txt")) << "my notes\n"; }
  CHECK_FALSE(resumed_log_continues(dir.file("notes.txt"), LogMark{}));

  // A FIFO is a stream: a resume writes to it without reading it (a read would take the reader's rows or
  // wait for a writer), and the mark counts what was written, reading nothing back.
  const std::string fifo = dir.file("fifo.csv");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(is_epoch_log(fifo));
  CHECK(resumed_log_continues(fifo, LogMark{5, "0000000000000000"}));
  CHECK(EpochLogger(fifo, true, 2).mark().bytes == 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(reader >= 0);
  {
    EpochLogger logger(fifo, true, 2);
    logger.write(row_of_epoch(3));
    const LogMark m = logger.mark();
    char buf[1024];
    const ssize_t got = ::read(reader, buf, sizeof buf);
    REQUIRE(got > 0);
    CHECK(m.bytes == got);  // header and row, all still in the pipe for its reader
    CHECK(m.checksum == hex64(fnv1a64(buf, static_cast<size_t>(got))));
  }
  ::close(reader);
}

TEST_CASE("JSON logs: a NaN loss is written as null and module names are escaped, so every line parses") {
  testing::TempDir dir("jsonlog");
  const std::string log = dir.file("run.jsonl");
  {
    EpochLogger logger(log);
    EpochRow row;
    row.epoch = 1;
    row.train_loss = std::nan("");
    row.test_loss = std::numeric_limits<double>::infinity();
    logger.write(row);
    row.epoch = 2;
    row.train_loss = 0.5;
    logger.write(row);
  }
  std::ifstream in(log);
  std::string line;
  std::vector<JsonValue> rows;
  while (std::getline(in, line)) rows.push_back(parse_json(line, "log line"));
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].find("train_loss")->kind == JsonValue::Kind::Null);
  CHECK(rows[0].find("test_loss")->kind == JsonValue::Kind::Null);
  CHECK(rows[1].find("train_loss")->number == 0.5);

  CacheEntryStats e;
  e.module_path = "odd \"name\"\\x";
  e.op = "conv2d";
  e.policy = "division:B=8,Q=2";
  e.shape = {2, 3};
  e.pack_seconds = std::nan("");
  const std::string report = dir.file("mem.json");
  write_memory_report(report, {e, e});
  std::ifstream rin(report);
  const JsonValue r = parse_json(std::string(std::istreambuf_iterator<char>(rin), {}), "memory report");
  REQUIRE(r.items.size() == 2);
  CHECK(r.items[1].find("module")->string == e.module_path);
  CHECK(r.items[1].find("pack_ms")->kind == JsonValue::Kind::Null);
}

TEST_CASE("--memory-report: one CSV row per saved tensor that adds up to the run's totals, and JSON too") {
  testing::TempDir dir("memory_report");
  TrainConfig c;
  c.dataset = "synthetic";
  c.synthetic_size = 64;
  c.batch_size = 32;
  c.model = "mlp";
  c.policy = "division:B=8,Q=2";
  c.policy_rules = {"fc1=exact"};
  c.memory_report = dir.file("layers.csv");
  c.quiet = true;
  const TrainSummary s = train(c);
  std::ifstream in(c.memory_report);
  std::string line;
  REQUIRE(std::getline(in, line));
  const std::vector<std::string> header = csv_fields(line);
  REQUIRE(header.size() == 10);
  CHECK(header[2] == "policy");
  int64_t raw = 0, packed = 0, expected = 0, rows = 0;
  std::set<std::string> policies;
  while (std::getline(in, line)) {
    const std::vector<std::string> f = csv_fields(line);
    REQUIRE_MESSAGE(f.size() == header.size(), line);  // a policy's commas stay inside its field
    ++rows;
    if (f[1].find(".input") == std::string::npos) continue;  // lossy saves only, as the summary counts
    policies.insert(f[0] + " " + f[2]);
    raw += std::stoll(f[5]);
    packed += std::stoll(f[6]);
    expected += std::stoll(f[7]);
    CHECK(std::stoll(f[6]) == std::stoll(f[7]));  // measured == closed form per tensor
  }
  CHECK(rows >= 4);
  CHECK(policies.count("fc1 exact") == 1);  // the per-module rule
  CHECK(policies.count("fc2 division:B=8,Q=2") == 1);
  CHECK(raw == s.saved_raw_bytes);
  CHECK(packed == s.saved_packed_bytes);
  CHECK(expected == s.saved_expected_bytes);
  c.memory_report = dir.file("layers.json");
  train(c);
  std::ifstream json_in(c.memory_report);
  const std::string json((std::istreambuf_iterator<char>(json_in)), std::istreambuf_iterator<char>());
  const JsonValue j = parse_json(json, "memory report");
  REQUIRE(j.kind == JsonValue::Kind::Array);
  CHECK(static_cast<int64_t>(j.items.size()) == rows);
  CHECK(j.items[0].find("policy")->string == "exact");  // fc1, kept exact by the rule
}

TEST_CASE("bad configurations are refused before anything runs") {
  TrainConfig c;
  c.batch_size = 0;
  CHECK_THROWS_WITH_AS(validate(c), doctest::Contains("batch size"), Error);
  c = TrainConfig();
  c.epochs = -1;
  CHECK_THROWS_WITH_AS(validate(c), doctest::Contains("epochs"), Error);
  c = TrainConfig();
  c.model = "resnet7";
  CHECK_THROWS_WITH_AS(validate(c), doctest::Contains("unknown model"), Error);
  c = TrainConfig();
  c.policy = "zip";
  CHECK_THROWS_WITH_AS(validate(c), doctest::Contains("policy"), Error);
  c = TrainConfig();
  c.threads = 0;
  CHECK_THROWS_AS(validate(c), Error);
  c = TrainConfig();
  c.dataset = "fashion-mnist";
  c.data_dir = "/nonexistent/actlab";
  CHECK_THROWS_WITH_AS(load_data(c), doctest::Contains("/nonexistent/actlab"), Error);
  c = TrainConfig();
  c.log_file = "/nonexistent/dir/log.csv";
  CHECK_THROWS_WITH_AS(validate(c), doctest::Contains("does not exist"), Error);
}

TEST_CASE("the flag parser: values, switches, repeats, and clear errors") {
  FlagParser f("prog", "test");
  f.add("batch-size", "int", "128", "batch");
  f.add("lr", "float", "0.1", "rate");
  f.add("quiet", "bool", "", "quiet");
  f.add("rule", "string", "", "rules", true);
  const char* ok[] = {"prog", "--batch-size", "64", "--lr=0.5", "--quiet", "--rule", "a=b", "--rule=c=d"};
  CHECK(f.parse(8, ok));
  CHECK(f.get_int("batch-size") == 64);
  CHECK(f.get_float("lr") == 0.5);
  CHECK(f.get_bool("quiet"));
  CHECK(f.get_all("rule") == std::vector<std::string>{"a=b", "c=d"});
  FlagParser g = f;
  const char* unknown[] = {"prog", "--bogus", "1"};
  CHECK_THROWS_WITH_AS(g.parse(3, unknown), doctest::Contains("unknown option --bogus"), Error);
  const char* missing[] = {"prog", "--batch-size"};
  CHECK_THROWS_WITH_AS(g.parse(2, missing), doctest::Contains("needs a value"), Error);
  const char* bad[] = {"prog", "--batch-size", "ten"};
  CHECK_THROWS_WITH_AS(g.parse(3, bad), doctest::Contains("integer"), Error);
  const char* help[] = {"prog", "--help"};
  CHECK(!g.parse(2, help));
  CHECK(g.help().find("--batch-size") != std::string::npos);
}
