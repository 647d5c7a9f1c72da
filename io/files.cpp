// Atomic file writes and output checks (io/files.h).
#include "actlab/io/files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "actlab/core/error.h"

namespace actlab {
namespace {

struct FdCloser {
  int fd = -1;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// The name write_file_atomic writes through before renaming (check_writable checks that it fits).
std::string temp_path(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

// The file a symbolic link names, through a chain of links, also when it does not exist yet (a dangling
// link: weakly_canonical stops at the link and gives the link's own path, so writing there replaced the
// link with a regular file); `path` itself when it is not a link.
std::string link_target(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p(path);
  for (int hops = 0; hops < 40; ++hops) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(p, ec)) || ec) return p.string();
    const fs::path to = fs::read_symlink(p, ec);
    ACTLAB_CHECK(!ec, "cannot read the link '", path, "': ", ec.message());
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  ACTLAB_FAIL("cannot resolve the link '", path, "': too many levels of links");
}

}  // namespace

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    ACTLAB_CHECK(w > 0, "writing '", path, "' failed: ", std::strerror(w < 0 ? errno : ENOSPC));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// existing `path` is untouched.
void write_file_atomic(const std::string& path_in, const std::function<void(int, const std::string&)>& fill) {
  // A symbolic link is followed: the file it names is replaced, the link stays. A character device or
  // FIFO (/dev/stdout, a pipe, /dev/full) is written in place: renaming over it would replace the
  // device node with a regular file. Anything else that is not a regular file is refused.
  const std::string path = link_target(path_in);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
      FdCloser fd{::open(path.c_str(), O_WRONLY | O_CLOEXEC)};
      ACTLAB_CHECK(fd.fd >= 0, "cannot open '", path_in, "' for writing: ", std::strerror(errno));
      fill(fd.fd, path_in);
      return;
    }
    ACTLAB_CHECK(S_ISREG(st.st_mode), "cannot write '", path_in, "': it exists and is not a regular file",
                 path != path_in ? " (the link points to '" + path + "')" : std::string());
  }
  const std::string tmp = temp_path(path);
  try {
    FdCloser fd{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
    ACTLAB_CHECK(fd.fd >= 0, "cannot create '", tmp, "': ", std::strerror(errno));
    fill(fd.fd, tmp);
    ACTLAB_CHECK(::fsync(fd.fd) == 0, "fsync of '", tmp, "' failed: ", std::strerror(errno));
    const int fd_value = fd.fd;
    fd.fd = -1;
    ACTLAB_CHECK(::close(fd_value) == 0, "closing '", tmp, "' failed: ", std::strerror(errno));
    ACTLAB_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "renaming '", tmp, "' to '", path,
                 "' failed: ", std::strerror(errno));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  FdCloser dfd{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dfd.fd >= 0) (void)::fsync(dfd.fd);
}

void write_text_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, [&](int fd, const std::string& tmp) { write_all(fd, text.data(), text.size(), tmp); });
}

std::vector<std::string> make_output_dir(const std::string& dir, const char* what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // One component at a time, as the kernel resolves them (`x/..` creates x), recording the ones this call
  // made: an existing directory, or one another process makes meanwhile (EEXIST), is never recorded.
  std::vector<std::string> made;
  fs::path at;
  for (const fs::path& part : fs::path(dir)) {
    at /= part;
    if (part.empty() || part == "." || part == ".." || part == "/") continue;
    if (::mkdir(at.c_str(), 0777) == 0) {
      made.insert(made.begin(), at.string());
    } else if (errno != EEXIST) {  // the first cause (a read-only parent), not a later ENOENT
      ec = std::error_code(errno, std::generic_category());
      break;
    }
  }
  ACTLAB_CHECK(fs::is_directory(dir), "cannot create ", what, " '", dir, "'", ec ? ": " + ec.message() : std::string());
  ACTLAB_CHECK(::access(dir.c_str(), W_OK) == 0, what, " '", dir, "' is not writable");
  return made;
}

