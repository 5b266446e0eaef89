// The sessions' state machine of `tierlab capture log`: one logged message
// (Entry) at a time -> trace records, one open unit per session.
//
// Per message nothing is allocated once the session's strings have grown to
// their size: entries are views, parameters are views into the message (or
// into param_text when quotes were doubled), and sessions and prepared
// statements are looked up by view.
#include "capture/log_internal.h"

#include "common/clock.h"
#include "common/error.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <ctime>

namespace tierlab::capture {

using logimpl::Entry;

namespace {

// `s` begins with the literal `p`: compared inline (a known length), not by
// a call to memcmp per message and word.
template <size_t N>
bool starts_with(std::string_view s, const char (&p)[N]) {
  return s.size() >= N - 1 && std::memcmp(s.data(), p, N - 1) == 0;
}

// ASCII, as the "C" locale tierlab runs in has it, without a call into
// the C library per character.
bool word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// `s` begins with the lower-case word `k` (any case) not followed by a word
// character.
bool keyword(std::string_view s, std::string_view k) {
  if (s.size() < k.size()) return false;
  for (size_t i = 0; i < k.size(); ++i)
    if (lower(s[i]) != k[i]) return false;
  return s.size() == k.size() || !word_char(s[k.size()]);
}

// The lower-case `k` occurs in `s` (any case).
bool contains(std::string_view s, std::string_view k) {
  for (size_t i = 0; i + k.size() <= s.size(); ++i)
    if (keyword(s.substr(i, k.size()), k)) return true;
  return false;
}

// The first 40 characters of a statement after blanks and comments: what
// its kind is told by.
std::string_view keyword_text(std::string_view sql) {
  size_t i = 0;
  for (;;) {  // skip blanks and comments
    while (i < sql.size() && space(sql[i])) ++i;
    if (sql.substr(i, 2) == "--") {
      while (i < sql.size() && sql[i] != '\n') ++i;
    } else if (sql.substr(i, 2) == "/*") {
      size_t e = sql.find("*/", i + 2);
      i = e == std::string_view::npos ? sql.size() : e + 2;
    } else {
      break;
    }
  }
  return sql.substr(i, 40);
}

// Calls fn(statement) for the statements of a query string, split at
// semicolons outside quotes and comments.
template <class Fn>
void each_statement(std::string_view sql, Fn&& fn) {
  // One statement, or one with a ';' and blanks after it only: nothing to
  // split (its kind is told by its start).
  const size_t semi = sql.find(';');
  if (semi == std::string_view::npos || sql.find_first_not_of(" \t\r\n", semi + 1) == std::string_view::npos) {
    if (sql.find_first_not_of(" \t\r\n;") != std::string_view::npos) fn(sql);
    return;
  }
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
      fn(sql.substr(start, i - start));
      start = i + 1;
    }
  }
  if (sql.find_first_not_of(" \t\r\n", start) != std::string_view::npos) fn(sql.substr(start));
}

// The transaction status after `sql` ran from `status` ('I', 'T', 'E'),
// failing or not.
char next_status(char status, std::string_view sql, bool failed) {
  const char before = status;
  bool opened = false;
  each_statement(sql, [&](std::string_view st) {
    std::string_view n = keyword_text(st);
    if (n.empty()) return;
    switch (lower(n[0])) {  // most statements start with none of these
      case 'a': case 'b': case 'c': case 'e': case 'p': case 'r': case 's': break;
      default: return;
    }
    if (keyword(n, "begin") || keyword(n, "start")) {
      if (status == 'I') status = 'T', opened = true;
    } else if (keyword(n, "rollback") || keyword(n, "abort")) {
      bool to_savepoint = contains(n, " to ") || keyword(n, "rollback to");
      if (to_savepoint) {
        if (status == 'E') status = 'T';
      } else {
        status = 'I';
      }
    } else if (keyword(n, "commit") || keyword(n, "end")) {
      if (!contains(n, "prepared")) status = 'I';
    } else if (keyword(n, "prepare") && contains(n, "transaction")) {
      status = 'I';
    }
  });
  if (failed) {
    // An error inside a transaction block fails it; in autocommit (or in a
    // block the same query opened implicitly) nothing stays open.
    if (before == 'T' || before == 'E' || opened) return 'E';
    return 'I';
  }
  return status;
}

