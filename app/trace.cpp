// tierlab trace info|dump|export: look inside a trace file.
//
//   tierlab trace info FILE [--json]       counts, time span, bytes per kind
//   tierlab trace dump FILE                one human-readable line per record
//   tierlab trace export FILE --format jsonl|csv|fio-iolog [--out F]
//
// Export formats are classes deriving from Exporter, listed in
// export_formats(): a new format is one more class and one more line there.
#include "app/command.h"
#include "capture/import.h"
#include "common/error.h"
#include "common/units.h"
#include "trace/reader.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fcntl.h>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <vector>

namespace tierlab::app {
namespace {

using namespace tierlab::trace;

// --- output ------------------------------------------------------------------

// Buffered output to stdout or a file created mode 0600 (exports hold SQL and
// parameter values). A closed pipe (`| head`) ends the output quietly.
class Output {
 public:
  explicit Output(const std::string& path) : path_(path.empty() ? "stdout" : path) {
    if (path.empty()) {
      f_ = stdout;
    } else {
      int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
      if (fd < 0) throw InputError(errno_message(path + ": cannot create", errno));
      // A device or FIFO named as the output keeps its mode.
      struct stat st;
      if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::fchmod(fd, 0600) != 0) {
        int err = errno;
        ::close(fd);
        throw InputError(errno_message(path + ": chmod 0600", err));
      }
      f_ = ::fdopen(fd, "w");
      if (!f_) {
        ::close(fd);
        throw RuntimeError(errno_message(path + ": fdopen", errno));
      }
      owned_ = true;
    }
    std::setvbuf(f_, nullptr, _IOFBF, 1 << 16);
  }
  ~Output() {
    if (owned_) std::fclose(f_);
  }

  void write(const std::string& s) {
    if (std::fwrite(s.data(), 1, s.size(), f_) != s.size()) check();
  }
  // False once the reader of a pipe has gone away.
  bool ok() {
    if (std::ferror(f_)) check();
    return !broken_;
  }
  void finish() {
    if (std::fflush(f_) != 0 || std::ferror(f_)) check();
  }

 private:
  void check() {
    if (errno == EPIPE) {
      broken_ = true;
      return;
    }
    throw RuntimeError(errno_message(path_ + ": write", errno));
  }

  std::string path_;
  std::FILE* f_ = nullptr;
  bool owned_ = false;
  bool broken_ = false;
};

// --- formatting helpers -----------------------------------------------------------

void append_u(std::string& s, uint64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  s.append(buf, r.ptr);
}
void append_i(std::string& s, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  s.append(buf, r.ptr);
}
void append_double(std::string& s, double v) {
  char buf[40];
  int n = std::snprintf(buf, sizeof buf, "%.17g", v);
  s.append(buf, static_cast<size_t>(n));
}

const char kHex[] = "0123456789abcdef";

void append_hex(std::string& s, std::string_view v) {
  for (unsigned char c : v) {
    s += kHex[c >> 4];
    s += kHex[c & 15];
  }
}

// Length of a valid UTF-8 sequence at s[i], or 0.
size_t utf8_len(std::string_view s, size_t i) {
  auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return 0;
  return n;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_len(s, i);
    if (!n) return false;
    i += n;
  }
  return true;
}

// "..." with C-style escapes; at most `limit` bytes shown.
void append_quoted(std::string& s, std::string_view v, size_t limit = 200) {
  s += '"';
  size_t shown = std::min(v.size(), limit);
  for (size_t i = 0; i < shown; ++i) {
    unsigned char c = static_cast<unsigned char>(v[i]);
    if (c >= 0x80) {
      size_t n = utf8_len(v, i);
      if (n && i + n <= shown) {
        s.append(v.data() + i, n);
        i += n - 1;
      } else {
        s += "\\x";
        s += kHex[c >> 4];
        s += kHex[c & 15];
      }
      continue;
    }
    switch (c) {
      case '"': s += "\\\""; break;
      case '\\': s += "\\\\"; break;
      case '\n': s += "\\n"; break;
      case '\r': s += "\\r"; break;
      case '\t': s += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          s += "\\x";
          s += kHex[c >> 4];
          s += kHex[c & 15];
        } else {
          s += static_cast<char>(c);
        }
    }
  }
  s += '"';
  if (shown < v.size()) {
    s += "...(";
    append_u(s, v.size());
    s += " bytes)";
  }
}

// JSON string; bytes that are not UTF-8 become U+FFFD.
void append_json(std::string& s, std::string_view v) {
  s += '"';
  for (size_t i = 0; i < v.size();) {
    unsigned char c = static_cast<unsigned char>(v[i]);
    if (c >= 0x80) {
      size_t n = utf8_len(v, i);
      if (n) {
        s.append(v.data() + i, n);
        i += n;
      } else {
        s += "\\ufffd";
        ++i;
      }
      continue;
    }
    switch (c) {
      case '"': s += "\\\""; break;
      case '\\': s += "\\\\"; break;
      case '\n': s += "\\n"; break;
      case '\r': s += "\\r"; break;
      case '\t': s += "\\t"; break;
      default:
        if (c < 0x20) {
          s += "\\u00";
          s += kHex[c >> 4];
          s += kHex[c & 15];
        } else {
          s += static_cast<char>(c);
        }
    }
    ++i;
  }
  s += '"';
}

// CSV field (RFC 4180): quoted when it holds a comma, quote or line break.
void append_csv(std::string& s, std::string_view v) {
  if (v.find_first_of(",\"\r\n") == std::string_view::npos) {
    s.append(v);
    return;
  }
  s += '"';
  for (char c : v) {
    if (c == '"') s += '"';
    s += c;
  }
  s += '"';
}

