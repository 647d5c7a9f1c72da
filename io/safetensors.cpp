// Safetensors reader and writer (io/safetensors.h).
#include "actlab/io/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>

#include "actlab/core/error.h"
#include "actlab/io/checksum.h"
#include "actlab/io/files.h"
#include "actlab/io/json.h"

namespace actlab {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the safetensors reference limit

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

void read_exact(std::FILE* f, void* data, size_t n, const std::string& path, const char* what) {
  ACTLAB_CHECK(std::fread(data, 1, n, f) == n, "checkpoint '", path, "': cannot read ", what, " (", n, " bytes)");
}

std::string header_json(const NamedTensors& tensors, const Metadata& metadata) {
  JsonWriter w;
  w.begin_object();
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const Tensor& x = t.second;
    w.key(t.first).begin_object().field("dtype", st_dtype_name(x.dtype())).key("shape").begin_array();
    for (int64_t d = 0; d < x.dim(); ++d) w.value(x.size(d));
    w.end_array().key("data_offsets").begin_array().value(offset).value(offset + x.nbytes()).end_array().end_object();
    offset += x.nbytes();
  }
  w.key("__metadata__").begin_object();
  for (const auto& m : metadata) w.field(m.first, m.second);
  w.end_object().end_object();
  std::string h = w.str();
  while ((h.size() + 8) % 8 != 0) h += ' ';
  return h;
}

// FNV-1a 64 of the metadata entries a writer was given (every key but the writer's own three), sorted by
// key, each as key NUL value NUL: the same for any order the entries are stored in.
uint64_t metadata_checksum(const Metadata& metadata) {
  std::vector<std::pair<std::string, std::string>> entries;
  for (const auto& m : metadata)
    if (!is_writer_metadata_key(m.first)) entries.push_back(m);
  std::sort(entries.begin(), entries.end());
  uint64_t h = fnv1a64(nullptr, 0);
  for (const auto& [key, value] : entries) {
    h = fnv1a64(key.data(), key.size() + 1, h);  // with the NUL that ends it
    h = fnv1a64(value.data(), value.size() + 1, h);
  }
  return h;
}

}  // namespace

bool is_writer_metadata_key(const std::string& key) {
  return key == "checksum" || key == "data_bytes" || key == "metadata_checksum";
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

void write_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  NamedTensors cpu;
  cpu.reserve(tensors.size());
  uint64_t checksum = fnv1a64(nullptr, 0), data_bytes = 0;
  // What read_safetensors refuses is refused here too, before anything is written: a file this writes
  // must read back.
  std::set<std::string> names;
  for (const auto& t : tensors) {
    ACTLAB_CHECK(t.second.defined(), "checkpoint tensor '", t.first, "' is undefined");
    ACTLAB_CHECK(t.first != "__metadata__" && !t.first.empty(), "bad checkpoint tensor name '", t.first, "'");
    ACTLAB_CHECK(names.insert(t.first).second, "checkpoint tensor name '", t.first, "' given twice");
    Tensor x = t.second.to(Device::cpu()).contiguous();
    checksum = fnv1a64(x.raw_data(), x.nbytes(), checksum);
    data_bytes += x.nbytes();
    cpu.emplace_back(t.first, std::move(x));
  }
  std::set<std::string> keys;
  for (const auto& [key, value] : metadata)
    ACTLAB_CHECK(!is_writer_metadata_key(key) && keys.insert(key).second, "checkpoint metadata key '", key,
                 is_writer_metadata_key(key) ? "' is the writer's own" : "' given twice");
  Metadata meta = metadata;
  meta.emplace_back("checksum", hex64(checksum));
  meta.emplace_back("data_bytes", std::to_string(data_bytes));
  meta.emplace_back("metadata_checksum", hex64(metadata_checksum(metadata)));
  const std::string header = header_json(cpu, meta);

  write_file_atomic(path, [&](int fd, const std::string& tmp) {
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((static_cast<uint64_t>(header.size()) >> (8 * i)) & 0xFF);
    write_all(fd, len, 8, tmp);
    write_all(fd, header.data(), header.size(), tmp);
    for (const auto& t : cpu) write_all(fd, t.second.raw_data(), t.second.nbytes(), tmp);
  });
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

// The error for a directory given as a checkpoint (a save directory, most often): the .safetensors files
// it holds, so the fix is one copy away.
std::string directory_error(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".safetensors") files.push_back((fs::path(path) / it->path().filename()).string());
  std::sort(files.begin(), files.end());
  std::string message = "checkpoint '" + path + "' is a directory; give the .safetensors file in it";
  if (files.empty()) return message + " (it holds none)";
  message += ", e.g. " + files[0];
  for (size_t i = 1; i < std::min<size_t>(files.size(), 3); ++i) message += " or " + files[i];
  return message;
}

