// The readers of `tierlab capture log`: stderr (log_line_prefix), csvlog,
// jsonlog and pgreplay replay files, each turning its input into Entry
// values for handle() (log_session.cpp).
#include "capture/log_internal.h"

#include "common/error.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cstdio>
#include <cstring>

namespace tierlab::capture {

using logimpl::Entry;
using logimpl::LogSource;
using logimpl::OwnedEntry;
using logimpl::Prefix;
using logimpl::TextMap;
using logimpl::parse_time_prefix;
using logimpl::severity_at;

void LogCapture::Impl::read_stderr(LogSource& in) {
  std::string_view line;
  bool complete = true;
  // Entries of each pid (or session) still collecting DETAIL lines.
  std::unordered_map<std::string, OwnedEntry> pending;
  std::vector<std::string> order;  // keys of `pending` by first line
  std::string last_key;
  uint64_t matched = 0;
  const uint64_t first_line = in.lineno() + 1;
  auto key_of = [](const OwnedEntry& e) { return !e.session_id.empty() ? e.session_id : "p" + std::to_string(e.pid); };
  auto flush = [&](const std::string& key) {
    auto it = pending.find(key);
    if (it == pending.end()) return;
    handle(it->second.view());
    pending.erase(it);
    order.erase(std::find(order.begin(), order.end(), key));
  };
  OwnedEntry e;
  while (in.next(line, complete)) {
    ++st.lines;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
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
      OwnedEntry& p = it->second;
      std::string& target = !p.statement.empty() ? p.statement : !p.detail.empty() ? p.detail : p.message;
      target += '\n';
      target.append(line.substr(1));
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
    std::string_view rest = line.substr(*at);
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

namespace {

// One csvlog record: its fields (views into the input, or into `scratch`
// for a field with doubled quotes), the bytes it takes with its newline and
// the newlines in it.
struct CsvRecord {
  static constexpr size_t kMaxFields = 32;
  std::string_view f[kMaxFields];
  size_t fields = 0;  // fields in the record; the first kMaxFields are in f
  size_t used = 0;
  uint64_t newlines = 0;
};

// Parses the record at the start of `in`. False if `in` ends before the
// record does. `scratch` must hold in.size() bytes: a field's unquoted text
// is never longer than the field.
bool parse_csv_record(std::string_view in, CsvRecord& r, char* scratch) {
  const char* d = in.data();
  const size_t n = in.size();
  size_t i = 0, w = 0;
  r.fields = 0;
  r.newlines = 0;
  for (;;) {
    std::string_view field;
    if (i < n && d[i] == '"') {
      const size_t s = i + 1;
      const void* q = std::memchr(d + s, '"', n - s);
      if (!q) return false;
      size_t e = static_cast<size_t>(static_cast<const char*>(q) - d);
      if (e + 1 >= n) return false;  // "" or the end: the next byte tells
      bool copied = false;
      if (d[e + 1] != '"') {
        field = {d + s, e - s};
        i = e + 1;
      } else {  // doubled quotes: the field's text is unquoted into scratch
        const size_t from = w;
        size_t k = s;
        for (;;) {
          q = std::memchr(d + k, '"', n - k);
          if (!q) return false;
          e = static_cast<size_t>(static_cast<const char*>(q) - d);
          if (e + 1 >= n) return false;
          std::memcpy(scratch + w, d + k, e - k);
          w += e - k;
          if (d[e + 1] != '"') break;
          scratch[w++] = '"';
          k = e + 2;
        }
        i = e + 1;
        field = {scratch + from, w - from};
        copied = true;
      }
      if (const void* nl = std::memchr(d + s, '\n', i - s))  // most fields are one line
        r.newlines += static_cast<uint64_t>(std::count(static_cast<const char*>(nl), d + i, '\n'));
      if (d[i] != ',' && d[i] != '\n') {
        // Text after the closing quote belongs to the field, as it is
        // (but for a CR); a quote there is an ordinary character.
        if (!copied) {
          std::memcpy(scratch + w, field.data(), field.size());
          field = {scratch + w, field.size()};
          w += field.size();
        }
        const size_t from = static_cast<size_t>(field.data() - scratch);
        for (; i < n && d[i] != ',' && d[i] != '\n'; ++i)
          if (d[i] != '\r') scratch[w++] = d[i];
        if (i >= n) return false;
        field = {scratch + from, w - from};
      }
    } else {
      const size_t s = i;
      bool cr = false;
      for (; i < n && d[i] != ',' && d[i] != '\n'; ++i) cr |= d[i] == '\r';
      if (i >= n) return false;
      field = {d + s, i - s};
      if (cr) {  // CRs are dropped (CRLF line ends)
        const size_t from = w;
        for (char c : field)
          if (c != '\r') scratch[w++] = c;
        field = {scratch + from, w - from};
      }
    }
    if (r.fields < CsvRecord::kMaxFields) r.f[r.fields] = field;
    ++r.fields;
    if (d[i] == ',') {
      ++i;
      continue;
    }
    // Invariant: d[i] is the record's '\n'.
    assert(d[i] == '\n');
    ++r.newlines;
    r.used = i + 1;
    return true;
  }
}

// Timestamps of consecutive records, which mostly share their second:
// the date and time of day are parsed when they change.
class LogTime {
 public:
  std::optional<int64_t> parse(std::string_view s) {
    // "YYYY-MM-DD HH:MM:SS.mmm ZONE": the same up to the fraction as before.
    const std::string_view l = last_;
    if (s.size() == l.size() && s.size() > 24 && s.substr(0, 19) == l.substr(0, 19) && s.substr(23) == l.substr(23) &&
        digit(s[20]) && digit(s[21]) && digit(s[22]))
      return base_ + ((s[20] - '0') * 100 + (s[21] - '0') * 10 + (s[22] - '0')) * int64_t{1'000'000};
    size_t len = 0;
    std::optional<int64_t> t = parse_time_prefix(s, len, false);
    if (t && len == s.size() && s.size() > 24 && s[19] == '.' && s[23] == ' ') {
      last_.assign(s);
      base_ = *t - ((s[20] - '0') * 100 + (s[21] - '0') * 10 + (s[22] - '0')) * int64_t{1'000'000};
    } else {
      last_.clear();
    }
    return t;
  }

 private:
  std::string last_;  // the last timestamp with milliseconds
  int64_t base_ = 0;  // its time without them
  static bool digit(char c) { return c >= '0' && c <= '9'; }
};

int32_t parse_pid(std::string_view s) {
  int32_t v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

}  // namespace

void LogCapture::Impl::read_csv(LogSource& in) {
  CsvRecord r;
  LogTime time;
  std::vector<char> scratch;
  uint64_t good = 0;
  Entry e;
  for (;;) {
    std::string_view win = in.window();
    if (scratch.size() < win.size()) scratch.resize(std::max(win.size(), 2 * scratch.size()));
    if (!parse_csv_record(win, r, scratch.data())) {
      if (in.more()) continue;
      win = in.window();
      if (win.empty()) break;
      // The input ends inside a record: a cut-off last line.
      uint64_t lines = static_cast<uint64_t>(std::count(win.begin(), win.end(), '\n'));
      if (win.back() != '\n') ++lines;
      st.lines += lines;
      in.count_lines(lines);
      in.consume(win.size());
      ++st.truncated;
      break;
    }
    const uint64_t line = in.lineno() + 1;
    in.consume(r.used);
    in.count_lines(r.newlines);
    st.lines += r.newlines;
    std::optional<int64_t> ts = time.parse(r.f[0]);
    if (r.fields < 23 || !ts) {
      if (good == 0)
        throw InputError(in.name() + ":" + std::to_string(line) + ": not a csvlog record (" +
                         std::to_string(r.fields) + " fields; PostgreSQL 15 writes 26, starting with a time)");
      ++st.unparsed;
      continue;
    }
    ++good;
    e.ts = *ts;
    e.user = r.f[1];
    e.database = r.f[2];
    e.pid = parse_pid(r.f[3]);
    e.client = r.f[4];
    e.session_id = r.f[5];
    e.severity = r.f[11];
    e.sqlstate = r.f[12];
    e.message = r.f[13];
    e.detail = r.f[14];
    e.statement = r.f[19];
    e.app = r.f[22];
    e.line = line;
    handle(e);
  }
}

void LogCapture::Impl::read_json(LogSource& in) {
  std::string_view line;
  bool complete = true;
  uint64_t good = 0;
  OwnedEntry e;
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
    nlohmann::json j = nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
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
    handle(e.view());
  }
}

// pgreplay's replay file (pgreplay -f): records of
//   u32 seconds since 2000-01-01 UTC, u32 microseconds, u64 session id,
//   u8 type, the type's fields, '\n'
// in network byte order; a string is a u32 length (0x80000000: NULL) and
// its bytes. Types: 0 connect (user, database), 1 disconnect, 2 execute
// (statement), 3 prepare (statement, name), 4 exec_prepared (name, u16
// count, values), 5 cancel.
void LogCapture::Impl::read_pgreplay(LogSource& in) {
  uint64_t records = 0;
  Entry e;
  std::string user, db, sql, name;
  std::vector<std::string> values;  // of an execution; params views them
  std::vector<bool> nulls;
  TextMap<TextMap<std::string>> prepared;  // session -> name -> sql
  char id[24];                             // the record's session, e.session_id views it
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
    // Grown as the bytes arrive: a record claiming a long string in a short
    // file costs what the file holds, not what it claims.
    for (size_t got = 0; got < len;) {
      const size_t step = std::min<size_t>(len - got, 1u << 20);
      if (out.capacity() < got + step) out.reserve(std::max(out.capacity() * 2, got + step));
      out.resize(got + step);
      if (!in.read_bytes(out.data() + got, step)) return false;
      got += step;
    }
    return true;
  };
  for (;;) {
    const uint64_t at = in.offset();
    uint32_t secs, usecs, hi, lo;
    unsigned char type = 0, nl = 0;
    bool null = false;
    if (!in.at_end() && u32(secs)) {
      bool ok = u32(usecs) && u32(hi) && u32(lo) && in.read_bytes(&type, 1) && type <= 5;
      e = Entry{};
      if (ok) {
        e.ts = (int64_t(secs) + 946'684'800) * 1'000'000'000 + int64_t(usecs) * 1000;
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
            const unsigned count = ok ? (c[0] << 8 | c[1]) : 0;
            if (values.size() < count) values.resize(count);
            nulls.assign(count, false);
            for (unsigned k = 0; ok && k < count; ++k) {
              ok = string(values[k], null);
              nulls[k] = null;
            }
            params.clear();
            for (unsigned k = 0; ok && k < count; ++k) {
              trace::Param p;
              p.is_null = nulls[k];
              if (!p.is_null) p.value = values[k];
              params.push_back(p);
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
        if (auto it = prepared.find(e.session_id); it != prepared.end()) prepared.erase(it);
        break;
      case 2: simple(e, sql, e.ts, 0); break;
      case 3: prepared[std::string(e.session_id)][name] = sql; break;
      case 4: {
        auto& names = prepared[std::string(e.session_id)];
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

void LogCapture::Impl::read(LogSource& in, LogFormat f) {
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
}  // namespace tierlab::capture