void remove_empty_directories(const std::vector<std::string>& dirs) {
  for (const std::string& d : dirs) ::rmdir(d.c_str());  // refused (ENOTEMPTY) where anything is in it
}

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& busy) {
  const std::string path = (std::filesystem::path(dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ACTLAB_CHECK(fd_ >= 0, "cannot open '", path, "': ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    ::close(fd_);
    fd_ = -1;
    // Only EWOULDBLOCK means another holder; a file system without locks (ENOLCK) is said as it is.
    ACTLAB_CHECK(error != EWOULDBLOCK, busy);
    ACTLAB_FAIL("cannot lock '", path, "': ", std::strerror(error));
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);
}

void check_writable(const std::string& path, bool overwrite, const char* what, bool atomic,
                    const std::string& planned_dir) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  const fs::path p(link_target(path));  // a link is written through: its target's directory must take the file
  ACTLAB_CHECK(!fs::is_directory(p), what, " '", path, "' is a directory");
  ACTLAB_CHECK(overwrite || !fs::exists(p), what, " '", path,
               "' already exists; pass --overwrite to replace it or choose another name");
  if (fs::exists(p) && !fs::is_regular_file(p)) return;  // a device or FIFO: written in place
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const bool planned = !planned_dir.empty() && !fs::exists(dir) && resolved_path(dir.string()) == resolved_path(planned_dir);
  if (!planned) {  // a directory the program creates first is checked when it makes it (make_output_dir)
    ACTLAB_CHECK(fs::is_directory(dir), what, " '", path, "': directory '", dir.string(), "' does not exist");
    ACTLAB_CHECK(::access(dir.c_str(), W_OK) == 0, what, " '", path, "': directory '", dir.string(),
                 "' is not writable");
  }
  if (!atomic) return;
  // A directory not there yet has its nearest existing ancestor's file system, as far as can be told now.
  fs::path on = dir;
  while (planned && !on.empty() && !fs::exists(on)) on = on.parent_path();
  const long name_max = ::pathconf((on.empty() ? fs::path(".") : on).c_str(), _PC_NAME_MAX);
  const std::string tmp_name = fs::path(temp_path(path)).filename().string();
  ACTLAB_CHECK(name_max <= 0 || static_cast<long>(tmp_name.size()) <= name_max, what, " '", path,
               "': the name is too long (it is written through '", tmp_name, "', ", tmp_name.size(),
               " characters; this file system allows ", name_max, ")");
}

bool replaceable_output(const std::string& path, const std::function<bool(const std::string&)>& own) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(link_target(path));
  const fs::file_status st = fs::status(p, ec);
  if (!fs::exists(st)) return true;
  if (!fs::is_regular_file(st)) return true;  // a device or FIFO is written in place; a directory is refused by check_writable
  return fs::file_size(p, ec) == 0 || own(p.string());
}

bool replaceable_output(const std::string& path, std::string_view start) {
  return replaceable_output(path, [start](const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    std::string head(start.size(), '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    return in.gcount() == static_cast<std::streamsize>(start.size()) && head == start;
  });
}

std::string resolved_path(const std::string& path) {
  // The link's target first: weakly_canonical stops at a dangling link and gives the link's own path, but a
  // write through the link (write_file_atomic, open(2) with O_CREAT) creates the file its target names.
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(link_target(path), ec), ec);
  return ec ? path : p.string();
}

void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].first.empty()) continue;
    const std::string a = resolved_path(outputs[i].first);
    for (size_t j = i + 1; j < outputs.size(); ++j)
      ACTLAB_CHECK(outputs[j].first.empty() || resolved_path(outputs[j].first) != a, outputs[i].second, " and ",
                   outputs[j].second, " name the same file '", outputs[i].first, "'");
  }
}

std::vector<std::string> remove_stale_temp_files(const std::vector<std::string>& outputs) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  for (const std::string& output : outputs) {
    if (output.empty()) continue;
    const fs::path path(output);
    const std::string prefix = path.filename().string() + ".tmp.";
    const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(prefix, 0) != 0) continue;
      const std::string digits = name.substr(prefix.size());
      if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
      struct stat st {};
      if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
      const pid_t pid = static_cast<pid_t>(std::stol(digits));
      if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // its writer may still be running
      std::error_code rm;
      if (fs::remove(entry.path(), rm)) removed.push_back(entry.path().string());
    }
  }
  return removed;
}

}  // namespace actlab
