// JSON reader and writer (io/json.h).
#include "actlab/io/json.h"

#include <cmath>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "actlab/core/error.h"

namespace actlab {
namespace {

constexpr int kMaxJsonDepth = 16;

// ---------------------------------------------------------------- reader
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

}  // namespace

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

std::string round_trip_double(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string json_number(double v) { return std::isfinite(v) ? round_trip_double(v) : "null"; }

// ---------------------------------------------------------------- writer
void JsonWriter::newline() {
  out_ += '\n';
  out_.append(2 * open_.size(), ' ');
}

void JsonWriter::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  ACTLAB_CHECK(open_.empty() ? out_.empty() : open_.back() == '[', "JSON writer: a value needs a key inside an object",
               open_.empty() ? " (or the document already has its value)" : "");
  if (!open_.empty()) {
    if (has_member_.back()) out_ += ',';
    has_member_.back() = true;
    if (pretty_) newline();
  }
}

JsonWriter& JsonWriter::key(const std::string& k) {
  ACTLAB_CHECK(!open_.empty() && open_.back() == '{' && !after_key_, "JSON writer: key '", k, "' outside an object");
  if (has_member_.back()) out_ += ',';
  has_member_.back() = true;
  if (pretty_) newline();
  out_ += json_quote(k);
  out_ += pretty_ ? ": " : ":";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::begin_object() {
  before_value();
  out_ += '{';
  open_.push_back('{');
  has_member_.push_back(false);
  return *this;
}

JsonWriter& JsonWriter::begin_array() {
  before_value();
  out_ += '[';
  open_.push_back('[');
  has_member_.push_back(false);
  return *this;
}

JsonWriter& JsonWriter::end_object() {
  ACTLAB_CHECK(!open_.empty() && open_.back() == '{' && !after_key_, "JSON writer: end_object without an open object");
  const bool any = has_member_.back();
  open_.pop_back();
  has_member_.pop_back();
  if (pretty_ && any) newline();
  out_ += '}';
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  ACTLAB_CHECK(!open_.empty() && open_.back() == '[', "JSON writer: end_array without an open array");
  const bool any = has_member_.back();
  open_.pop_back();
  has_member_.pop_back();
  if (pretty_ && any) newline();
  out_ += ']';
  return *this;
}

JsonWriter& JsonWriter::value(double v) {
  before_value();
  out_ += json_number(v);
  return *this;
}

JsonWriter& JsonWriter::value(int64_t v) {
  before_value();
  out_ += std::to_string(v);
  return *this;
}

JsonWriter& JsonWriter::value(uint64_t v) {
  before_value();
  out_ += std::to_string(v);
  return *this;
}

JsonWriter& JsonWriter::value(bool v) {
  before_value();
  out_ += v ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::value(const std::string& v) {
  before_value();
  out_ += json_quote(v);
  return *this;
}

JsonWriter& JsonWriter::null() {
  before_value();
  out_ += "null";
  return *this;
}

JsonWriter& JsonWriter::raw(const std::string& json) {
  before_value();
  out_ += json;
  return *this;
}

const std::string& JsonWriter::str() const {
  ACTLAB_CHECK(open_.empty() && !after_key_, "JSON writer: the document still has ", open_.size(), " open levels");
  return out_;
}

}  // namespace actlab
