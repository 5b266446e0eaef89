// PostgreSQL server logs -> trace records (capture/log.h).
//
// Three readers (stderr with a log_line_prefix, csvlog, jsonlog) turn lines
// into Entry values, one per logged message with its DETAIL and STATEMENT;
// the Converter turns entries into records, one open unit per session.
#include "capture/log.h"

#include "common/error.h"

#include <nlohmann/json.hpp>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <ctime>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tierlab::capture {

LogFormat parse_log_format(const std::string& s) {
  if (s == "auto") return LogFormat::Auto;
  if (s == "stderr") return LogFormat::Stderr;
  if (s == "csvlog" || s == "csv") return LogFormat::Csv;
  if (s == "jsonlog" || s == "json") return LogFormat::Json;
  if (s == "pgreplay") return LogFormat::Pgreplay;
  throw InputError("log format '" + s + "': expected stderr, csvlog, jsonlog or pgreplay");
}

namespace {

using trace::Nanos;

bool digits(std::string_view s, size_t pos, size_t n) {
  if (pos + n > s.size()) return false;
  for (size_t i = 0; i < n; ++i)
    if (!std::isdigit(static_cast<unsigned char>(s[pos + i]))) return false;
  return true;
}

int num(std::string_view s, size_t pos, size_t n) {
  int v = 0;
  for (size_t i = 0; i < n; ++i) v = v * 10 + (s[pos + i] - '0');
  return v;
}

// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

bool tz_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-'; }

// Parses a timestamp at the start of `s`; sets `len` to the characters used.
// with_zone: a " ZONE" must follow (%t, %m, csvlog, jsonlog).
std::optional<int64_t> parse_time_prefix(std::string_view s, size_t& len, bool with_zone) {
  // "YYYY-MM-DD HH:MM:SS"
  if (!(digits(s, 0, 4) && s.size() >= 19 && s[4] == '-' && digits(s, 5, 2) && s[7] == '-' &&
        digits(s, 8, 2) && s[10] == ' ' && digits(s, 11, 2) && s[13] == ':' && digits(s, 14, 2) &&
        s[16] == ':' && digits(s, 17, 2)))
    return std::nullopt;
  int64_t days = days_from_civil(num(s, 0, 4), num(s, 5, 2), num(s, 8, 2));
  int64_t secs = days * 86400 + num(s, 11, 2) * 3600 + num(s, 14, 2) * 60 + num(s, 17, 2);
  int64_t ns = 0;
  size_t p = 19;
  if (p < s.size() && s[p] == '.') {
    ++p;
    int64_t scale = 100'000'000;
    while (p < s.size() && std::isdigit(static_cast<unsigned char>(s[p]))) {
      ns += (s[p] - '0') * scale;
      scale /= 10;
      ++p;
    }
  }
  if (p < s.size() && s[p] == ' ' && p + 1 < s.size() && tz_char(s[p + 1])) {
    size_t q = p + 1;
    while (q < s.size() && tz_char(s[q])) ++q;
    std::string_view zone = s.substr(p + 1, q - p - 1);
    if ((zone[0] == '+' || zone[0] == '-') && zone.size() >= 3 && digits(zone, 1, 2)) {
      int off = num(zone, 1, 2) * 3600;
      if (zone.size() >= 5 && digits(zone, 3, 2)) off += num(zone, 3, 2) * 60;
      secs -= zone[0] == '+' ? off : -off;
    }
    p = q;
  } else if (with_zone) {
    return std::nullopt;
  }
  len = p;
  return secs * 1'000'000'000 + ns;
}

// Seconds since the epoch, "1764758886.190" (%n).
std::optional<int64_t> parse_epoch_prefix(std::string_view s, size_t& len) {
  size_t p = 0;
  int64_t secs = 0;
  while (p < s.size() && std::isdigit(static_cast<unsigned char>(s[p]))) secs = secs * 10 + (s[p++] - '0');
  if (p == 0) return std::nullopt;
  int64_t ns = 0;
  if (p < s.size() && s[p] == '.') {
    ++p;
    int64_t scale = 100'000'000;
    while (p < s.size() && std::isdigit(static_cast<unsigned char>(s[p]))) {
      ns += (s[p++] - '0') * scale;
      scale /= 10;
    }
  }
  len = p;
  return secs * 1'000'000'000 + ns;
}

}  // namespace

std::optional<int64_t> parse_log_time(std::string_view s) {
  size_t len = 0;
  if (auto t = parse_time_prefix(s, len, false); t && len == s.size()) return t;
  if (auto t = parse_epoch_prefix(s, len); t && len == s.size()) return t;
  return std::nullopt;
}

namespace {

// One logged message with the lines that belong to it.
struct Entry {
  int64_t ts = 0;  // ns since the epoch; 0 unknown
  int32_t pid = 0;
  std::string session_id, user, database, app, client;
  std::string severity, sqlstate, message, detail, statement;
  uint64_t line = 0;

