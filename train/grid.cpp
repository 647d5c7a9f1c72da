// The ablation grid's cells and their runner (see grid.h): cell ids and child command lines, reading
// a cell directory back, and running the cells that are not done as child processes. A cell directory
// is the only state: summary.json with "interrupted": false means done; a checkpoint without it means
// resume; failed.txt records a non-zero exit. Presets live in grid_presets.cpp, reports in
// grid_report.cpp. Tested in tests/test_ablate.cpp.
#include "actlab/train/grid.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "actlab/core/error.h"
#include "actlab/io/checksum.h"
#include "actlab/io/files.h"
#include "actlab/io/json.h"
#include "actlab/train/checkpoint.h"
#include "actlab/train/grid_internal.h"
#include "actlab/train/logging.h"

namespace fs = std::filesystem;

namespace actlab {
using namespace grid_detail;

namespace grid_detail {

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string table_list(const Cell& cell, const char* sep) {
  std::string s;
  for (const auto& t : cell.tables) s += (s.empty() ? "" : sep) + t.first;
  return s;
}

}  // namespace grid_detail

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Shell quoting for command.txt: plain tokens stay as they are, others go in single quotes.
std::string shell_quote(const std::string& s) {
  const bool plain = !s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                       "0123456789_./:=,+-@%") == std::string::npos;
  if (plain) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The inverse of joining shell_quote()d tokens with spaces.
std::vector<std::string> shell_split(const std::string& line) {
  std::vector<std::string> out;
  std::string tok;
  bool in_tok = false, quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '\'') quoted = false; else tok += c;
    } else if (c == '\'') {
      quoted = in_tok = true;
    } else if (c == '\\' && i + 1 < line.size()) {
      tok += line[++i];
      in_tok = true;
    } else if (c == ' ' || c == '\n' || c == '\t') {
      if (in_tok) out.push_back(tok);
      tok.clear();
      in_tok = false;
    } else {
      tok += c;
      in_tok = true;
    }
  }
  if (in_tok) out.push_back(tok);
  return out;
}

}  // namespace

// ------------------------------------------------------------------ cells and grids
std::string shell_command_line(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + shell_quote(a);
  return s;
}

const std::vector<std::string>& grid_managed_flags() {
  static const std::vector<std::string> flags = {
      "--model", "--dataset", "--policy", "--seed", "--epochs", "--batch-size", "--lr", "--momentum", "--optimizer",
      "--weight-decay", "--schedule", "--threads", "--steps-per-epoch", "--train-limit", "--test-limit", "--device",
      "--precision", "--data-dir", "--log", "--save-dir", "--summary-json", "--memory-report", "--resume",
      "--overwrite"};
  return flags;
}

