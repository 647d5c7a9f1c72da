// Progress lines, epoch logs, memory reports and the summary.
#include "actlab/train/logging.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "actlab/core/allocator.h"
#include "actlab/core/precision.h"
#include "actlab/io/checksum.h"
#include "actlab/io/files.h"
#include "actlab/io/json.h"
#include "actlab/train/config_file.h"

namespace actlab {

namespace {
constexpr const char* kCsvHeader =
    "epoch,lr,train_loss,train_acc,test_loss,test_acc,img_per_s,peak_mib,activation_mib,wall_s";

// A log on a FIFO or a device is a stream: written to, never read back (a read would take the reader's
// rows, or wait for a writer for ever), so never cut back either.
bool is_stream(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  return !ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st) &&
         !std::filesystem::is_directory(st);
}
}  // namespace

bool is_epoch_log(const std::string& path) {
  if (is_stream(path)) return true;
  std::ifstream in(path);
  if (!in) return false;
  std::string first;
  if (!std::getline(in, first)) return true;  // empty
  return first == kCsvHeader || first.rfind("{\"epoch\":", 0) == 0;
}

namespace {
// The epoch of a log row (CSV "E,..." or JSON {"epoch":E,...}); -1 for the CSV header or anything else.
int64_t row_epoch(const std::string& line) {
  const size_t start = line.rfind("{\"epoch\":", 0) == 0 ? 9 : 0;
  int64_t e = 0;
  size_t i = start;
  for (; i < line.size() && line[i] >= '0' && line[i] <= '9' && i < start + 18; ++i) e = e * 10 + (line[i] - '0');
  return i > start && i < line.size() && line[i] == ',' ? e : -1;
}

// The text of the file at path ("" where it cannot be read).
std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// What of a resumed run's log its checkpoint holds (see EpochLogger's constructor): the length of the
// whole lines before the first row of an epoch after `epochs_done`; dropped counts the rows after it,
// partial says whether the text ends in a line cut short.
struct KeptLog {
  size_t keep = 0;
  int64_t dropped = 0;
  bool partial = false;
};

KeptLog kept_log(const std::string& text, int64_t epochs_done) {
  KeptLog k;
  k.keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  k.partial = k.keep < text.size();
  for (size_t at = 0; at < k.keep;) {
    const size_t end = text.find('\n', at);
    if (row_epoch(text.substr(at, end - at)) > epochs_done) {
      for (size_t r = at; r < k.keep; r = text.find('\n', r) + 1) ++k.dropped;
      k.keep = at;
      break;
    }
    at = end + 1;
  }
  return k;
}

// Cuts a resumed run's log back to what its checkpoint holds.
void trim_resumed_log(const std::string& path, int64_t epochs_done) {
  if (is_stream(path)) return;
  const std::string text = read_all(path);
  const KeptLog k = kept_log(text, epochs_done);
  if (k.keep == text.size()) return;  // a new log (the open then says what is wrong) or nothing to cut
  ACTLAB_CHECK(::truncate(path.c_str(), static_cast<off_t>(k.keep)) == 0, "cannot cut log file '", path,
               "' back to its checkpoint's epoch: ", std::strerror(errno));
  std::string what;
  if (k.dropped > 0)
    what = " removed " + std::to_string(k.dropped) + (k.dropped == 1 ? " row" : " rows") +
           " of later epochs, which this run writes again";
  if (k.partial) what += std::string(k.dropped > 0 ? ";" : "") + " removed a last line cut short";
  std::fprintf(stderr, "actlab-train: note: log '%s' cut back to epoch %lld, where the checkpoint is:%s\n", path.c_str(),
               static_cast<long long>(epochs_done), what.c_str());
}

LogMark mark_of(const std::string& text, size_t bytes) {
  return {static_cast<int64_t>(bytes), hex64(fnv1a64(text.data(), bytes))};
}
}  // namespace

EpochLogger::EpochLogger(const std::string& path, bool append, int64_t epochs_done, std::function<void()> on_open)
    : path_(path), append_(append), epochs_done_(epochs_done), on_open_(std::move(on_open)) {
  const std::string ext = path.size() >= 5 ? path.substr(path.rfind('.') == std::string::npos ? 0 : path.rfind('.')) : "";
  json_ = ext == ".jsonl" || ext == ".json";
}

