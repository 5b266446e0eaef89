#include "trace/text.h"

#include "trace/fields.h"

#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace tierlab::trace {
namespace {

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

// How a string's bytes are escaped: as dump quotes them (C style) or as
// JSON.
enum class Escapes { C, Json };

// Appends v[0, shown): UTF-8 sequences as they are; quote, backslash, \n,
// \r and \t by their escapes; other control bytes (and, C style, DEL) as
// \xHH or \u00HH; bytes that are not UTF-8 as \xHH or U+FFFD.
void append_escaped(std::string& s, std::string_view v, size_t shown, Escapes e) {
  const char* hex_prefix = e == Escapes::C ? "\\x" : "\\u00";
  for (size_t i = 0; i < shown; ++i) {
    unsigned char c = static_cast<unsigned char>(v[i]);
    if (c >= 0x80) {
      size_t n = utf8_len(v, i);
      if (n && i + n <= shown) {
        s.append(v.data() + i, n);
        i += n - 1;
      } else if (e == Escapes::Json) {
        s += "\\ufffd";
      } else {
        s += hex_prefix;
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
        if (c < 0x20 || (c == 0x7f && e == Escapes::C)) {
          s += hex_prefix;
          s += kHex[c >> 4];
          s += kHex[c & 15];
        } else {
          s += static_cast<char>(c);
        }
    }
  }
}

// "..." with C-style escapes; at most `limit` bytes shown.
void append_quoted(std::string& s, std::string_view v, size_t limit = 200) {
  s += '"';
  size_t shown = std::min(v.size(), limit);
  append_escaped(s, v, shown, Escapes::C);
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
  append_escaped(s, v, v.size(), Escapes::Json);
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

}  // namespace

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

namespace {

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

std::string_view enum_name(EndReason v) { return reason_name(v); }
std::string_view enum_name(LossKind v) { return loss_name(v); }
std::string_view enum_name(IoOp v) { return op_name(v); }
std::string_view enum_name(CopyDir v) { return dir_name(v); }

// A string dump prints as it is, not quoted (a severity, a sample's name).
struct Bare {
  std::string_view v;
};

// `label`, then `v` as dump shows its type: strings quoted, enums by name,
// a one-character code as it is, lists in brackets.
template <class M>
void shown(std::string& s, std::string_view label, const M& v) {
  s.append(label);
  if constexpr (std::is_same_v<M, std::string_view>) {
    append_quoted(s, v);
  } else if constexpr (std::is_same_v<M, Bare>) {
    s.append(v.v);
  } else if constexpr (std::is_same_v<M, char>) {
    s += v;
  } else if constexpr (std::is_enum_v<M>) {
    s.append(enum_name(v));
  } else if constexpr (std::is_same_v<M, double>) {
    append_double(s, v);
  } else if constexpr (is_span_v<M>) {
    constexpr bool params = std::is_same_v<M, std::span<const Param>>;
    s += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) s.append(params ? ", " : ",");
      if constexpr (params)
        append_param(s, v[i]);
      else
        shown(s, "", v[i]);
    }
    s += ']';
  } else if constexpr (std::is_signed_v<M>) {
    append_i(s, v);
  } else {
    append_u(s, v);
  }
}

}  // namespace

// --- dump ------------------------------------------------------------------------

void dump_line(std::string& s, const Record& r, Nanos origin) {
  s.clear();
  append_rel(s, r.ts, origin);
  shown(s, " s=", r.session);
  shown(s, " ", Bare{kind_name(r.kind())});
  std::visit(
      [&](const auto& b) {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, SessionBegin>) {
          shown(s, " user=", b.user);
          shown(s, " database=", b.database);
          shown(s, " application=", b.application_name);
          shown(s, " client=", b.client_addr);
          shown(s, " pid=", b.backend_pid);
          if (b.flags & kSessionUnknownStartup) s += " unknown_startup";
          if (b.flags & kSessionUnixSocket) s += " unix";
          if (b.flags & kSessionTls) s += " tls";
        } else if constexpr (std::is_same_v<T, SessionEnd>) {
          shown(s, " reason=", b.reason);
        } else if constexpr (std::is_same_v<T, Query>) {
          shown(s, " sql=", b.sql);
        } else if constexpr (std::is_same_v<T, Parse>) {
          shown(s, " stmt=", b.statement);
          shown(s, " sql=", b.sql);
          shown(s, " types=", b.param_types);
        } else if constexpr (std::is_same_v<T, Bind>) {
          shown(s, " portal=", b.portal);
          shown(s, " stmt=", b.statement);
          shown(s, " params=", b.params);
          if (!b.result_formats.empty()) shown(s, " result_formats=", b.result_formats);
        } else if constexpr (std::is_same_v<T, Execute>) {
          shown(s, " portal=", b.portal);
          shown(s, " max_rows=", b.max_rows);
        } else if constexpr (std::is_same_v<T, Describe> || std::is_same_v<T, Close>) {
          shown(s, b.target == 'P' ? " portal=" : " stmt=", b.name);
        } else if constexpr (std::is_same_v<T, CopyData>) {
          shown(s, " ", b.dir);
          shown(s, " bytes=", b.data.size());
          s += ' ';
          append_quoted(s, b.data, 64);
        } else if constexpr (std::is_same_v<T, CopyDone>) {
          shown(s, " ", b.dir);
        } else if constexpr (std::is_same_v<T, CopyFail>) {
          shown(s, " message=", b.message);
        } else if constexpr (std::is_same_v<T, Result>) {
          shown(s, " tag=", b.tag);
          if (b.has_rows) shown(s, " rows=", b.rows);
        } else if constexpr (std::is_same_v<T, Error>) {
          shown(s, " ", Bare{b.severity});
          shown(s, " ", Bare{b.sqlstate});
          shown(s, " ", b.message);
        } else if constexpr (std::is_same_v<T, Ready>) {
          shown(s, " status=", b.status);
        } else if constexpr (std::is_same_v<T, BlockIo>) {
          shown(s, " ", b.op);
          s += " dev=";
          append_device(s, b.device);
          append_io_fields(s, b.offset, b.length, (b.flags & kIoIncomplete) ? -1 : b.complete_ns - r.ts, b.pid,
                           b.flags);
        } else if constexpr (std::is_same_v<T, FileIo>) {
          shown(s, " ", b.op);
          shown(s, " file=", b.file);
          append_io_fields(s, b.offset, b.length, b.latency_ns, b.pid, b.flags);
        } else if constexpr (std::is_same_v<T, Sample>) {
          shown(s, " ", Bare{b.name});
          shown(s, "=", b.value);
        } else if constexpr (std::is_same_v<T, Meta>) {
          shown(s, " ", Bare{b.key});
          shown(s, "=", b.value);
        } else if constexpr (std::is_same_v<T, Loss>) {
          shown(s, " ", b.what);
          shown(s, " count=", b.count);
        }
      },
      r.body);
  s += '\n';
}

