// stderr log lines: a compiled log_line_prefix and the severity words.
#include "capture/log_internal.h"

#include "common/error.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace tierlab::capture::logimpl {

void OwnedEntry::clear() {
  ts = 0;
  pid = 0;
  session_id.clear();
  user.clear();
  database.clear();
  app.clear();
  client.clear();
  severity.clear();
  sqlstate.clear();
  message.clear();
  detail.clear();
  statement.clear();
  line = 0;
}

Entry OwnedEntry::view() const {
  Entry e;
  e.ts = ts;
  e.pid = pid;
  e.session_id = session_id;
  e.user = user;
  e.database = database;
  e.app = app;
  e.client = client;
  e.severity = severity;
  e.sqlstate = sqlstate;
  e.message = message;
  e.detail = detail;
  e.statement = statement;
  e.line = line;
  return e;
}

namespace {

// Severity words of a stderr line, main messages first.
constexpr std::string_view kMain[] = {"LOG", "ERROR", "FATAL", "PANIC", "WARNING", "NOTICE", "INFO",
                                      "DEBUG", "DEBUG1", "DEBUG2", "DEBUG3", "DEBUG4", "DEBUG5"};
constexpr std::string_view kExtra[] = {"DETAIL", "HINT", "STATEMENT", "CONTEXT", "QUERY", "LOCATION"};

}  // namespace

// "WORD:  " at the start of `s`: the word's length, or 0.
size_t severity_at(std::string_view s, bool* extra) {
  auto try_list = [&](auto& list, bool is_extra) -> size_t {
    for (std::string_view w : list)
      if (s.size() >= w.size() + 3 && s.substr(0, w.size()) == w && s.substr(w.size(), 3) == ":  ") {
        if (extra) *extra = is_extra;
        return w.size();
      }
    return 0;
  };
  if (size_t n = try_list(kMain, false)) return n;
  return try_list(kExtra, true);
}

namespace {

size_t take(const OwnedEntry& tmp, OwnedEntry& e, size_t end) {
  e.ts = tmp.ts;
  e.pid = tmp.pid;
  e.session_id = tmp.session_id;
  e.user = tmp.user;
  e.database = tmp.database;
  e.app = tmp.app;
  e.client = tmp.client;
  e.sqlstate = tmp.sqlstate;
  return end;
}

std::string_view trim(std::string_view v) {
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  return v;
}

void assign(char esc, std::string_view v, OwnedEntry& e) {
  v = trim(v);
  switch (esc) {
    case 'a': e.app = v; break;
    case 'u': e.user = v; break;
    case 'd': e.database = v; break;
    case 'h':
      if (e.client.empty()) e.client = v == "[local]" ? "unix" : std::string(v);
      break;
    case 'r': {
      if (v == "[local]") {
        e.client = "unix";
      } else if (auto open = v.rfind('('); open != std::string_view::npos && v.back() == ')') {
        e.client = std::string(v.substr(0, open)) + ":" + std::string(v.substr(open + 1, v.size() - open - 2));
      } else {
        e.client = v;
      }
      break;
    }
    case 'c': e.session_id = v; break;
    case 'e': e.sqlstate = v; break;
    default: break;
  }
}

// Typed escapes: how many characters at `s` the value takes (nullopt: no
// match). Free-text escapes return nullopt here and are matched by search.
std::optional<size_t> typed(char esc, std::string_view s, OwnedEntry& e) {
  size_t lead = 0;
  while (lead < s.size() && s[lead] == ' ') ++lead;  // padding (%10p)
  std::string_view v = s.substr(lead);
  size_t n = 0;
  switch (esc) {
    case 'p': case 'l': case 'x': case 'P': case 'Q': {
      if (esc == 'Q' && !v.empty() && v[0] == '-') ++n;
      while (n < v.size() && std::isdigit(static_cast<unsigned char>(v[n]))) ++n;
      if (esc == 'p') {
        if (n == 0) return std::nullopt;
        int64_t pid = 0;
          for (size_t k = 0; k < n; ++k) {
            pid = pid * 10 + (v[k] - '0');
            if (pid > INT32_MAX) return std::nullopt;  // no process has it
          }
          e.pid = static_cast<int32_t>(pid);
      }
      return lead + n;
    }
    case 't': case 'm': case 's': {
      auto t = parse_time_prefix(v, n, true);
      if (!t) return std::nullopt;
      if (esc != 's') e.ts = *t;
      return lead + n;
    }
    case 'n': {
      auto t = parse_epoch_prefix(v, n);
      if (!t) return std::nullopt;
      e.ts = *t;
      return lead + n;
    }
    case 'c': {
      while (n < v.size() && (std::isxdigit(static_cast<unsigned char>(v[n])) || v[n] == '.')) ++n;
      if (n == 0) return std::nullopt;
      e.session_id = v.substr(0, n);
      return lead + n;
    }
    case 'e': {
      if (v.size() < 5) return std::nullopt;
      for (size_t i = 0; i < 5; ++i)
        if (!std::isalnum(static_cast<unsigned char>(v[i]))) return std::nullopt;
      e.sqlstate = v.substr(0, 5);
      return lead + 5;
    }
    case 'v': {
      while (n < v.size() && (std::isdigit(static_cast<unsigned char>(v[n])) || v[n] == '/')) ++n;
      return lead + n;
    }
    case 'q': return 0;
    default: return std::nullopt;
  }
}

}  // namespace

