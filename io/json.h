// JSON, the one home of every JSON byte actlab reads or writes: a strict reader (safetensors
// headers, stored configurations, the ablation grid's results) and a writer that every JSON output
// (epoch logs, memory reports, summaries, checkpoint headers, benchmark results) goes through, so
// strings are always escaped and a NaN or infinity is always written as null (JSON has neither).
// Tested in tests/test_json.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace actlab {

// Numbers: integers are Kind::Int (exact int64; what safetensors offsets and shapes must be), numbers
// with a fraction or exponent Kind::Number (a double; a header that needs an Int rejects them). Strings
// with the standard escapes, objects with keys in file order, arrays, true/false/null; nesting depth
// <= 16. Errors name the byte offset.
struct JsonValue {
  enum class Kind { Null, Bool, Int, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;  // Int and Number: the value as a double
  std::string string;
  std::vector<JsonValue> items;                            // Array
  std::vector<std::pair<std::string, JsonValue>> members;  // Object, in file order
  const JsonValue* find(const std::string& key) const;     // Object member or nullptr
};
// Parses one JSON value; only whitespace may follow it. `what` prefixes every error message.
JsonValue parse_json(const std::string& text, const std::string& what = "JSON");
// "text" with ", \ and control characters escaped. Throws Error when s is not valid UTF-8.
std::string json_quote(const std::string& s);
// The shortest of %.15g/%.17g that reads back to the same double: values round-trip bit for bit and
// stay readable (checkpoint metadata stores the running sums this way). NaN and infinities print as
// "nan"/"inf", which strtod reads back.
std::string round_trip_double(double v);
// A number as JSON: round_trip_double, or null for NaN and infinities.
std::string json_number(double v);

// Builds one JSON document. Commas and the separator between a key and its value are placed here;
// strings go through json_quote, doubles through json_number.
//   JsonWriter w;  w.begin_object().field("epoch", 3).field("loss", 0.25).end_object();  w.str()
// With `pretty`, every member of an object or array starts a line indented by two spaces per level.
class JsonWriter {
 public:
  explicit JsonWriter(bool pretty = false) : pretty_(pretty) {}
  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(const std::string& k);  // inside an object, before each value
  JsonWriter& value(double v);
  JsonWriter& value(int64_t v);
  JsonWriter& value(int v) { return value(static_cast<int64_t>(v)); }
  JsonWriter& value(uint64_t v);
  JsonWriter& value(bool v);
  JsonWriter& value(const std::string& v);
  JsonWriter& value(const char* v) { return value(std::string(v)); }
  JsonWriter& null();
  JsonWriter& raw(const std::string& json);  // an already-written JSON value (another JsonWriter's str())
  template <typename T>
  JsonWriter& field(const std::string& k, const T& v) { return key(k).value(v); }
  // The document; throws Error while an object or array is still open.
  const std::string& str() const;

 private:
  void before_value();
  void newline();
  bool pretty_;
  std::string out_;
  std::vector<char> open_;        // '{' or '['
  std::vector<bool> has_member_;  // per open level: a member was written
  bool after_key_ = false;
};

}  // namespace actlab