bool resumed_log_continues(const std::string& path, const LogMark& mark) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) || is_stream(path) || std::filesystem::is_empty(path, ec)) return true;
  if (!is_epoch_log(path)) return false;
  if (mark.bytes < 0) return true;
  const std::string text = read_all(path);
  if (mark.bytes > 0)
    return static_cast<uint64_t>(mark.bytes) <= text.size() &&
           mark_of(text, static_cast<size_t>(mark.bytes)).checksum == mark.checksum;
  // Nothing recorded: a log with whole rows is not this run's, or holds only rows a resume cuts off anyway
  // (this run's own, written after the checkpoint: the trainer's error says so). A last line cut short is
  // cut off in either case.
  const size_t whole = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  for (size_t at = 0; at < whole; at = text.find('\n', at) + 1)
    if (row_epoch(text.substr(at, text.find('\n', at) - at)) >= 0) return false;
  return true;
}

LogMark EpochLogger::mark() const {
  if (file_) return {written_, hex64(hash_)};
  if (path_.empty() || !append_ || is_stream(path_)) return mark_of("", 0);  // nothing, or written afresh
  const std::string text = read_all(path_);  // a resumed log before its first row: what the cut keeps
  return mark_of(text, kept_log(text, epochs_done_).keep);
}

void EpochLogger::open() {
  if (append_) trim_resumed_log(path_, epochs_done_);
  struct stat st {};
  created_ = ::stat(path_.c_str(), &st) != 0;
  // What the log holds from here on is counted as it is written (mark() reads nothing back).
  const std::string kept = append_ && !is_stream(path_) ? read_all(path_) : std::string();
  written_ = static_cast<int64_t>(kept.size());
  hash_ = fnv1a64(kept.data(), kept.size());
  file_ = std::fopen(path_.c_str(), append_ ? "a" : "w");
  ACTLAB_CHECK(file_ != nullptr, "cannot open log file '", path_, "': ", std::strerror(errno));
  std::fseek(file_, 0, SEEK_END);
}

EpochLogger::~EpochLogger() {
  if (file_) std::fclose(file_);
}

void EpochLogger::write(const EpochRow& r) {
  if (path_.empty()) return;
  if (!file_) open();
  const double mib = 1024.0 * 1024.0;
  std::string line;
  if (json_) {
    JsonWriter w;
    w.begin_object().field("epoch", r.epoch).field("lr", r.lr).field("train_loss", r.train_loss)
        .field("train_acc", r.train_acc).field("test_loss", r.test_loss).field("test_acc", r.test_acc)
        .field("img_per_s", r.img_per_s).field("peak_mib", r.peak_bytes / mib)
        .field("activation_mib", r.activation_bytes / mib).field("wall_s", r.wall_s).end_object();
    line = w.str() + "\n";
  } else {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%lld,%.6g,%.6f,%.4f,%.6f,%.4f,%.2f,%.3f,%.3f,%.3f\n", static_cast<long long>(r.epoch),
                  r.lr, r.train_loss, r.train_acc, r.test_loss, r.test_acc, r.img_per_s, r.peak_bytes / mib,
                  r.activation_bytes / mib, r.wall_s);
    line = buf;
  }
  const long before = std::ftell(file_);
  // An empty CSV log gets its header in the same write as its first row, so a failed first write leaves
  // no header-only log behind. (A stream has no position: its first row is its start.)
  const bool at_start = before == 0 || (before < 0 && is_stream(path_));
  if (!json_ && !opened_ && at_start) line = std::string(kCsvHeader) + "\n" + line;
  const bool written = std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  if (written) {
    written_ += static_cast<int64_t>(line.size());
    hash_ = fnv1a64(line.data(), line.size(), hash_);
    if (!opened_ && on_open_) on_open_();
    opened_ = true;
    return;
  }
  const int error = errno;
  // A full disk may have taken part of the row: cut it off, so the log ends with its last whole row. A log
  // this run created and could not write its first row to is removed again: nothing is left behind.
  std::clearerr(file_);
  if (before >= 0 && ::ftruncate(::fileno(file_), static_cast<off_t>(before)) == 0)
    std::fseek(file_, before, SEEK_SET);
  if (before == 0 && created_) {
    std::fclose(file_);
    file_ = nullptr;
    std::remove(path_.c_str());
  }
  ACTLAB_FAIL("writing log file '", path_, "' failed: ", std::strerror(error));
}

Progress::Progress(bool quiet, int64_t every) : quiet_(quiet), tty_(::isatty(STDOUT_FILENO) == 1), every_(every) {}

namespace {
// "1h02m", "4m05s", "37s"; "?" before a rate is known.
std::string format_eta(double s) {
  if (!(s >= 0) || s > 1e8) return "?";
  const long long t = static_cast<long long>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, (t / 60) % 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%llds", t);
  return buf;
}
}  // namespace

namespace {
std::atomic<bool> g_progress_line_open{false};
}  // namespace

std::string rate_text(double img_per_s) {
  if (!std::isfinite(img_per_s)) return "n/a img/s (no timed step)";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f img/s", img_per_s);
  return buf;
}