  void clear() {
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
};

// Severity words of a stderr line, main messages first.
constexpr std::string_view kMain[] = {"LOG", "ERROR", "FATAL", "PANIC", "WARNING", "NOTICE", "INFO",
                                      "DEBUG", "DEBUG1", "DEBUG2", "DEBUG3", "DEBUG4", "DEBUG5"};
constexpr std::string_view kExtra[] = {"DETAIL", "HINT", "STATEMENT", "CONTEXT", "QUERY", "LOCATION"};

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

// A compiled log_line_prefix.
class Prefix {
 public:
  explicit Prefix(const std::string& spec) : spec_(spec) {
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
  const std::string& spec() const { return spec_; }
  bool has(char esc) const {
    return std::any_of(toks_.begin(), toks_.end(), [&](const Tok& t) { return t.esc == esc; });
  }

  // Matches the prefix at the start of `line`; on success fills `e`'s prefix
  // fields and returns the offset of the severity word.
  std::optional<size_t> match(std::string_view line, Entry& e) const {
    Entry tmp;
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

 private:
  struct Tok {
    char esc = 0;  // 0: literal
    std::string text;
    size_t left_width = 0;  // %-N: spaces after a shorter value
  };
  std::string spec_;
  std::vector<Tok> toks_;
  bool has_q_ = false;

  void literal(char c) {
    if (toks_.empty() || toks_.back().esc != 0) toks_.push_back(Tok{});
    toks_.back().text += c;
  }

  static size_t take(const Entry& tmp, Entry& e, size_t end) {
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

  static std::string_view trim(std::string_view v) {
    while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
    while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
    return v;
  }

  static void assign(char esc, std::string_view v, Entry& e) {
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
  static std::optional<size_t> typed(char esc, std::string_view s, Entry& e) {
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
          e.pid = static_cast<int32_t>(std::strtol(std::string(v.substr(0, n)).c_str(), nullptr, 10));
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

  // Invariant: toks_[i..end) must match line[pos..) and be followed by a
  // severity word.
  bool match_from(std::string_view line, size_t pos, size_t i, size_t end, Entry& e, size_t& out) const {
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
};

// Lines of a gzip'd or plain file, or of a string.
class LineSource {
 public:
  explicit LineSource(const std::string& path) : name_(path) {
    gz_ = gzopen(path.c_str(), "rb");
    if (!gz_) throw InputError(errno_message(path, errno ? errno : ENOMEM));
    gzbuffer(gz_, 256 * 1024);
  }
  LineSource(const std::string& text, const std::string& name) : name_(name), text_(text) {}
  ~LineSource() {
    if (gz_) gzclose(gz_);
  }
  // The next line without its '\n'; false at the end. `complete` is false for
  // a last line without '\n'.
  bool next(std::string& line, bool& complete) {
    line.clear();
    if (!gz_) {
      if (pos_ >= text_.size()) return false;
      size_t nl = text_.find('\n', pos_);
      complete = nl != std::string::npos;
      if (!complete) nl = text_.size();
      line.assign(text_, pos_, nl - pos_);
      pos_ = nl + 1;
      ++lineno_;
      return true;
    }
    for (;;) {
      if (bpos_ < blen_) {
        const char* start = buf_ + bpos_;
        const char* nl = static_cast<const char*>(std::memchr(start, '\n', blen_ - bpos_));
        if (nl) {
          line.append(start, static_cast<size_t>(nl - start));
          bpos_ += static_cast<size_t>(nl - start) + 1;
          complete = true;
          ++lineno_;
          return true;
        }
        line.append(start, blen_ - bpos_);
        bpos_ = blen_;
      }
      if (!fill()) {
        if (line.empty()) return false;
        complete = false;
        ++lineno_;
        return true;
      }
    }
  }
  uint64_t lineno() const { return lineno_; }
  // Binary input: `n` bytes into `out`; false if the input ends first.
  bool read_bytes(void* out, size_t n) {
    char* p = static_cast<char*>(out);
    while (n > 0) {
      if (!gz_) {
        if (pos_ >= text_.size()) return false;
        size_t k = std::min(n, text_.size() - pos_);
        std::memcpy(p, text_.data() + pos_, k);
        pos_ += k, p += k, n -= k, offset_ += k;
        continue;
      }
      if (bpos_ >= blen_ && !fill()) return false;
      size_t k = std::min(n, blen_ - bpos_);
      std::memcpy(p, buf_ + bpos_, k);
      bpos_ += k, p += k, n -= k, offset_ += k;
    }
    return true;
  }
  bool at_end() {
    if (!gz_) return pos_ >= text_.size();
    return bpos_ >= blen_ && !fill();
  }
  uint64_t offset() const { return offset_; }
  // A NUL among the first bytes: not log text (a pgreplay replay file).
  bool looks_binary() {
    if (!gz_) return text_.substr(0, 64).find('\0') != std::string::npos;
    if (bpos_ >= blen_ && !fill()) return false;
    return std::memchr(buf_ + bpos_, 0, std::min<size_t>(64, blen_ - bpos_)) != nullptr;
  }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  gzFile gz_ = nullptr;
  std::string text_;
  size_t pos_ = 0;
  char buf_[64 * 1024];
  size_t bpos_ = 0, blen_ = 0;
  uint64_t lineno_ = 0;
  uint64_t offset_ = 0;  // bytes taken by read_bytes()

  // Refills the buffer; false at the end of the input.
  bool fill() {
    int n = gzread(gz_, buf_, sizeof buf_);
    if (n < 0) {
      int err = 0;
      const char* msg = gzerror(gz_, &err);
      throw InputError(name_ + ": line " + std::to_string(lineno_ + 1) + ": " +
                       (err == Z_ERRNO ? std::strerror(errno) : msg));
    }
    bpos_ = 0;
    blen_ = static_cast<size_t>(n);
    return n > 0;
  }
};

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string lower_keyword_text(std::string_view sql) {
  std::string out;
  size_t i = 0;
  for (;;) {  // skip blanks and comments
    while (i < sql.size() && std::isspace(static_cast<unsigned char>(sql[i]))) ++i;
    if (sql.substr(i, 2) == "--") {
      while (i < sql.size() && sql[i] != '\n') ++i;
    } else if (sql.substr(i, 2) == "/*") {
      size_t e = sql.find("*/", i + 2);
      i = e == std::string_view::npos ? sql.size() : e + 2;
    } else {
      break;
    }
  }
  for (; i < sql.size() && out.size() < 40; ++i)
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(sql[i])));
  return out;
}

bool keyword(std::string_view norm, std::string_view k) {
  if (!starts_with(norm, k)) return false;
  if (norm.size() == k.size()) return true;
  unsigned char c = static_cast<unsigned char>(norm[k.size()]);
  return !(std::isalnum(c) || c == '_');
}

// The statements of a query string, split at semicolons outside quotes and
// comments.
std::vector<std::string_view> split_statements(std::string_view sql) {
  std::vector<std::string_view> out;
  size_t start = 0;
  char quote = 0;
  for (size_t i = 0; i < sql.size(); ++i) {
    char c = sql[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '-' && i + 1 < sql.size() && sql[i + 1] == '-') {
      while (i < sql.size() && sql[i] != '\n') ++i;
    } else if (c == ';') {
      out.push_back(sql.substr(start, i - start));
      start = i + 1;
    }
  }
  if (sql.find_first_not_of(" \t\r\n", start) != std::string_view::npos) out.push_back(sql.substr(start));
  return out;
}

// The transaction status after `sql` ran from `status` ('I', 'T', 'E'),
// failing or not.
char next_status(char status, std::string_view sql, bool failed) {
  const char before = status;
  bool opened = false;
  for (std::string_view st : split_statements(sql)) {
    std::string n = lower_keyword_text(st);
    if (keyword(n, "begin") || keyword(n, "start")) {
      if (status == 'I') status = 'T', opened = true;
    } else if (keyword(n, "rollback") || keyword(n, "abort")) {
      bool to_savepoint = n.find(" to ") != std::string::npos || keyword(n, "rollback to");
      if (to_savepoint) {
        if (status == 'E') status = 'T';
      } else {
        status = 'I';
      }
    } else if (keyword(n, "commit") || keyword(n, "end")) {
      if (n.find("prepared") == std::string::npos) status = 'I';
    } else if (keyword(n, "prepare") && n.find("transaction") != std::string::npos) {
      status = 'I';
    }
  }
  if (failed) {
    // An error inside a transaction block fails it; in autocommit (or in a
    // block the same query opened implicitly) nothing stays open.
    if (before == 'T' || before == 'E' || opened) return 'E';
    return 'I';
  }
  return status;
}

// "$1 = '5', $2 = NULL" -> values (nullopt for NULL). False if malformed.
bool parse_parameters(std::string_view s, std::vector<std::optional<std::string>>& out) {
  out.clear();
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] != '$') return false;
    size_t eq = s.find(" = ", i);
    if (eq == std::string_view::npos) return false;
    i = eq + 3;
    if (s.substr(i, 4) == "NULL") {
      out.emplace_back(std::nullopt);
      i += 4;
    } else if (i < s.size() && s[i] == '\'') {
      std::string v;
      ++i;
      for (;;) {
        if (i >= s.size()) return false;
        if (s[i] == '\'') {
          if (i + 1 < s.size() && s[i + 1] == '\'') {
            v += '\'';
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        v += s[i++];
      }
      out.emplace_back(std::move(v));
    } else {
      return false;
    }
    if (i < s.size()) {
      if (s.substr(i, 2) != ", ") return false;
      i += 2;
    }
  }
  return true;
}

// "key=value key=value" of connection lines.
std::string field(std::string_view msg, std::string_view key) {
  std::string k = std::string(key) + "=";
  size_t p = 0;
  while ((p = msg.find(k, p)) != std::string_view::npos) {
    if (p == 0 || msg[p - 1] == ' ') {
      size_t b = p + k.size();
      size_t e = msg.find(' ', b);
      return std::string(msg.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b));
    }
    p += k.size();
  }
  return {};
}

}  // namespace

struct LogCapture::Impl {
  LogOptions opts;
  OpenWriter open;
  trace::Writer* w = nullptr;
  int64_t base = 0;  // realtime of trace ts 0
  LogStats st;
  std::optional<Prefix> prefix;
  uint64_t next_session = 1;