// --- export ----------------------------------------------------------------------

namespace {

// jsonl: one JSON object per record, every field of trace/fields.h under
// its name, by type: strings and one-character codes as JSON strings,
// enums by name, numbers as numbers, spans as arrays, a double that is not
// finite as null. Binary parameter values and COPY data that is not UTF-8
// are given as hex (value_hex, data_hex). Where a field reads better
// another way, json_field() below says so.

void json_key(std::string& s, std::string_view k) {
  s += ",\"";
  s.append(k);
  s += "\":";
}

void json_param(std::string& s, const Param& p) {
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

template <class M>
void json_value(std::string& s, const M& v) {
  if constexpr (std::is_same_v<M, std::string_view>) {
    append_json(s, v);
  } else if constexpr (std::is_same_v<M, char>) {
    append_json(s, std::string_view(&v, 1));
  } else if constexpr (std::is_enum_v<M>) {
    append_json(s, enum_name(v));
  } else if constexpr (is_span_v<M>) {
    s += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) s += ',';
      if constexpr (std::is_same_v<M, std::span<const Param>>)
        json_param(s, v[i]);
      else
        json_value(s, v[i]);
    }
    s += ']';
  } else if constexpr (std::is_same_v<M, double>) {
    if (std::isfinite(v))
      append_double(s, v);
    else
      s += "null";
  } else if constexpr (std::is_signed_v<M>) {
    append_i(s, v);
  } else {
    append_u(s, v);
  }
}

// One field of b, as jsonl prints it.
template <class T, class F>
void json_field(std::string& s, const Record& r, const T& b, const F& f) {
  const auto& v = f.get(b);
  using M = std::decay_t<decltype(v)>;
  if constexpr (std::is_same_v<T, Describe> || std::is_same_v<T, Close>) {
    if (f.name == "target") {
      json_key(s, f.name);
      append_json(s, b.target == 'P' ? "portal" : "statement");
      return;
    }
  } else if constexpr (std::is_same_v<T, Result>) {
    if (f.name == "has_rows") return;  // rows is null without a row count
    if (f.name == "rows" && !b.has_rows) {
      json_key(s, f.name);
      s += "null";
      return;
    }
  } else if constexpr (std::is_same_v<T, BlockIo>) {
    if (f.name == "device") {
      json_key(s, f.name);
      s += '"';
      append_device(s, b.device);
      s += '"';
      return;
    }
    if (f.name == "queued_ns") return;  // not part of the jsonl export
    if (f.name == "complete_ns") {
      json_key(s, f.name);
      append_i(s, b.complete_ns);
      json_key(s, "latency_ns");
      append_i(s, b.complete_ns - r.ts);
      return;
    }
  }
  if constexpr (std::is_same_v<M, std::string_view>) {
    if (f.wire == Wire::Bytes && !valid_utf8(v)) {
      s += ",\"";
      s.append(f.name);
      s += "_hex\":\"";
      append_hex(s, v);
      s += '"';
      return;
    }
  }
  json_key(s, f.name);
  json_value(s, v);
}

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
    std::visit(
        [&](const auto& b) {
          using T = std::decay_t<decltype(b)>;
          for_each_field<T>([&](const auto& f) { json_field(s, r, b, f); });
        },
        r.body);
    s += "}\n";
  }
};

}  // namespace

const char* const kCsvHelp =
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

namespace {

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

}  // namespace


const std::vector<ExportFormat>& export_formats() {
  static const std::vector<ExportFormat> formats = {
      {"jsonl", [] { return std::make_unique<JsonlExporter>(); }},
      {"csv", [] { return std::make_unique<CsvExporter>(); }},
  };
  return formats;
}

}  // namespace tierlab::trace
