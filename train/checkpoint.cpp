// Safetensors checkpoints: strict JSON header, atomic writes, checked reads, model/optimizer mapping.
// Format: u64 LE header length N, N bytes of UTF-8 JSON (space-padded to 8-byte alignment), then
// the tensors' raw little-endian bytes, packed in header order with offsets relative to the data.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>

#include "core/error.h"

namespace actlab {
namespace {

constexpr int kFormatVersion = 1;
constexpr int kMaxJsonDepth = 16;
constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the safetensors reference limit

// ---------------------------------------------------------------- JSON reader
class JsonReader {
 public:
  JsonReader(const std::string& text, const std::string& what) : s_(text), what_(what) {}
  JsonValue document() {
    JsonValue v = value(0);
    skip_space();
    if (pos_ != s_.size()) fail("unexpected trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const { ACTLAB_FAIL(what_, ": ", msg, " at byte ", pos_); }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  char peek() { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  void literal(const char* word) {
    const size_t n = std::strlen(word);
    if (s_.compare(pos_, n, word) != 0) fail("invalid literal");
    pos_ += n;
  }
  JsonValue value(int depth) {
    if (depth > kMaxJsonDepth) fail("nesting deeper than 16");
    skip_space();
    JsonValue v;
    const char c = peek();
    if (c == '{') {
      v.kind = JsonValue::Kind::Object;
      ++pos_;
      skip_space();
      if (peek() == '}') { ++pos_; return v; }
      for (;;) {
        skip_space();
        if (peek() != '"') fail("expected a string key");
        std::string key = string();
        for (const auto& m : v.members)
          if (m.first == key) fail("duplicate key \"" + key + "\"");
        skip_space();
        expect(':');
        JsonValue member = value(depth + 1);
        v.members.emplace_back(std::move(key), std::move(member));
        skip_space();
        if (peek() == ',') { ++pos_; continue; }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = JsonValue::Kind::Array;
      ++pos_;
      skip_space();
      if (peek() == ']') { ++pos_; return v; }
      for (;;) {
        v.items.push_back(value(depth + 1));
        skip_space();
        if (peek() == ',') { ++pos_; continue; }
        expect(']');
        return v;
      }
    }
    if (c == '"') { v.kind = JsonValue::Kind::String; v.string = string(); return v; }
    if (c == 't') { literal("true"); v.kind = JsonValue::Kind::Bool; v.boolean = true; return v; }
    if (c == 'f') { literal("false"); v.kind = JsonValue::Kind::Bool; return v; }
    if (c == 'n') { literal("null"); return v; }
    if (c == '-' || (c >= '0' && c <= '9')) { number(v); return v; }
    fail(pos_ >= s_.size() ? "unexpected end of text" : "unexpected character");
  }
  // JSON's number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  void number(JsonValue& v) {
    const size_t start = pos_;
    v.kind = JsonValue::Kind::Int;
    v.integer = integer();
    v.number = static_cast<double>(v.integer);
    if (peek() != '.' && peek() != 'e' && peek() != 'E') return;
    if (peek() == '.') {
      ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("expected a digit after '.'");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("expected a digit in the exponent");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    v.kind = JsonValue::Kind::Number;
    v.integer = 0;
    v.number = std::strtod(s_.substr(start, pos_ - start).c_str(), nullptr);
    if (!std::isfinite(v.number)) fail("number out of range");
  }
  int64_t integer() {
    const bool neg = peek() == '-';
    if (neg) ++pos_;
    if (!(peek() >= '0' && peek() <= '9')) fail("expected a digit");
    if (peek() == '0' && pos_ + 1 < s_.size() && s_[pos_ + 1] >= '0' && s_[pos_ + 1] <= '9') fail("leading zero");
    uint64_t u = 0;
    while (peek() >= '0' && peek() <= '9') {
      const uint64_t d = static_cast<uint64_t>(peek() - '0');
      if (u > (static_cast<uint64_t>(INT64_MAX) - d) / 10) fail("integer out of range");
      u = u * 10 + d;
      ++pos_;
    }
    return neg ? -static_cast<int64_t>(u) : static_cast<int64_t>(u);
  }
  unsigned hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      u <<= 4;
      if (h >= '0' && h <= '9') u |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') u |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') u |= static_cast<unsigned>(h - 'A' + 10);
      else fail("bad \\u escape");
    }
    return u;
  }
  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) { out += static_cast<char>(cp); return; }
    if (cp < 0x800) { out += static_cast<char>(0xC0 | (cp >> 6)); }
    else if (cp < 0x10000) { out += static_cast<char>(0xE0 | (cp >> 12)); out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)); }
    else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    }
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') { out += c; continue; }
      if (pos_ >= s_.size()) fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
            if (s_.compare(pos_, 2, "\\u") != 0) fail("unpaired surrogate");
            pos_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("unpaired surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
  }

  const std::string& s_;
  std::string what_;
  size_t pos_ = 0;
};

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int extra = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : -1;
    if (extra < 0 || (extra > 0 && i + static_cast<size_t>(extra) >= s.size())) return false;
    for (int k = 1; k <= extra; ++k)
      if ((static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) >> 6) != 0x2) return false;
    i += static_cast<size_t>(extra) + 1;
  }
  return true;
}