  struct Sess {
    uint64_t id = 0;
    bool begun = false;
    bool excluded = false;
    char status = 'I';
    std::string client;  // from "connection received"
    // The unit sent and not yet answered.
    bool open = false;
    std::string sql;
    Nanos sent = 0, done = 0;
    bool failed = false;
    // Logged at its completion (log_min_duration_statement): an error
    // after it is another statement's.
    bool completed = false;
    bool stmts_since_idle = false;
    std::unordered_map<std::string, std::string> prepared;
  };
  std::unordered_map<std::string, Sess> sessions;
  std::vector<std::optional<std::string>> params_tmp;
  std::vector<trace::Param> params;

  Impl(const LogOptions& o, OpenWriter op) : opts(o), open(std::move(op)) {
    if (!opts.prefix.empty()) prefix.emplace(opts.prefix);
  }

  trace::Writer& writer(int64_t realtime) {
    if (!w) {
      base = realtime;
      w = &open(realtime);
      w->write(0, 0, trace::Meta{"source", "log"});
      w->write(0, 0, trace::Meta{"log.missing",
                                 "row counts, result sizes, Describe messages, parameter types; "
                                 "statement times at the log's precision"});
    }
    return *w;
  }
  Nanos rel(int64_t ts) { return ts - base; }

  void write(const Sess& s, int64_t ts, const trace::Body& b) { writer(ts).write(rel(ts), s.id, b); }