// "$1 = '5', $2 = NULL" -> out (views into `s`, or into `text` for values
// with doubled quotes). False if malformed.
bool parse_parameters(std::string_view s, std::vector<trace::Param>& out, std::string& text) {
  out.clear();
  text.clear();
  text.reserve(s.size());  // unquoted values are shorter: views into it stay valid
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] != '$') return false;
    size_t eq = s.find(" = ", i);
    if (eq == std::string_view::npos) return false;
    i = eq + 3;
    trace::Param p;
    p.format = 0;
    if (s.substr(i, 4) == "NULL") {
      p.is_null = true;
      i += 4;
    } else if (i < s.size() && s[i] == '\'') {
      ++i;
      size_t q = s.find('\'', i);
      if (q == std::string_view::npos) return false;
      if (q + 1 >= s.size() || s[q + 1] != '\'') {  // no doubled quote: a view of the message
        p.value = s.substr(i, q - i);
        i = q + 1;
      } else {
        const size_t from = text.size();
        for (;;) {
          if (i >= s.size()) return false;
          if (s[i] == '\'') {
            if (i + 1 < s.size() && s[i + 1] == '\'') {
              text += '\'';
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          text += s[i++];
        }
        p.value = std::string_view(text).substr(from);
      }
    } else {
      return false;
    }
    out.push_back(p);
    if (i < s.size()) {
      if (s.substr(i, 2) != ", ") return false;
      i += 2;
    }
  }
  return true;
}

// "key=value key=value" of connection lines.
std::string_view field(std::string_view msg, std::string_view key) {
  size_t p = 0;
  while ((p = msg.find(key, p)) != std::string_view::npos) {
    if ((p == 0 || msg[p - 1] == ' ') && p + key.size() < msg.size() && msg[p + key.size()] == '=') {
      size_t b = p + key.size() + 1;
      size_t e = msg.find(' ', b);
      return msg.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b);
    }
    p += key.size();
  }
  return {};
}

// The key of a message's session: its session id (%c), else its pid.
std::string_view session_key(const Entry& e, char (&buf)[16]) {
  if (!e.session_id.empty()) return e.session_id;
  buf[0] = 'p';
  auto r = std::to_chars(buf + 1, buf + sizeof buf, e.pid);
  return {buf, static_cast<size_t>(r.ptr - buf)};
}

}  // namespace

LogCapture::Impl::Impl(const LogOptions& o, OpenWriter op) : opts(o), open(std::move(op)) {
  if (!opts.prefix.empty()) prefix.emplace(opts.prefix);
}