std::string_view reason_name(EndReason r) {
  switch (r) {
    case EndReason::Clean: return "clean";
    case EndReason::ClientAbort: return "client_abort";
    case EndReason::ServerClosed: return "server_closed";
    case EndReason::ProtocolError: return "protocol_error";
    case EndReason::CaptureEnd: return "capture_end";
    case EndReason::Unknown: return "unknown";
  }
  return "unknown";
}

std::string_view loss_name(LossKind k) {
  switch (k) {
    case LossKind::QueueOverflow: return "queue_overflow";
    case LossKind::PacketDrop: return "packet_drop";
    case LossKind::StreamGap: return "stream_gap";
    case LossKind::EventsLost: return "events_lost";
    case LossKind::Unsupported: return "unsupported";
  }
  return "unknown";
}

void append_io_flags(std::string& s, uint8_t f) {
  static const char* names[] = {"sync", "meta", "fua", "incomplete"};
  bool first = true;
  for (int i = 0; i < 8; ++i) {
    if (!(f & (1u << i))) continue;
    if (!first) s += '|';
    first = false;
    if (i < 4) {
      s += names[i];
    } else {
      s += "bit";
      append_u(s, static_cast<uint64_t>(i));
    }
  }
}

// " offset=.. len=.. latency_us=.. pid=.. [flags=..]" of a block or file
// I/O; a negative latency prints as unknown.
void append_io_fields(std::string& s, uint64_t offset, uint64_t length, Nanos latency_ns, int32_t pid,
                      uint8_t flags) {
  s += " offset=";
  append_u(s, offset);
  s += " len=";
  append_u(s, length);
  if (latency_ns < 0) {
    s += " latency=?";
  } else {
    s += " latency_us=";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(latency_ns) / 1000.0);
    s += buf;
  }
  s += " pid=";
  append_i(s, pid);
  if (flags) {
    s += " flags=";
    append_io_flags(s, flags);
  }
}

void append_device(std::string& s, uint32_t dev) {
  append_u(s, dev >> 20);
  s += ':';
  append_u(s, dev & 0xfffff);
}

std::string_view dir_name(CopyDir d) { return d == CopyDir::In ? "in" : "out"; }

// A Bind parameter as dump shows it: text:'42', binary:x'0102', NULL.
void append_param(std::string& s, const Param& p) {
  if (p.is_null) {
    s += "NULL";
    return;
  }
  if (p.format == 1) {
    s += "binary:x'";
    append_hex(s, p.value.substr(0, 64));
    s += '\'';
    if (p.value.size() > 64) {
      s += "...(";
      append_u(s, p.value.size());
      s += " bytes)";
    }
    return;
  }
  if (p.format == 0) {
    s += "text:";
  } else {
    s += "format";
    append_i(s, p.format);
    s += ':';
  }
  s += '\'';
  for (char c : p.value.substr(0, 200)) {
    if (c == '\'') s += '\'';
    s += c;
  }
  s += '\'';
  if (p.value.size() > 200) {
    s += "...(";
    append_u(s, p.value.size());
    s += " bytes)";
  }
}