  void close_unit(Sess& s, int64_t ts) {
    if (!s.open) return;
    char status = next_status(s.status, s.sql, s.failed);
    int64_t at = std::max({s.done, s.sent, std::min(ts, s.done ? s.done : ts)});
    write(s, at, trace::Ready{status});
    s.stmts_since_idle = true;
    if (status == 'I') {
      ++st.transactions;
      s.stmts_since_idle = false;
    }
    s.status = status;
    s.open = false;
    s.failed = false;
    s.done = 0;
  }

  Sess* session_for(const Entry& e, bool create) {
    std::string key = !e.session_id.empty() ? e.session_id : "p" + std::to_string(e.pid);
    auto it = sessions.find(key);
    if (it == sessions.end()) {
      if (!create) return nullptr;
      it = sessions.emplace(key, Sess{}).first;
    }
    return &it->second;
  }

  bool excluded(const std::string& user, const std::string& db) const {
    return (!opts.database.empty() && db != opts.database) || (!opts.user.empty() && user != opts.user);
  }

  void begin(Sess& s, const Entry& e, const std::string& user, const std::string& db,
             const std::string& app, bool unknown_start, int64_t at) {
    s.begun = true;
    if (excluded(user, db)) {
      s.excluded = true;
      return;
    }
    s.id = next_session++;
    trace::SessionBegin b;
    b.user = user;
    b.database = db;
    b.application_name = app;
    std::string client = !s.client.empty() ? s.client : e.client;
    if (client == "[local]") client = "unix";
    b.client_addr = client;
    b.backend_pid = e.pid;
    if (unknown_start) b.flags |= trace::kSessionUnknownStartup;
    if (client == "unix") b.flags |= trace::kSessionUnixSocket;
    write(s, at, b);
    ++st.sessions;
    if (unknown_start) ++st.sessions_unknown_start;
  }

  // The session a statement or error belongs to, begun if the log lacks
  // its start; nullptr when it is filtered out.
  // `at`: when the statement was sent (before a duration line's time).
  Sess* active(const Entry& e, int64_t at) {
    Sess* s = session_for(e, true);
    if (!s->begun) begin(*s, e, e.user, e.database, e.app, true, at);
    if (s->excluded) {
      ++st.filtered;
      return nullptr;
    }
    return s;
  }

  void simple(const Entry& e, std::string_view sql, int64_t sent, int64_t done) {
    Sess* s = active(e, sent);
    if (!s) return;
    close_unit(*s, sent);
    write(*s, sent, trace::Query{sql});
    ++st.queries;
    s->open = true;
    s->sql = sql;
    s->sent = sent;
    s->done = done;
    s->completed = done != 0;
  }

  void execute(const Entry& e, std::string_view rest, int64_t sent, int64_t done) {
    // "[fetch from ]NAME[/PORTAL]: SQL"
    bool fetch = starts_with(rest, "fetch from ");
    if (fetch) rest.remove_prefix(11);
    size_t colon = rest.find(": ");
    if (colon == std::string_view::npos) {
      ++st.other;
      return;
    }
    std::string_view target = rest.substr(0, colon), sql = rest.substr(colon + 2);
    std::string_view name = target, portal;
    if (size_t slash = target.find('/'); slash != std::string_view::npos) {
      name = target.substr(0, slash);
      portal = target.substr(slash + 1);
    }
    if (name == "<unnamed>") name = {};
    params_tmp.clear();
    if (starts_with(e.detail, "parameters: ") &&
        !parse_parameters(std::string_view(e.detail).substr(12), params_tmp)) {
      ++st.unparsed;
      return;
    }
    run_extended(e, name, portal, sql, fetch, sent, done);
  }

