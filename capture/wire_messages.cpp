// The wire decoder's messages, field by field: the startup packet, every
// request a client sends and every answer a server sends, validated and
// turned into trace records (capture/wire.h). The session, framing, gaps and
// hunting are in capture/wire.cpp.
#include "capture/wire.h"
#include "capture/wire_impl.h"

#include <cstdio>
#include <cstring>

namespace tierlab::capture {
using namespace wire_impl;

bool SessionDecoder::deliver_startup(Dir& s, const uint8_t* b, uint32_t len, trace::Nanos ts) {
  const Direction d = Direction::Frontend;
  uint32_t code = rd32(b);
  Dir& backend = dirs_[idx(Direction::Backend)];
  if (code == kSslCode || code == kGssEncCode) {
    if (len != 4) return fail(d, s, "SSLRequest/GSSENCRequest of wrong length");
    backend.mode = Mode::SslByte;
    return true;
  }
  if (code == kCancelCode) {
    if (len != 12) return fail(d, s, "CancelRequest of wrong length");
    cancel_ = true;
    s.mode = Mode::Opaque;
    backend.mode = Mode::Opaque;
    return true;
  }
  if ((code >> 16) != 3) {
    char why[80];
    std::snprintf(why, sizeof why, "unsupported protocol version %u.%u", code >> 16, code & 0xffff);
    return fail(d, s, why);
  }
  // Parameters: key\0value\0 ... \0. Keep a copy for SessionBegin.
  if (len - 4 > startup_.size()) return fail(d, s, "startup packet too long");
  std::memcpy(startup_.data(), b + 4, len - 4);
  Cursor c{reinterpret_cast<const uint8_t*>(startup_.data()),
           reinterpret_cast<const uint8_t*>(startup_.data()) + (len - 4)};
  std::string_view user, database, app;
  for (;;) {
    std::string_view key = c.cstr();
    if (!c.ok()) return fail(d, s, c.problem);
    if (key.empty()) break;
    std::string_view value = c.cstr();
    if (!c.ok()) return fail(d, s, c.problem);
    if (key == "user") user = value;
    else if (key == "database") database = value;
    else if (key == "application_name") app = value;
  }
  if (!c.finish()) return fail(d, s, c.problem);
  if (user.empty()) return fail(d, s, "no user in StartupMessage");
  user_ = user;
  database_ = database.empty() ? user : database;
  app_ = app;
  started_ = true;
  begin_pending_ = true;
  begin_ts_ = ts;
  s.startup = false;
  return true;
}

bool SessionDecoder::frontend_message(char type, const uint8_t* b, uint32_t len, trace::Nanos ts) {
  const Direction d = Direction::Frontend;
  Dir& s = dirs_[idx(d)];
  Cursor c{b, b + len};
  switch (type) {
    case 'Q': {
      std::string_view sql = c.cstr();
      if (!c.finish()) return fail(d, s, c.problem);
      ++stats_.statements;
      ++unit_statements_;
      emit(ts, trace::Query{sql});
      return true;
    }
    case 'P': {
      std::string_view name = c.cstr();
      std::string_view sql = c.cstr();
      int16_t n = c.i16();
      if (c.ok() && n < 0) return fail(d, s, "negative parameter type count");
      if (!c.need(static_cast<size_t>(n) * 4)) return fail(d, s, c.problem);
      if (param_types_.size() < static_cast<size_t>(n)) param_types_.resize(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) param_types_[static_cast<size_t>(i)] = c.u32();
      if (!c.finish()) return fail(d, s, c.problem);
      emit(ts, trace::Parse{name, sql, std::span<const uint32_t>(param_types_.data(), static_cast<size_t>(n))});
      return true;
    }
    case 'B': {
      std::string_view portal = c.cstr();
      std::string_view stmt = c.cstr();
      int16_t nfmt = c.i16();
      if (c.ok() && nfmt < 0) return fail(d, s, "negative parameter format count");
      const uint8_t* fmts = c.p;
      if (!c.need(static_cast<size_t>(nfmt) * 2)) return fail(d, s, c.problem);
      c.p += static_cast<size_t>(nfmt) * 2;
      int16_t np = c.i16();
      if (c.ok() && np < 0) return fail(d, s, "negative parameter count");
      if (!c.ok()) return fail(d, s, c.problem);
      if (nfmt > 1 && nfmt != np) return fail(d, s, "parameter format count differs from parameter count");
      if (params_.size() < static_cast<size_t>(np)) params_.resize(static_cast<size_t>(np));
      for (int i = 0; i < np; ++i) {
        trace::Param& prm = params_[static_cast<size_t>(i)];
        prm.format = nfmt == 0 ? 0 : static_cast<int16_t>(rd16(fmts + 2 * (nfmt == 1 ? 0 : i)));
        int32_t plen = static_cast<int32_t>(c.u32());
        if (!c.ok()) return fail(d, s, c.problem);
        if (plen < -1) return fail(d, s, "negative parameter length");
        prm.is_null = plen == -1;
        prm.value = plen >= 0 ? c.bytes(static_cast<size_t>(plen)) : std::string_view{};
        if (!c.ok()) return fail(d, s, c.problem);
      }
      int16_t nres = c.i16();
      if (c.ok() && nres < 0) return fail(d, s, "negative result format count");
      if (!c.need(static_cast<size_t>(nres) * 2)) return fail(d, s, c.problem);
      if (result_formats_.size() < static_cast<size_t>(nres)) result_formats_.resize(static_cast<size_t>(nres));
      for (int i = 0; i < nres; ++i) result_formats_[static_cast<size_t>(i)] = c.i16();
      if (!c.finish()) return fail(d, s, c.problem);
      emit(ts, trace::Bind{portal, stmt,
                           std::span<const trace::Param>(params_.data(), static_cast<size_t>(np)),
                           std::span<const int16_t>(result_formats_.data(), static_cast<size_t>(nres))});
      return true;
    }
    case 'E': {
      std::string_view portal = c.cstr();
      uint32_t max_rows = c.u32();
      if (!c.finish()) return fail(d, s, c.problem);
      ++stats_.statements;
      ++unit_statements_;
      emit(ts, trace::Execute{portal, max_rows});
      return true;
    }
    case 'D':
    case 'C': {
      char target = static_cast<char>(c.u8());
      std::string_view name = c.cstr();
      if (!c.finish()) return fail(d, s, c.problem);
      if (target != 'S' && target != 'P') return fail(d, s, "target is neither 'S' nor 'P'");
      if (type == 'D') emit(ts, trace::Describe{target, name});
      else emit(ts, trace::Close{target, name});
      return true;
    }
    case 'S':
      emit(ts, trace::Sync{});
      return true;
    case 'H':
      emit(ts, trace::Flush{});
      return true;
    case 'X':
      terminated_ = true;
      return true;
    case 'd':
      emit(ts, trace::CopyData{trace::CopyDir::In,
                               std::string_view(reinterpret_cast<const char*>(b), len)});
      return true;
    case 'c':
      emit(ts, trace::CopyDone{trace::CopyDir::In});
      return true;
    case 'f': {
      std::string_view msg = c.cstr();
      if (!c.finish()) return fail(d, s, c.problem);
      emit(ts, trace::CopyFail{msg});
      return true;
    }
    default:
      return true;  // 'p' and 'F' are skipped, never collected
  }
}

bool SessionDecoder::backend_message(char type, const uint8_t* b, uint32_t len, trace::Nanos ts) {
  const Direction d = Direction::Backend;
  Dir& s = dirs_[idx(d)];
  Cursor c{b, b + len};
  switch (type) {
    case 'R': {
      uint32_t code = c.u32();
      if (!c.ok()) return fail(d, s, c.problem);
      if (code > 12) return fail(d, s, "unknown authentication request");
      return true;  // authentication exchanges are never recorded
    }
    case 'K': {
      backend_pid_ = static_cast<int32_t>(c.u32());
      c.u32();
      if (!c.finish()) return fail(d, s, c.problem);
      flush_begin();
      return true;
    }
    case 'S': {
      std::string_view name = c.cstr();
      std::string_view value = c.cstr();
      if (!c.finish()) return fail(d, s, c.problem);
      sink_.parameter_status(session_, name, value, ts);
      return true;
    }
    case 'Z': {
      char st = static_cast<char>(c.u8());
      if (st != 'I' && st != 'T' && st != 'E') return fail(d, s, "unknown transaction status");
      if (st == 'I' && unit_statements_ > 0) {
        ++stats_.transactions;
        unit_statements_ = 0;
      }
      emit(ts, trace::Ready{st});
      return true;
    }
    case 'C': {
      std::string_view tag = c.cstr();
      if (!c.finish()) return fail(d, s, c.problem);
      emit(ts, trace::split_command_tag(tag));
      return true;
    }
    case 's':  // PortalSuspended: an Execute's answer, like CommandComplete
      emit(ts, trace::Suspended{});
      return true;
    case 'I':  // EmptyQueryResponse
      emit(ts, trace::EmptyQuery{});
      return true;
    case 'E':
    case 'N': {
      std::string_view sev, vsev, code, msg;
      for (;;) {
        uint8_t f = c.u8();
        if (!c.ok()) return fail(d, s, c.problem);
        if (f == 0) break;
        std::string_view v = c.cstr();
        if (!c.ok()) return fail(d, s, c.problem);
        switch (f) {
          case 'S': sev = v; break;
          case 'V': vsev = v; break;
          case 'C': code = v; break;
          case 'M': msg = v; break;
          default: break;
        }
      }
      if (!c.finish()) return fail(d, s, c.problem);
      if (type == 'N') return true;
      std::string_view severity = vsev.empty() ? sev : vsev;
      if (severity == "FATAL" || severity == "PANIC") fatal_seen_ = true;
      ++stats_.errors;
      emit(ts, trace::Error{code, severity, msg});
      return true;
    }
    case 'A': {
      c.u32();
      c.cstr();
      c.cstr();
      if (!c.finish()) return fail(d, s, c.problem);
      return true;
    }
    case 'G':
    case 'H':
    case 'W': {
      c.u8();
      int16_t n = c.i16();
      if (c.ok() && n < 0) return fail(d, s, "negative column count");
      c.bytes(static_cast<size_t>(n) * 2);
      if (!c.finish()) return fail(d, s, c.problem);
      return true;
    }
    case 'd':
      emit(ts, trace::CopyData{trace::CopyDir::Out,
                               std::string_view(reinterpret_cast<const char*>(b), len)});
      return true;
    case 'c':
      emit(ts, trace::CopyDone{trace::CopyDir::Out});
      return true;
    default:
      return true;
  }
}

}  // namespace tierlab::capture
