// Helpers of the trace tests: temp dirs, a canonical text form of a record
// (every field, so two records compare equal iff their texts do), and a set
// of records covering every kind.
#pragma once

#include "trace/reader.h"
#include "trace/writer.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace tierlab::trace::testutil {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tierlab-trace-test-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    if (!d) throw std::runtime_error("mkdtemp failed");
    path_ = d;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string hex(std::string_view s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

inline std::string canon(const Record& r) {
  std::string s = std::to_string(r.ts) + " s" + std::to_string(r.session) + " " +
                  std::string(kind_name(r.kind())) + " ";
  auto q = [](std::string_view v) { return "[" + hex(v) + "]"; };
  std::visit(
      [&](const auto& b) {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, SessionBegin>)
          s += q(b.user) + q(b.database) + q(b.application_name) + q(b.client_addr) +
               std::to_string(b.backend_pid) + "/" + std::to_string(b.flags);
        else if constexpr (std::is_same_v<T, SessionEnd>)
          s += std::to_string(static_cast<int>(b.reason));
        else if constexpr (std::is_same_v<T, Query>)
          s += q(b.sql);
        else if constexpr (std::is_same_v<T, Parse>) {
          s += q(b.statement) + q(b.sql);
          for (auto t : b.param_types) s += " " + std::to_string(t);
        } else if constexpr (std::is_same_v<T, Bind>) {
          s += q(b.portal) + q(b.statement);
          for (const auto& p : b.params)
            s += " p" + std::to_string(p.format) + (p.is_null ? "null" : q(p.value));
          for (auto f : b.result_formats) s += " f" + std::to_string(f);
        } else if constexpr (std::is_same_v<T, Execute>)
          s += q(b.portal) + std::to_string(b.max_rows);
        else if constexpr (std::is_same_v<T, Describe> || std::is_same_v<T, Close>)
          s += std::string(1, b.target) + q(b.name);
        else if constexpr (std::is_same_v<T, CopyData>)
          s += std::to_string(static_cast<int>(b.dir)) + q(b.data);
        else if constexpr (std::is_same_v<T, CopyDone>)
          s += std::to_string(static_cast<int>(b.dir));
        else if constexpr (std::is_same_v<T, CopyFail>)
          s += q(b.message);
        else if constexpr (std::is_same_v<T, Result>)
          s += q(b.tag) + (b.has_rows ? std::to_string(b.rows) : "-");
        else if constexpr (std::is_same_v<T, Error>)
          s += q(b.sqlstate) + q(b.severity) + q(b.message);
        else if constexpr (std::is_same_v<T, Ready>)
          s += std::string(1, b.status);
        else if constexpr (std::is_same_v<T, BlockIo>)
          s += std::to_string(b.complete_ns) + " " + std::to_string(b.device) + " " +
               std::to_string(b.offset) + " " + std::to_string(b.length) + " " +
               std::string(op_name(b.op)) + " " + std::to_string(b.flags) + " " + std::to_string(b.pid) +
               " q" + std::to_string(b.queued_ns);
        else if constexpr (std::is_same_v<T, FileIo>)
          s += std::to_string(b.pid) + q(b.file) + std::to_string(b.offset) + " " +
               std::to_string(b.length) + " " + std::string(op_name(b.op)) + " " +
               std::to_string(b.flags) + " " + std::to_string(b.latency_ns);
        else if constexpr (std::is_same_v<T, Sample>) {
          char buf[64];
          uint64_t bits;
          std::memcpy(&bits, &b.value, 8);
          std::snprintf(buf, sizeof buf, "%.17g/%016llx", b.value, static_cast<unsigned long long>(bits));
          s += q(b.name) + buf;
        } else if constexpr (std::is_same_v<T, Meta>)
          s += q(b.key) + q(b.value);
        else if constexpr (std::is_same_v<T, Loss>)
          s += std::to_string(static_cast<int>(b.what)) + " " + std::to_string(b.count);
      },
      r.body);
  return s;
}

// Backing storage for records whose views must outlive a test.
struct Corpus {
  std::vector<Record> records;
  std::vector<std::string> strings;  // reserved up front: views stay valid
  std::vector<std::vector<Param>> params;
  std::vector<std::vector<uint32_t>> types;
  std::vector<std::vector<int16_t>> formats;
  Corpus() {
    strings.reserve(10000);
    params.reserve(1000);
    types.reserve(1000);
    formats.reserve(1000);
  }
  std::string_view keep(std::string s) {
    strings.push_back(std::move(s));
    return strings.back();
  }
};