void end_progress_line() {
  if (g_progress_line_open.exchange(false)) {
    std::printf("\n");
    std::fflush(stdout);
  }
}

void Progress::step(int64_t epoch, int64_t epochs, int64_t step, int64_t steps, double loss, double acc,
                    double img_per_s, int64_t live_bytes, double eta_s) {
  if (quiet_) return;
  const bool last = step == steps;
  if (!tty_ && step % every_ != 0 && !last && step != 1) return;
  std::printf("%sepoch %lld/%lld step %lld/%lld  loss %.4f  acc %.2f%%  %.1f img/s  ETA %s  live %s%s",
              tty_ ? "\r" : "", static_cast<long long>(epoch), static_cast<long long>(epochs),
              static_cast<long long>(step), static_cast<long long>(steps), loss, acc, img_per_s,
              format_eta(eta_s).c_str(), format_bytes(live_bytes).c_str(), tty_ ? "   " : "\n");
  std::fflush(stdout);
  g_progress_line_open = tty_;
}

void Progress::epoch_done(const EpochRow& r, int64_t epochs) {
  if (quiet_) return;
  g_progress_line_open = false;  // the "\n" below ends it
  std::printf("%sepoch %lld/%lld done: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | %s | "
              "peak %s | activations %s | %.1f s\n",
              tty_ ? "\n" : "", static_cast<long long>(r.epoch), static_cast<long long>(epochs), r.train_loss,
              r.train_acc, r.test_loss, r.test_acc, rate_text(r.img_per_s).c_str(), format_bytes(r.peak_bytes).c_str(),
              format_bytes(r.activation_bytes).c_str(), r.wall_s);
  if (r.acgc_bits >= 0) std::printf("  acgc: average width %.2f bits over its saves' last packs\n", r.acgc_bits);
  std::fflush(stdout);
}

void print_first_step_report(const TrainSummary& s, const StepResult& first, const TrainConfig& c) {
  std::printf("%s", memory_stats(Device::parse(c.device)).table().c_str());
  std::printf("first step: activation memory %s (docs/measures.md: live after forward+loss minus before, "
              "minus logits and loss, input batch included)\n",
              format_bytes(first.activation_bytes).c_str());
  if (first.recomputed_segments > 0)
    std::printf("checkpoint: %lld segments recomputed in backward, %.1f ms of the step\n",
                static_cast<long long>(first.recomputed_segments), first.recompute_seconds * 1e3);
  if (first.offloaded_bytes > 0)
    std::printf("swap: %s of saves kept in host memory after forward (moved out and back: twice that per step)\n",
                format_bytes(first.offloaded_bytes).c_str());
  const SavedBytes& saved = first.saved;  // this step's, as the activation memory above
  if (saved.raw > 0 && saved.packed > 0) {
    std::printf("policy %s on the saves a policy may code (layer inputs, norm, GELU and matmul inputs, softmax "
                "outputs): %s raw -> %s kept, %.2fx measured, %.2fx closed form\n",
                s.policy.c_str(), format_bytes(saved.raw).c_str(), format_bytes(saved.packed).c_str(),
                static_cast<double>(saved.raw) / static_cast<double>(saved.packed),
                saved.expected > 0 ? static_cast<double>(saved.raw) / static_cast<double>(saved.expected) : 0.0);
    // raw counts fp32 bytes in every precision; a low-precision run's own baseline is exact's 16-bit copies.
    const Precision p = parse_precision(c.precision);
    if (p != Precision::F32)
      std::printf("  under %s, raw is the saves in fp32; against exact's %s copies (half of raw): %.2fx\n",
                  precision_name(p), precision_name(p),
                  static_cast<double>(saved.raw) / 2.0 / static_cast<double>(saved.packed));
  }
  std::fflush(stdout);
}