std::string Cell::id() const {
  std::string slug;
  for (char c : policy) {
    if (c == ':' || c == ',') slug += '_';
    else if (c == '=') continue;
    else if (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') slug += c;
    else slug += '-';
  }
  return model + "-" + dataset + "-" + slug + (precision == "fp32" ? "" : "-" + precision) +
         (optimizer == kSgdName ? "" : "-" + optimizer) + id_suffix + "-s" + std::to_string(seed);
}

std::string Cell::run_label() const { return precision == "fp32" ? policy : policy + "@" + precision; }

std::vector<std::string> Cell::train_args() const {
  std::vector<std::string> a = {"--model", model, "--dataset", dataset, "--policy", policy,
                                "--seed", std::to_string(seed), "--epochs", std::to_string(epochs),
                                "--batch-size", std::to_string(batch_size), "--lr", fmt("%g", lr)};
  // An SGD cell's command line is what it was before --optimizer existed, so earlier grids still resume.
  if (optimizer == kSgdName) a.insert(a.end(), {"--momentum", fmt("%g", momentum)});
  else a.insert(a.end(), {"--optimizer", optimizer});
  a.insert(a.end(), {"--weight-decay", fmt("%g", weight_decay), "--schedule", schedule, "--threads",
                     std::to_string(threads)});
  auto opt = [&](const char* flag, int64_t v) {
    if (v > 0) a.insert(a.end(), {flag, std::to_string(v)});
  };
  opt("--steps-per-epoch", steps_per_epoch);
  opt("--train-limit", train_limit);
  opt("--test-limit", test_limit);
  a.insert(a.end(), {"--device", device});  // always: a resumed child would otherwise inherit its checkpoint's
  if (precision != "fp32") a.insert(a.end(), {"--precision", precision});
  if (!data_dir.empty()) a.insert(a.end(), {"--data-dir", data_dir});
  a.insert(a.end(), extra_args.begin(), extra_args.end());
  return a;
}

void Grid::add(const Cell& cell, const std::string& table, const std::string& label) {
  std::vector<size_t>& listed = table_cells[table];
  const auto list = [&](size_t i) {
    if (std::find(listed.begin(), listed.end(), i) == listed.end()) listed.push_back(i);
  };
  Cell added = cell;
  for (Cell& c : cells) {
    if (c.id() != added.id()) continue;
    if (c.model == cell.model && c.dataset == cell.dataset && c.policy == cell.policy &&
        c.precision == cell.precision && c.optimizer == cell.optimizer && c.seed == cell.seed) {
      // Two spellings of one run in one table (`exact;exact@fp32`, or `exact@bf16` in a bf16 grid) are one
      // row entry: listed twice, the row read its one seed as a mean over two.
      const std::pair<std::string, std::string> entry(table, label);
      if (std::find(c.tables.begin(), c.tables.end(), entry) == c.tables.end()) c.tables.push_back(entry);
      list(static_cast<size_t>(&c - cells.data()));
      return;
    }
    // Another run whose policy spells the same directory name: the later one's name takes a hash of its
    // policy, the same on every rerun of the same grid (cells are added in the same order), so it resumes.
    // A rerun without the earlier policy names the later one plainly: check_cell_commands then refuses the
    // directory that holds the earlier one's run, rather than mixing the two.
    char suffix[16];
    std::snprintf(suffix, sizeof suffix, "-h%08llx",
                  static_cast<unsigned long long>(fnv1a64(cell.policy.data(), cell.policy.size()) & 0xffffffffull));
    added.id_suffix = suffix;
  }
  cells.push_back(added);
  cells.back().tables = {{table, label}};
  list(cells.size() - 1);
}

// ------------------------------------------------------------------ reading a cell directory
namespace {

// A number of summary.json (parse_json); NaN when the key is missing or null (a non-finite value).
double to_number(const JsonValue& summary, const char* key) {
  const JsonValue* v = summary.find(key);
  if (v == nullptr || (v->kind != JsonValue::Kind::Int && v->kind != JsonValue::Kind::Number)) return CellResult::kNaN;
  return v->number;
}

// Rows of a CSV file with a header, as name → value maps.
std::vector<std::map<std::string, std::string>> read_csv(const fs::path& path) {
  std::vector<std::map<std::string, std::string>> rows;
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return rows;
  const auto header = csv_fields(line);
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto f = csv_fields(line);
    if (f.size() != header.size()) continue;  // a line cut short by a crash
    std::map<std::string, std::string> row;
    for (size_t k = 0; k < f.size(); ++k) row[header[k]] = f[k];
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string last_line(const fs::path& path) {
  const std::string text = read_text(path);
  size_t end = text.find_last_not_of("\n\r ");
  if (end == std::string::npos) return "(empty log)";
  const size_t begin = text.find_last_of("\n\r", end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1, end - (begin == std::string::npos ? 0 : begin + 1) + 1);
}

// epochs.csv: per-epoch accuracy, the last training loss and the summed epoch times. A resumed run
// appends; a row repeated by a crash between the log row and the checkpoint counts once (the last).
void read_epochs(const fs::path& path, CellResult& r) {
  std::map<int64_t, std::map<std::string, std::string>> by_epoch;
  for (auto& row : read_csv(path)) by_epoch[std::atoll(row["epoch"].c_str())] = row;
  double wall = 0;
  for (auto& [epoch, row] : by_epoch) {
    r.test_acc_per_epoch.emplace_back(epoch, std::strtod(row["test_acc"].c_str(), nullptr));
    r.train_loss = std::strtod(row["train_loss"].c_str(), nullptr);
    wall += std::strtod(row["wall_s"].c_str(), nullptr);
  }
  r.epochs_done = static_cast<int64_t>(by_epoch.size());
  if (!by_epoch.empty()) r.wall_s = wall;
}

}  // namespace

const char* status_name(CellStatus s) {
  switch (s) {
    case CellStatus::Done: return "done";
    case CellStatus::Interrupted: return "interrupted";
    case CellStatus::Failed: return "failed";
    case CellStatus::Diverged: return "diverged";
    default: return "not run";
  }
}

bool finished(CellStatus s) { return s == CellStatus::Done || s == CellStatus::Diverged; }

CellResult read_cell(const std::string& cell_dir) {
  const fs::path dir(cell_dir);
  CellResult r;
  if (fs::exists(dir / "epochs.csv")) read_epochs(dir / "epochs.csv", r);
  bool have_summary = false, interrupted = true;
  std::string diverged;
  if (fs::exists(dir / "summary.json")) {
    try {
      const JsonValue s = parse_json(read_text(dir / "summary.json"), "summary.json");
      ACTLAB_CHECK(s.kind == JsonValue::Kind::Object, "summary.json is not a JSON object");
      have_summary = true;
      const JsonValue* flag = s.find("interrupted");
      interrupted = flag == nullptr || flag->kind != JsonValue::Kind::Bool || flag->boolean;
      const JsonValue* why = s.find("diverged");
      if (why != nullptr && why->kind == JsonValue::Kind::String) diverged = why->string;
      auto bytes = [&](const char* key) {
        const double v = to_number(s, key);
        return std::isfinite(v) ? static_cast<int64_t>(v) : int64_t{0};
      };
      r.best_test_acc = to_number(s, "best_test_acc");
      r.final_test_acc = to_number(s, "final_test_acc");
      r.img_per_s = to_number(s, "median_img_per_s");
      r.activation_bytes = bytes("activation_bytes");
      r.peak_bytes = bytes("peak_bytes");
      r.saved_raw_bytes = bytes("saved_raw_bytes");
      r.saved_packed_bytes = bytes("saved_packed_bytes");
      // A square image's side (every data set's images are square); a summary from before the run recorded
      // its input has neither, and its row's columns stay empty.
      if (bytes("input_height") == bytes("input_width")) r.input_size = bytes("input_height");
      r.input_channels = bytes("input_channels");
    } catch (const Error&) {
      have_summary = false;  // half-written or foreign: treat as not finished
    }
  }
  if (!r.test_acc_per_epoch.empty()) r.final_test_acc = r.test_acc_per_epoch.back().second;
  if (fs::exists(dir / "failed.txt")) {
    r.status = CellStatus::Failed;
    r.message = last_line(dir / "failed.txt");
  } else if (have_summary && !diverged.empty()) {
    r.status = CellStatus::Diverged;
    r.message = diverged;
    r.final_test_acc = r.best_test_acc = r.train_loss = CellResult::kNaN;  // no accuracy to report
  } else if (have_summary && !interrupted) {
    r.status = CellStatus::Done;
  } else if (have_summary || fs::exists(dir / "ckpt" / "last.safetensors") || r.epochs_done > 0) {
    r.status = CellStatus::Interrupted;
  }
  return r;
}

// ------------------------------------------------------------------ running
namespace {

std::atomic<pid_t> g_child{0};
volatile std::sig_atomic_t g_stop = 0;
// OUT/.lock's descriptor while a grid runs (-1 otherwise): each child inherits it, so the directory stays
// locked while a child that outlived the grid (a SIGKILL of actlab-ablate) is still checkpointing.
std::atomic<int> g_lock_fd{-1};
static_assert(std::atomic<pid_t>::is_always_lock_free, "the signal handler reads g_child");

// Record the first signal and pass every signal on to the child: it checkpoints on the first and
// dies at once on a second one, as it would in a terminal. The child runs in its own process group,
// so a Ctrl-C in the terminal reaches it only through here (once, not twice).
extern "C" void on_grid_signal(int sig) {
  if (g_stop == 0) g_stop = sig;
  const pid_t child = g_child.load();
  if (child > 0) ::kill(child, sig);
}

// How a child ended: its exit code, or the signal that killed it. Kept apart because a plain exit code
// of 128+n (actlab-train's own 130 after a checkpointed Ctrl-C) is not a death by signal n.
struct ChildExit {
  int code = 0;    // the exit code; 127 when it could not be started
  int signal = 0;  // the signal that killed it, 0 when it exited
};

// The signals actlab-train takes as a request to checkpoint and stop (its exit code is then 128 + the signal).
bool is_stop_signal(int sig) { return sig == SIGINT || sig == SIGTERM || sig == SIGHUP; }

// Runs argv[0] with stdout+stderr appended to `log_path`; while it runs, calls on_tick (if any) about once a
// second.
ChildExit run_child(const std::vector<std::string>& argv, const std::string& log_path,
                    const std::function<void()>& on_tick = {}) {
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  ACTLAB_CHECK(log_fd >= 0, "cannot open '", log_path, "': ", std::strerror(errno));
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {  // only async-signal-safe calls from here to exec
    ::setpgid(0, 0);
    // The grid killed hard: do not leave a training run behind. SIGHUP, which actlab-train takes as a stop
    // request however often it comes: the kernel sends this signal once per exiting thread of the grid
    // process, and a second SIGTERM would kill the run before its checkpoint.
    ::prctl(PR_SET_PDEATHSIG, SIGHUP);
    // A grid under nohup ignores SIGHUP, and an ignored signal stays ignored across exec: the child would
    // then train on to the end of its cell after the grid was killed. It is in its own process group, so no
    // terminal's hang-up reaches it, only the parent-death signal.
    // SIGPIPE back to its default too: the grid ignores it for itself.
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    ::sigaction(SIGHUP, &default_action, nullptr);
    ::sigaction(SIGPIPE, &default_action, nullptr);
    if (::getppid() != parent) ::_exit(127);
    const int lock_fd = g_lock_fd.load();
    if (lock_fd >= 0) ::fcntl(lock_fd, F_SETFD, 0);  // kept across exec (see g_lock_fd)
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::execv(cargv[0], cargv.data());
    const char msg[] = "actlab-ablate: cannot execute the actlab-train binary\n";
    (void)!::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(log_fd);
  if (null_fd >= 0) ::close(null_fd);
  ACTLAB_CHECK(pid > 0, "fork failed: ", std::strerror(fork_errno));
  g_child.store(pid);
  if (g_stop != 0) ::kill(pid, g_stop);  // a signal that arrived between fork and the store above
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, on_tick ? WNOHANG : 0);
    if (done == pid) break;
    ACTLAB_CHECK(done == 0 || errno == EINTR, "waiting for actlab-train failed: ", std::strerror(errno));
    if (done == 0) {
      struct timespec second {1, 0};
      ::nanosleep(&second, nullptr);  // a signal cuts it short; the loop goes on waiting
      on_tick();
    }
  }
  g_child.store(0);
  if (WIFSIGNALED(status)) return {0, WTERMSIG(status)};
  return {WEXITSTATUS(status), 0};
}

// The child's arguments with the output paths, the thread count, the device and the resume flags
// removed: what must agree between the command.txt of an earlier run and the current grid (a grid
// started on a GPU may be finished on the CPU, as with another thread count).
std::vector<std::string> comparable_args(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--overwrite") continue;
    if (a == "--threads" || a == "--device" || a == "--resume" || a == "--log" || a == "--save-dir" || a == "--summary-json" ||
        a == "--memory-report") {
      ++i;
      continue;
    }
    out.push_back(a);
  }
  return out;
}

// Error before anything runs when OUT/cells/<id>/command.txt holds a run with other settings
// (another epoch count, learning rate, ...): its results would be reported under this grid's recipe.
void check_cell_commands(const Grid& grid, const fs::path& cells_dir, const RunOptions& o) {
  for (const Cell& c : grid.cells) {
    const fs::path file = cells_dir / c.id() / "command.txt";
    if (!fs::exists(file)) continue;
    std::vector<std::string> stored = shell_split(read_text(file));
    if (!stored.empty()) stored.erase(stored.begin());  // the binary may have moved
    const auto before = comparable_args(stored), now = comparable_args(c.train_args());
    if (before == now) continue;
    size_t k = 0;
    while (k < before.size() && k < now.size() && before[k] == now[k]) ++k;
    if (k > 0 && k < before.size() && before[k].rfind("--", 0) != 0) --k;  // show "--flag value"
    const std::string was = k < before.size() ? before[k] + (k + 1 < before.size() ? " " + before[k + 1] : "") : "(end)";
    const std::string is = k < now.size() ? now[k] + (k + 1 < now.size() ? " " + now[k + 1] : "") : "(end)";
    ACTLAB_CHECK(!o.report_only, "'", (cells_dir / c.id()).string(), "' holds a run with other settings (", was,
                 " there, ", is, " now); --report-only reports a grid under the flags that trained it: ",
                 o.report_hint);
    ACTLAB_FAIL("'", (cells_dir / c.id()).string(), "' holds a run with other settings (", was, " there, ", is,
                " now); use another --out or delete that directory");
  }
}

std::string format_duration(double s) {
  if (!std::isfinite(s)) return "?";
  if (s < 90) return fmt("%.0f s", s);
  if (s < 5400) return fmt("%.0f min", s / 60);
  return fmt("%.1f h", s / 3600);
}

std::string cell_title(const Grid& grid, const Cell& c) {
  bool many_data = false;
  for (const Cell& o : grid.cells) many_data = many_data || o.dataset != c.dataset;
  return c.model + (many_data ? " " + c.dataset : "") + " " + c.run_label() + " seed " + std::to_string(c.seed);
}

// How a cell that is not done gets (re)started: from its checkpoint when that holds an unfinished
// run, from scratch otherwise (no checkpoint, or one that finished while summary.json went missing).
std::vector<std::string> cell_command(const Cell& c, const std::string& train_bin, const fs::path& dir,
                                      std::string* mode, int64_t* from_epoch = nullptr) {
  std::vector<std::string> argv = {train_bin};
  for (auto& a : c.train_args()) argv.push_back(a);
  argv.insert(argv.end(), {"--log", (dir / "epochs.csv").string(), "--save-dir", (dir / "ckpt").string(),
                           "--summary-json", (dir / "summary.json").string(), "--memory-report",
                           (dir / "memory.csv").string()});
  const fs::path ckpt = dir / "ckpt" / "last.safetensors";
  *mode = "fresh";
  if (fs::exists(ckpt)) {
    try {
      const TrainState st = checkpoint_state(read_safetensors(ckpt.string()));
      if (st.epoch < c.epochs) {
        // --overwrite: the cell's files are the grid's. Its log goes on where the checkpoint recorded it;
        // one that does not (an earlier attempt's rows, left when the cell was restarted fresh and
        // stopped before its first row) starts afresh instead of failing the cell.
        argv.insert(argv.end(), {"--resume", ckpt.string(), "--overwrite"});
        if (from_epoch) *from_epoch = st.epoch;
        *mode = "resume from epoch " + std::to_string(st.epoch) +
                (st.step_in_epoch > 0 ? " step " + std::to_string(st.step_in_epoch) : "");
        return argv;
      }
      *mode = "fresh (its checkpoint is complete but summary.json is missing)";
    } catch (const Error& e) {
      *mode = std::string("fresh (checkpoint unreadable: ") + e.what() + ")";
    }
  }
  argv.push_back("--overwrite");
  return argv;
}

struct Eta {
  double estimated_done = 0, measured_done = 0;  // over the cells run in this process
  double ratio() const { return estimated_done > 0 ? measured_done / estimated_done : 1.0; }
};

// Runs one cell; returns its status afterwards and prints the end of its progress line.
CellStatus run_cell(const Cell& c, const RunOptions& o, const fs::path& dir, Eta* eta) {
  fs::create_directories(dir);
  std::string mode;
  int64_t from_epoch = 0;
  const auto argv = cell_command(c, o.train_bin, dir, &mode, &from_epoch);
  write_text_atomic((dir / "command.txt").string(), shell_command_line(argv) + "\n");
  std::error_code ec;
  fs::remove(dir / "failed.txt", ec);
  {
    std::ofstream log(dir / "log.txt", std::ios::app);
    const std::time_t now = std::time(nullptr);
    char when[32];
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
    log << "==== actlab-ablate " << when << ": " << mode << "\n" << shell_command_line(argv) << "\n";
  }
  if (mode != "fresh") std::printf("(%s) ", mode.c_str());
  std::fflush(stdout);
  const auto start = std::chrono::steady_clock::now();
  // A cell of several epochs (the paper preset's take hours) says each epoch as its row reaches the cell's
  // epoch log: "epoch 2/6 88.1% · ", read as the reports read it (read_epochs), by epoch number: a resumed
  // cell's log holds the epochs before its checkpoint, and the run cuts off any after it and writes them
  // again. A log whose last row is still being written (no newline yet) waits for the next tick.
  const fs::path epoch_log = dir / "epochs.csv";
  int64_t shown = from_epoch;
  const auto show_epochs = [&] {
    std::ifstream in(epoch_log, std::ios::ate | std::ios::binary);
    char last = 0;
    if (!in || in.tellg() <= 0 || !in.seekg(-1, std::ios::end).get(last) || last != '\n') return;
    CellResult now;
    read_epochs(epoch_log, now);
    for (const auto& [epoch, acc] : now.test_acc_per_epoch) {
      if (epoch != shown + 1) continue;
      shown = epoch;
      std::printf("epoch %lld/%lld %.1f%% \u00b7 ", static_cast<long long>(epoch), static_cast<long long>(c.epochs), acc);
    }
    std::fflush(stdout);
  };
  const ChildExit child =
      run_child(argv, (dir / "log.txt").string(), c.epochs > 1 ? std::function<void()>(show_epochs) : nullptr);
  if (c.epochs > 1) show_epochs();  // the rows written after the last tick
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const CellResult r = read_cell(dir.string());
  if (r.status == CellStatus::Diverged) {  // the child's exit status is 2 then: it ended with an error line
    std::printf("diverged after %s (%s)", format_duration(secs).c_str(), r.message.c_str());
    return CellStatus::Diverged;
  }
  const bool clean_exit = child.signal == 0 && child.code == 0;
  if (clean_exit && r.status == CellStatus::Done) {
    eta->estimated_done += estimate_cell_seconds(c);
    eta->measured_done += secs;
    std::printf("%s, test acc %.1f%%", format_duration(secs).c_str(), r.final_test_acc);
    return CellStatus::Done;
  }
  // Stopped through the grid (even before its first checkpoint), or by a signal sent to the child.
  if (g_stop != 0 ||
      (r.status == CellStatus::Interrupted && (is_stop_signal(child.signal) || is_stop_signal(child.code - 128)))) {
    std::printf("interrupted after %s; the next run resumes it", format_duration(secs).c_str());
    return CellStatus::Interrupted;
  }
  const std::string status = child.signal != 0 ? "killed by signal " + std::to_string(child.signal) + " (" +
                                                     strsignal(child.signal) + ")"
                                               : "exit " + std::to_string(child.code);
  const std::string why =
      status + ": " + (clean_exit ? std::string("no finished summary.json") : last_line(dir / "log.txt"));
  write_text_atomic((dir / "failed.txt").string(), why + "\n");
  std::printf("FAILED (%s)", why.c_str());
  return CellStatus::Failed;
}

void print_plan(const Grid& grid, const RunOptions& o, const std::vector<CellResult>& before) {
  const fs::path cells = fs::path(o.out_dir) / "cells";
  double todo = 0;
  int done = 0;
  for (size_t i = 0; i < grid.cells.size(); ++i) {
    const Cell& c = grid.cells[i];
    const double est = estimate_cell_seconds(c);
    const std::string tables = table_list(c, ",");
    if (finished(before[i].status)) ++done; else todo += est;
    std::printf("[%zu/%zu] %-44s %-9s %-12s ~%s\n", i + 1, grid.cells.size(), c.id().c_str(), tables.c_str(),
                status_name(before[i].status), format_duration(est).c_str());
    if (o.dry_run && !finished(before[i].status)) {
      std::string mode;
      std::printf("        %s\n", shell_command_line(cell_command(c, o.train_bin, cells / c.id(), &mode)).c_str());
    }
  }
  std::printf("%zu cells, %d done; estimated %s for the rest on this machine (rough; refined as cells finish)\n",
              grid.cells.size(), done, format_duration(todo).c_str());
}

}  // namespace