  // One execution of `name` (SQL `sql`) with the values in params_tmp.
  void run_extended(const Entry& e, std::string_view name, std::string_view portal, std::string_view sql,
                    bool fetch, int64_t sent, int64_t done) {
    Sess* s = active(e, sent);
    if (!s) return;
    close_unit(*s, sent);
    if (!fetch) {
      auto it = s->prepared.find(std::string(name));
      if (name.empty() || it == s->prepared.end() || it->second != sql) {
        write(*s, sent, trace::Parse{name, sql, {}});
        if (!name.empty()) s->prepared[std::string(name)] = sql;
      }
      params.clear();
      for (const auto& v : params_tmp) {
        trace::Param p;
        p.format = 0;
        p.is_null = !v;
        if (v) p.value = *v;
        params.push_back(p);
      }
      write(*s, sent, trace::Bind{portal, name, params, {}});
    }
    write(*s, sent, trace::Execute{portal, 0});
    write(*s, sent, trace::Sync{});
    ++st.executes;
    s->open = true;
    s->sql = sql;
    s->sent = sent;
    s->done = done;
    s->completed = done != 0;
  }

  void error(const Entry& e) {
    Sess* s = active(e, e.ts);
    if (!s) return;
    if (!s->open || s->completed || (!e.statement.empty() && e.statement != s->sql)) {
      // The statement was not logged before it failed (an error at parse
      // time, or log_min_duration_statement, which logs only completions).
      if (e.statement.empty()) {
        ++st.other;
        return;
      }
      close_unit(*s, e.ts);
      write(*s, e.ts, trace::Query{e.statement});
      ++st.queries;
      ++st.unlogged_statements;
      s->open = true;
      s->sql = e.statement;
      s->sent = e.ts;
      s->done = 0;
      s->completed = false;
    }
    std::string code = e.sqlstate.size() == 5 ? e.sqlstate : std::string();
    write(*s, e.ts, trace::Error{code, e.severity, e.message});
    ++st.errors;
    s->failed = true;
  }

  void end_session(const Entry& e, trace::EndReason why) {
    std::string key = !e.session_id.empty() ? e.session_id : "p" + std::to_string(e.pid);
    auto it = sessions.find(key);
    if (it == sessions.end()) return;
    Sess& s = it->second;
    if (s.begun && !s.excluded) {
      close_unit(s, e.ts);
      write(s, e.ts, trace::SessionEnd{why});
    }
    sessions.erase(it);
  }

  void handle(const Entry& e) {
    ++st.messages;
    if ((opts.begin && e.ts < *opts.begin) || (opts.end && e.ts >= *opts.end)) {
      ++st.outside_window;
      return;
    }
    std::string_view m = e.message;
    if (e.severity == "LOG") {
      if (starts_with(m, "connection received: ")) {
        Sess* s = session_for(e, true);
        std::string host = field(m, "host"), port = field(m, "port");
        s->client = host == "[local]" ? "unix" : port.empty() ? host : host + ":" + port;
        return;
      }
      if (starts_with(m, "connection authorized: ")) {
        Sess* s = session_for(e, true);
        if (s->begun) return;
        std::string user = field(m, "user"), db = field(m, "database"), app = field(m, "application_name");
        begin(*s, e, user.empty() ? e.user : user, db.empty() ? e.database : db, app.empty() ? e.app : app,
              false, e.ts);
        return;
      }
      if (starts_with(m, "disconnection: ")) {
        end_session(e, trace::EndReason::Clean);
        return;
      }
      if (starts_with(m, "statement: ")) {
        simple(e, m.substr(11), e.ts, 0);
        return;
      }
      if (starts_with(m, "execute ")) {
        execute(e, m.substr(8), e.ts, 0);
        return;
      }
      if (starts_with(m, "duration: ")) {
        char* endp = nullptr;
        std::string num_text(m.substr(10, 40));
        double ms = std::strtod(num_text.c_str(), &endp);
        size_t used = static_cast<size_t>(endp - num_text.c_str());
        std::string_view rest = m.substr(10 + used);
        if (used == 0 || !starts_with(rest, " ms")) {
          ++st.unparsed;
          return;
        }
        rest.remove_prefix(3);
        const int64_t dur = static_cast<int64_t>(ms * 1e6);
        ++st.durations;
        if (rest.empty()) {  // the statement was logged by log_statement
          Sess* s = session_for(e, false);
          if (s && s->open) s->done = e.ts;
          return;
        }
        if (starts_with(rest, "  statement: ")) return simple(e, rest.substr(13), e.ts - dur, e.ts);
        if (starts_with(rest, "  execute ")) return execute(e, rest.substr(10), e.ts - dur, e.ts);
        --st.durations;
        ++st.other;  // parse and bind: their execution says all the trace keeps
        return;
      }
      ++st.other;
      return;
    }
    if (e.severity == "ERROR") return error(e);
    if (e.severity == "FATAL" || e.severity == "PANIC") {
      Sess* s = session_for(e, false);
      if (s && s->begun && !s->excluded) {
        std::string code = e.sqlstate.size() == 5 ? e.sqlstate : std::string();
        write(*s, e.ts, trace::Error{code, e.severity, e.message});
        ++st.errors;
        s->failed = true;
        end_session(e, trace::EndReason::ServerClosed);
      } else {
        ++st.other;
      }
      return;
    }
    ++st.other;
  }

