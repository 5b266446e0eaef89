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
#include <cstdlib>
#include <cstring>


namespace tierlab::capture {

using logimpl::CsvRecord;
using logimpl::Entry;
using logimpl::LogSource;
using logimpl::OwnedEntry;
using logimpl::Prefix;
using logimpl::TextMap;
using logimpl::parse_csv_plain;
using logimpl::parse_json_plain;
using logimpl::parse_csv_record;
using logimpl::parse_time_prefix;
using logimpl::severity_at;

void LogCapture::Impl::read_stderr(LogSource& in) {
  std::string_view line;
  bool complete = true;
  // Entries of each pid (or session) still collecting DETAIL lines, by
  // first line (at most 65): slots reused, so that a message allocates
  // nothing once their strings have grown.
  struct Pending {
    std::string key;
    OwnedEntry e;
  };
  std::vector<Pending> slots;
  std::vector<size_t> order, free_slots;  // indices into slots
  std::string last_key;
  uint64_t matched = 0;
  const uint64_t first_line = in.lineno() + 1;
  auto key_of = [](const OwnedEntry& e) { return !e.session_id.empty() ? e.session_id : "p" + std::to_string(e.pid); };
  // The entry pending for `key`, or nullptr.
  auto find = [&](std::string_view key) -> Pending* {
    for (size_t i : order)
      if (slots[i].key == key) return &slots[i];
    return nullptr;
  };
  auto flush_at = [&](size_t pos) {
    handle(slots[order[pos]].e.view());
    free_slots.push_back(order[pos]);
    order.erase(order.begin() + static_cast<ptrdiff_t>(pos));
  };
  auto flush = [&](std::string_view key) {
    for (size_t pos = 0; pos < order.size(); ++pos)
      if (slots[order[pos]].key == key) return flush_at(pos);
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
      Pending* it = find(last_key);
      if (!it) {
        ++st.unparsed;
        continue;
      }
      OwnedEntry& p = it->e;
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
        // SettingError: the app says which flag gives the server's prefix.
        throw SettingError("log_line_prefix",
                           in.name() + ":" + std::to_string(first_line) + ": no line of the first " +
                               std::to_string(in.lineno() - first_line + 1) + " matches log_line_prefix " +
                               (prefix ? "'" + prefix->spec() + "'"
                                       : std::string("'%m [%p] ', '%t:%r:%u@%d:[%p]:' or '%m|%u|%d|%c|'")));
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
      Pending* it = find(prefix->has('p') || prefix->has('c') ? key : last_key);
      if (!it) {
        ++st.unparsed;
        continue;
      }
      if (word == "DETAIL") it->e.detail = text;
      if (word == "STATEMENT") it->e.statement = text;
      last_key = it->key;
      continue;
    }
    flush(key);
    if (word.substr(0, 5) == "DEBUG") word = "DEBUG";
    e.severity = word;
    e.message = text;
    e.line = in.lineno();
    size_t slot;
    if (free_slots.empty()) {
      slot = slots.size();
      slots.emplace_back();
    } else {
      slot = free_slots.back();
      free_slots.pop_back();
    }
    slots[slot].key = key;
    slots[slot].e = e;
    order.push_back(slot);
    last_key = key;
    // Keep the wait for DETAIL lines short: a process's message and its
    // DETAIL are written together, so older entries of other processes
    // are complete.
    while (order.size() > 64) flush_at(0);
  }
  if (matched == 0 && st.lines > 0 && in.lineno() >= first_line) {
    throw SettingError("log_line_prefix",
                       in.name() + ":" + std::to_string(first_line) + ": no line matches log_line_prefix " +
                           (prefix ? "'" + prefix->spec() + "'"
                                   : std::string("'%m [%p] ', '%t:%r:%u@%d:[%p]:' or '%m|%u|%d|%c|'")));
  }
  while (!order.empty()) flush_at(0);
}

namespace {

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
    if (!parse_csv_plain(win, r) && !parse_csv_record(win, r, scratch.data())) {
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
  // Records read by parse_json_plain() are views (no allocation per line);
  // the others through a JSON document, into `owned`.
  logimpl::JsonRecord jr;
  std::string scratch, client, pid_text;
  OwnedEntry owned;
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
    size_t tl = 0;
    std::optional<int64_t> ts;
    const bool plain = parse_json_plain(line, jr, scratch);
    nlohmann::json j;
    if (plain) {
      ts = parse_time_prefix(jr.v[jr.Timestamp], tl, false);
    } else {
      j = nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
      if (!j.is_discarded() && j.is_object()) ts = parse_time_prefix(str(j, "timestamp"), tl, false);
    }
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
    if (plain) {
      e = Entry{};
      e.ts = *ts;
      e.user = jr.v[jr.User];
      e.database = jr.v[jr.Database];
      pid_text = jr.v[jr.Pid];  // as strtol reads it, below
      e.pid = static_cast<int32_t>(std::strtol(pid_text.c_str(), nullptr, 10));
      client = jr.v[jr.Host];
      if (!jr.v[jr.Port].empty()) (client += ':') += jr.v[jr.Port];
      e.client = client;
      e.session_id = jr.v[jr.SessionId];
      e.severity = jr.v[jr.Severity];
      e.sqlstate = jr.v[jr.SqlState];
      e.message = jr.v[jr.Message];
      e.detail = jr.v[jr.Detail];
      e.statement = jr.v[jr.Statement];
      e.app = jr.v[jr.App];
      e.line = in.lineno();
      handle(e);
      continue;
    }
    owned.clear();
    owned.ts = *ts;
    owned.user = str(j, "user");
    owned.database = str(j, "dbname");
    owned.pid = static_cast<int32_t>(std::strtol(str(j, "pid").c_str(), nullptr, 10));
    owned.client = str(j, "remote_host");
    if (std::string port = str(j, "remote_port"); !port.empty()) owned.client += ":" + port;
    owned.session_id = str(j, "session_id");
    owned.severity = str(j, "error_severity");
    owned.sqlstate = str(j, "state_code");
    owned.message = str(j, "message");
    owned.detail = str(j, "detail");
    owned.statement = str(j, "statement");
    owned.app = str(j, "application_name");
    owned.line = in.lineno();
    handle(owned.view());
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