void install_grid_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_grid_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  struct sigaction hup {};  // a closed terminal stops the grid as SIGTERM does; nohup's ignore stays
  if (::sigaction(SIGHUP, nullptr, &hup) == 0 && hup.sa_handler != SIG_IGN) ::sigaction(SIGHUP, &sa, nullptr);
  // A reader of the grid's output that died first (`| tee` in a killed process group) must not end the
  // grid before it has written its reports: writes to it fail with EPIPE instead.
  ::signal(SIGPIPE, SIG_IGN);
}

namespace {

// One grid run per output directory: two would train the same cell into the same files. An flock on
// OUT/.lock for the run's duration (the kernel drops it with the process, even after a SIGKILL).
class OutputDirLock {
 public:
  explicit OutputDirLock(const fs::path& out)
      : lock_(out.string(), "another actlab-ablate is using '" + out.string() + "' (it or a training run it started holds " +
                                (out / ".lock").string() + "); wait for it to end, or choose another --out") {
    g_lock_fd.store(lock_.fd());
  }
  ~OutputDirLock() { g_lock_fd.store(-1); }
  OutputDirLock(const OutputDirLock&) = delete;
  OutputDirLock& operator=(const OutputDirLock&) = delete;

 private:
  DirectoryLock lock_;
};

// --report-only rewrites results.csv and tables.md from the cells' directories alone. A cell that the old
// results.csv records as finished but whose directory no longer says so (its summary.json or failed.txt gone:
// a copy of the grid that kept only the logs, as docs/results/ablate-cpu does) would lose its row, so the
// rewrite is refused before anything is written.
void check_report_keeps_results(const Grid& grid, const std::vector<CellResult>& now, const fs::path& results,
                                const std::string& hint) {
  std::map<std::string, std::string> recorded;  // cell id → its status in the old results.csv
  for (const auto& row : read_csv(results))
    if (row.count("cell") && row.count("status")) recorded[row.at("cell")] = row.at("status");
  int lost = 0;
  std::string first;
  for (size_t i = 0; i < grid.cells.size(); ++i) {
    const auto it = recorded.find(grid.cells[i].id());
    if (it == recorded.end() || (it->second != "done" && it->second != "diverged" && it->second != "failed")) continue;
    if (now[i].status != CellStatus::NotRun && now[i].status != CellStatus::Interrupted) continue;
    if (lost++ == 0) first = grid.cells[i].id() + " (" + it->second + " there, " + status_name(now[i].status) + " now)";
  }
  ACTLAB_CHECK(lost == 0, "--report-only: ", lost, " of the cells that ", results.string(),
               " records as finished read as unfinished from their directories (no summary.json or failed.txt), the "
               "first ", first, "; rewriting it would lose their rows, so nothing was written (restore those files, "
               "or move results.csv away to report the cells as they are)");
  // Finished cells of another grid (other flags than those that trained this directory) would lose their rows too.
  std::set<std::string> ids;
  for (const Cell& c : grid.cells) ids.insert(c.id());
  for (const auto& [cell, status] : recorded)
    if (!ids.count(cell) && (status == "done" || status == "diverged" || status == "failed") && lost++ == 0) first = cell;
  ACTLAB_CHECK(lost == 0, "--report-only: ", results.string(), " records ", lost, " finished cell", lost == 1 ? "" : "s",
               " this grid does not have (the first ", first, "); rewriting it would lose their rows, so nothing was "
               "written (", hint, ")");
}

}  // namespace

