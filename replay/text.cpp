// Pure text helpers: SQL fingerprints, user maps.
#include "replay/plan.h"

#include "common/error.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace tierlab::replay {
namespace {

bool ident_char(char c) {
  unsigned char u = static_cast<unsigned char>(c);
  return std::isalnum(u) || c == '_' || u >= 0x80;
}

// A character after which a space is kept when whitespace follows.
bool word_end(char c) { return ident_char(c) || c == '?' || c == '"' || c == '\'' || c == '*'; }

}  // namespace

uint64_t hash_text(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string normalize_sql(std::string_view sql) {
  std::string out;
  out.reserve(sql.size());
  bool pending_space = false;
  auto emit = [&](char c) {
    if (pending_space && !out.empty() && word_end(out.back()) && (ident_char(c) || c == '?' || c == '"' || c == '*'))
      out += ' ';
    pending_space = false;
    out += c;
  };
  size_t i = 0, n = sql.size();
  while (i < n) {
    char c = sql[i];
    unsigned char uc = static_cast<unsigned char>(c);
    if (std::isspace(uc)) {
      pending_space = true;
      ++i;
    } else if (c == '-' && i + 1 < n && sql[i + 1] == '-') {
      while (i < n && sql[i] != '\n') ++i;
      pending_space = true;
    } else if (c == '/' && i + 1 < n && sql[i + 1] == '*') {
      size_t end = sql.find("*/", i + 2);
      i = end == std::string_view::npos ? n : end + 2;
      pending_space = true;
    } else if (c == '\'') {
      // E'..' strings take backslash escapes; drop the prefix letter.
      bool escapes = false;
      if (!out.empty() && (out.back() == 'e' || out.back() == 'b' || out.back() == 'x') &&
          (out.size() == 1 || !ident_char(out[out.size() - 2]))) {
        escapes = out.back() == 'e';
        out.pop_back();
      }
      ++i;
      while (i < n) {
        if (escapes && sql[i] == '\\' && i + 1 < n) {
          i += 2;
        } else if (sql[i] == '\'') {
          if (i + 1 < n && sql[i + 1] == '\'') {
            i += 2;
          } else {
            ++i;
            break;
          }
        } else {
          ++i;
        }
      }
      emit('?');
    } else if (c == '"') {
      size_t start = i++;
      while (i < n) {
        if (sql[i] == '"') {
          if (i + 1 < n && sql[i + 1] == '"') {
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        ++i;
      }
      emit('"');
      out.append(sql.substr(start + 1, i - start - 1));
    } else if (c == '$' && i + 1 < n && std::isdigit(static_cast<unsigned char>(sql[i + 1])) &&
               (out.empty() || pending_space || !ident_char(out.back()))) {
      ++i;
      while (i < n && std::isdigit(static_cast<unsigned char>(sql[i]))) ++i;
      emit('?');
    } else if (c == '$' && (out.empty() || pending_space || !ident_char(out.back()))) {
      // dollar quoting: $tag$ ... $tag$
      size_t close = sql.find('$', i + 1);
      bool tag_ok = close != std::string_view::npos;
      for (size_t k = i + 1; tag_ok && k < close; ++k)
        if (!ident_char(sql[k])) tag_ok = false;
      if (!tag_ok) {
        emit(c);
        ++i;
        continue;
      }
      std::string_view tag = sql.substr(i, close - i + 1);
      size_t end = sql.find(tag, close + 1);
      i = end == std::string_view::npos ? n : end + tag.size();
      emit('?');
    } else if ((std::isdigit(uc) || (c == '.' && i + 1 < n &&
                                     std::isdigit(static_cast<unsigned char>(sql[i + 1])))) &&
               (out.empty() || !ident_char(out.back()) || pending_space)) {
      while (i < n) {
        char d = sql[i];
        if (std::isdigit(static_cast<unsigned char>(d)) || d == '.') {
          ++i;
        } else if ((d == 'e' || d == 'E') && i + 1 < n &&
                   (std::isdigit(static_cast<unsigned char>(sql[i + 1])) ||
                    ((sql[i + 1] == '-' || sql[i + 1] == '+') && i + 2 < n &&
                     std::isdigit(static_cast<unsigned char>(sql[i + 2]))))) {
          i += 2;
        } else {
          break;
        }
      }
      // A unary minus belongs to the literal: "v + -3" is "v + $1".
      if (out.size() >= 1 && out.back() == '-' &&
          (out.size() == 1 || std::strchr("+-*/%^=<>(,|&", out[out.size() - 2]))) {
        out.pop_back();
        pending_space = false;
      }
      emit('?');
    } else if (ident_char(c)) {
      emit(static_cast<char>(std::tolower(uc)));
      ++i;
      while (i < n && ident_char(sql[i])) {
        out += static_cast<char>(std::tolower(static_cast<unsigned char>(sql[i])));
        ++i;
      }
    } else {
      emit(c);
      ++i;
      if (c == ',') pending_space = true;
    }
  }
  while (!out.empty() && (out.back() == ';' || out.back() == ' ')) out.pop_back();
  // ", " is kept for readability; a space before ',' or ')' is not.
  std::string tidy;
  tidy.reserve(out.size());
  for (size_t k = 0; k < out.size(); ++k) {
    if (out[k] == ',' ) {
      tidy += ", ";
      while (k + 1 < out.size() && out[k + 1] == ' ') ++k;
      continue;
    }
    tidy += out[k];
  }
  while (!tidy.empty() && tidy.back() == ' ') tidy.pop_back();
  return tidy;
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
  if (!in) throw InputError(errno_message("--user-map " + path, errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_user_map(ss.str(), path);
}

}  // namespace tierlab::replay