  // --- readers -----------------------------------------------------------

  void read_stderr(LineSource& in) {
    std::string line;
    bool complete = true;
    // Entries of each pid (or session) still collecting DETAIL lines.
    std::unordered_map<std::string, Entry> pending;
    std::vector<std::string> order;  // keys of `pending` by first line
    std::string last_key;
    uint64_t matched = 0;
    const uint64_t first_line = in.lineno() + 1;
    auto key_of = [](const Entry& e) { return !e.session_id.empty() ? e.session_id : "p" + std::to_string(e.pid); };
    auto flush = [&](const std::string& key) {
      auto it = pending.find(key);
      if (it == pending.end()) return;
      handle(it->second);
      pending.erase(it);
      order.erase(std::find(order.begin(), order.end(), key));
    };
    Entry e;
    while (in.next(line, complete)) {
      ++st.lines;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!complete) {
        ++st.truncated;
        continue;
      }
      if (!line.empty() && line[0] == '\t') {  // continuation of the last message
        auto it = pending.find(last_key);
        if (it == pending.end()) {
          ++st.unparsed;
          continue;
        }
        Entry& p = it->second;
        std::string& target = !p.statement.empty() ? p.statement : !p.detail.empty() ? p.detail : p.message;
        target += '\n';
        target.append(line, 1);
        continue;
      }
      e.clear();
      std::optional<size_t> at;
      if (!prefix) {
        for (const char* spec : kDefaultPrefixes) {
          Prefix cand(spec);
          if ((at = cand.match(line, e))) {
            prefix.emplace(cand);
            break;
          }
        }
      } else {
        at = prefix->match(line, e);
      }
      if (!at) {
        if (line.empty()) continue;
        if (matched == 0 && in.lineno() - first_line >= 20) {
          throw InputError(in.name() + ":" + std::to_string(first_line) + ": no line of the first " +
                           std::to_string(in.lineno() - first_line + 1) + " matches log_line_prefix " +
                           (prefix ? "'" + prefix->spec() + "'"
                                   : std::string("'%m [%p] ', '%t:%r:%u@%d:[%p]:' or '%m|%u|%d|%c|'")) +
                           " (give the server's with --log-line-prefix)");
        }
        ++st.unparsed;
        continue;
      }
      ++matched;
      bool extra = false;
      std::string_view rest = std::string_view(line).substr(*at);
      size_t w = severity_at(rest, &extra);
      std::string_view word = rest.substr(0, w), text = rest.substr(w + 3);
      std::string key = key_of(e);
      if (extra) {
        // DETAIL / STATEMENT / ...: of the message this process logged last.
        auto it = pending.find(prefix->has('p') || prefix->has('c') ? key : last_key);
        if (it == pending.end()) {
          ++st.unparsed;
          continue;
        }
        if (word == "DETAIL") it->second.detail = text;
        if (word == "STATEMENT") it->second.statement = text;
        last_key = it->first;
        continue;
      }
      flush(key);
      e.severity = word.substr(0, 5) == "DEBUG" ? "DEBUG" : std::string(word);
      e.message = text;
      e.line = in.lineno();
      pending.emplace(key, e);
      order.push_back(key);
      last_key = key;
      // Keep the wait for DETAIL lines short: a process's message and its
      // DETAIL are written together, so older entries of other processes
      // are complete.
      while (order.size() > 64) flush(order.front());
    }
    if (matched == 0 && st.lines > 0 && in.lineno() >= first_line) {
      throw InputError(in.name() + ":" + std::to_string(first_line) + ": no line matches log_line_prefix " +
                       (prefix ? "'" + prefix->spec() + "'"
                               : std::string("'%m [%p] ', '%t:%r:%u@%d:[%p]:' or '%m|%u|%d|%c|'")) +
                       " (give the server's with --log-line-prefix)");
    }
    while (!order.empty()) flush(order.front());
  }