// ---------------------------------------------------------------- dtypes
struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypes[] = {{DType::F32, "F32"}, {DType::BF16, "BF16"}, {DType::F16, "F16"},
                                 {DType::U8, "U8"},   {DType::I32, "I32"},   {DType::I64, "I64"}};
const char* st_dtype_name(DType d) {
  for (const auto& e : kDTypes)
    if (e.dtype == d) return e.name;
  ACTLAB_FAIL("dtype ", dtype_name(d), " has no safetensors name");
}

// ---------------------------------------------------------------- file helpers
struct FdCloser {
  int fd = -1;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

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

void read_exact(std::FILE* f, void* data, size_t n, const std::string& path, const char* what) {
  ACTLAB_CHECK(std::fread(data, 1, n, f) == n, "checkpoint '", path, "': cannot read ", what, " (", n, " bytes)");
}

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

std::string header_json(const NamedTensors& tensors, const Metadata& metadata) {
  std::string h = "{";
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const Tensor& x = t.second;
    h += json_quote(t.first) + ":{\"dtype\":\"" + st_dtype_name(x.dtype()) + "\",\"shape\":[";
    for (int64_t d = 0; d < x.dim(); ++d) h += (d ? "," : "") + std::to_string(x.size(d));
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + x.nbytes()) + "]},";
    offset += x.nbytes();
  }
  h += "\"__metadata__\":{";
  for (size_t i = 0; i < metadata.size(); ++i)
    h += (i ? "," : "") + json_quote(metadata[i].first) + ":" + json_quote(metadata[i].second);
  h += "}}";
  while ((h.size() + 8) % 8 != 0) h += ' ';
  return h;
}

}  // namespace

// ---------------------------------------------------------------- JSON public
const JsonValue* JsonValue::find(const std::string& key) const {
  for (const auto& m : members)
    if (m.first == key) return &m.second;
  return nullptr;
}

JsonValue parse_json(const std::string& text, const std::string& what) { return JsonReader(text, what).document(); }

std::string json_quote(const std::string& s) {
  ACTLAB_CHECK(valid_utf8(s), "string is not valid UTF-8: '", s, "'");
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

const std::string* SafetensorsFile::find_metadata(const std::string& key) const {
  for (const auto& m : metadata)
    if (m.first == key) return &m.second;
  return nullptr;
}

const std::string& SafetensorsFile::metadata_value(const std::string& key) const {
  const std::string* v = find_metadata(key);
  ACTLAB_CHECK(v != nullptr, "checkpoint metadata has no '", key, "' entry");
  return *v;
}

// ---------------------------------------------------------------- write
// Writes `<path>.tmp.<pid>` through `fill`, fsyncs, renames over `path`, then fsyncs the directory
// (best effort: some file systems refuse that). On any failure the temp file is removed and an
// existing `path` is untouched.
void write_file_atomic(const std::string& path, const std::function<void(int, const std::string&)>& fill) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
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

void write_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  NamedTensors cpu;
  cpu.reserve(tensors.size());
  uint64_t checksum = fnv1a64(nullptr, 0), data_bytes = 0;
  for (const auto& t : tensors) {
    ACTLAB_CHECK(t.second.defined(), "checkpoint tensor '", t.first, "' is undefined");
    ACTLAB_CHECK(t.first != "__metadata__" && !t.first.empty(), "bad checkpoint tensor name '", t.first, "'");
    Tensor x = t.second.to(Device::cpu()).contiguous();
    checksum = fnv1a64(x.raw_data(), x.nbytes(), checksum);
    data_bytes += x.nbytes();
    cpu.emplace_back(t.first, std::move(x));
  }
  Metadata meta = metadata;
  meta.emplace_back("checksum", hex64(checksum));
  meta.emplace_back("data_bytes", std::to_string(data_bytes));
  const std::string header = header_json(cpu, meta);

  write_file_atomic(path, [&](int fd, const std::string& tmp) {
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((static_cast<uint64_t>(header.size()) >> (8 * i)) & 0xFF);
    write_all(fd, len, 8, tmp);
    write_all(fd, header.data(), header.size(), tmp);
    for (const auto& t : cpu) write_all(fd, t.second.raw_data(), t.second.nbytes(), tmp);
  });
}