trace::Writer& LogCapture::Impl::writer(int64_t realtime) {
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

void LogCapture::Impl::close_unit(Sess& s, int64_t ts) {
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

LogCapture::Impl::Sess* LogCapture::Impl::session_for(const Entry& e, bool create) {
  char buf[16];
  std::string_view key = session_key(e, buf);
  Recent& c = recent[static_cast<uint32_t>(e.pid) % recent.size()];
  if (c.s && c.len == key.size() && std::memcmp(c.key, key.data(), key.size()) == 0) return c.s;
  auto it = sessions.find(key);
  if (it == sessions.end()) {
    if (!create) return nullptr;
    it = sessions.emplace(std::string(key), Sess{}).first;
  }
  if (key.size() <= sizeof c.key) {
    c.s = &it->second;
    c.len = static_cast<uint8_t>(key.size());
    std::memcpy(c.key, key.data(), key.size());
  }
  return &it->second;
}

bool LogCapture::Impl::excluded(std::string_view user, std::string_view db) const {
  return (!opts.database.empty() && db != opts.database) || (!opts.user.empty() && user != opts.user);
}

void LogCapture::Impl::begin(Sess& s, const Entry& e, std::string_view user, std::string_view db,
                             std::string_view app, bool unknown_start, int64_t at) {
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
  std::string_view client = !s.client.empty() ? std::string_view(s.client) : e.client;
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
LogCapture::Impl::Sess* LogCapture::Impl::active(const Entry& e, int64_t at) {
  Sess* s = session_for(e, true);
  if (!s->begun) begin(*s, e, e.user, e.database, e.app, true, at);
  if (s->excluded) {
    ++st.filtered;
    return nullptr;
  }
  return s;
}

void LogCapture::Impl::simple(const Entry& e, std::string_view sql, int64_t sent, int64_t done) {
  Sess* s = active(e, sent);
  if (!s) return;
  close_unit(*s, sent);
  write(*s, sent, trace::Query{sql});
  ++st.queries;
  s->start_unit(sql, sent, done);
}

void LogCapture::Impl::execute(const Entry& e, std::string_view rest, int64_t sent, int64_t done) {
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
  params.clear();
  if (starts_with(e.detail, "parameters: ") && !parse_parameters(e.detail.substr(12), params, param_text)) {
    ++st.unparsed;
    return;
  }
  run_extended(e, name, portal, sql, fetch, sent, done);
}

// One execution of `name` (SQL `sql`) with the values in params_tmp.
void LogCapture::Impl::run_extended(const Entry& e, std::string_view name, std::string_view portal,
                                    std::string_view sql, bool fetch, int64_t sent, int64_t done) {
  Sess* s = active(e, sent);
  if (!s) return;
  close_unit(*s, sent);
  if (!fetch) {
    auto it = name.empty() ? s->prepared.end() : s->prepared.find(name);
    if (name.empty() || it == s->prepared.end() || it->second != sql) {
      write(*s, sent, trace::Parse{name, sql, {}});
      if (!name.empty()) {
        if (it == s->prepared.end()) it = s->prepared.emplace(std::string(name), std::string()).first;
        it->second = sql;
      }
    }
    write(*s, sent, trace::Bind{portal, name, params, {}});
  }
  write(*s, sent, trace::Execute{portal, 0});
  write(*s, sent, trace::Sync{});
  ++st.executes;
  s->start_unit(sql, sent, done);
}

void LogCapture::Impl::error(const Entry& e) {
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
    s->start_unit(e.statement, e.ts, 0);
  }
  std::string_view code = e.sqlstate.size() == 5 ? e.sqlstate : std::string_view();
  write(*s, e.ts, trace::Error{code, e.severity, e.message});
  ++st.errors;
  s->failed = true;
}

void LogCapture::Impl::end_session(const Entry& e, trace::EndReason why) {
  char buf[16];
  auto it = sessions.find(session_key(e, buf));
  if (it == sessions.end()) return;
  Sess& s = it->second;
  if (s.begun && !s.excluded) {
    close_unit(s, e.ts);
    write(s, e.ts, trace::SessionEnd{why});
  }
  for (Recent& c : recent)
    if (c.s == &s) c.s = nullptr;
  sessions.erase(it);
}

void LogCapture::Impl::handle(const Entry& e) {
  ++st.messages;
  if ((opts.begin && e.ts < *opts.begin) || (opts.end && e.ts >= *opts.end)) {
    ++st.outside_window;
    return;
  }
  std::string_view m = e.message;
  if (e.severity == "LOG") {
    if (starts_with(m, "connection received: ")) {
      Sess* s = session_for(e, true);
      std::string_view host = field(m, "host"), port = field(m, "port");
      if (host == "[local]") {
        s->client = "unix";
      } else {
        s->client = host;
        if (!port.empty()) (s->client += ':') += port;
      }
      return;
    }
    if (starts_with(m, "connection authorized: ")) {
      Sess* s = session_for(e, true);
      if (s->begun) return;
      std::string_view user = field(m, "user"), db = field(m, "database"),
                       app = field(m, "application_name");
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
      double ms = 0;
      std::string_view num_text = m.substr(10, 40);
      auto [endp, ec] = std::from_chars(num_text.data(), num_text.data() + num_text.size(), ms);
      size_t used = ec == std::errc() ? static_cast<size_t>(endp - num_text.data()) : 0;
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
      std::string_view code = e.sqlstate.size() == 5 ? e.sqlstate : std::string_view();
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
LogStats LogCapture::Impl::finish() {
  for (auto& [key, s] : sessions) {
    if (!s.begun || s.excluded) continue;
    // A session that sent nothing ends where its last record is (its begin).
    int64_t at = std::max({s.sent, s.done, s.last});
    close_unit(s, at);
    write(s, at, trace::SessionEnd{trace::EndReason::CaptureEnd});
  }
  sessions.clear();
  recent = {};
  if (!w) {
    writer(clock_ns(CLOCK_REALTIME));
  }
  if (prefix) st.prefix = prefix->spec();
  return st;
}
}  // namespace tierlab::capture
