// One number as the reports print it, through a printf format ("%.1f ms").
// Private to models/.
#pragma once

#include <cstdio>
#include <string>

namespace tierlab::models {

inline std::string fmt(const char* f, double v) {
  char buf[96];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace tierlab::models
