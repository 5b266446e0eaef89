// Line handling shared by the text importers (fio iolog, blkparse output).
#pragma once

#include "common/error.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tierlab::capture::import_text {

// Splits on spaces, tabs and carriage returns; empty fields are skipped.
inline std::vector<std::string_view> split_ws(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r')) ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ' ' && s[j] != '\t' && s[j] != '\r') ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

// "FILE:LINE: what", as an input error.
[[noreturn]] inline void bad(const std::string& name, uint64_t line, const std::string& what) {
  throw InputError(name + ":" + std::to_string(line) + ": " + what);
}

}  // namespace tierlab::capture::import_text
