// Writing files so that a crash never leaves half of one: every output file of actlab (checkpoints,
// logs' side files, reports, tables, pictures) is written to `<path>.tmp.<pid>`, fsynced and renamed
// over `path`. Plus the checks an app makes before long work, so that an output that cannot be written
// fails at start, not after an hour. Tested in tests/test_checkpoint.cpp and tests/cli/bad_input.sh.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace actlab {

// Writes `<path>.tmp.<pid>` through `fill(fd, tmp_path)`, fsyncs it, renames it over `path`, then fsyncs
// the directory (best effort: some file systems refuse that). On any failure the temp file is removed,
// an existing `path` is untouched and one Error names the file and what failed. A symbolic link is
// followed (its target is replaced, the link kept); a character device or FIFO (/dev/stdout, a pipe) is
// written in place, with no rename; any other path that exists and is not a regular file (a directory)
// is refused with an Error before anything is written.
void write_file_atomic(const std::string& path, const std::function<void(int, const std::string&)>& fill);
// Writes `text` to `path` the same way: readers never see half a file.
void write_text_atomic(const std::string& path, const std::string& text);
// write(2) of all n bytes to fd (retrying short writes and EINTR); Error names `path` on failure.
void write_all(int fd, const void* data, size_t n, const std::string& path);
// Throws Error (naming `what` and `path`) unless `path` could be created: its directory exists and is
// writable, it does not exist yet unless `overwrite`, and it is not a directory. An empty path (no
// output asked for) passes. Apps call it before long work, so a bad output path fails at once.
// For a file written by write_file_atomic (`atomic`), also checks that the temporary file's name
// (`<name>.tmp.<pid>`) fits the file system's name limit: a name that does not would fail only when the
// file is written, after the work. `planned_dir`: a directory the program creates before it writes (a
// training run's --save-dir); a path directly in it passes the directory checks while it does not exist yet.
void check_writable(const std::string& path, bool overwrite, const char* what, bool atomic = true,
                    const std::string& planned_dir = "");
// Whether a program may replace `path` without being told to (--overwrite): nothing is there, or nothing
// that could be lost (an empty file; a device or FIFO, written in place), or `own(path)` says the file is
// this output's from an earlier run, not a user's file that happens to have the name. A link is judged by
// what it points to.
bool replaceable_output(const std::string& path, const std::function<bool(const std::string&)>& own);
// The common case: the file begins with `start`, the first bytes the program writes to that output.
bool replaceable_output(const std::string& path, std::string_view start);
// The path with `.`, `..` and symbolic links resolved as far as it exists (the path as given where it
// cannot be), so that two spellings of one file compare equal. A link whose target does not exist yet
// (a dangling one, through a chain of links) resolves to the path its target names, where a write through
// the link lands; Error for a chain of links that does not end.
std::string resolved_path(const std::string& path);
// Throws Error naming both options when two of `outputs` ({path, option name}; empty paths skipped) name
// one file: the second write would destroy the first without a word.
void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);
// Creates `dir` and its parents if needed and checks that it is a writable directory; Error names `what`,
// the directory and the reason ("cannot create output directory '/proc/x': No such file or directory").
// Returns the directories it created, deepest first (none where `dir` existed), for remove_empty_directories.
std::vector<std::string> make_output_dir(const std::string& dir, const char* what);
// Removes those of `dirs` (deepest first, as make_output_dir returns them) that are empty: a program that
// failed before its first output takes back the folders it made. One something was written into stays.
void remove_empty_directories(const std::vector<std::string>& dirs);
// One writer per output directory: an exclusive flock on DIR/.lock, held until the object is destroyed (the
// kernel drops it with the process, even after a SIGKILL). Error `busy` when another open of that file holds
// it (another process, or another run in this one); Error naming the reason when the lock cannot be taken.
class DirectoryLock {
 public:
  DirectoryLock(const std::string& dir, const std::string& busy);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};
// Removes the temp files (`NAME.tmp.<pid>`, beside NAME) of `outputs`, files this program writes atomically
// (checkpoints, exported weights, summaries), left by a writer that was killed mid-write (SIGKILL, power
// loss: no chance to unlink): regular files of this user whose process no longer exists. Anything else, a
// live writer's file included, is kept. Returns the paths removed. The outputs themselves were never
// touched (the rename did not happen). Empty paths are skipped.
// NOTE: "no longer exists" is judged in this PID namespace; do not share an output folder across containers.
std::vector<std::string> remove_stale_temp_files(const std::vector<std::string>& outputs);

}  // namespace actlab
