// Builds PostgreSQL protocol messages byte by byte for the wire decoder tests,
// and a sink that keeps a readable line per record.
#pragma once

#include "capture/wire.h"

#include <cstdint>
#include <string>
#include <vector>

namespace wiretest {

using Bytes = std::vector<uint8_t>;

class Msg {
 public:
  // type 0: an untyped startup packet.
  explicit Msg(char type) : type_(type) {}
  Msg& u8(uint8_t v) { body_.push_back(v); return *this; }
  Msg& i16(int v) { body_.push_back(uint8_t(v >> 8)); body_.push_back(uint8_t(v)); return *this; }
  Msg& i32(int64_t v) {
    uint32_t u = static_cast<uint32_t>(v);
    for (int s = 24; s >= 0; s -= 8) body_.push_back(uint8_t(u >> s));
    return *this;
  }
  Msg& str(const std::string& s) { body_.insert(body_.end(), s.begin(), s.end()); body_.push_back(0); return *this; }
  Msg& raw(const std::string& s) { body_.insert(body_.end(), s.begin(), s.end()); return *this; }
  Bytes bytes() const {
    Bytes out;
    if (type_) out.push_back(static_cast<uint8_t>(type_));
    uint32_t len = static_cast<uint32_t>(body_.size() + 4);
    for (int s = 24; s >= 0; s -= 8) out.push_back(uint8_t(len >> s));
    out.insert(out.end(), body_.begin(), body_.end());
    return out;
  }
  operator Bytes() const { return bytes(); }

 private:
  char type_;
  Bytes body_;
};

inline Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

inline Bytes startup(const std::string& user, const std::string& db, const std::string& app = "") {
  Msg m(0);
  m.i32(196608).str("user").str(user).str("database").str(db);
  if (!app.empty()) m.str("application_name").str(app);
  m.u8(0);
  return m;
}
inline Bytes ssl_request() { return Msg(0).i32(80877103); }
inline Bytes cancel_request(int pid, int key) { return Msg(0).i32(80877102).i32(pid).i32(key); }
inline Bytes auth_ok() { return Msg('R').i32(0); }
inline Bytes key_data(int pid) { return Msg('K').i32(pid).i32(12345); }
inline Bytes param_status(const std::string& k, const std::string& v) { return Msg('S').str(k).str(v); }
inline Bytes ready(char st) { return Msg('Z').u8(static_cast<uint8_t>(st)); }
inline Bytes query(const std::string& sql) { return Msg('Q').str(sql); }
inline Bytes complete(const std::string& tag) { return Msg('C').str(tag); }
inline Bytes error(const std::string& sev, const std::string& code, const std::string& msg) {
  return Msg('E').u8('S').str(sev).u8('V').str(sev).u8('C').str(code).u8('M').str(msg).u8(0);
}
inline Bytes terminate() { return Msg('X'); }
inline Bytes sync_msg() { return Msg('S'); }

// A sink that describes each record as one line and keeps them.
class LineSink : public tierlab::capture::RecordSink {
 public:
  void record(const tierlab::trace::Record& r) override;
  void parameter_status(uint64_t, std::string_view name, std::string_view value,
                        tierlab::trace::Nanos) override {
    params.push_back(std::string(name) + "=" + std::string(value));
  }
  std::vector<std::string> lines;
  std::vector<std::string> params;
  std::vector<tierlab::trace::Nanos> times;
};

std::string describe(const tierlab::trace::Record& r);

inline void LineSink::record(const tierlab::trace::Record& r) {
  lines.push_back(describe(r));
  times.push_back(r.ts);
}

}  // namespace wiretest
