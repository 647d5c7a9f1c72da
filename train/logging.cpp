// Progress lines, epoch logs, memory reports and the summary.
#include "train/logging.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <string>

#include "core/allocator.h"
#include "train/checkpoint.h"
#include "train/config_file.h"

namespace actlab {

EpochLogger::EpochLogger(const std::string& path, bool append) : path_(path) {
  if (path.empty()) return;
  const std::string ext = path.size() >= 5 ? path.substr(path.rfind('.') == std::string::npos ? 0 : path.rfind('.')) : "";
  json_ = ext == ".jsonl" || ext == ".json";
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  ACTLAB_CHECK(file_ != nullptr, "cannot open log file '", path, "': ", std::strerror(errno));
  std::fseek(file_, 0, SEEK_END);
  if (!json_ && std::ftell(file_) == 0) {
    std::fprintf(file_, "epoch,lr,train_loss,train_acc,test_loss,test_acc,img_per_s,peak_mib,activation_mib,wall_s\n");
    std::fflush(file_);
  }
}

EpochLogger::~EpochLogger() {
  if (file_) std::fclose(file_);
}

void EpochLogger::write(const EpochRow& r) {
  if (!file_) return;
  const double mib = 1024.0 * 1024.0;
  if (json_) {
    std::fprintf(file_,
                 "{\"epoch\":%lld,\"lr\":%.6g,\"train_loss\":%.6f,\"train_acc\":%.4f,\"test_loss\":%.6f,"
                 "\"test_acc\":%.4f,\"img_per_s\":%.2f,\"peak_mib\":%.3f,\"activation_mib\":%.3f,\"wall_s\":%.3f}\n",
                 static_cast<long long>(r.epoch), r.lr, r.train_loss, r.train_acc, r.test_loss, r.test_acc,
                 r.img_per_s, r.peak_bytes / mib, r.activation_bytes / mib, r.wall_s);
  } else {
    std::fprintf(file_, "%lld,%.6g,%.6f,%.4f,%.6f,%.4f,%.2f,%.3f,%.3f,%.3f\n", static_cast<long long>(r.epoch), r.lr,
                 r.train_loss, r.train_acc, r.test_loss, r.test_acc, r.img_per_s, r.peak_bytes / mib,
                 r.activation_bytes / mib, r.wall_s);
  }
  ACTLAB_CHECK(std::fflush(file_) == 0, "writing log file '", path_, "' failed: ", std::strerror(errno));
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
}

void Progress::epoch_done(const EpochRow& r, int64_t epochs) {
  if (quiet_) return;
  std::printf("%sepoch %lld/%lld done: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | %.1f img/s | "
              "peak %s | activations %s | %.1f s\n",
              tty_ ? "\n" : "", static_cast<long long>(r.epoch), static_cast<long long>(epochs), r.train_loss,
              r.train_acc, r.test_loss, r.test_acc, r.img_per_s, format_bytes(r.peak_bytes).c_str(),
              format_bytes(r.activation_bytes).c_str(), r.wall_s);
  std::fflush(stdout);
}

void print_first_step_report(const TrainSummary& s, int64_t activation_bytes, const TrainConfig& c) {
  std::printf("%s", memory_stats(Device::parse(c.device)).table().c_str());
  std::printf("first step: activation memory %s (reference measure: live after forward+loss minus before, "
              "minus logits and loss, input batch included)\n",
              format_bytes(activation_bytes).c_str());
  if (s.saved_raw_bytes > 0 && s.saved_packed_bytes > 0) {
    std::printf("policy %s on conv/linear/batchnorm inputs: %s raw -> %s kept, %.2fx measured, %.2fx closed form\n",
                c.policy.c_str(), format_bytes(s.saved_raw_bytes).c_str(), format_bytes(s.saved_packed_bytes).c_str(),
                static_cast<double>(s.saved_raw_bytes) / static_cast<double>(s.saved_packed_bytes),
                s.saved_expected_bytes > 0
                    ? static_cast<double>(s.saved_raw_bytes) / static_cast<double>(s.saved_expected_bytes)
                    : 0.0);
  }
  std::fflush(stdout);
}

void print_summary(const TrainSummary& s, const TrainConfig& c) {
  std::printf("summary: %s, %s, policy %s: test accuracy %.2f%% after %lld epochs (%lld steps), "
              "%.1f img/s median, peak memory %s, activation memory %s, wall %.1f s\n",
              c.model.c_str(), s.data_note.c_str(), c.policy.c_str(), s.final_test_acc,
              static_cast<long long>(s.epochs.size()), static_cast<long long>(s.steps), s.median_img_per_s,
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
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  ACTLAB_CHECK(f != nullptr, "cannot write memory report '", tmp, "': ", std::strerror(errno));
  if (json) std::fprintf(f, "[\n");
  else std::fprintf(f, "module,op,policy,shape,packs,bytes_raw,bytes_packed,bytes_expected,pack_ms,unpack_ms\n");
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    const std::string shape = shape_str(e.shape);
    if (json) {
      std::fprintf(f,
                   "  {\"module\":\"%s\",\"op\":\"%s\",\"policy\":\"%s\",\"shape\":\"%s\",\"packs\":%lld,"
                   "\"bytes_raw\":%lld,\"bytes_packed\":%lld,\"bytes_expected\":%lld,\"pack_ms\":%.3f,\"unpack_ms\":%.3f}%s\n",
                   e.module_path.c_str(), e.op.c_str(), e.policy.c_str(), shape.c_str(),
                   static_cast<long long>(e.packs), static_cast<long long>(e.bytes_raw),
                   static_cast<long long>(e.bytes_packed), static_cast<long long>(e.bytes_expected),
                   e.pack_seconds * 1e3, e.unpack_seconds * 1e3, i + 1 < entries.size() ? "," : "");
    } else {
      std::fprintf(f, "%s,%s,%s,%s,%lld,%lld,%lld,%lld,%.3f,%.3f\n", csv_field(e.module_path).c_str(),
                   csv_field(e.op).c_str(), csv_field(e.policy).c_str(), csv_field(shape).c_str(),
                   static_cast<long long>(e.packs),
                   static_cast<long long>(e.bytes_raw), static_cast<long long>(e.bytes_packed),
                   static_cast<long long>(e.bytes_expected), e.pack_seconds * 1e3, e.unpack_seconds * 1e3);
    }
  }
  if (json) std::fprintf(f, "]\n");
  const bool ok = std::fflush(f) == 0;
  std::fclose(f);
  ACTLAB_CHECK(ok && std::rename(tmp.c_str(), path.c_str()) == 0, "writing memory report '", path, "' failed");
}

}  // namespace actlab