// Seconds since the trace's clock origin: "12.345678".
void append_rel(std::string& s, Nanos ts, Nanos origin) {
  Nanos d = ts - origin;
  if (d < 0) {
    s += '-';
    d = -d;
  }
  append_i(s, d / 1'000'000'000);
  char buf[16];
  std::snprintf(buf, sizeof buf, ".%06" PRId64, (d % 1'000'000'000) / 1000);
  s += buf;
}

std::string wall_clock(Nanos realtime_ns) {
  time_t sec = static_cast<time_t>(realtime_ns / 1'000'000'000);
  long usec = static_cast<long>((realtime_ns % 1'000'000'000) / 1000);
  if (usec < 0) {
    --sec;
    usec += 1'000'000;
  }
  struct tm tm;
  gmtime_r(&sec, &tm);
  char buf[64];
  size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%06ld UTC", usec);
  return buf;
}

// --- dump ------------------------------------------------------------------------

void dump_line(std::string& s, const Record& r, Nanos origin) {
  s.clear();
  append_rel(s, r.ts, origin);
  s += " s=";
  append_u(s, r.session);
  s += ' ';
  s.append(kind_name(r.kind()));
  std::visit(
      [&](const auto& b) {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, SessionBegin>) {
          s += " user=";
          append_quoted(s, b.user);
          s += " database=";
          append_quoted(s, b.database);
          s += " application=";
          append_quoted(s, b.application_name);
          s += " client=";
          append_quoted(s, b.client_addr);
          s += " pid=";
          append_i(s, b.backend_pid);
          if (b.flags & kSessionUnknownStartup) s += " unknown_startup";
          if (b.flags & kSessionUnixSocket) s += " unix";
          if (b.flags & kSessionTls) s += " tls";
        } else if constexpr (std::is_same_v<T, SessionEnd>) {
          s += " reason=";
          s.append(reason_name(b.reason));
        } else if constexpr (std::is_same_v<T, Query>) {
          s += " sql=";
          append_quoted(s, b.sql);
        } else if constexpr (std::is_same_v<T, Parse>) {
          s += " stmt=";
          append_quoted(s, b.statement);
          s += " sql=";
          append_quoted(s, b.sql);
          s += " types=[";
          for (size_t i = 0; i < b.param_types.size(); ++i) {
            if (i) s += ',';
            append_u(s, b.param_types[i]);
          }
          s += ']';
        } else if constexpr (std::is_same_v<T, Bind>) {
          s += " portal=";
          append_quoted(s, b.portal);
          s += " stmt=";
          append_quoted(s, b.statement);
          s += " params=[";
          for (size_t i = 0; i < b.params.size(); ++i) {
            if (i) s += ", ";
            append_param(s, b.params[i]);
          }
          s += ']';
          if (!b.result_formats.empty()) {
            s += " result_formats=[";
            for (size_t i = 0; i < b.result_formats.size(); ++i) {
              if (i) s += ',';
              append_i(s, b.result_formats[i]);
            }
            s += ']';
          }
        } else if constexpr (std::is_same_v<T, Execute>) {
          s += " portal=";
          append_quoted(s, b.portal);
          s += " max_rows=";
          append_u(s, b.max_rows);
        } else if constexpr (std::is_same_v<T, Describe> || std::is_same_v<T, Close>) {
          s += b.target == 'P' ? " portal=" : " stmt=";
          append_quoted(s, b.name);
        } else if constexpr (std::is_same_v<T, CopyData>) {
          s += ' ';
          s.append(dir_name(b.dir));
          s += " bytes=";
          append_u(s, b.data.size());
          s += ' ';
          append_quoted(s, b.data, 64);
        } else if constexpr (std::is_same_v<T, CopyDone>) {
          s += ' ';
          s.append(dir_name(b.dir));
        } else if constexpr (std::is_same_v<T, CopyFail>) {
          s += " message=";
          append_quoted(s, b.message);
        } else if constexpr (std::is_same_v<T, Result>) {
          s += " tag=";
          append_quoted(s, b.tag);
          if (b.has_rows) {
            s += " rows=";
            append_u(s, b.rows);
          }
        } else if constexpr (std::is_same_v<T, Error>) {
          s += ' ';
          s.append(b.severity);
          s += ' ';
          s.append(b.sqlstate);
          s += ' ';
          append_quoted(s, b.message);
        } else if constexpr (std::is_same_v<T, Ready>) {
          s += " status=";
          s += b.status;
        } else if constexpr (std::is_same_v<T, BlockIo>) {
          s += ' ';
          s.append(op_name(b.op));
          s += " dev=";
          append_device(s, b.device);
          append_io_fields(s, b.offset, b.length, (b.flags & kIoIncomplete) ? -1 : b.complete_ns - r.ts, b.pid,
                           b.flags);
        } else if constexpr (std::is_same_v<T, FileIo>) {
          s += ' ';
          s.append(op_name(b.op));
          s += " file=";
          append_quoted(s, b.file);
          append_io_fields(s, b.offset, b.length, b.latency_ns, b.pid, b.flags);
        } else if constexpr (std::is_same_v<T, Sample>) {
          s += ' ';
          s.append(b.name);
          s += '=';
          append_double(s, b.value);
        } else if constexpr (std::is_same_v<T, Meta>) {
          s += ' ';
          s.append(b.key);
          s += '=';
          append_quoted(s, b.value);
        } else if constexpr (std::is_same_v<T, Loss>) {
          s += ' ';
          s.append(loss_name(b.what));
          s += " count=";
          append_u(s, b.count);
        }
      },
      r.body);
  s += '\n';
}

// --- export ----------------------------------------------------------------------

// One export format. begin() is called once before the first record, end()
// after the last; each writes into `line`, which the caller outputs.
class Exporter {
 public:
  virtual ~Exporter() = default;
  virtual void begin(std::string& line, const Header&) { line.clear(); }
  virtual void record(std::string& line, const Record& r) = 0;
  virtual void end(std::string& line) { line.clear(); }
};

// jsonl: one JSON object per record, every field. Binary parameter values
// and COPY data that is not UTF-8 are given as hex (value_hex, data_hex).
class JsonlExporter : public Exporter {
 public:
  void record(std::string& s, const Record& r) override {
    s.clear();
    s += "{\"ts_ns\":";
    append_i(s, r.ts);
    s += ",\"session\":";
    append_u(s, r.session);
    s += ",\"kind\":\"";
    s.append(kind_name(r.kind()));
    s += '"';
    auto str = [&](const char* k, std::string_view v) {
      s += ",\"";
      s += k;
      s += "\":";
      append_json(s, v);
    };
    auto num = [&](const char* k, int64_t v) {
      s += ",\"";
      s += k;
      s += "\":";
      append_i(s, v);
    };
    auto unum = [&](const char* k, uint64_t v) {
      s += ",\"";
      s += k;
      s += "\":";
      append_u(s, v);
    };
    std::visit(
        [&](const auto& b) {
          using T = std::decay_t<decltype(b)>;
          if constexpr (std::is_same_v<T, SessionBegin>) {
            str("user", b.user);
            str("database", b.database);
            str("application_name", b.application_name);
            str("client_addr", b.client_addr);
            num("backend_pid", b.backend_pid);
            unum("flags", b.flags);
          } else if constexpr (std::is_same_v<T, SessionEnd>) {
            str("reason", reason_name(b.reason));
          } else if constexpr (std::is_same_v<T, Query>) {
            str("sql", b.sql);
          } else if constexpr (std::is_same_v<T, Parse>) {
            str("statement", b.statement);
            str("sql", b.sql);
            s += ",\"param_types\":[";
            for (size_t i = 0; i < b.param_types.size(); ++i) {
              if (i) s += ',';
              append_u(s, b.param_types[i]);
            }
            s += ']';
          } else if constexpr (std::is_same_v<T, Bind>) {
            str("portal", b.portal);
            str("statement", b.statement);
            s += ",\"params\":[";
            for (size_t i = 0; i < b.params.size(); ++i) {
              const Param& p = b.params[i];
              if (i) s += ',';
              s += "{\"format\":";
              append_i(s, p.format);
              if (p.is_null) {
                s += ",\"value\":null}";
              } else if (p.format == 0 && valid_utf8(p.value)) {
                s += ",\"value\":";
                append_json(s, p.value);
                s += '}';
              } else {
                s += ",\"value_hex\":\"";
                append_hex(s, p.value);
                s += "\"}";
              }
            }
            s += "],\"result_formats\":[";
            for (size_t i = 0; i < b.result_formats.size(); ++i) {
              if (i) s += ',';
              append_i(s, b.result_formats[i]);
            }
            s += ']';
          } else if constexpr (std::is_same_v<T, Execute>) {
            str("portal", b.portal);
            unum("max_rows", b.max_rows);
          } else if constexpr (std::is_same_v<T, Describe> || std::is_same_v<T, Close>) {
            str("target", b.target == 'P' ? "portal" : "statement");
            str("name", b.name);
          } else if constexpr (std::is_same_v<T, CopyData>) {
            str("direction", dir_name(b.dir));
            if (valid_utf8(b.data)) {
              str("data", b.data);
            } else {
              s += ",\"data_hex\":\"";
              append_hex(s, b.data);
              s += '"';
            }
          } else if constexpr (std::is_same_v<T, CopyDone>) {
            str("direction", dir_name(b.dir));
          } else if constexpr (std::is_same_v<T, CopyFail>) {
            str("message", b.message);
          } else if constexpr (std::is_same_v<T, Result>) {
            str("tag", b.tag);
            if (b.has_rows)
              unum("rows", b.rows);
            else
              s += ",\"rows\":null";
          } else if constexpr (std::is_same_v<T, Error>) {
            str("sqlstate", b.sqlstate);
            str("severity", b.severity);
            str("message", b.message);
          } else if constexpr (std::is_same_v<T, Ready>) {
            str("status", std::string_view(&b.status, 1));
          } else if constexpr (std::is_same_v<T, BlockIo>) {
            str("op", op_name(b.op));
            s += ",\"device\":\"";
            append_device(s, b.device);
            s += '"';
            unum("offset", b.offset);
            unum("length", b.length);
            num("complete_ns", b.complete_ns);
            num("latency_ns", b.complete_ns - r.ts);
            unum("flags", b.flags);
            num("pid", b.pid);
          } else if constexpr (std::is_same_v<T, FileIo>) {
            str("op", op_name(b.op));
            str("file", b.file);
            unum("offset", b.offset);
            unum("length", b.length);
            num("latency_ns", b.latency_ns);
            unum("flags", b.flags);
            num("pid", b.pid);
          } else if constexpr (std::is_same_v<T, Sample>) {
            str("name", b.name);
            s += ",\"value\":";
            if (std::isfinite(b.value))
              append_double(s, b.value);
            else
              s += "null";
          } else if constexpr (std::is_same_v<T, Meta>) {
            str("key", b.key);
            str("value", b.value);
          } else if constexpr (std::is_same_v<T, Loss>) {
            str("what", loss_name(b.what));
            unum("count", b.count);
          }
        },
        r.body);
    s += "}\n";
  }
};

constexpr const char* kCsvHelp =
    "csv columns: ts_ns,session,kind,name,detail,extra,text,n1,n2,n3,n4\n"
    "  session_begin name=user detail=database extra=client_addr text=application_name n1=backend_pid n2=flags\n"
    "  session_end   detail=reason\n"
    "  query         text=sql\n"
    "  parse         name=statement text=sql detail=parameter type OIDs (space separated) n1=count\n"
    "  bind          name=statement detail=portal text=parameters as in dump n1=count\n"
    "  execute       detail=portal n1=max_rows\n"
    "  describe/close name=name detail=S|P\n"
    "  copy_data     detail=in|out text=data (\\x + hex when not UTF-8) n1=bytes\n"
    "  copy_done     detail=in|out\n"
    "  copy_fail     text=message\n"
    "  result        name=tag n1=rows (empty without a row count)\n"
    "  error         name=sqlstate detail=severity text=message\n"
    "  ready         detail=status (I|T|E)\n"
    "  block_io      name=device (major:minor) detail=op extra=flags n1=offset n2=length n3=latency_ns n4=pid\n"
    "  file_io       name=file detail=op extra=flags n1=offset n2=length n3=latency_ns n4=pid\n"
    "  sample        name=name n1=value\n"
    "  meta          name=key text=value\n"
    "  loss          detail=what n1=count\n";

// csv: the fixed columns of kCsvHelp, with a header line.
class CsvExporter : public Exporter {
 public:
  void begin(std::string& s, const Header&) override {
    s = "ts_ns,session,kind,name,detail,extra,text,n1,n2,n3,n4\n";
  }
  void record(std::string& s, const Record& r) override {
    s.clear();
    std::string_view name, detail, extra_sv, text;
    tmp_.clear();
    extra_.clear();
    std::string* text_buf = nullptr;
    int64_t n[4] = {};
    int nn = 0;  // numbers present: n[0..nn)
    bool u0 = false;  // n1 is unsigned (offsets, rows)
    uint64_t n0u = 0;
    std::visit(
        [&](const auto& b) {
          using T = std::decay_t<decltype(b)>;
          if constexpr (std::is_same_v<T, SessionBegin>) {
            name = b.user, detail = b.database, extra_sv = b.client_addr, text = b.application_name;
            n[0] = b.backend_pid, n[1] = b.flags, nn = 2;
          } else if constexpr (std::is_same_v<T, SessionEnd>) {
            detail = reason_name(b.reason);
          } else if constexpr (std::is_same_v<T, Query>) {
            text = b.sql;
          } else if constexpr (std::is_same_v<T, Parse>) {
            name = b.statement, text = b.sql;
            for (size_t i = 0; i < b.param_types.size(); ++i) {
              if (i) tmp_ += ' ';
              append_u(tmp_, b.param_types[i]);
            }
            detail = tmp_;
            n[0] = static_cast<int64_t>(b.param_types.size()), nn = 1;
          } else if constexpr (std::is_same_v<T, Bind>) {
            name = b.statement, detail = b.portal;
            for (size_t i = 0; i < b.params.size(); ++i) {
              if (i) tmp_ += ", ";
              append_param(tmp_, b.params[i]);
            }
            text_buf = &tmp_;
            n[0] = static_cast<int64_t>(b.params.size()), nn = 1;
          } else if constexpr (std::is_same_v<T, Execute>) {
            detail = b.portal, n[0] = b.max_rows, nn = 1;
          } else if constexpr (std::is_same_v<T, Describe> || std::is_same_v<T, Close>) {
            name = b.name, detail = b.target == 'P' ? "P" : "S";
          } else if constexpr (std::is_same_v<T, CopyData>) {
            detail = dir_name(b.dir);
            if (valid_utf8(b.data)) {
              text = b.data;
            } else {
              tmp_ = "\\x";
              append_hex(tmp_, b.data);
              text_buf = &tmp_;
            }
            n[0] = static_cast<int64_t>(b.data.size()), nn = 1;
          } else if constexpr (std::is_same_v<T, CopyDone>) {
            detail = dir_name(b.dir);
          } else if constexpr (std::is_same_v<T, CopyFail>) {
            text = b.message;
          } else if constexpr (std::is_same_v<T, Result>) {
            name = b.tag;
            if (b.has_rows) u0 = true, n0u = b.rows, nn = 1;
          } else if constexpr (std::is_same_v<T, Error>) {
            name = b.sqlstate, detail = b.severity, text = b.message;
          } else if constexpr (std::is_same_v<T, Ready>) {
            detail = std::string_view(&b.status, 1);
          } else if constexpr (std::is_same_v<T, BlockIo>) {
            append_device(tmp_, b.device);
            name = tmp_;
            detail = op_name(b.op);
            append_io_flags(extra_, b.flags);
            u0 = true, n0u = b.offset;
            n[1] = b.length, n[2] = b.complete_ns - r.ts, n[3] = b.pid, nn = 4;
          } else if constexpr (std::is_same_v<T, FileIo>) {
            name = b.file, detail = op_name(b.op);
            append_io_flags(extra_, b.flags);
            u0 = true, n0u = b.offset;
            n[1] = b.length, n[2] = b.latency_ns, n[3] = b.pid, nn = 4;
          } else if constexpr (std::is_same_v<T, Sample>) {
            name = b.name;
            append_double(extra_, b.value);
            nn = -1;  // n1 is the double in extra_
          } else if constexpr (std::is_same_v<T, Meta>) {
            name = b.key, text = b.value;
          } else if constexpr (std::is_same_v<T, Loss>) {
            detail = loss_name(b.what);
            u0 = true, n0u = b.count, nn = 1;
          }
        },
        r.body);
    if (!extra_.empty() && nn >= 0) extra_sv = extra_;
    append_i(s, r.ts);
    s += ',';
    append_u(s, r.session);
    s += ',';
    s.append(kind_name(r.kind()));
    s += ',';
    append_csv(s, name);
    s += ',';
    append_csv(s, detail);
    s += ',';
    append_csv(s, extra_sv);
    s += ',';
    append_csv(s, text_buf ? std::string_view(*text_buf) : text);
    if (nn < 0) {
      s += ',';
      s += extra_;
      s += ",,,\n";
      return;
    }
    for (int i = 0; i < 4; ++i) {
      s += ',';
      if (i >= nn) continue;
      if (i == 0 && u0)
        append_u(s, n0u);
      else
        append_i(s, n[i]);
    }
    s += '\n';
  }

 private:
  std::string tmp_, extra_;
};

struct ExportFormat {
  const char* name;
  std::function<std::unique_ptr<Exporter>()> make;
};

const std::vector<ExportFormat>& export_formats() {
  static const std::vector<ExportFormat> formats = {
      {"jsonl", [] { return std::make_unique<JsonlExporter>(); }},
      {"csv", [] { return std::make_unique<CsvExporter>(); }},
  };
  return formats;
}

// --- info ------------------------------------------------------------------------

// printf into `out`.
[[gnu::format(printf, 2, 3)]] void appendf(std::string& out, const char* fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  if (n > 0) {
    size_t at = out.size();
    out.resize(at + static_cast<size_t>(n) + 1);
    std::vsnprintf(out.data() + at, static_cast<size_t>(n) + 1, fmt, ap2);
    out.resize(at + static_cast<size_t>(n));
  }
  va_end(ap2);
}

std::string info_text(const std::string& path, const Header& h, const Summary& s) {
  std::string out;
  const ReadStats& rs = s.read;
  auto line = [&](const char* k, const std::string& v) { appendf(out, "%-22s %s\n", k, v.c_str()); };
  auto count = [&](const char* k, uint64_t v) { line(k, std::to_string(v)); };
  double secs = static_cast<double>(s.duration_ns) / 1e9;
  char buf[256];
  line("trace:", path);
  line("format version:", std::to_string(h.major) + "." + std::to_string(h.minor));
  line("started:", wall_clock(h.start_mono_ns + h.realtime_offset_ns));
  if (s.records) {
    std::snprintf(buf, sizeof buf, "%.6f s, from %s to %s", secs,
                  wall_clock(s.first_ts + h.realtime_offset_ns).c_str(),
                  wall_clock(s.last_ts + h.realtime_offset_ns).c_str());
    line("time span:", buf);
  } else {
    line("time span:", "no records");
  }
  count("sessions:", s.sessions);
  if (secs > 0) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " (%.1f per second)", s.statements,
                  static_cast<double>(s.statements) / secs);
    line("statements:", buf);
    std::snprintf(buf, sizeof buf, "%" PRIu64 " (%.1f per second)", s.transactions,
                  static_cast<double>(s.transactions) / secs);
    line("transactions:", buf);
  } else {
    count("statements:", s.statements);
    count("transactions:", s.transactions);
  }
  count("errors:", s.errors);
  if (secs > 0 && s.block_ios) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " (%.1f per second)", s.block_ios,
                  static_cast<double>(s.block_ios) / secs);
    line("block I/Os:", buf);
  } else {
    count("block I/Os:", s.block_ios);
  }
  count("file I/Os:", s.file_ios);
  count("samples:", s.samples);
  count("lost:", s.lost);
  count("records:", s.records);
  uint64_t raw = 0;
  for (uint64_t b : rs.kind_bytes) raw += b;
  std::snprintf(buf, sizeof buf, "%" PRIu64 " bytes (%s) in %" PRIu64 " chunks, %.2f bytes per record",
                rs.bytes, format_bytes(rs.bytes).c_str(), rs.chunks,
                s.records ? static_cast<double>(rs.bytes) / static_cast<double>(s.records) : 0.0);
  line("size:", buf);
  if (rs.recovered_tail_bytes) {
    std::snprintf(buf, sizeof buf,
                  "%" PRIu64 " bytes (an incomplete last chunk: the writer stopped mid-write; dropped)",
                  rs.recovered_tail_bytes);
    line("recovered tail:", buf);
  } else {
    line("recovered tail:", "0 bytes");
  }
  line("terminated:", rs.terminated ? "yes" : "no (no end record: the writer did not close the trace)");
  if (!s.records) return out;
  appendf(out, "\n%-15s %12s %14s %10s %7s\n", "kind", "records", "bytes", "bytes/rec", "share");
  for (size_t k = 0; k < rs.kind_records.size(); ++k) {
    if (!rs.kind_records[k]) continue;
    appendf(out, "%-15s %12" PRIu64 " %14" PRIu64 " %10.2f %6.1f%%\n",
                std::string(kind_name(static_cast<Kind>(k))).c_str(), rs.kind_records[k], rs.kind_bytes[k],
                static_cast<double>(rs.kind_bytes[k]) / static_cast<double>(rs.kind_records[k]),
                raw ? 100.0 * static_cast<double>(rs.kind_bytes[k]) / static_cast<double>(raw) : 0.0);
  }
  appendf(out, "(bytes per kind are before compression, the strings each kind introduced included;\n"
              " %" PRIu64 " bytes in all, stored as %" PRIu64 ")\n",
              raw, rs.bytes);
  return out;
}

nlohmann::json info_json(const std::string& path, const Header& h, const Summary& s) {
  const ReadStats& rs = s.read;
  nlohmann::json j;
  j["path"] = path;
  j["version"] = std::to_string(h.major) + "." + std::to_string(h.minor);
  j["start_mono_ns"] = h.start_mono_ns;
  j["realtime_offset_ns"] = h.realtime_offset_ns;
  j["start_realtime_ns"] = h.start_mono_ns + h.realtime_offset_ns;
  j["sessions"] = s.sessions;
  j["statements"] = s.statements;
  j["transactions"] = s.transactions;
  j["errors"] = s.errors;
  j["block_ios"] = s.block_ios;
  j["file_ios"] = s.file_ios;
  j["samples"] = s.samples;
  j["lost"] = s.lost;
  j["records"] = s.records;
  j["first_ts_ns"] = s.first_ts;
  j["last_ts_ns"] = s.last_ts;
  j["duration_ns"] = s.duration_ns;
  j["recovered_tail_bytes"] = rs.recovered_tail_bytes;
  j["terminated"] = rs.terminated;
  j["bytes"] = rs.bytes;
  j["chunks"] = rs.chunks;
  nlohmann::json kinds = nlohmann::json::object();
  for (size_t k = 0; k < rs.kind_records.size(); ++k) {
    if (!rs.kind_records[k]) continue;
    kinds[std::string(kind_name(static_cast<Kind>(k)))] = {{"records", rs.kind_records[k]},
                                                           {"bytes", rs.kind_bytes[k]}};
  }
  j["kinds"] = kinds;
  return j;
}

// --- subcommands -----------------------------------------------------------------

struct InfoOptions {
  std::string file;
  bool json = false;
};

void run_info(const InfoOptions& o) {
  auto r = open_reader(o.file);
  Summary s = summarize(*r);
  Output out("");
  if (o.json)
    out.write(info_json(o.file, r->header(), s).dump(2) + "\n");
  else
    out.write(info_text(o.file, r->header(), s));
  out.finish();
}

struct DumpOptions {
  std::string file;
  std::string out;
};

void run_dump(const DumpOptions& o) {
  auto r = open_reader(o.file);
  Output out(o.out);
  std::string line;
  Record rec;
  const Nanos origin = r->header().start_mono_ns;
  uint64_t n = 0;
  while (r->next(rec)) {
    dump_line(line, rec, origin);
    out.write(line);
    if ((++n & 1023) == 0 && !out.ok()) return;
  }
  if (r->stats().recovered_tail_bytes) {
    line = "# recovered tail: " + std::to_string(r->stats().recovered_tail_bytes) +
           " bytes of an incomplete last chunk dropped\n";
    out.write(line);
  }
  if (!r->stats().terminated) out.write("# unterminated: no end record\n");
  out.finish();
}

struct ExportOptions {
  std::string file;
  std::string format;
  std::string out;
  std::string fio_file;  // fio-iolog: name every I/O with this file
  bool allow_device = false;
};

// fio-iolog without --fio-file: every I/O names this file (relative: fio
// creates it in its working directory), never the captured device.
constexpr const char* kFioPlaceholder = "tierlab-replay.img";

std::string read_line(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "re");
  if (!f) return "";
  char buf[256];
  std::string s = std::fgets(buf, sizeof buf, f) ? buf : "";
  std::fclose(f);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// /sys/dev/block/MAJ:MIN of a device number.
std::string sysfs_dev(dev_t d) {
  return "/sys/dev/block/" + std::to_string(major(d)) + ":" + std::to_string(minor(d));
}

std::string dev_name(dev_t d) {
  std::FILE* f = std::fopen((sysfs_dev(d) + "/uevent").c_str(), "re");
  if (f) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, f)) {
      std::string l = buf;
      if (l.rfind("DEVNAME=", 0) == 0) {
        std::fclose(f);
        while (!l.empty() && l.back() == '\n') l.pop_back();
        return "/dev/" + l.substr(8);
      }
    }
    std::fclose(f);
  }
  return std::to_string(major(d)) + ":" + std::to_string(minor(d));
}

