// Pure text helpers: SQL fingerprints (normalize_sql: common/sql.cpp), user maps.
#include "replay/plan.h"

#include "common/error.h"
#include "common/sql.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace tierlab::replay {

uint64_t hash_text(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t fingerprint(std::string_view sql) { return hash_text(normalize_sql(sql)); }

const std::string* UserMap::find(std::string_view captured) const {
  for (const auto& [from, to] : entries)
    if (from == captured) return &to;
  return nullptr;
}

UserMap parse_user_map(std::string_view text, const std::string& name) {
  UserMap m;
  auto trim = [](std::string_view v) {
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
    return v;
  };
  size_t line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++line_no;
    line = trim(line);
    if (line.empty() || line.front() == '#') continue;
    size_t eq = line.find('=');
    std::string where = name + ":" + std::to_string(line_no) + ": ";
    if (eq == std::string_view::npos)
      throw InputError(where + "expected captured=target, got '" + std::string(line) + "'");
    std::string_view from = trim(line.substr(0, eq)), to = trim(line.substr(eq + 1));
    if (from.empty() || to.empty())
      throw InputError(where + "expected captured=target, got '" + std::string(line) + "'");
    if (m.find(from))
      throw InputError(where + "user '" + std::string(from) + "' is mapped twice");
    m.entries.emplace_back(std::string(from), std::string(to));
  }
  return m;
}

UserMap load_user_map(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(errno_message(path, errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_user_map(ss.str(), path);
}

}  // namespace tierlab::replay