// Every record kind with edge values: empty strings, NULL and binary params,
// big and negative numbers, unaligned block offsets, COPY data larger than a
// chunk (`big_copy` bytes).
inline void fill_every_kind(Corpus& c, size_t big_copy) {
  Nanos t = 1'000'000'000'000;
  auto add = [&](Nanos dt, uint64_t session, Body b) {
    t += dt;
    c.records.push_back(Record{t, session, b});
  };
  add(0, 0, Meta{"server_version", "15.8"});
  add(0, 0, Meta{"", ""});
  add(10, 1, SessionBegin{"alice", "bench", "pgbench", "127.0.0.1:54321", 4242,
                          kSessionUnixSocket | kSessionTls});
  add(10, 2, SessionBegin{"", "", "", "", 0, kSessionUnknownStartup});
  add(5, 1, Query{"SELECT 1"});
  add(0, 1, Query{""});
  c.types.push_back({23, 25, 0, 4294967295u});
  add(1000, 1, Parse{"P0_1", "SELECT abalance FROM pgbench_accounts WHERE aid = $1", c.types.back()});
  add(0, 1, Parse{"", "", {}});
  std::string bin("\x00\x01\xff\x80zz", 6);
  c.params.push_back({Param{0, false, "42"}, Param{0, true, ""}, Param{1, false, c.keep(bin)},
                      Param{1, true, ""}, Param{0, false, ""}, Param{0, false, "-9223372036854775808"},
                      Param{0, false, "007"}, Param{0, false, "-0"}, Param{0, false, "18446744073709551616"},
                      Param{0, false, "0"}, Param{7, false, "odd"}, Param{-3, true, ""},
                      Param{0, false, "héllo wörld"}});
  c.formats.push_back({0, 1, -1});
  add(3, 1, Bind{"portal", "P0_1", c.params.back(), c.formats.back()});
  add(0, 1, Bind{"", "", {}, {}});
  add(0, 1, Execute{"portal", 100});
  add(0, 1, Execute{"", 0});
  add(-50, 2, Describe{'S', "P0_1"});
  add(0, 2, Describe{'P', ""});
  add(7, 2, Close{'P', "portal"});
  add(7, 2, Close{'S', ""});
  add(1, 2, Sync{});
  add(1, 2, Flush{});
  add(1, 3, CopyData{CopyDir::In, "1\tone\n2\ttwo\n"});
  add(1, 3, CopyData{CopyDir::Out, ""});
  std::string big(big_copy, '\0');
  uint64_t x = 88172645463325252ull;
  for (auto& ch : big) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    ch = static_cast<char>(x);
  }
  add(1, 3, CopyData{CopyDir::In, c.keep(big)});
  add(1, 3, CopyDone{CopyDir::In});
  add(1, 3, CopyDone{CopyDir::Out});
  add(1, 3, CopyFail{"aborted by user"});
  add(1, 3, Result{"INSERT", true, 1});
  add(1, 3, Result{"BEGIN", false, 0});
  add(1, 3, Result{"SELECT", true, 0});
  add(1, 3, Result{"", true, ~0ull - 1});
  add(1, 3, Error{"23505", "ERROR", "duplicate key value violates unique constraint \"k\""});
  add(1, 3, Error{"", "", ""});
  add(1, 3, Ready{'I'});
  add(1, 3, Ready{'T'});
  add(1, 3, Ready{'E'});
  add(1, 3, Suspended{});
  add(0, 3, EmptyQuery{});
  add(100, 0, BlockIo{t + 250'000, (8u << 20) | 16, 1ull << 36, 8192, IoOp::Read, kIoSync, 4242});
  add(100, 0, BlockIo{t + 99, (8u << 20) | 16, (1ull << 36) + 8192, 8192, IoOp::Write, kIoMeta | kIoFua, 4243});
  add(100, 0, BlockIo{t + 100, (259u << 20) | 1, 4097, 513, IoOp::Flush, 0, 1});
  add(100, 0, BlockIo{t - 5, 0, 0, 0, IoOp::Discard, kIoIncomplete, 0});
  add(0, 0, BlockIo{t, ~0u, ~0ull - 511, 512, IoOp::Read, 0xff, -1});
  add(0, 0, BlockIo{t + 3, 7, 1024, ~0u, IoOp::Write, 0, 2147483647});
  // Queue times (format 1.2): well before the issue, at the issue, before
  // the previous record, and in a session record's chunk position.
  add(100, 0, BlockIo{t + 400'000, (8u << 20) | 16, 1ull << 30, 8192, IoOp::Read, 0, 4242, t - 40'000});
  add(100, 0, BlockIo{t + 300'000, (8u << 20) | 16, 1ull << 31, 8192, IoOp::Read, 0, 4242, t + 100});
  add(0, 0, BlockIo{t + 10, (8u << 20) | 16, 4096, 4096, IoOp::Write, kIoSync, 4243, t - 7'000'000});
  add(5, 7, Ready{'T'});
  add(5, 0, BlockIo{t + 10, (8u << 20) | 16, 8192, 4096, IoOp::Write, kIoSync, 4243, 1});
  add(10, 0, FileIo{4242, "base/5/16384", 8192 * 7, 8192, IoOp::Read, 0, 12345});
  add(10, 0, FileIo{-1, "fd:7", 3, 1, IoOp::Write, kIoSync, -1});
  add(10, 0, FileIo{0, "", ~0ull, 0, IoOp::Flush, 0xff, 0});
  add(5, 0, Sample{"cpu.user_ns", 123456789.0});
  add(0, 0, Sample{"ratio", 0.125});
  add(0, 0, Sample{"neg", -0.0});
  add(0, 0, Sample{"big", 1e300});
  add(0, 0, Sample{"inf", INFINITY});
  add(0, 0, Sample{"int_min", -9007199254740992.0});
  add(0, 4, Loss{LossKind::QueueOverflow, 17});
  add(0, 0, Loss{LossKind::Unsupported, 0});
  add(-1'000'000'000'000, 0xffffffffffffffffull, SessionEnd{EndReason::Unknown});
  add(1, 1, SessionEnd{EndReason::Clean});
  add(1, 2, SessionEnd{EndReason::ProtocolError});
}

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::vector<uint8_t> out;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return out;
  uint8_t buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  std::fclose(f);
  return out;
}

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

inline std::vector<std::string> read_all(Reader& r) {
  std::vector<std::string> out;
  Record rec;
  while (r.next(rec)) out.push_back(canon(rec));
  return out;
}

}  // namespace tierlab::trace::testutil