// How the block device `d` is in use: "" if it is not mounted (its own
// file system, /proc/self/mountinfo), held (/sys/.../holders: a device
// mapper or md array on it), a swap area (/proc/swaps), or a whole disk with
// a partition that is any of these.
std::string device_use(dev_t d, int depth = 0) {
  const std::string mm = std::to_string(major(d)) + ":" + std::to_string(minor(d));
  if (std::FILE* f = std::fopen("/proc/self/mountinfo", "re")) {
    char buf[4096];
    while (std::fgets(buf, sizeof buf, f)) {
      std::istringstream l(buf);
      std::string id, parent, devno, root, point;
      l >> id >> parent >> devno >> root >> point;
      if (devno == mm) {
        std::fclose(f);
        return dev_name(d) + " is mounted on " + point;
      }
    }
    std::fclose(f);
  }
  if (std::FILE* f = std::fopen("/proc/swaps", "re")) {
    char buf[4096];
    while (std::fgets(buf, sizeof buf, f)) {
      std::istringstream l(buf);
      std::string path;
      l >> path;
      struct stat st{};
      if (::stat(path.c_str(), &st) == 0 && S_ISBLK(st.st_mode) && st.st_rdev == d) {
        std::fclose(f);
        return dev_name(d) + " is a swap area";
      }
    }
    std::fclose(f);
  }
  const std::string sys = sysfs_dev(d);
  std::error_code ec;
  for (const auto& h : std::filesystem::directory_iterator(sys + "/holders", ec))
    return dev_name(d) + " is held by /dev/" + h.path().filename().string();
  if (depth == 0) {
    // A whole disk: each of its partitions (a subdirectory with a "partition" file).
    for (const auto& e : std::filesystem::directory_iterator(sys, ec)) {
      if (!std::filesystem::exists(e.path() / "partition", ec)) continue;
      unsigned maj = 0, min = 0;
      if (std::sscanf(read_line((e.path() / "dev").string()).c_str(), "%u:%u", &maj, &min) != 2) continue;
      std::string why = device_use(makedev(maj, min), 1);
      if (!why.empty()) return dev_name(d) + " holds a partition: " + why;
    }
  }
  return "";
}

