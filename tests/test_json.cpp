// io/json.h: the strict reader, and the writer every JSON output goes through (escaping, non-finite
// numbers as null, commas and nesting), checked by reading its output back with the reader; and
// io/markdown.h's table cells.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "actlab/io/json.h"
#include "actlab/io/markdown.h"
#include "tests/error_of.h"

using namespace actlab;
using actlab::testing::error_of;

TEST_CASE("json: strict parsing of the header subset") {
  const JsonValue v = parse_json(R"( {"a": [1, -2, 30], "b": {"c": "x\"y\u00e9\n"}, "t": true, "n": null} )");
  REQUIRE(v.kind == JsonValue::Kind::Object);
  REQUIRE(v.find("a") != nullptr);
  CHECK(v.find("a")->items.size() == 3);
  CHECK(v.find("a")->items[1].integer == -2);
  CHECK(v.find("b")->find("c")->string == "x\"y\xc3\xa9\n");
  CHECK(v.find("t")->boolean);
  CHECK(v.find("missing") == nullptr);
  CHECK(parse_json(json_quote("tab\there \"q\" \x01")).string == "tab\there \"q\" \x01");
  for (const char* bad : {"", "{", "{\"a\":1,}", "[1 2]", "01", "1.", "1e", "1e+", "-", ".5", "{\"a\":1}x", "\"\\q\"", "\"a",
                          "{\"a\":1,\"a\":2}", "[\"\\ud800\"]", "99999999999999999999", "tru", "{1:2}"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_json(bad), Error);
  }
  // Fractions and exponents are Kind::Number (summaries, logs); integers stay exact Kind::Int.
  CHECK(parse_json("1.5").kind == JsonValue::Kind::Number);
  CHECK(parse_json("-2.5e-3").number == doctest::Approx(-2.5e-3));
  CHECK(parse_json("1E3").number == 1000.0);
  CHECK(parse_json("42").kind == JsonValue::Kind::Int);
  CHECK(parse_json("42").number == 42.0);
  CHECK_THROWS_AS(parse_json("1e999"), Error);  // not finite
  CHECK(error_of([] { parse_json(std::string(40, '[') + std::string(40, ']')); }).find("nesting") !=
        std::string::npos);
  CHECK_THROWS_AS(json_quote("\xff\xfe"), Error);  // not UTF-8
}

TEST_CASE("json: the writer escapes strings and writes NaN and infinities as null") {
  const double inf = std::numeric_limits<double>::infinity();
  JsonWriter w;
  w.begin_object()
      .field("name", "layer1.0 \"conv\"\\\n\t")
      .field("not_a_number", std::nan(""))
      .field("plus", inf)
      .field("minus", -inf)
      .field("third", 1.0 / 3.0)
      .field("big", int64_t{1} << 62)
      .field("flag", false)
      .key("list").begin_array().value(1).value("a,b").null().begin_object().end_object().end_array()
      .end_object();
  const std::string text = w.str();
  CHECK(text.find("nan") == std::string::npos);
  CHECK(text.find("inf") == std::string::npos);
  const JsonValue v = parse_json(text);
  REQUIRE(v.kind == JsonValue::Kind::Object);
  CHECK(v.find("name")->string == "layer1.0 \"conv\"\\\n\t");
  CHECK(v.find("not_a_number")->kind == JsonValue::Kind::Null);
  CHECK(v.find("plus")->kind == JsonValue::Kind::Null);
  CHECK(v.find("minus")->kind == JsonValue::Kind::Null);
  CHECK(v.find("third")->number == 1.0 / 3.0);  // round-trips bit for bit
  CHECK(v.find("big")->integer == (int64_t{1} << 62));
  CHECK(v.find("flag")->kind == JsonValue::Kind::Bool);
  const JsonValue* list = v.find("list");
  REQUIRE(list->items.size() == 4);
  CHECK(list->items[1].string == "a,b");
  CHECK(list->items[2].kind == JsonValue::Kind::Null);
  CHECK(list->items[3].kind == JsonValue::Kind::Object);
}

TEST_CASE("json: the pretty writer reads back the same and puts one member a line") {
  JsonWriter compact, pretty(true);
  for (JsonWriter* w : {&compact, &pretty}) {
    JsonWriter row;
    row.begin_object().field("x", 1).end_object();
    w->begin_object().field("a", 1.5).key("rows").begin_array().raw(row.str()).raw(row.str()).end_array().key("e")
        .begin_array().end_array().end_object();
  }
  CHECK(compact.str() == R"({"a":1.5,"rows":[{"x":1},{"x":1}],"e":[]})");
  CHECK(pretty.str() == "{\n  \"a\": 1.5,\n  \"rows\": [\n    {\"x\":1},\n    {\"x\":1}\n  ],\n  \"e\": []\n}");
  CHECK(parse_json(pretty.str()).find("rows")->items.size() == 2);
}

TEST_CASE("json: the writer refuses documents that are not JSON") {
  CHECK(error_of([] { JsonWriter().begin_object().value(1); }).find("needs a key") != std::string::npos);
  CHECK(error_of([] { JsonWriter().begin_array().key("k"); }).find("outside an object") != std::string::npos);
  CHECK(error_of([] { (void)JsonWriter().begin_object().str(); }).find("open") != std::string::npos);
  CHECK(error_of([] { JsonWriter().value(1).value(2); }).find("already has its value") != std::string::npos);
  CHECK(error_of([] { JsonWriter().begin_array().end_object(); }).find("end_object") != std::string::npos);
  CHECK_THROWS_AS(JsonWriter().value("\xff"), Error);  // not UTF-8
}

TEST_CASE("json: round_trip_double is the shortest text that reads back exactly") {
  for (const double v : {0.0, -0.0, 0.1, 1.0 / 3.0, 1e300, 5e-324, 123456789.0}) {
    CAPTURE(v);
    CHECK(std::strtod(round_trip_double(v).c_str(), nullptr) == v);
  }
  CHECK(round_trip_double(0.1) == "0.1");
  CHECK(json_number(std::nan("")) == "null");
}

TEST_CASE("markdown: a cell's '|' is escaped, so a mixed policy string stays one column") {
  CHECK(md_cell("division:B=8,Q=2") == "division:B=8,Q=2");
  CHECK(md_cell("quant:Q=2|layer1.*=division:B=8,Q=2") == "quant:Q=2\\|layer1.*=division:B=8,Q=2");
  CHECK(md_cell("|a||") == "\\|a\\|\\|");
  CHECK(md_cell("") == "");
}

TEST_CASE("markdown: a figure is rounded to four significant digits, not cut off") {
  CHECK(md_number(10.5689) == "10.57");  // cut to five characters it read 10.56
  CHECK(md_number(8.29992) == "8.300");
  CHECK(md_number(55.6149) == "55.61");
  CHECK(md_number(9.99971) == "10.00");
  CHECK(md_number(99.996) == "100.0");
  CHECK(md_number(1234.6) == "1235");
  CHECK(md_number(0.12345) == "0.123");
  CHECK(md_number(2.5, 2) == "2.5");
  CHECK(md_number(9.97, 2) == "10");
  CHECK(md_number(9.94, 2) == "9.9");
}