  // One CSV record (it may span lines); false at the end.
  bool csv_record(LineSource& in, std::vector<std::string>& fields, bool& truncated) {
    std::string line;
    bool complete = true;
    fields.clear();
    truncated = false;
    if (!in.next(line, complete)) return false;
    ++st.lines;
    std::string cur;
    bool quoted = false, was_quoted = false;
    size_t i = 0;
    for (;;) {
      if (i >= line.size()) {
        if (quoted) {  // a newline inside a quoted field
          if (!complete || !in.next(line, complete)) {
            truncated = true;
            return true;
          }
          ++st.lines;
          cur += '\n';
          i = 0;
          continue;
        }
        fields.push_back(std::move(cur));
        if (!complete) truncated = true;
        return true;
      }
      char c = line[i++];
      if (quoted) {
        if (c == '"') {
          if (i < line.size() && line[i] == '"') {
            cur += '"';
            ++i;
          } else {
            quoted = false;
          }
        } else {
          cur += c;
        }
      } else if (c == '"' && cur.empty() && !was_quoted) {
        quoted = was_quoted = true;
      } else if (c == ',') {
        fields.push_back(std::move(cur));
        cur.clear();
        was_quoted = false;
      } else if (c != '\r') {
        cur += c;
      }
    }
  }

  void read_csv(LineSource& in) {
    std::vector<std::string> f;
    bool truncated = false;
    uint64_t good = 0;
    Entry e;
    while (true) {
      const uint64_t line = in.lineno() + 1;
      if (!csv_record(in, f, truncated)) break;
      if (truncated) {
        ++st.truncated;
        continue;
      }
      size_t tl = 0;
      std::optional<int64_t> ts = f.empty() ? std::nullopt : parse_time_prefix(f[0], tl, false);
      if (f.size() < 23 || !ts) {
        if (good == 0)
          throw InputError(in.name() + ":" + std::to_string(line) + ": not a csvlog record (" +
                           std::to_string(f.size()) + " fields; PostgreSQL 15 writes 26, starting with a time)");
        ++st.unparsed;
        continue;
      }
      ++good;
      e.clear();
      e.ts = *ts;
      e.user = f[1];
      e.database = f[2];
      e.pid = static_cast<int32_t>(std::strtol(f[3].c_str(), nullptr, 10));
      e.client = f[4];
      e.session_id = f[5];
      e.severity = f[11];
      e.sqlstate = f[12];
      e.message = f[13];
      e.detail = f[14];
      e.statement = f[19];
      e.app = f[22];
      e.line = line;
      handle(e);
    }
  }

  void read_json(LineSource& in) {
    std::string line;
    bool complete = true;
    uint64_t good = 0;
    Entry e;
    auto str = [](const nlohmann::json& j, const char* k) -> std::string {
      auto it = j.find(k);
      if (it == j.end()) return {};
      if (it->is_string()) return it->get<std::string>();
      if (it->is_number()) return it->dump();
      return {};
    };
    while (in.next(line, complete)) {
      ++st.lines;
      if (line.empty()) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      size_t tl = 0;
      std::optional<int64_t> ts;
      if (!j.is_discarded() && j.is_object()) ts = parse_time_prefix(str(j, "timestamp"), tl, false);
      if (!ts) {
        if (!complete) {
          ++st.truncated;
          continue;
        }
        if (good == 0)
          throw InputError(in.name() + ":" + std::to_string(in.lineno()) +
                           ": not a jsonlog record (a JSON object with a \"timestamp\" per line)");
        ++st.unparsed;
        continue;
      }
      ++good;
      e.clear();
      e.ts = *ts;
      e.user = str(j, "user");
      e.database = str(j, "dbname");
      e.pid = static_cast<int32_t>(std::strtol(str(j, "pid").c_str(), nullptr, 10));
      e.client = str(j, "remote_host");
      if (std::string port = str(j, "remote_port"); !port.empty()) e.client += ":" + port;
      e.session_id = str(j, "session_id");
      e.severity = str(j, "error_severity");
      e.sqlstate = str(j, "state_code");
      e.message = str(j, "message");
      e.detail = str(j, "detail");
      e.statement = str(j, "statement");
      e.app = str(j, "application_name");
      e.line = in.lineno();
      handle(e);
    }
  }

