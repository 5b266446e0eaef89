// Private parts of `tierlab capture log` (capture/log.h), shared by its
// source files:
//   log_time.cpp     timestamps as the log writes them;
//   log_prefix.cpp   stderr lines: a compiled log_line_prefix, severity words;
//   log_source.cpp   the input: blocks of a gzip'd or plain file, or a string;
//   log_csv.cpp      csvlog records -> fields;
//   log_json.cpp     jsonlog records -> values;
//   log_read.cpp     the readers: stderr, csvlog, jsonlog, pgreplay files ->
//                    Entry values;
//   log_session.cpp  the sessions' state machine: Entry values -> records.
#pragma once

#include "capture/log.h"
#include "trace/record.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tierlab::capture::logimpl {

// Parses a timestamp at the start of `s`; sets `len` to the characters used.
// with_zone: a " ZONE" must follow (%t, %m, csvlog, jsonlog).
std::optional<int64_t> parse_time_prefix(std::string_view s, size_t& len, bool with_zone);
// Seconds since the epoch, "1764758886.190" (%n).
std::optional<int64_t> parse_epoch_prefix(std::string_view s, size_t& len);

// One logged message with its DETAIL and STATEMENT. The views point into
// the reader's buffer or an OwnedEntry and are valid for one handle() call.
struct Entry {
  int64_t ts = 0;  // ns since the epoch; 0 unknown
  int32_t pid = 0;
  std::string_view session_id, user, database, app, client;
  std::string_view severity, sqlstate, message, detail, statement;
  uint64_t line = 0;
};

// An Entry that owns its text: for readers that gather a message from
// several lines (stderr) or decode it (jsonlog).
struct OwnedEntry {
  int64_t ts = 0;
  int32_t pid = 0;
  std::string session_id, user, database, app, client;
  std::string severity, sqlstate, message, detail, statement;
  uint64_t line = 0;

  void clear();
  Entry view() const;
};

// "WORD:  " at the start of `s` (LOG, ERROR, ..., DETAIL, STATEMENT, ...):
// the word's length, or 0. *extra: the word adds to a message (DETAIL ...).
size_t severity_at(std::string_view s, bool* extra);

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
bool parse_csv_record(std::string_view in, CsvRecord& r, char* scratch);
// The record at the start of `in` if it is plain, as parse_csv_record()
// would parse it: every field either unquoted without a CR, or quoted
// without a quote inside and nothing after the closing quote. False if it
// is not, or if the record does not end within the whole 64-byte blocks of
// `in`: parse_csv_record() then tells. Takes 64 bytes at a time as a bit
// per byte for commas, quotes, newlines and CRs: quoted stretches are a
// prefix XOR of the quote bits, the separators the commas and newlines
// outside them. Fields are views into `in`.
bool parse_csv_plain(std::string_view in, CsvRecord& r);

// The values of one jsonlog record that a trace needs, as its JSON text
// has them (a string unescaped, a number as written; "" for a key not
// there or a true, false or null).
struct JsonRecord {
  enum Key { Timestamp, User, Database, Pid, Host, Port, SessionId, Severity, SqlState, Message, Detail,
             Statement, App, kKeys };
  std::string_view v[kKeys];
};

// Reads `line` if it is a flat JSON object that needs no more than the
// plain reading: ASCII strings without \u escapes, integers, true, false,
// null, no key read twice. Views are into `line` or `scratch`. False if it
// is not: a JSON parser then tells what it is.
bool parse_json_plain(std::string_view line, JsonRecord& r, std::string& scratch);

// A compiled log_line_prefix.
class Prefix {
 public:
  // Throws InputError naming `spec` and an unknown escape.
  explicit Prefix(const std::string& spec);
  const std::string& spec() const { return spec_; }
  bool has(char esc) const;
  // Matches the prefix at the start of `line`; on success fills `e`'s prefix
  // fields and returns the offset of the severity word.
  std::optional<size_t> match(std::string_view line, OwnedEntry& e) const;

 private:
  struct Tok {
    char esc = 0;  // 0: literal
    std::string text;
    size_t left_width = 0;  // %-N: spaces after a shorter value
  };
  std::string spec_;
  std::vector<Tok> toks_;
  bool has_q_ = false;

  void literal(char c);
  bool match_from(std::string_view line, size_t pos, size_t i, size_t end, OwnedEntry& e, size_t& out) const;
};

// The bytes of a gzip'd or plain file, or of a string, read in large
// blocks. Line and block access may be mixed; a view returned by either is
// valid until the next call that reads.
class LogSource {
 public:
  // Throws InputError naming `path` if it cannot be opened.
  explicit LogSource(const std::string& path);
  // `text` must outlive the source.
  LogSource(std::string_view text, const std::string& name);
  ~LogSource();
  LogSource(const LogSource&) = delete;
  LogSource& operator=(const LogSource&) = delete;