// Why fio must not write to `path` (--fio-file): "" if it may. A block
// device in use (device_use), or a file that backs a loop device in use.
std::string fio_file_in_use(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return "";  // fio creates it
  if (S_ISBLK(st.st_mode)) return device_use(st.st_rdev);
  if (!S_ISREG(st.st_mode)) return "";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/block", ec)) {
    std::string backing = read_line((e.path() / "loop/backing_file").string());
    if (backing.empty()) continue;
    struct stat bs{};
    if (::stat(backing.c_str(), &bs) != 0 || bs.st_dev != st.st_dev || bs.st_ino != st.st_ino) continue;
    unsigned maj = 0, min = 0;
    if (std::sscanf(read_line((e.path() / "dev").string()).c_str(), "%u:%u", &maj, &min) != 2) continue;
    std::string why = device_use(makedev(maj, min));
    if (!why.empty()) return "it backs /dev/" + e.path().filename().string() + ": " + why;
  }
  return "";
}

std::string format_names() {
  std::string names;
  for (const auto& f : export_formats()) names += (names.empty() ? "" : ", ") + std::string(f.name);
  return names + ", fio-iolog";
}

void run_fio_export(const ExportOptions& o) {
  if (!o.fio_file.empty() && !o.allow_device) {
    std::string why = fio_file_in_use(o.fio_file);
    if (!why.empty())
      throw InputError("--fio-file " + o.fio_file + ": " + why +
                       "; fio replaying the iolog would write to it (--allow-device to export anyway)");
  }
  auto r = open_reader(o.file);
  Output out(o.out);
  std::ostringstream text;
  capture::FioExportOptions fo;
  fo.filename = o.fio_file.empty() ? kFioPlaceholder : o.fio_file;
  fo.trims = false;  // fio 3.33 refuses trim lines ("bad ddir: 2")
  if (o.fio_file.empty())
    fo.comment = std::string("tierlab: I/O names the placeholder ") + kFioPlaceholder +
                 ", not the captured device; fio --replay_redirect=PATH replays it on PATH";
  capture::FioExportStats st = capture::write_fio_iolog_v3(*r, text, fo);
  out.write(text.str());
  out.finish();
  std::string from;
  for (const auto& s : st.sources) from += (from.empty() ? "" : ", ") + s;
  if (st.ios == 0)
    std::fprintf(stderr, "tierlab: fio-iolog: the trace has no block I/O to export%s\n",
                 st.trims_dropped ? " but trims" : "");
  else if (o.fio_file.empty())
    std::fprintf(stderr,
                 "tierlab: fio-iolog: %llu I/Os name the placeholder %s, not the trace's %s; replay them on a "
                 "scratch file of at least %llu bytes (%s) with fio --read_iolog=FILE --replay_redirect=PATH, or "
                 "export with --fio-file PATH\n",
                 (unsigned long long)st.ios, kFioPlaceholder, from.c_str(), (unsigned long long)st.end,
                 format_bytes(double(st.end)).c_str());
  else
    std::fprintf(stderr, "tierlab: fio-iolog: %llu I/Os name %s (the trace's %s); it needs at least %llu bytes (%s)\n",
                 (unsigned long long)st.ios, o.fio_file.c_str(), from.c_str(), (unsigned long long)st.end,
                 format_bytes(double(st.end)).c_str());
  if (st.trims_dropped)
    std::fprintf(stderr, "tierlab: fio-iolog: %llu trim%s left out: fio 3.33 refuses trim lines (\"bad ddir: 2\")\n",
                 (unsigned long long)st.trims_dropped, st.trims_dropped == 1 ? "" : "s");
}