  // pgreplay's replay file (pgreplay -f): records of
  //   u32 seconds since 2000-01-01 UTC, u32 microseconds, u64 session id,
  //   u8 type, the type's fields, '\n'
  // in network byte order; a string is a u32 length (0x80000000: NULL) and
  // its bytes. Types: 0 connect (user, database), 1 disconnect, 2 execute
  // (statement), 3 prepare (statement, name), 4 exec_prepared (name, u16
  // count, values), 5 cancel.
  void read_pgreplay(LineSource& in) {
    uint64_t records = 0;
    Entry e;
    std::string user, db, sql, name;
    std::unordered_map<std::string, std::unordered_map<std::string, std::string>> prepared;  // session -> name -> sql
    auto u32 = [&](uint32_t& v) {
      unsigned char b[4];
      if (!in.read_bytes(b, 4)) return false;
      v = (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | b[3];
      return true;
    };
    auto string = [&](std::string& out, bool& is_null) {
      uint32_t len;
      if (!u32(len)) return false;
      out.clear();
      is_null = len == 0x80000000u;
      if (is_null) return true;
      if (len > (1u << 30)) return false;
      out.resize(len);
      return len == 0 || in.read_bytes(out.data(), len);
    };
    for (;;) {
      const uint64_t at = in.offset();
      uint32_t secs, usecs, hi, lo;
      unsigned char type = 0, nl = 0;
      bool null = false;
      if (!in.at_end() && u32(secs)) {
        bool ok = u32(usecs) && u32(hi) && u32(lo) && in.read_bytes(&type, 1) && type <= 5;
        e.clear();
        if (ok) {
          e.ts = (int64_t(secs) + 946'684'800) * 1'000'000'000 + int64_t(usecs) * 1000;
          char id[24];
          std::snprintf(id, sizeof id, "%x.%x", hi, lo);
          e.session_id = id;
          e.severity = "LOG";
          e.line = records + 1;
          switch (type) {
            case 0: ok = string(user, null) && string(db, null); break;
            case 2: ok = string(sql, null); break;
            case 3: ok = string(sql, null) && string(name, null); break;
            case 4: {
              ok = string(name, null);
              unsigned char c[2];
              ok = ok && in.read_bytes(c, 2);
              params_tmp.clear();
              for (unsigned n = ok ? (c[0] << 8 | c[1]) : 0; ok && n > 0; --n) {
                std::string v;
                ok = string(v, null);
                if (null) params_tmp.emplace_back(std::nullopt);
                else params_tmp.emplace_back(std::move(v));
              }
              break;
            }
            default: break;
          }
          ok = ok && in.read_bytes(&nl, 1) && nl == '\n';
        }
        if (!ok) {
          if (records == 0)
            throw InputError(in.name() + ": byte " + std::to_string(at) +
                             ": not a pgreplay replay file record (pgreplay -f writes them)");
          ++st.truncated;  // the rest cannot be framed
          break;
        }
      } else if (in.at_end()) {
        break;
      } else {
        ++st.truncated;
        break;
      }
      ++records;
      ++st.lines;
      ++st.messages;
      if ((opts.begin && e.ts < *opts.begin) || (opts.end && e.ts >= *opts.end)) {
        ++st.outside_window;
        continue;
      }
      switch (type) {
        case 0: {
          Sess* s = session_for(e, true);
          if (!s->begun) begin(*s, e, user, db, "", false, e.ts);
          break;
        }
        case 1:
          end_session(e, trace::EndReason::Clean);
          prepared.erase(e.session_id);
          break;
        case 2: simple(e, sql, e.ts, 0); break;
        case 3: prepared[e.session_id][name] = sql; break;
        case 4: {
          auto& names = prepared[e.session_id];
          auto it = names.find(name);
          if (it == names.end()) {
            ++st.unparsed;  // executed without its prepare in the file
            break;
          }
          run_extended(e, name, {}, it->second, false, e.ts, 0);
          break;
        }
        default: ++st.other; break;  // cancel requests
      }
    }
  }

  void read(LineSource& in, LogFormat f) {
    ++st.files;
    if (f == LogFormat::Auto && in.looks_binary()) f = LogFormat::Pgreplay;
    if (f == LogFormat::Pgreplay) return read_pgreplay(in);
    if (f == LogFormat::Auto) {
      const std::string& n = in.name();
      auto ends = [&](std::string_view s) {
        return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
      };
      f = ends(".csv") || ends(".csv.gz") ? LogFormat::Csv
          : ends(".json") || ends(".json.gz") ? LogFormat::Json
                                               : LogFormat::Stderr;
    }
    if (f == LogFormat::Csv) return read_csv(in);
    if (f == LogFormat::Json) return read_json(in);
    if ((!opts.database.empty() || !opts.user.empty()) && prefix) {
      if (!opts.database.empty() && !prefix->has('d'))
        throw InputError("log_line_prefix '" + prefix->spec() + "' has no %d: the database of a session is "
                         "known only from its connection lines");
    }
    read_stderr(in);
  }

  LogStats finish() {
    for (auto& [key, s] : sessions) {
      if (!s.begun || s.excluded) continue;
      int64_t at = std::max(s.sent, s.done);
      close_unit(s, at);
      write(s, at, trace::SessionEnd{trace::EndReason::CaptureEnd});
    }
    sessions.clear();
    if (!w) {
      timespec now{};
      ::clock_gettime(CLOCK_REALTIME, &now);
      writer(int64_t(now.tv_sec) * 1'000'000'000 + now.tv_nsec);
    }
    if (prefix) st.prefix = prefix->spec();
    return st;
  }
};

LogCapture::LogCapture(const LogOptions& opts, OpenWriter open)
    : impl_(std::make_unique<Impl>(opts, std::move(open))) {}
LogCapture::~LogCapture() = default;

void LogCapture::read_file(const std::string& path) {
  LineSource in(path);
  impl_->read(in, impl_->opts.format);
}

void LogCapture::read_text(const std::string& text, const std::string& name, LogFormat format) {
  LineSource in(text, name);
  impl_->read(in, format);
}

LogStats LogCapture::finish() { return impl_->finish(); }

}  // namespace tierlab::capture