  // The next line without its '\n'; false at the end. `complete` is false
  // for a last line without '\n'.
  bool next(std::string_view& line, bool& complete);
  uint64_t lineno() const { return lineno_; }
  // Lines taken through window()/consume(), for lineno().
  void count_lines(uint64_t n) { lineno_ += n; }

  // The bytes read and not consumed yet.
  std::string_view window() const { return {data_ + pos_, len_ - pos_}; }
  void consume(size_t n) { pos_ += n; }
  // Reads more input after the window (keeping it; the buffer grows when
  // the window fills it). False at the end of the input.
  bool more();

  // Binary input: `n` bytes into `out`; false if the input ends first.
  bool read_bytes(void* out, size_t n);
  bool at_end();
  uint64_t offset() const { return offset_; }
  // A NUL among the first bytes: not log text (a pgreplay replay file).
  bool looks_binary();
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  gzFile gz_ = nullptr;  // a gzip'd file, or one read through zlib
  int fd_ = -1;          // a plain file read as it is
  std::vector<char> buf_;          // file input
  const char* data_ = nullptr;     // buf_ or the string
  size_t pos_ = 0, len_ = 0;       // window: data_[pos_, len_)
  uint64_t lineno_ = 0;
  uint64_t offset_ = 0;  // bytes taken by read_bytes()
};

// Hash for maps keyed by std::string and looked up by string_view.
struct TextHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using TextMap = std::unordered_map<std::string, V, TextHash, std::equal_to<>>;

}  // namespace tierlab::capture::logimpl

namespace tierlab::capture {

struct LogCapture::Impl {
  using Entry = logimpl::Entry;

  LogOptions opts;
  OpenWriter open;
  trace::Writer* w = nullptr;
  int64_t base = 0;  // realtime of trace ts 0
  LogStats st;
  std::optional<logimpl::Prefix> prefix;
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
    trace::Nanos sent = 0, done = 0;
    int64_t last = 0;  // the time of its latest record (log time)
    bool failed = false;
    // Logged at its completion (log_min_duration_statement): an error
    // after it is another statement's.
    bool completed = false;
    bool stmts_since_idle = false;
    logimpl::TextMap<std::string> prepared;

    // `sql` was sent at `sent` (and completed at `done`, 0 if not logged).
    void start_unit(std::string_view text, trace::Nanos at, trace::Nanos completion) {
      open = true;
      sql = text;
      sent = at;
      done = completion;
      completed = completion != 0;
    }
  };
  logimpl::TextMap<Sess> sessions;
  // The session each pid (modulo the size) looked up last: most messages
  // find theirs here without hashing their key. Cleared when it ends.
  struct Recent {
    Sess* s = nullptr;
    uint8_t len = 0;
    char key[31];
  };
  std::array<Recent, 64> recent{};
  // The parameters of the execution at hand: views into the message or
  // into param_text (values that had quotes doubled).
  std::vector<trace::Param> params;
  std::string param_text;

  Impl(const LogOptions& o, OpenWriter op);

  // --- log_session.cpp: entries -> records ---
  trace::Writer& writer(int64_t realtime);
  void write(Sess& s, int64_t ts, const trace::Body& b) {
    s.last = std::max(s.last, ts);
    writer(ts).write(ts - base, s.id, b);
  }
  void close_unit(Sess& s, int64_t ts);
  Sess* session_for(const Entry& e, bool create);
  bool excluded(std::string_view user, std::string_view db) const;
  void begin(Sess& s, const Entry& e, std::string_view user, std::string_view db, std::string_view app,
             bool unknown_start, int64_t at);
  Sess* active(const Entry& e, int64_t at);
  void simple(const Entry& e, std::string_view sql, int64_t sent, int64_t done);
  void execute(const Entry& e, std::string_view rest, int64_t sent, int64_t done);
  // One execution of `name` (SQL `sql`) with the values in `params`.
  void run_extended(const Entry& e, std::string_view name, std::string_view portal, std::string_view sql,
                    bool fetch, int64_t sent, int64_t done);
  void error(const Entry& e);
  void end_session(const Entry& e, trace::EndReason why);
  void handle(const Entry& e);
  LogStats finish();

  // --- log_read.cpp: the readers ---
  void read(logimpl::LogSource& in, LogFormat f);
  void read_stderr(logimpl::LogSource& in);
  void read_csv(logimpl::LogSource& in);
  void read_json(logimpl::LogSource& in);
  void read_pgreplay(logimpl::LogSource& in);
};

}  // namespace tierlab::capture
