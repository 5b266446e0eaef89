// capture log: the two csvlog record parsers (capture/log_csv.cpp) agree.
#include "capture/log_internal.h"

#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

using namespace tierlab::capture::logimpl;

namespace {

// One record's fields as parsed, or "" if the parser took none.
std::string fields_of(const CsvRecord& r) {
  std::string out;
  for (size_t i = 0; i < std::min(r.fields, CsvRecord::kMaxFields); ++i) (out += '[') += std::string(r.f[i]) += ']';
  return out + " fields=" + std::to_string(r.fields) + " used=" + std::to_string(r.used) +
         " newlines=" + std::to_string(r.newlines);
}

// A random field: plain, quoted, with doubled quotes, newlines, CRs, commas
// or text after the closing quote; most short, some longer than 64 bytes.
std::string random_field(std::mt19937& rng) {
  static const char kChars[] = "ab ,\"\n\r'$=x";
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  const size_t len = pick(8) == 0 ? 40 + pick(120) : pick(6);
  std::string text;
  for (size_t i = 0; i < len; ++i) text += pick(4) == 0 ? kChars[pick(sizeof kChars - 1)] : char('a' + pick(26));
  switch (pick(4)) {
    case 0: {  // unquoted: no comma or newline, maybe a CR or a stray quote
      std::string f;
      for (char c : text)
        if (c != ',' && c != '\n' && (c != '"' || !f.empty())) f += c;
      return f;
    }
    case 1: {  // quoted, quotes doubled
      std::string f = "\"";
      for (char c : text) (f += c) += c == '"' ? "\"" : "";
      f += '"';
      if (pick(6) == 0) f += "tail\r";  // text after the closing quote
      return f;
    }
    default: {  // quoted, no quote inside (what PostgreSQL mostly writes)
      std::string f = "\"";
      for (char c : text)
        if (c != '"') f += c;
      return f + '"';
    }
  }
}

}  // namespace

TEST_CASE("capture log: the block-wise csvlog parser reads every record it accepts as the general one does",
          "[log][csv]") {
  std::mt19937 rng(33);
  size_t plain = 0, records = 0;
  for (int round = 0; round < 20000; ++round) {
    // A few records, each of 1 to 30 fields.
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < n; ++k) {
      const int fields = 1 + static_cast<int>(rng() % 30);
      for (int i = 0; i < fields; ++i) {
        if (i) text += ',';
        text += random_field(rng);
      }
      text += '\n';
    }
    // Cut at random some of the time: a record the input ends in.
    if (rng() % 4 == 0) text.resize(rng() % (text.size() + 1));
    std::string_view in = text;
    while (!in.empty()) {
      CsvRecord general, fast;
      std::vector<char> scratch(in.size() + 1);
      const bool g = parse_csv_record(in, general, scratch.data());
      const bool f = parse_csv_plain(in, fast);
      INFO("input: " << std::string(in));
      if (f) {
        ++plain;
        REQUIRE(g);
        REQUIRE(fields_of(fast) == fields_of(general));
      }
      if (!g) break;
      ++records;
      in.remove_prefix(general.used);
    }
  }
  INFO(plain << " of " << records << " records read block-wise");
  // Both paths were taken: the comparison compared something.
  CHECK(plain > records / 20);
  CHECK(plain < records);
}

TEST_CASE("capture log: the block-wise csvlog parser on a PostgreSQL record: fields as views, quoted newlines counted",
          "[log][csv]") {
  const std::string rec =
      "2026-12-03 19:47:16.306 UTC,\"postgres\",\"postgres\",15363,\"[local]\",6b11c744.3c03,4,\"SELECT\","
      "2026-12-03 19:47:16 UTC,3/32,0,LOG,00000,\"statement: SELECT\n  1,\n  2\",,,,,,,,,\"psql\",\"client backend\",,0\n"
      "next record: the first one ends within the 64-byte blocks of the input";
  CsvRecord r;
  REQUIRE(parse_csv_plain(rec, r));
  CHECK(r.fields == 26);
  CHECK(r.f[0] == "2026-12-03 19:47:16.306 UTC");
  CHECK(r.f[1] == "postgres");
  CHECK(r.f[13] == "statement: SELECT\n  1,\n  2");
  CHECK(r.f[22] == "psql");
  CHECK(r.f[25] == "0");
  CHECK(r.newlines == 3);
  CHECK(r.used == rec.find("next record"));
  // A record that ends in the input's last, partial 64 bytes is the general
  // parser's, as is one with a doubled quote.
  CHECK_FALSE(parse_csv_plain(rec.substr(0, rec.find("next record") + 4), r));
  CHECK_FALSE(parse_csv_plain("\"a\"\"b\"," + std::string(70, 'x') + "\n", r));
}