namespace actlab {
namespace {
// JSON has no NaN/Inf: those become null (e.g. best_test_acc before any evaluation).
std::string format_json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
}  // namespace

void write_summary_json(const std::string& path, const TrainSummary& s, const TrainConfig& c) {
  std::string j = "{\n";
  auto num = [&](const char* key, double v) { j += "  \"" + std::string(key) + "\": " + format_json_number(v) + ",\n"; };
  j += "  \"config\": " + config_to_json(c) + ",\n";
  j += "  \"data\": " + json_quote(s.data_note) + ",\n";
  j += "  \"interrupted\": " + std::string(s.interrupted ? "true" : "false") + ",\n";
  num("epochs_done", static_cast<double>(s.epochs.size()));
  num("steps", static_cast<double>(s.steps));
  num("final_test_acc", s.final_test_acc);
  num("final_test_loss", s.final_test_loss);
  num("best_test_acc", s.best_test_acc);
  num("median_img_per_s", s.median_img_per_s);
  num("peak_bytes", static_cast<double>(s.peak_bytes));
  num("reserved_peak_bytes", static_cast<double>(s.reserved_peak_bytes));
  num("activation_bytes", static_cast<double>(s.activation_bytes));
  num("saved_raw_bytes", static_cast<double>(s.saved_raw_bytes));
  num("saved_packed_bytes", static_cast<double>(s.saved_packed_bytes));
  num("saved_expected_bytes", static_cast<double>(s.saved_expected_bytes));
  num("wall_s", s.wall_s);
  num("skipped_steps", static_cast<double>(s.skipped_steps));
  j += "  \"epoch_rows\": [";
  for (size_t i = 0; i < s.epochs.size(); ++i) {
    const EpochRow& r = s.epochs[i];
    j += std::string(i ? ",\n" : "\n") + "    {\"epoch\": " + std::to_string(r.epoch) +
         ", \"lr\": " + format_json_number(r.lr) + ", \"train_loss\": " + format_json_number(r.train_loss) +
         ", \"train_acc\": " + format_json_number(r.train_acc) + ", \"test_loss\": " + format_json_number(r.test_loss) +
         ", \"test_acc\": " + format_json_number(r.test_acc) + ", \"img_per_s\": " + format_json_number(r.img_per_s) +
         ", \"peak_bytes\": " + std::to_string(r.peak_bytes) + ", \"activation_bytes\": " +
         std::to_string(r.activation_bytes) + ", \"wall_s\": " + format_json_number(r.wall_s) + "}";
  }
  j += s.epochs.empty() ? "]\n}\n" : "\n  ]\n}\n";
  write_text_atomic(path, j);
}

}  // namespace actlab
