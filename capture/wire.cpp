// The wire decoder (capture/wire.h): a session's life (begin, join, end),
// each direction's framing and validation of headers, gaps and the hunt for
// a message boundary; each message's fields are read in
// capture/wire_messages.cpp.
#include "capture/wire.h"
#include "capture/wire_impl.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstring>

namespace tierlab::capture {
using namespace wire_impl;

StartupPacket classify_startup(const uint8_t* data, size_t len, uint32_t max_startup) {
  StartupPacket r;
  if (len < 4) return r;
  r.length = rd32(data);
  if (r.length < 8 || r.length > max_startup) {
    r.kind = StartupKind::Invalid;
    return r;
  }
  if (len < r.length) return r;
  uint32_t code = rd32(data + 4);
  if (code == kSslCode && r.length == 8) r.kind = StartupKind::SslRequest;
  else if (code == kGssEncCode && r.length == 8) r.kind = StartupKind::GssEncRequest;
  else if (code == kCancelCode && r.length == 16) r.kind = StartupKind::Cancel;
  else if ((code >> 16) == 3) r.kind = StartupKind::Startup;
  else r.kind = StartupKind::Invalid;
  return r;
}


size_t make_error_response(uint8_t* out, size_t cap, std::string_view severity,
                           std::string_view sqlstate, std::string_view message) {
  size_t body = 4 + 2 * (1 + severity.size() + 1) + (1 + sqlstate.size() + 1) +
                (1 + message.size() + 1) + 1;
  size_t total = 1 + body;
  if (total > cap) return 0;
  uint8_t* p = out;
  *p++ = 'E';
  *p++ = uint8_t(body >> 24);
  *p++ = uint8_t(body >> 16);
  *p++ = uint8_t(body >> 8);
  *p++ = uint8_t(body);
  auto field = [&p](char code, std::string_view v) {
    *p++ = static_cast<uint8_t>(code);
    if (!v.empty()) std::memcpy(p, v.data(), v.size());  // v.data() may be null when empty
    p += v.size();
    *p++ = 0;
  };
  field('S', severity);
  field('V', severity);
  field('C', sqlstate);
  field('M', message);
  *p++ = 0;
  assert(static_cast<size_t>(p - out) == total);
  return total;
}

bool BufferBudget::take(uint64_t n) {
  uint64_t cur = held.load(std::memory_order_relaxed);
  do {
    if (cur + n > cap) return false;
  } while (!held.compare_exchange_weak(cur, cur + n, std::memory_order_relaxed));
  return true;
}

SessionDecoder::SessionDecoder(RecordSink& sink, WireLimits limits)
    : sink_(sink), limits_(limits) {
  startup_.resize(std::max<uint32_t>(limits_.max_startup, 512) + 512);
}

SessionDecoder::~SessionDecoder() {
  for (Dir& s : dirs_) release(s);
}

bool SessionDecoder::grow(Dir& s, size_t need) {
  if (limits_.budget && need > BufferBudget::kFree) {
    const uint64_t charge = need - BufferBudget::kFree;
    if (charge > s.charged) {
      if (!limits_.budget->take(charge - s.charged)) return false;
      s.charged = charge;
    }
  }
  s.buf.resize(need);
  return true;
}

void SessionDecoder::release(Dir& s) {
  if (s.charged == 0) return;
  limits_.budget->give_back(s.charged);
  s.charged = 0;
  s.buf.resize(BufferBudget::kFree);
  s.buf.shrink_to_fit();
}

void SessionDecoder::begin(uint64_t session, std::string_view client_addr, uint32_t flags,
                           trace::Nanos ts) {
  session_ = session;
  failed_ = started_ = begin_pending_ = begun_ = ended_ = false;
  terminated_ = fatal_seen_ = cancel_ = tls_ = false;
  flags_ = flags;
  backend_pid_ = 0;
  begin_ts_ = ts;
  unit_statements_ = 0;
  stats_ = {};
  error_[0] = 0;
  user_ = database_ = app_ = {};
  size_t n = std::min(client_addr.size(), sizeof(client_addr_buf_));
  if (n) std::memcpy(client_addr_buf_, client_addr.data(), n);  // data() may be null when empty
  client_addr_ = std::string_view(client_addr_buf_, n);
  for (Dir& s : dirs_) {
    release(s);
    s.mode = Mode::Header;
    s.startup = false;
    s.hdr_have = 0;
    s.type = 0;
    s.body_len = s.body_have = 0;
    s.offset = s.msg_offset = 0;
  }
  dirs_[idx(Direction::Frontend)].startup = true;
}

void SessionDecoder::join(uint64_t session, const JoinInfo& info, trace::Nanos ts) {
  begin(session, info.client_addr, info.flags | trace::kSessionUnknownStartup, ts);
  dirs_[idx(Direction::Frontend)].startup = false;
  for (Dir& s : dirs_) s.mode = Mode::Hunt;
  // Copy the caller's strings into startup_.
  char* p = startup_.data();
  char* end = p + startup_.size();
  auto keep = [&p, end](std::string_view v) {
    size_t n = std::min(v.size(), static_cast<size_t>(end - p));
    if (n) std::memcpy(p, v.data(), n);  // v.data() may be null when empty
    std::string_view r(p, n);
    p += n;
    return r;
  };
  user_ = keep(info.user);
  database_ = keep(info.database);
  app_ = keep(info.application_name);
  backend_pid_ = info.backend_pid;
  started_ = true;
  begin_pending_ = true;
  flush_begin();
}

bool SessionDecoder::at_boundary(Direction d) const {
  const Dir& s = dirs_[idx(d)];
  return s.mode == Mode::Header && s.hdr_have == 0;
}

void SessionDecoder::flush_begin() {
  if (!begin_pending_) return;
  begin_pending_ = false;
  begun_ = true;
  trace::Record r{begin_ts_, session_,
                  trace::SessionBegin{user_, database_, app_, client_addr_, backend_pid_, flags_}};
  sink_.record(r);
  ++stats_.records;
}


void SessionDecoder::end(trace::EndReason reason, trace::Nanos ts) {
  if (ended_) return;
  ended_ = true;
  if (!begun_ && !begin_pending_) return;
  flush_begin();
  trace::Record r{ts, session_, trace::SessionEnd{reason}};
  sink_.record(r);
  ++stats_.records;
}

void SessionDecoder::note_error(std::string_view severity, std::string_view sqlstate,
                                std::string_view message, trace::Nanos ts) {
  if (ended_ || (!started_ && !begun_)) return;
  if (severity == "FATAL" || severity == "PANIC") fatal_seen_ = true;
  ++stats_.errors;
  emit(ts, trace::Error{sqlstate, severity, message});
}

bool SessionDecoder::fail(Direction d, const Dir& s, const char* what) {
  failed_ = true;
  char type[16];
  if (s.startup && d == Direction::Frontend) std::snprintf(type, sizeof type, "startup packet");
  else if (s.type >= 0x20 && s.type < 0x7f) std::snprintf(type, sizeof type, "message '%c'", s.type);
  else std::snprintf(type, sizeof type, "message 0x%02x", static_cast<unsigned>(static_cast<uint8_t>(s.type)));
  std::snprintf(error_, sizeof error_, "%s %s at byte %llu: %s", dir_name(d), type,
                static_cast<unsigned long long>(s.msg_offset), what);
  return false;
}

namespace {
// Action codes, as SessionDecoder::Action: 0 Unknown, 1 Collect, 2 Skip, 3 Copy.
constexpr uint8_t action_of(Direction d, char type) {
  if (d == Direction::Frontend) {
    switch (type) {
      case 'Q': case 'P': case 'B': case 'E': case 'D': case 'C': case 'S':
      case 'H': case 'X': case 'f': case 'c':
        return 1;
      case 'd':
        return 3;
      case 'p': case 'F':
        return 2;
      default:
        return 0;
    }
  }
  switch (type) {
    case 'R': case 'K': case 'S': case 'Z': case 'C': case 'E': case 'N': case 'A':
    case 'G': case 'H': case 'W': case 'c': case 's': case 'I':
      return 1;
    case 'd':
      return 3;
    case 'D': case 'T': case 't': case '1': case '2': case '3': case 'n':
    case 'v': case 'V':
      return 2;
    default:
      return 0;
  }
}
}  // namespace

namespace {
// Length (including the length field) that a fixed-size message must have;
// 0 when variable.
constexpr uint32_t fixed_length(Direction d, char type) {
  if (d == Direction::Frontend) {
    switch (type) {
      case 'S': case 'H': case 'X': case 'c': return 4;
      default: return 0;
    }
  }
  switch (type) {
    case 'Z': return 5;
    case 'K': return 12;
    case '1': case '2': case '3': case 'n': case 's': case 'I': case 'c': return 4;
    default: return 0;
  }
}
// Smallest valid length for variable-size messages.
constexpr uint32_t min_length(Direction d, char type) {
  if (d == Direction::Frontend) {
    switch (type) {
      case 'Q': case 'f': return 5;
      case 'P': return 8;    // two empty strings + int16
      case 'B': return 12;   // two strings + three int16
      case 'E': return 9;    // string + int32
      case 'D': case 'C': return 6;
      default: return 4;
    }
  }
  switch (type) {
    case 'R': return 8;
    case 'S': return 6;
    case 'C': return 5;
    case 'E': case 'N': return 5;
    case 'A': return 10;
    case 'G': case 'H': case 'W': return 7;
    case 'D': case 'T': case 't': return 6;
    default: return 4;
  }
}


// Per direction and type byte: what to do with the message and its length
// rules, looked up once per message.
struct TypeInfo {
  uint8_t action = 0;
  uint8_t fixed = 0;  // required length, 0 = variable
  uint8_t min = 0;    // smallest length
};
struct TypeTable {
  TypeInfo t[2][256];
};
constexpr TypeTable make_type_table() {
  TypeTable tt{};
  for (int d = 0; d < 2; ++d) {
    for (int c = 0; c < 256; ++c) {
      Direction dir = static_cast<Direction>(d);
      char type = static_cast<char>(c);
      tt.t[d][c].action = action_of(dir, type);
      tt.t[d][c].fixed = static_cast<uint8_t>(fixed_length(dir, type));
      tt.t[d][c].min = static_cast<uint8_t>(min_length(dir, type));
    }
  }
  return tt;
}
constexpr TypeTable kTypes = make_type_table();

inline const TypeInfo& type_info(Direction d, char type) {
  return kTypes.t[static_cast<size_t>(d)][static_cast<uint8_t>(type)];
}
}  // namespace

SessionDecoder::Action SessionDecoder::action(Direction d, char type) const {
  return static_cast<Action>(type_info(d, type).action);
}

bool SessionDecoder::header_ok(Direction d, char type, uint32_t len) const {
  const TypeInfo& ti = type_info(d, type);
  if (ti.action == 0 || len > limits_.max_message) return false;
  return ti.fixed ? len == ti.fixed : len >= ti.min;
}

bool SessionDecoder::start_message(Direction d, Dir& s, char type, uint32_t len) {
  s.type = type;
  if (s.startup && d == Direction::Frontend) {
    if (len < 8 || len > limits_.max_startup) {
      char why[96];
      std::snprintf(why, sizeof why, "length %u outside 8..%u", len, limits_.max_startup);
      return fail(d, s, why);
    }
    s.body_len = len - 4;
    s.body_have = 0;
    s.mode = Mode::Collect;
    if (s.buf.size() < s.body_len) s.buf.resize(s.body_len);
    return true;
  }
  Action a = action(d, type);
  if (a == Action::Unknown) [[unlikely]] return fail(d, s, "unknown message type");
  if (len > limits_.max_message) {
    char why[96];
    std::snprintf(why, sizeof why, "length %u exceeds the maximum message size %u", len,
                  limits_.max_message);
    return fail(d, s, why);
  }
  if (!header_ok(d, type, len)) {
    char why[64];
    std::snprintf(why, sizeof why, "invalid length %u", len);
    return fail(d, s, why);
  }
  s.body_len = len - 4;
  s.body_have = 0;
  if (a == Action::Copy)
    a = s.body_len <= limits_.copy_reassemble_max ? Action::Collect : Action::Copy;
  switch (a) {
    case Action::Collect:
      // The buffer grows as the body arrives (Mode::Collect), not by the
      // length the header claims: a header alone costs no memory.
      s.mode = Mode::Collect;
      break;
    case Action::Copy:
      s.mode = Mode::Stream;
      break;
    default:
      s.mode = Mode::Skip;
      break;
  }
  return true;
}

bool SessionDecoder::feed(Direction d, const uint8_t* data, size_t len, trace::Nanos ts) {
  if (failed_) return false;
  stats_.bytes[idx(d)] += len;
  return feed_dir(d, dirs_[idx(d)], data, len, ts);
}

bool SessionDecoder::feed_dir(Direction d, Dir& s, const uint8_t* p, size_t n,
                              trace::Nanos ts) {
  size_t pos = 0;
  while (pos < n) {
    switch (s.mode) {
      case Mode::Opaque:
        s.offset += n - pos;
        return true;

      case Mode::Hunt: {
        s.offset += 0;  // hunt() accounts offsets itself
        return hunt(d, s, p + pos, n - pos, ts);
      }

      case Mode::SslByte: {
        char c = static_cast<char>(p[pos]);
        if (c == 'N') {
          ++pos;
          ++s.offset;
          s.mode = Mode::Header;
        } else if (c == 'S' || c == 'G') {
          ++pos;
          ++s.offset;
          tls_ = true;
          flags_ |= trace::kSessionTls;
          for (Dir& x : dirs_) x.mode = Mode::Opaque;
        } else if (c == 'E') {
          s.mode = Mode::Header;  // the server refused with an ErrorResponse
        } else {
          s.msg_offset = s.offset;
          s.type = c;
          return fail(d, s, "answer to SSLRequest/GSSENCRequest is not 'S', 'G' or 'N'");
        }
        break;
      }

      case Mode::Header: {
        const bool startup = s.startup && d == Direction::Frontend;
        const size_t hsize = startup ? 4 : 5;
        const uint8_t* h;
        if (s.hdr_have == 0 && n - pos >= hsize) {
          h = p + pos;  // fast path: the whole header is in this piece
          pos += hsize;
        } else {
          if (s.hdr_have == 0) s.msg_offset = s.offset;
          size_t take = std::min(hsize - s.hdr_have, n - pos);
          std::memcpy(s.hdr + s.hdr_have, p + pos, take);
          s.hdr_have = static_cast<uint8_t>(s.hdr_have + take);
          pos += take;
          s.offset += take;
          if (s.hdr_have < hsize) return true;
          h = s.hdr;
          s.hdr_have = 0;
          s.offset -= hsize;  // re-added below
          s.msg_offset = s.offset;
        }
        s.msg_offset = s.offset;
        s.offset += hsize;
        char type = startup ? 0 : static_cast<char>(h[0]);
        uint32_t len = rd32(h + (startup ? 0 : 1));
        if (!start_message(d, s, type, len)) return false;
        // Fast path: deliver straight from the caller's buffer, no copy.
        if (s.body_len <= n - pos) {
          if (s.mode == Mode::Collect) {
            if (!deliver(d, s, type, p + pos, s.body_len, ts)) return false;
          } else {
            ++stats_.messages[idx(d)];
            if (s.mode == Mode::Stream) {
              emit(ts, trace::CopyData{d == Direction::Frontend ? trace::CopyDir::In : trace::CopyDir::Out,
                                       std::string_view(reinterpret_cast<const char*>(p + pos), s.body_len)});
            }
          }
          pos += s.body_len;
          s.offset += s.body_len;
          if (s.mode != Mode::Opaque && s.mode != Mode::SslByte && s.mode != Mode::Hunt)
            s.mode = Mode::Header;
        }
        break;
      }

      case Mode::Collect: {
        size_t take = std::min<size_t>(s.body_len - s.body_have, n - pos);
        if (s.buf.size() < s.body_have + take && !grow(s, s.body_have + take)) [[unlikely]] {
          // No room left for it among all the decoders: the message is
          // lost as a whole, as behind a stream gap; the session goes on.
          limits_.budget->refused.fetch_add(1, std::memory_order_relaxed);
          limits_.budget->refused_bytes.fetch_add(s.body_len, std::memory_order_relaxed);
          stats_.gap_bytes += s.body_len;
          emit(ts, trace::Loss{trace::LossKind::StreamGap, s.body_len});
          release(s);
          s.mode = Mode::Skip;
          break;
        }
        std::memcpy(s.buf.data() + s.body_have, p + pos, take);
        s.body_have += static_cast<uint32_t>(take);
        pos += take;
        s.offset += take;
        if (s.body_have == s.body_len) {
          s.mode = Mode::Header;
          const bool ok = deliver(d, s, s.type, s.buf.data(), s.body_len, ts);
          release(s);
          if (!ok) return false;
        }
        break;
      }

      case Mode::Skip:
      case Mode::Stream: {
        size_t take = std::min<size_t>(s.body_len - s.body_have, n - pos);
        if (s.mode == Mode::Stream && take > 0) {
          emit(ts, trace::CopyData{d == Direction::Frontend ? trace::CopyDir::In : trace::CopyDir::Out,
                                   std::string_view(reinterpret_cast<const char*>(p + pos), take)});
        }
        s.body_have += static_cast<uint32_t>(take);
        pos += take;
        s.offset += take;
        if (s.body_have == s.body_len) {
          ++stats_.messages[idx(d)];
          s.mode = Mode::Header;
        }
        break;
      }
    }
  }
  return true;
}

bool SessionDecoder::deliver(Direction d, Dir& s, char type, const uint8_t* body, uint32_t len,
                             trace::Nanos ts) {
  ++stats_.messages[idx(d)];
  if (d == Direction::Frontend) {
    if (s.startup) return deliver_startup(s, body, len, ts);
    if (!frontend_message(type, body, len, ts)) return false;
  } else {
    if (!backend_message(type, body, len, ts)) return false;
  }
  return true;
}


void SessionDecoder::gap(Direction d, uint64_t bytes, trace::Nanos ts) {
  if (failed_ || bytes == 0) return;
  stats_.gap_bytes += bytes;
  emit(ts, trace::Loss{trace::LossKind::StreamGap, bytes});
  Dir& s = dirs_[idx(d)];
  s.offset += bytes;
  switch (s.mode) {
    case Mode::Opaque:
      return;
    case Mode::Collect:
    case Mode::Skip:
    case Mode::Stream: {
      uint64_t rest = s.body_len - s.body_have;
      if (bytes <= rest) {
        s.body_have += static_cast<uint32_t>(bytes);
        // A message being reassembled is lost as a whole.
        if (s.mode == Mode::Collect) {
          s.mode = Mode::Skip;
          release(s);
        }
        if (s.body_have == s.body_len) {
          ++stats_.messages[idx(d)];
          s.mode = Mode::Header;
        }
        return;
      }
      break;
    }
    default:
      break;
  }
  s.mode = Mode::Hunt;
  s.startup = false;
  s.hdr_have = 0;
  s.body_have = 0;  // fill of the hunt window
}

bool SessionDecoder::hunt(Direction d, Dir& s, const uint8_t* p, size_t n, trace::Nanos ts) {
  // Invariant: s.buf[0, s.body_have) holds bytes not yet decoded; the first
  // of them is at stream offset s.offset - s.body_have.
  while (n > 0) {
    size_t take = std::min(n, kHuntWindow - s.body_have);
    // The window grows with what arrives: a sniffer joins thousands of
    // connections, most of which never send a window's worth of bytes.
    if (s.buf.size() < s.body_have + take)
      s.buf.resize(std::min(kHuntWindow, std::max(s.buf.size() * 2, s.body_have + take)));
    std::memcpy(s.buf.data() + s.body_have, p, take);
    s.body_have += static_cast<uint32_t>(take);
    s.offset += take;
    p += take;
    n -= take;

    const uint8_t* w = s.buf.data();
    const size_t have = s.body_have;
    size_t accept = have, wait_from = have;
    for (size_t i = 0; i < have && accept == have; ++i) {
      // Walk the chain of headers from i.
      size_t j = i;
      int count = 0;
      enum { Undecided, Yes, No } verdict = Undecided;
      for (;;) {
        if (j == have) { verdict = count >= 1 ? Yes : Undecided; break; }
        if (have - j < 5) { verdict = count >= 2 ? Yes : Undecided; break; }
        char type = static_cast<char>(w[j]);
        uint32_t len = rd32(w + j + 1);
        if (!header_ok(d, type, len) || (count == 0 && len > kHuntWindow - 5)) {
          verdict = No;
          break;
        }
        if (j + 1 + len > have) { verdict = count >= 2 ? Yes : Undecided; break; }
        ++count;
        j += 1 + len;
      }
      if (verdict == Yes) accept = i;
      else if (verdict == Undecided && wait_from == have) wait_from = i;
    }
    if (accept < have) {
      stats_.hunt_discarded += accept;
      // Decode the window from the accepted offset, then the rest of input.
      hunt_scratch_.assign(w + accept, w + have);
      s.mode = Mode::Header;
      s.hdr_have = 0;
      s.offset -= have - accept;
      s.body_have = 0;
      if (!feed_dir(d, s, hunt_scratch_.data(), hunt_scratch_.size(), ts)) return false;
      return n == 0 ? true : feed_dir(d, s, p, n, ts);
    }
    // Keep what may still start a message; drop the rest.
    size_t keep_from = wait_from;
    if (keep_from == have) keep_from = have > 4 ? have - 4 : 0;
    if (keep_from == 0 && have == kHuntWindow) keep_from = have / 2;
    if (keep_from > 0) {
      std::memmove(s.buf.data(), s.buf.data() + keep_from, have - keep_from);
      s.body_have = static_cast<uint32_t>(have - keep_from);
      stats_.hunt_discarded += keep_from;
    }
  }
  return true;
}

}  // namespace tierlab::capture