Prefix::Prefix(const std::string& spec) : spec_(spec) {
  for (size_t i = 0; i < spec.size(); ++i) {
    if (spec[i] != '%' || i + 1 >= spec.size()) {
      literal(spec[i]);
      continue;
    }
    ++i;
    // Padding (%-10u, %10p): the value is padded with spaces to the width.
    const bool left = i < spec.size() && spec[i] == '-';
    if (left) ++i;
    size_t width = 0;
    while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i]))) width = width * 10 + (spec[i++] - '0');
    if (i >= spec.size()) break;
    char c = spec[i];
    if (c == '%') {
      literal('%');
      continue;
    }
    if (!std::strchr("audrhbpPtmnieclsvxqQ", c))
      throw InputError("log_line_prefix '" + spec + "': unknown escape %" + std::string(1, c));
    Tok t;
    t.esc = c;
    t.left_width = left ? width : 0;
    toks_.push_back(t);
    if (c == 'q') has_q_ = true;
  }
}

bool Prefix::has(char esc) const {
  return std::any_of(toks_.begin(), toks_.end(), [&](const Tok& t) { return t.esc == esc; });
}

void Prefix::literal(char c) {
  if (toks_.empty() || toks_.back().esc != 0) toks_.push_back(Tok{});
  toks_.back().text += c;
}

std::optional<size_t> Prefix::match(std::string_view line, OwnedEntry& e) const {
  OwnedEntry tmp;
  size_t end = 0;
  if (match_from(line, 0, 0, toks_.size(), tmp, end)) return take(tmp, e, end);
  if (has_q_) {  // processes without a session print the prefix up to %q
    size_t q = 0;
    while (toks_[q].esc != 'q') ++q;
    tmp.clear();
    if (match_from(line, 0, 0, q, tmp, end)) return take(tmp, e, end);
  }
  return std::nullopt;
}

// Invariant: toks_[i..end) must match line[pos..) and be followed by a
// severity word.
bool Prefix::match_from(std::string_view line, size_t pos, size_t i, size_t end, OwnedEntry& e,
                        size_t& out) const {
  if (i == end) {
    if (!severity_at(line.substr(pos), nullptr)) return false;
    out = pos;
    return true;
  }
  const Tok& t = toks_[i];
  if (t.esc == 0) {
    if (line.substr(pos, t.text.size()) != t.text) return false;
    return match_from(line, pos + t.text.size(), i + 1, end, e, out);
  }
  if (auto n = typed(t.esc, line.substr(pos), e)) {
    size_t k = pos + *n;
    while (k < line.size() && k < pos + t.left_width && line[k] == ' ') ++k;
    return match_from(line, k, i + 1, end, e, out);
  }
  if (std::strchr("ptmnslcexvPQ", t.esc)) return false;  // typed and did not match
  // Free text: the shortest value after which the rest matches.
  const size_t limit = std::min(line.size(), pos + 512);
  for (size_t k = pos; k <= limit; ++k) {
    if (i + 1 < end && toks_[i + 1].esc == 0 && line.substr(k, toks_[i + 1].text.size()) != toks_[i + 1].text)
      continue;
    if (match_from(line, k, i + 1, end, e, out)) {
      assign(t.esc, line.substr(pos, k - pos), e);
      return true;
    }
  }
  return false;
}

}  // namespace tierlab::capture::logimpl