std::vector<std::string> trained_grid_args(const std::string& out_dir) {
  const fs::path file = fs::path(out_dir) / "command.txt";
  if (!fs::is_regular_file(file)) return {};
  std::vector<std::string> args = shell_split(read_text(file));
  if (!args.empty()) args.erase(args.begin());
  return args;
}

int run_grid(const Grid& grid, const RunOptions& o) {
  ACTLAB_CHECK(!grid.cells.empty(), "the grid has no cells");
  const fs::path cells_dir = fs::path(o.out_dir) / "cells";
  ACTLAB_CHECK(!o.report_only || fs::is_directory(cells_dir), "--report-only: '", o.out_dir,
               "' holds no grid (no cells/ directory); run the grid there first");
  // A folder with files of its own and no grid (no cells/): the reports (results.csv, tables.md, the figures,
  // command.txt) would replace any of the same names. Its lock and a grid's command.txt, written before its
  // first cell, are a grid's.
  std::error_code ec;
  if (!fs::is_directory(cells_dir))
    for (fs::directory_iterator it(o.out_dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      const auto grid_command = [&] {
        const std::vector<std::string> argv = shell_split(read_text(it->path()));
        return !argv.empty() && fs::path(argv[0]).filename() == "actlab-ablate";
      };
      ACTLAB_CHECK(name == ".lock" || (name == "command.txt" && grid_command()), "output directory '", o.out_dir,
                   "' holds files and no grid (no cells/ folder), '", name,
                   "' among them; the reports would replace files of the same names: choose an empty or new --out");
    }
  std::unique_ptr<OutputDirLock> lock;
  if (!o.dry_run) {  // a dry run writes nothing, the directory included
    make_output_dir(o.out_dir, "output directory");
    lock = std::make_unique<OutputDirLock>(o.out_dir);
  } else {  // ... but says what the real run would refuse: a file where the directory (or a parent) goes
    fs::path p = o.out_dir;
    while (!p.empty() && !fs::exists(p)) p = p.parent_path();
    ACTLAB_CHECK(p.empty() || fs::is_directory(p), "cannot create output directory '", o.out_dir, "': '",
                 p.string(), "' is not a directory");
  }
  check_cell_commands(grid, cells_dir, o);
  std::vector<CellResult> before;
  for (const Cell& c : grid.cells) before.push_back(read_cell((cells_dir / c.id()).string()));
  if (o.report_only) check_report_keeps_results(grid, before, fs::path(o.out_dir) / "results.csv", o.report_hint);
  std::printf("actlab-ablate: preset %s, %s; output in %s\n", grid.preset.c_str(),
              grid.tables.size() == 1 ? ("table " + grid.tables[0]).c_str() : (std::to_string(grid.tables.size()) + " tables").c_str(),
              o.out_dir.c_str());
  if (o.dry_run || !o.report_only) print_plan(grid, o, before);
  if (o.dry_run) return 0;
  int exit_code = 0;
  int failed = 0;  // cells that failed in this run, and the first of them, for the closing error line
  std::string first_failed;
  // The reports name the command that trained the grid: every run that trains writes it to OUT/command.txt
  // before its first cell (so a grid that stops part-way keeps it), and a --report-only run rewrites the
  // reports under that command, saying it rewrote them.
  const fs::path command_file = fs::path(o.out_dir) / "command.txt";
  std::string command = o.command_line;
  if (o.report_only && fs::exists(command_file)) {
    std::string trained = read_text(command_file);
    while (!trained.empty() && (trained.back() == '\n' || trained.back() == '\r')) trained.pop_back();
    command = trained + "`; reports rewritten by `" + o.command_line;
  }
  if (!o.report_only) {
    ACTLAB_CHECK(::access(o.train_bin.c_str(), X_OK) == 0, "actlab-train binary '", o.train_bin,
                 "' is not executable; pass --train-bin PATH");
    write_text_atomic(command_file.string(), o.command_line + "\n");
    Eta eta;
    double remaining = 0;
    for (size_t i = 0; i < grid.cells.size(); ++i)
      if (!finished(before[i].status)) remaining += estimate_cell_seconds(grid.cells[i]);
    for (size_t i = 0; i < grid.cells.size() && g_stop == 0; ++i) {
      const Cell& c = grid.cells[i];
      std::printf("[%zu/%zu] %s \u2026 ", i + 1, grid.cells.size(), cell_title(grid, c).c_str());
      if (finished(before[i].status)) {
        std::printf("skip (%s)\n", status_name(before[i].status));
        continue;
      }
      remaining -= estimate_cell_seconds(c);
      const CellStatus s = run_cell(c, o, cells_dir / c.id(), &eta);
      if (!finished(s)) exit_code = 1;
      if (s == CellStatus::Failed && failed++ == 0) first_failed = c.id();
      if (remaining > 1 && g_stop == 0) std::printf(", ETA %s", format_duration(remaining * eta.ratio()).c_str());
      std::printf("\n");
      std::fflush(stdout);
    }
    if (g_stop != 0) {
      std::printf("actlab-ablate: stopped by signal %d; run the same command again to continue\n",
                  static_cast<int>(g_stop));
      exit_code = 128 + g_stop;
    }
  } else {
    for (const CellResult& r : before) exit_code = finished(r.status) ? exit_code : 1;
  }
  std::string names;
  for (const std::string& name : write_reports(grid, o.out_dir, command)) names += (names.empty() ? "" : ", ") + name;
  std::printf("wrote %s/%s\n", o.out_dir.c_str(), names.c_str());
  if (failed > 0) {  // the FAILED lines went to stdout with the progress; stderr gets one line too
    std::fflush(stdout);
    std::fprintf(stderr, "actlab-ablate: error: %d of %zu cells failed; the first, %s: %s (its log: %s)\n", failed,
                 grid.cells.size(), first_failed.c_str(), last_line(cells_dir / first_failed / "failed.txt").c_str(),
                 (cells_dir / first_failed / "log.txt").c_str());
  }
  return exit_code;
}

}  // namespace actlab