void print_summary(const TrainSummary& s, const TrainConfig& c) {
  std::printf("summary: %s, %s, policy %s: test accuracy %.2f%% after %lld epoch%s (%lld step%s), "
              "median %s, peak memory %s, activation memory %s, wall %.1f s\n",
              c.model.c_str(), s.data_note.c_str(), s.policy.c_str(), s.final_test_acc,
              static_cast<long long>(s.epochs_done()), s.epochs_done() == 1 ? "" : "s", static_cast<long long>(s.steps),
              s.steps == 1 ? "" : "s", rate_text(s.median_img_per_s).c_str(),
              format_bytes(s.peak_bytes).c_str(), format_bytes(s.activation_bytes).c_str(), s.wall_s);
  if (Device::parse(c.device).is_cuda())  // the caching allocator holds more than is live: say how much the run took from the device
    std::printf("device %s: peak allocated %s, peak reserved %s\n", c.device.c_str(), format_bytes(s.peak_bytes).c_str(),
                format_bytes(s.reserved_peak_bytes).c_str());
  std::fflush(stdout);
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  const size_t n = !line.empty() && line.back() == '\r' ? line.size() - 1 : line.size();  // a CRLF file
  for (size_t i = 0; i < n; ++i) {
    const char c = line[i];
    if (c == '"') {
      if (quoted && i + 1 < n && line[i + 1] == '"') out.back() += line[++i];
      else quoted = !quoted;
    } else if (c == ',' && !quoted) {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

void write_memory_report(const std::string& path, const std::vector<CacheEntryStats>& entries) {
  const bool json = path.size() > 5 && path.substr(path.size() - 5) == ".json";
  std::string out;
  JsonWriter rows(true);  // one entry a line
  if (json) rows.begin_array();
  else out = "module,op,policy,shape,packs,bytes_raw,bytes_packed,bytes_expected,pack_ms,unpack_ms\n";
  for (const auto& e : entries) {
    const std::string shape = shape_str(e.shape);
    if (json) {
      JsonWriter w;
      w.begin_object().field("module", e.module_path).field("op", e.op).field("policy", e.policy)
          .field("shape", shape).field("packs", e.packs).field("bytes_raw", e.bytes_raw)
          .field("bytes_packed", e.bytes_packed).field("bytes_expected", e.bytes_expected)
          .field("pack_ms", e.pack_seconds * 1e3).field("unpack_ms", e.unpack_seconds * 1e3).end_object();
      rows.raw(w.str());
    } else {
      char nums[160];
      std::snprintf(nums, sizeof nums, "%lld,%lld,%lld,%lld,%.3f,%.3f\n", static_cast<long long>(e.packs),
                    static_cast<long long>(e.bytes_raw), static_cast<long long>(e.bytes_packed),
                    static_cast<long long>(e.bytes_expected), e.pack_seconds * 1e3, e.unpack_seconds * 1e3);
      out += csv_field(e.module_path) + "," + csv_field(e.op) + "," + csv_field(e.policy) + "," + csv_field(shape) +
             "," + nums;
    }
  }
  if (json) out = rows.end_array().str() + "\n";
  write_text_atomic(path, out);
}

}  // namespace actlab

namespace actlab {

void write_summary_json(const std::string& path, const TrainSummary& s, const TrainConfig& c) {
  write_text_atomic(path, summary_to_json(s, c) + "\n");
}

std::string summary_to_json(const TrainSummary& s, const TrainConfig& c) {
  JsonWriter w(true);
  w.begin_object()
      .key("config").raw(config_to_json(c))
      .field("data", s.data_note)
      .field("input_channels", s.input_channels)
      .field("input_height", s.input_height)
      .field("input_width", s.input_width)
      .field("interrupted", s.interrupted)
      .field("diverged", s.diverged)
      .field("epochs_done", s.epochs_done())
      .field("steps", s.steps)
      .field("final_test_acc", s.final_test_acc)
      .field("final_test_loss", s.final_test_loss)
      .field("best_test_acc", s.best_test_acc)
      .field("median_img_per_s", s.median_img_per_s)
      .field("peak_bytes", s.peak_bytes)
      .field("reserved_peak_bytes", s.reserved_peak_bytes)
      .field("activation_bytes", s.activation_bytes)
      .field("saved_raw_bytes", s.saved_raw_bytes)
      .field("saved_packed_bytes", s.saved_packed_bytes)
      .field("saved_expected_bytes", s.saved_expected_bytes)
      .field("wall_s", s.wall_s)
      .field("skipped_steps", s.skipped_steps)
      .field("loss_scale", s.loss_scale)
      .field("overflow_skips", s.overflow_skips)
      .field("world_size", s.world_size)
      .field("comm_s", s.comm_s)
      .field("comm_exposed_s", s.comm_exposed_s)
      .field("comm_cpu_s", s.comm_cpu_s)
      .key("epoch_rows").begin_array();
  for (const EpochRow& r : s.epochs) {
    JsonWriter row;  // one row a line
    row.begin_object().field("epoch", r.epoch).field("lr", r.lr).field("train_loss", r.train_loss)
        .field("train_acc", r.train_acc).field("test_loss", r.test_loss).field("test_acc", r.test_acc)
        .field("img_per_s", r.img_per_s).field("peak_bytes", r.peak_bytes)
        .field("activation_bytes", r.activation_bytes).field("wall_s", r.wall_s).end_object();
    w.raw(row.str());
  }
  w.end_array().end_object();
  return w.str();
}

}  // namespace actlab