void write_text_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, [&](int fd, const std::string& tmp) { write_all(fd, text.data(), text.size(), tmp); });
}

std::vector<std::string> remove_stale_temp_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::string digits;
    for (const char* prefix : {"last.safetensors.tmp.", "best.safetensors.tmp."})
      if (name.rfind(prefix, 0) == 0) digits = name.substr(std::strlen(prefix));
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    struct stat st {};
    if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // its writer may still be running
    if (fs::remove(entry.path(), ec)) removed.push_back(entry.path().string());
  }
  return removed;
}

// ---------------------------------------------------------------- read
namespace {

struct HeaderEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

HeaderEntry parse_entry(const std::string& name, const JsonValue& v, const std::string& where) {
  using K = JsonValue::Kind;
  ACTLAB_CHECK(v.kind == K::Object, where, ": tensor '", name, "' is not an object");
  const JsonValue* dt = v.find("dtype");
  const JsonValue* shape = v.find("shape");
  const JsonValue* off = v.find("data_offsets");
  ACTLAB_CHECK(dt && dt->kind == K::String && shape && shape->kind == K::Array && off && off->kind == K::Array &&
                   off->items.size() == 2 && v.members.size() == 3,
               where, ": tensor '", name, "' needs exactly dtype, shape and data_offsets [begin, end]");
  HeaderEntry e{name, DType::F32, {}, 0, 0};
  bool known = false;
  for (const auto& d : kDTypes)
    if (dt->string == d.name) { e.dtype = d.dtype; known = true; }
  ACTLAB_CHECK(known, where, ": tensor '", name, "' has unsupported dtype '", dt->string, "'");
  ACTLAB_CHECK(shape->items.size() <= 8, where, ": tensor '", name, "' has ", shape->items.size(), " dimensions");
  uint64_t numel = 1;
  for (const auto& d : shape->items) {
    ACTLAB_CHECK(d.kind == K::Int && d.integer >= 0 && d.integer < (int64_t{1} << 40), where, ": tensor '", name,
                 "' has a bad dimension");
    e.shape.push_back(d.integer);
    numel *= static_cast<uint64_t>(d.integer);
    ACTLAB_CHECK(numel < (uint64_t{1} << 40), where, ": tensor '", name, "' is too large");
  }
  for (const auto& o : off->items)
    ACTLAB_CHECK(o.kind == K::Int && o.integer >= 0, where, ": tensor '", name, "' has a bad data offset");
  e.begin = static_cast<uint64_t>(off->items[0].integer);
  e.end = static_cast<uint64_t>(off->items[1].integer);
  ACTLAB_CHECK(e.begin <= e.end && e.end - e.begin == numel * dtype_size(e.dtype), where, ": tensor '", name,
               "' has offsets [", e.begin, ", ", e.end, ") but needs ", numel * dtype_size(e.dtype), " bytes");
  return e;
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  ACTLAB_CHECK(f != nullptr, "cannot open checkpoint '", path, "': ", std::strerror(errno));
  struct stat st {};
  ACTLAB_CHECK(::fstat(::fileno(f.get()), &st) == 0 && S_ISREG(st.st_mode), "checkpoint '", path,
               "' is not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  ACTLAB_CHECK(file_size >= 8, "checkpoint '", path, "' is truncated: ", file_size, " bytes, no header length");
  unsigned char len[8];
  read_exact(f.get(), len, 8, path, "the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  ACTLAB_CHECK(n >= 2 && n <= kMaxHeaderBytes && n <= file_size - 8, "checkpoint '", path, "': header length ", n,
               " does not fit the file size ", file_size, " (truncated or not a safetensors file)");
  std::string header(n, '\0');
  read_exact(f.get(), header.data(), n, path, "the header");
  const std::string where = "checkpoint '" + path + "' header";
  const JsonValue root = parse_json(header, where);
  ACTLAB_CHECK(root.kind == JsonValue::Kind::Object, where, ": not a JSON object");

  SafetensorsFile out;
  std::vector<HeaderEntry> entries;
  for (const auto& m : root.members) {
    if (m.first == "__metadata__") {
      ACTLAB_CHECK(m.second.kind == JsonValue::Kind::Object, where, ": __metadata__ is not an object");
      for (const auto& kv : m.second.members) {
        ACTLAB_CHECK(kv.second.kind == JsonValue::Kind::String, where, ": metadata '", kv.first, "' is not a string");
        out.metadata.emplace_back(kv.first, kv.second.string);
      }
      continue;
    }
    entries.push_back(parse_entry(m.first, m.second, where));
  }
  // Offsets: sorted by begin they must tile [0, data_bytes) exactly.
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return entries[a].begin < entries[b].begin; });
  uint64_t expect = 0;
  for (const size_t i : order) {
    const HeaderEntry& e = entries[i];
    ACTLAB_CHECK(e.begin == expect, where, ": tensor '", e.name, "' starts at ", e.begin,
                 " but the previous one ends at ", expect, e.begin < expect ? " (overlap)" : " (gap)");
    expect = e.end;
  }
  const uint64_t data_size = file_size - 8 - n;
  ACTLAB_CHECK(data_size == expect, "checkpoint '", path, "' has ", data_size, " data bytes but its header describes ",
               expect, data_size < expect ? " (truncated file)" : " (trailing bytes)");
  if (const std::string* db = out.find_metadata("data_bytes"))
    ACTLAB_CHECK(*db == std::to_string(data_size), "checkpoint '", path, "': data_bytes ", *db, " != ", data_size);

