#include "common/sql.h"

#include <cctype>
#include <cstring>

namespace tierlab {
namespace {

bool ident_char(char c) {
  unsigned char u = static_cast<unsigned char>(c);
  return std::isalnum(u) || c == '_' || u >= 0x80;
}

// A character after which a space is kept when whitespace follows.
bool word_end(char c) { return ident_char(c) || c == '?' || c == '"' || c == '\'' || c == '*'; }

}  // namespace

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

}  // namespace tierlab