void run_export(const ExportOptions& o) {
  if (o.format == "fio-iolog") {  // block I/O as a fio iolog v3 (capture/import.h)
    run_fio_export(o);
    return;
  }
  if (!o.fio_file.empty() || o.allow_device)
    throw InputError(std::string(o.fio_file.empty() ? "--allow-device" : "--fio-file") +
                     ": only used with --format fio-iolog");
  std::unique_ptr<Exporter> ex;
  for (const auto& f : export_formats())
    if (o.format == f.name) ex = f.make();
  if (!ex) throw InputError("--format " + o.format + ": unknown export format (known: " + format_names() + ")");
  auto r = open_reader(o.file);
  Output out(o.out);
  std::string line;
  ex->begin(line, r->header());
  out.write(line);
  Record rec;
  uint64_t n = 0;
  while (r->next(rec)) {
    ex->record(line, rec);
    out.write(line);
    if ((++n & 1023) == 0 && !out.ok()) return;
  }
  ex->end(line);
  out.write(line);
  out.finish();
}

void setup_trace(CLI::App& parent) {
  auto& tr = group(parent, "trace");

  auto info = std::make_shared<InfoOptions>();
  auto* si = tr.add_subcommand("info", "counts, time span, bytes per record kind, recovered tail");
  si->add_option("FILE", info->file, "trace file (.tlt)")->required();
  si->add_flag("--json", info->json, "print JSON instead of text");
  si->callback([info] { run_info(*info); });

  auto dump = std::make_shared<DumpOptions>();
  auto* sd = tr.add_subcommand("dump", "print every record, one line each (time in seconds from the trace start)");
  sd->add_option("FILE", dump->file, "trace file (.tlt)")->required();
  sd->add_option("--out,-o", dump->out, "write to this file (mode 0600) instead of stdout");
  sd->callback([dump] { run_dump(*dump); });

  auto exp = std::make_shared<ExportOptions>();
  auto* se = tr.add_subcommand("export", "write every record as JSON lines or CSV, or the block I/O as a fio iolog");
  se->add_option("FILE", exp->file, "trace file (.tlt)")->required();
  std::string names;
  for (const auto& f : export_formats()) names += (names.empty() ? "" : "|") + std::string(f.name);
  names += "|fio-iolog";
  se->add_option("--format,-f", exp->format, "output format: " + names)->required();
  se->add_option("--fio-file", exp->fio_file,
                 "fio-iolog: name every I/O with this file or device (default: the placeholder "
                 "tierlab-replay.img, never the captured device); a mounted block device, one holding a "
                 "mounted partition, swap or a device mapper, or a file backing a loop device in use is "
                 "refused");
  se->add_flag("--allow-device", exp->allow_device, "fio-iolog: accept a --fio-file that is in use");
  se->add_option("--out,-o", exp->out, "write to this file (mode 0600) instead of stdout");
  se->footer(kCsvHelp);
  se->callback([exp] { run_export(*exp); });
}

const Registration reg{"trace", 50, &setup_trace};

}  // namespace
}  // namespace tierlab::app
