// FlagParser implementation.
#include "actlab/train/cli.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <sstream>

#include "actlab/core/error.h"
#include "actlab/io/files.h"

namespace actlab {
bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}
// Decimal only (strtod also reads hexadecimal "0x10", "inf" and "nan"). A value too small for a double
// (1e-320, 1e-400) reads as its denormal or zero, and the option's own range check names the problem; one
// too large (1e400) is refused here.
bool parse_float(const std::string& s, double* out) {
  if (s.empty() || s.find_first_of("xX") != std::string::npos) return false;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v) || (errno != 0 && !(errno == ERANGE && std::fabs(v) < 1.0))) return false;
  *out = v;
  return true;
}
bool parse_bool(const std::string& s, bool* out) {
  if (s == "true" || s == "1" || s == "yes" || s == "on") { *out = true; return true; }
  if (s == "false" || s == "0" || s == "no" || s == "off") { *out = false; return true; }
  return false;
}
void remove_stale_outputs(const char* program, const std::vector<std::string>& outputs) {
  for (const auto& stale : remove_stale_temp_files(outputs))
    std::fprintf(stderr, "%s: removed '%s', left by a run killed while writing it\n", program, stale.c_str());
}

int report_error(const char* program, const std::exception& e) {
  const std::string what = e.what();
  const size_t eol = what.find('\n');
  std::fprintf(stderr, "%s: error: %s\n", program, what.substr(0, eol).c_str());
  if (eol != std::string::npos) {
    std::printf("%s", what.substr(eol + 1).c_str());
    std::fflush(stdout);
  }
  const bool memory = dynamic_cast<const OutOfMemory*>(&e) != nullptr || dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
  return memory ? 3 : 2;
}

std::vector<std::string> split_list(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  // "a,,b", ",a" and "a,," are typos that dropping the empty item would hide. One trailing separator ("exact;",
  // how lists built in shell loops end) yields no item at all from getline, and is taken as the end.
  while (std::getline(in, item, sep)) {
    ACTLAB_CHECK(!item.empty(), "the list '", text, "' has an empty item (two '", sep, "' in a row, or one at the start)");
    out.push_back(item);
  }
  return out;
}

int64_t parse_byte_size(const std::string& text, const std::string& what) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const std::map<std::string, double> scale = {{"", 1.0},  {"B", 1.0},     {"K", 1024.0},  {"KB", 1024.0},
                                               {"KIB", 1024.0}, {"M", 1048576.0}, {"MB", 1048576.0},
                                               {"MIB", 1048576.0}, {"G", 1073741824.0}, {"GB", 1073741824.0},
                                               {"GIB", 1073741824.0}};
  const auto it = scale.find(unit);
  const double bytes = it == scale.end() ? 0 : value * it->second;
  ACTLAB_CHECK(used > 0 && it != scale.end() && bytes >= 1 && bytes < 9.0e18, what, " '", text,
               "' is not a size; use bytes or a number with KiB, MiB or GiB (e.g. 512MiB, 1.5GiB)");
  return static_cast<int64_t>(bytes);
}

FlagParser::FlagParser(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

void FlagParser::add(const std::string& name, const std::string& kind, const std::string& default_value,
                     const std::string& help, bool repeatable) {
  options_.push_back({name, kind, default_value, help, repeatable, {}});
}

const FlagParser::Option& FlagParser::find(const std::string& name) const {
  for (const auto& o : options_)
    if (o.name == name) return o;
  ACTLAB_FAIL("internal: option --", name, " was never declared");
}

bool FlagParser::parse(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return false;
    ACTLAB_CHECK(arg.size() > 2 && arg.compare(0, 2, "--") == 0, "unexpected argument '", arg,
                 "' (options start with --; see --help)");
    std::string name = arg.substr(2), value;
    bool has_value = false;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    Option* opt = nullptr;
    for (auto& o : options_)
      if (o.name == name) opt = &o;
    ACTLAB_CHECK(opt != nullptr, "unknown option --", name, " (see ", program_, " --help)");
    if (!has_value) {
      if (opt->kind == "bool") {
        value = "true";
      } else {
        ACTLAB_CHECK(i + 1 < argc, "option --", name, " needs a value");
        value = argv[++i];
      }
    }
    int64_t iv;
    double fv;
    bool bv;
    if (opt->kind == "int")
      ACTLAB_CHECK(parse_int(value, &iv), "option --", name, " needs an integer, got '", value, "'");
    if (opt->kind == "float")
      ACTLAB_CHECK(parse_float(value, &fv) && std::isfinite(fv), "option --", name, " needs a number, got '", value,
                   "'");
    if (opt->kind == "bool")
      ACTLAB_CHECK(parse_bool(value, &bv), "option --", name, " needs true or false, got '", value, "'");
    if (!opt->repeatable) opt->values.clear();
    opt->values.push_back(value);
  }
  return true;
}

std::string FlagParser::help() const {
  std::ostringstream os;
  os << "usage: " << program_ << " [options]\n" << summary_ << "\n\noptions:\n";
  for (const auto& o : options_) {
    std::string head = "  --" + o.name + (o.kind == "bool" ? "" : " " + std::string(o.kind == "string" ? "S" : o.kind == "int" ? "N" : "X"));
    if (head.size() < 28) head += std::string(28 - head.size(), ' ');
    // A help of several lines (the policy forms) keeps its later lines under the descriptions' column.
    std::string help = o.help;
    for (size_t at = help.find('\n'); at != std::string::npos; at = help.find('\n', at + 1))
      help.insert(at + 1, std::string(head.size() + 3, ' '));
    os << head << " " << help;
    if (!o.default_value.empty()) os << " (default: " << o.default_value << ")";
    if (o.repeatable) os << " [repeatable]";
    os << "\n";
  }
  return os.str();
}

std::string FlagParser::get(const std::string& name) const {
  const Option& o = find(name);
  return o.values.empty() ? o.default_value : o.values.back();
}

int64_t FlagParser::get_int(const std::string& name) const {
  int64_t v = 0;
  const std::string s = get(name);
  ACTLAB_CHECK(parse_int(s, &v), "option --", name, " needs an integer, got '", s, "'");
  return v;
}

double FlagParser::get_float(const std::string& name) const {
  double v = 0;
  const std::string s = get(name);
  ACTLAB_CHECK(parse_float(s, &v), "option --", name, " needs a number, got '", s, "'");
  return v;
}

bool FlagParser::get_bool(const std::string& name) const {
  bool v = false;
  const std::string s = get(name);
  ACTLAB_CHECK(parse_bool(s, &v), "option --", name, " needs true or false, got '", s, "'");
  return v;
}

std::vector<std::string> FlagParser::get_all(const std::string& name) const { return find(name).values; }

bool FlagParser::given(const std::string& name) const { return !find(name).values.empty(); }

std::vector<std::pair<std::string, std::string>> FlagParser::effective() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& o : options_) {
    if (o.repeatable) {
      std::string joined;
      for (const auto& v : o.values) joined += (joined.empty() ? "" : ",") + v;
      out.emplace_back(o.name, joined);
    } else {
      out.emplace_back(o.name, get(o.name));
    }
  }
  return out;
}

}  // namespace actlab
