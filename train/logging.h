// What a training run prints and writes: progress lines (a live bar on a terminal), per-epoch log
// rows (CSV or JSON lines, flushed after every epoch so a crash loses nothing written), the
// first-step memory report and the final summary.
// Tested in tests/test_train.cpp.
#pragma once
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "actlab/compress/policy.h"
#include "actlab/train/checkpoint.h"
#include "actlab/train/config.h"
#include "actlab/train/step.h"
#include "actlab/train/summary.h"

namespace actlab {

// Whether `path` holds an epoch log (EpochLogger's): empty, or its first line is the CSV header or a JSON
// row with an "epoch" field first; a FIFO or device counts without being read (a stream the log goes to).
// What a resumed run may append to without --overwrite.
bool is_epoch_log(const std::string& path);

// Whether a run resumed from a checkpoint that recorded `mark` continues the log at `path` (what EpochLogger
// may cut back and append to): no file, an empty one or a stream (a FIFO, a device: never read back); or
// an epoch log that begins with the bytes `mark` recorded (mark.bytes 0, a checkpoint written before the
// log's first row or with no log: a log with no rows). Anything else is another run's log (or not a log),
// which the resume would cut back or write into. A mark not recorded (bytes -1, checkpoints from before
// it) cannot tell: an epoch log passes.
bool resumed_log_continues(const std::string& path, const LogMark& mark);

class EpochLogger {
 public:
  // path empty: no log. ".jsonl"/".json" → JSON lines, anything else → CSV. append (a resumed run):
  // keep the rows already there and add to them (the CSV header only when the file is empty). A resumed
  // run's log is first cut back to what its checkpoint holds: a last line without its newline (a write
  // that failed part way, a kill) and the rows of epochs after `epochs_done` (a resume from an older
  // checkpoint, which writes those epochs again) are removed, with a note on stderr.
  // Nothing is opened, cut or created before the first row: a run that fails before its first epoch ends
  // leaves an existing log as it was. on_open runs once, right after the first row is written (the trainer
  // writes its configuration beside the log then).
  explicit EpochLogger(const std::string& path, bool append = false, int64_t epochs_done = 0,
                       std::function<void()> on_open = {});
  ~EpochLogger();
  EpochLogger(const EpochLogger&) = delete;
  EpochLogger& operator=(const EpochLogger&) = delete;
  // Appends one row (a new CSV log's header with the first). A row that cannot be written whole is cut off
  // again (the file ends with the last whole row; a log this logger created and wrote nothing to is
  // removed) and the write throws Error.
  void write(const EpochRow& row);
  // What the log holds now, as the run sees it (before the first row of a resumed run: what the cut back
  // will keep; of a new log: nothing), for the checkpoint written next.
  LogMark mark() const;
 private:
  void open();
  std::FILE* file_ = nullptr;
  bool json_ = false;
  std::string path_;
  bool append_ = false;
  int64_t epochs_done_ = 0;
  std::function<void()> on_open_;
  bool created_ = false;  // the file did not exist before open()
  bool opened_ = false;   // a row has been written (on_open_ has run)
  int64_t written_ = 0;   // bytes the open log holds, and their FNV-1a (mark)
  uint64_t hash_ = 0;
};

class Progress {
 public:
  // every: steps between lines when stdout is not a terminal (a terminal gets one live line).
  Progress(bool quiet, int64_t every);
  // eta_s: estimated seconds to the end of the run's training steps (evaluation not included).
  void step(int64_t epoch, int64_t epochs, int64_t step, int64_t steps, double loss, double acc, double img_per_s,
            int64_t live_bytes, double eta_s);
  void epoch_done(const EpochRow& row, int64_t epochs);
 private:
  bool quiet_, tty_;
  int64_t every_;
};

// On a terminal Progress::step leaves its live line open (ending in '\r' updates); this ends it with a
// newline, if one is open, so that what comes next (an error on stderr, an interruption notice) starts on
// a line of its own. A no-op when nothing is open.
void end_progress_line();
// "238.2 img/s", or "n/a img/s (no timed step)" for NaN: the rates leave out a run's first step (warm-up).
std::string rate_text(double img_per_s);

void print_first_step_report(const TrainSummary& s, const StepResult& first, const TrainConfig& c);
void print_summary(const TrainSummary& s, const TrainConfig& c);
// The run's summary as one JSON object (configuration, final/best accuracy, throughput, memory, the
// saved-tensor totals, per-epoch rows, whether it was interrupted). Written to a temp file and renamed,
// so a reader (actlab-ablate) never sees half a file.
void write_summary_json(const std::string& path, const TrainSummary& s, const TrainConfig& c);
std::string summary_to_json(const TrainSummary& s, const TrainConfig& c);  // the same object as text
// The first bytes of every summary file: one that begins so is an earlier run's, which a run replaces
// without --overwrite (replaceable_output, io/files.h).
inline constexpr std::string_view kSummaryJsonStart = "{\n  \"config\": {";
void write_memory_report(const std::string& path, const std::vector<CacheEntryStats>& entries);
// One CSV field (RFC 4180): as it is, or in double quotes with inner quotes doubled when it holds a
// comma, a quote or a line break (policy strings such as "division:B=8,Q=2" do).
std::string csv_field(const std::string& s);
// The fields of one CSV line written that way (a trailing '\r' is dropped): csv_fields of the
// comma-joined csv_field()s gives the strings back (for strings without line breaks: one line, one row).
std::vector<std::string> csv_fields(const std::string& line);

}  // namespace actlab