  // Read in file order (sequential I/O), checksumming the data section as it streams past.
  std::vector<Tensor> loaded(entries.size());
  uint64_t checksum = fnv1a64(nullptr, 0);
  for (const size_t i : order) {
    const HeaderEntry& e = entries[i];
    loaded[i] = Tensor::empty(e.shape, e.dtype);
    read_exact(f.get(), loaded[i].raw_data(), loaded[i].nbytes(), path, "the tensor data");
    checksum = fnv1a64(loaded[i].raw_data(), loaded[i].nbytes(), checksum);
  }
  for (size_t i = 0; i < entries.size(); ++i) out.tensors.emplace_back(entries[i].name, std::move(loaded[i]));
  if (const std::string* sum = out.find_metadata("checksum"))
    ACTLAB_CHECK(*sum == hex64(checksum), "corrupt checkpoint '", path, "': data checksum ", hex64(checksum),
                 " does not match the recorded ", *sum);
  return out;
}

// ---------------------------------------------------------------- training checkpoints
namespace {

const char* const kMomentumPrefix = "optim.momentum.";

// The shortest of %.15g/%.17g that reads back to the same double: the running sums round-trip
// bit for bit and stay readable.
std::string exact_double(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

int64_t meta_int(const SafetensorsFile& f, const std::string& key) {
  const std::string& s = f.metadata_value(key);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  ACTLAB_CHECK(!s.empty() && errno == 0 && *end == '\0', "checkpoint metadata '", key, "' is not an integer: '", s, "'");
  return v;
}

double meta_double(const SafetensorsFile& f, const std::string& key) {
  const std::string& s = f.metadata_value(key);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  ACTLAB_CHECK(!s.empty() && *end == '\0', "checkpoint metadata '", key, "' is not a number: '", s, "'");
  return v;
}

}  // namespace

void save_checkpoint(const std::string& path, const Module& model, Sgd& opt, const TrainState& st) {
  NamedTensors tensors;
  const auto params = model.named_parameters();
  for (const auto& p : params) tensors.emplace_back(p.first, p.second.data());
  for (const auto& b : model.named_buffers()) tensors.emplace_back(b.first, b.second);
  const std::vector<Tensor>& moms = opt.momentum_buffers();
  ACTLAB_CHECK(moms.size() == params.size(), "optimizer holds ", moms.size(), " parameters, the model ",
               params.size());
  for (size_t i = 0; i < params.size(); ++i)
    if (moms[i].defined()) tensors.emplace_back(kMomentumPrefix + params[i].first, moms[i]);
  const Metadata meta = {
      {"format", "actlab-checkpoint"},
      {"format_version", std::to_string(kFormatVersion)},
      {"model", st.model},
      {"epoch", std::to_string(st.epoch)},
      {"step_in_epoch", std::to_string(st.step_in_epoch)},
      {"global_step", std::to_string(st.global_step)},
      {"pack_step", std::to_string(st.pack_step)},
      {"seed", std::to_string(st.seed)},
      {"optimizer_steps", std::to_string(opt.steps())},
      {"epoch_loss_sum", exact_double(st.loss_sum)},
      {"epoch_correct", std::to_string(st.correct)},
      {"epoch_seen", std::to_string(st.seen)},
      {"best_test_acc", exact_double(st.best_acc)},
      {"lr_schedule", st.lr_schedule},
      {"config", st.config_json},
  };
  write_safetensors(path, tensors, meta);
}

TrainState checkpoint_state(const SafetensorsFile& f) {
  const std::string* fmt = f.find_metadata("format");
  ACTLAB_CHECK(fmt != nullptr && *fmt == "actlab-checkpoint", "not an actlab training checkpoint (metadata 'format' ",
               fmt ? "'" + *fmt + "'" : std::string("missing"), ")");
  const int64_t version = meta_int(f, "format_version");
  ACTLAB_CHECK(version == kFormatVersion, "checkpoint format version ", version, " is not supported (this build reads ",
               kFormatVersion, ")");
  ACTLAB_CHECK(f.find_metadata("checksum") != nullptr, "checkpoint has no checksum");
  TrainState st;
  st.model = f.metadata_value("model");
  st.epoch = meta_int(f, "epoch");
  st.step_in_epoch = meta_int(f, "step_in_epoch");
  st.global_step = meta_int(f, "global_step");
  st.pack_step = static_cast<uint64_t>(meta_int(f, "pack_step"));
  st.seed = static_cast<uint64_t>(meta_int(f, "seed"));
  st.optimizer_steps = meta_int(f, "optimizer_steps");
  st.loss_sum = meta_double(f, "epoch_loss_sum");
  st.correct = meta_int(f, "epoch_correct");
  st.seen = meta_int(f, "epoch_seen");
  st.best_acc = meta_double(f, "best_test_acc");
  st.lr_schedule = f.metadata_value("lr_schedule");
  st.config_json = f.metadata_value("config");
  ACTLAB_CHECK(st.epoch >= 0 && st.step_in_epoch >= 0 && st.global_step >= 0 && st.seen >= 0,
               "checkpoint loop position is negative");
  return st;
}

void restore_checkpoint(const SafetensorsFile& f, Module& model, Sgd* opt) {
  std::map<std::string, const Tensor*> unused;
  for (const auto& t : f.tensors) unused[t.first] = &t.second;
  // Check everything before copying anything, so a refused file leaves model and optimizer as they were.
  std::vector<std::pair<Tensor, const Tensor*>> copies;  // (destination, source)
  auto check = [](const std::string& name, const Tensor& src, const Tensor& dst) {
    ACTLAB_CHECK(src.dtype() == dst.dtype() && src.shape() == dst.shape(), "checkpoint tensor '", name, "' is ",
                 dtype_name(src.dtype()), " ", shape_str(src.shape()), " but the model's is ", dtype_name(dst.dtype()),
                 " ", shape_str(dst.shape()), " (a checkpoint of another model or configuration?)");
  };
  auto need = [&](const std::string& name, const Tensor& dst) {
    const auto it = unused.find(name);
    ACTLAB_CHECK(it != unused.end(), "checkpoint has no tensor '", name, "' (a checkpoint of another model?)");
    check(name, *it->second, dst);
    copies.emplace_back(dst, it->second);
    unused.erase(it);
  };
  const auto params = model.named_parameters();
  for (const auto& p : params) need(p.first, p.second.data());
  for (const auto& b : model.named_buffers()) need(b.first, b.second);
  std::vector<std::pair<size_t, const Tensor*>> momentum;  // (parameter index, source)
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = unused.find(kMomentumPrefix + params[i].first);
    if (it == unused.end()) continue;  // that parameter had no step yet (or momentum is 0)
    check(it->first, *it->second, params[i].second.data());
    momentum.emplace_back(i, it->second);
    unused.erase(it);
  }
  ACTLAB_CHECK(unused.empty(), "checkpoint has tensor '", unused.empty() ? "" : unused.begin()->first,
               "' that the model does not (a checkpoint of another model?)");
  const int64_t optimizer_steps = opt != nullptr ? meta_int(f, "optimizer_steps") : 0;

  for (auto& c : copies) c.first.copy_(*c.second);
  if (opt == nullptr) return;
  for (const auto& m : momentum) {
    const Tensor& p = params[m.first].second.data();
    Tensor& buf = opt->momentum_buffers().at(m.first);
    buf = Tensor::empty_tagged(p.shape(), MemTag::OptimState, DType::F32, p.device());
    buf.copy_(*m.second);
  }
  opt->set_steps(optimizer_steps);
}

}  // namespace actlab