// An open safetensors file's header, read and parsed: the file, its size and header length, and the JSON.
struct Header {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file{nullptr, &std::fclose};
  uint64_t file_size = 0, length = 0;
  JsonValue root;
};

Header read_header(const std::string& path) {
  std::error_code ec;
  ACTLAB_CHECK(!std::filesystem::is_directory(path, ec), directory_error(path));
  Header h;
  h.file.reset(std::fopen(path.c_str(), "rb"));
  ACTLAB_CHECK(h.file != nullptr, "cannot open checkpoint '", path, "': ", std::strerror(errno));
  struct stat st {};
  ACTLAB_CHECK(::fstat(::fileno(h.file.get()), &st) == 0 && S_ISREG(st.st_mode), "checkpoint '", path,
               "' is not a regular file");
  h.file_size = static_cast<uint64_t>(st.st_size);
  ACTLAB_CHECK(h.file_size >= 8, "checkpoint '", path, "' is truncated: ", h.file_size, " bytes, no header length");
  unsigned char len[8];
  read_exact(h.file.get(), len, 8, path, "the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  ACTLAB_CHECK(n >= 2 && n <= kMaxHeaderBytes && n <= h.file_size - 8, "checkpoint '", path, "': header length ", n,
               " does not fit the file size ", h.file_size, " (truncated or not a safetensors file)");
  h.length = n;
  std::string header(n, '\0');
  read_exact(h.file.get(), header.data(), n, path, "the header");
  const std::string where = "checkpoint '" + path + "' header";
  h.root = parse_json(header, where);
  ACTLAB_CHECK(h.root.kind == JsonValue::Kind::Object, where, ": not a JSON object");
  return h;
}

// The "__metadata__" member of a header (empty where there is none).
Metadata header_metadata(const JsonValue& root, const std::string& where) {
  Metadata out;
  for (const auto& m : root.members) {
    if (m.first != "__metadata__") continue;
    ACTLAB_CHECK(m.second.kind == JsonValue::Kind::Object, where, ": __metadata__ is not an object");
    for (const auto& kv : m.second.members) {
      ACTLAB_CHECK(kv.second.kind == JsonValue::Kind::String, where, ": metadata '", kv.first, "' is not a string");
      out.emplace_back(kv.first, kv.second.string);
    }
  }
  return out;
}

}  // namespace

Metadata read_safetensors_metadata(const std::string& path) {
  return header_metadata(read_header(path).root, "checkpoint '" + path + "' header");
}

SafetensorsFile read_safetensors(const std::string& path) {
  const Header h = read_header(path);
  const uint64_t file_size = h.file_size, n = h.length;
  std::FILE* const f = h.file.get();
  const std::string where = "checkpoint '" + path + "' header";

  SafetensorsFile out;
  out.metadata = header_metadata(h.root, where);
  std::vector<HeaderEntry> entries;
  for (const auto& m : h.root.members)
    if (m.first != "__metadata__") entries.push_back(parse_entry(m.first, m.second, where));
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
    read_exact(f, loaded[i].raw_data(), loaded[i].nbytes(), path, "the tensor data");
    checksum = fnv1a64(loaded[i].raw_data(), loaded[i].nbytes(), checksum);
  }
  for (size_t i = 0; i < entries.size(); ++i) out.tensors.emplace_back(entries[i].name, std::move(loaded[i]));
  if (const std::string* sum = out.find_metadata("checksum"))
    ACTLAB_CHECK(*sum == hex64(checksum), "corrupt checkpoint '", path, "': data checksum ", hex64(checksum),
                 " does not match the recorded ", *sum);
  if (const std::string* sum = out.find_metadata("metadata_checksum"))
    ACTLAB_CHECK(*sum == hex64(metadata_checksum(out.metadata)), "corrupt checkpoint '", path,
                 "': its metadata (the stored configuration and state) has checksum ", hex64(metadata_checksum(out.metadata)),
                 ", not the recorded ", *sum);
  return out;
}

}  // namespace actlab
