// A small command-line flag parser shared by the apps: typed options with defaults and help text,
// `--name value` and `--name=value`, repeatable options, boolean switches, --help output, and one
// clear Error for an unknown flag, a missing value or a value of the wrong type.
// Tested in tests/test_train.cpp.
#pragma once
#include <cstdint>
#include <exception>
#include <map>
#include <string>
#include <vector>

namespace actlab {

// Splits "a,b,c" (or "a,b,c,": one trailing separator ends the list) on `sep`: {"a", "b", "c"}. An empty item
// ("a,,b", ",a", "a,,") throws Error naming the list: it is a typo, not an item to drop.
std::vector<std::string> split_list(const std::string& text, char sep);

// The one reading of a number or switch from text, for flags and config files alike; each returns false
// (leaving *out) for anything else. parse_int: a whole decimal number that fits in int64, nothing after it.
// parse_float: a finite decimal number (not hexadecimal, inf or nan). parse_bool: true/1/yes/on or
// false/0/no/off.
bool parse_int(const std::string& s, int64_t* out);
bool parse_float(const std::string& s, double* out);
bool parse_bool(const std::string& s, bool* out);

// "1500000", "512KiB", "300MiB", "1.5GiB" (also K/M/G, KB/MB/GB as powers of 1024) -> bytes (> 0).
// `what` names the option in the Error for anything else.
int64_t parse_byte_size(const std::string& text, const std::string& what);

// How a tool stops on an exception: one line "PROGRAM: error: <the message's first line>" on stderr,
// and whatever the message carries after its first line (an OutOfMemory's allocator table) on stdout.
// Returns the exit status: 3 for out of memory (OutOfMemory, std::bad_alloc), 2 for anything else.
int report_error(const char* program, const std::exception& e);

// Removes the temp files a killed run of a tool left beside its outputs (io/files.h's remove_stale_temp_files)
// and says so on stderr, one line per file: "PROGRAM: removed 'F', left by a run killed while writing it".
void remove_stale_outputs(const char* program, const std::vector<std::string>& outputs);

class FlagParser {
 public:
  FlagParser(std::string program, std::string summary);

  // Declares an option. `kind` is "string", "int", "float" or "bool" (a switch: --x or --x=false).
  void add(const std::string& name, const std::string& kind, const std::string& default_value,
           const std::string& help, bool repeatable = false);
  // Parses argv; returns false when --help was given (help() has the text). Throws Error on bad input.
  bool parse(int argc, const char* const* argv);
  std::string help() const;

  std::string get(const std::string& name) const;
  int64_t get_int(const std::string& name) const;
  double get_float(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  std::vector<std::string> get_all(const std::string& name) const;  // repeatable options
  bool given(const std::string& name) const;  // set on the command line (not just the default)
  // Every option with its effective value, in declaration order ("name=value").
  std::vector<std::pair<std::string, std::string>> effective() const;

 private:
  struct Option {
    std::string name, kind, default_value, help;
    bool repeatable = false;
    std::vector<std::string> values;
  };
  const Option& find(const std::string& name) const;
  std::string program_, summary_;
  std::vector<Option> options_;
};

}  // namespace actlab
