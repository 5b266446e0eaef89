// Benchmark driver for bench/trace-throughput: generates two streams in
// memory, times the trace Writer and Reader on them (one core, in memory, so
// the disk does not enter the figures) and prints records/s and bytes per
// record. With --peers DIR it also writes the same streams in the text forms
// of the peer tools, for the script to measure:
//   statements.csvlog  PostgreSQL 15 csvlog with log_statement=all (what
//                      pgreplay reads): one execute line with its parameters
//                      per execution, plus connection lines
//   statements-duration.csvlog  the same with log_min_duration_statement=0:
//                      a bind and an execute line per execution
//   block.blkparse     blkparse default text: the D (issue) and C (complete)
//                      lines of each request
//   block.iolog        fio iolog version 3: one line per request
//
// Streams:
//   statements  pgbench -M prepared -S: 8 interleaved sessions, each
//               execution = Bind (one text int param, random aid), Execute,
//               Sync sent together, then Result "SELECT" 1 and Ready 'I'
//               50-200 us later; the next Bind 5-30 us after that.
//   block       random 8 KiB reads (70%) and writes on a 100 GiB device,
//               ~20k IOPS (exponential gaps), reads 80-400 us, writes 20-120 us,
//               reads from 16 backend pids, writes from 2 writeback threads.
#include "common/clock.h"
#include "trace/reader.h"
#include "trace/writer.h"

#include <charconv>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace tierlab::trace;

namespace {

struct StmtEv {  // one execution of one session
  Nanos send, resp;
  uint32_t session;
  uint32_t aid;
};

struct BlockEv {
  Nanos issue, complete;
  uint64_t offset;
  int32_t pid;
  bool write;
};

constexpr uint32_t kDevice = (259u << 20) | 1;  // nvme0n1p1 style

std::vector<StmtEv> gen_statements(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  constexpr int kSessions = 8;
  Nanos next_send[kSessions];
  Nanos t0 = 1'000'000'000'000;
  for (int s = 0; s < kSessions; ++s) next_send[s] = t0 + static_cast<Nanos>(rng() % 100'000);
  std::vector<StmtEv> out;
  out.reserve(n);
  // Each session: send, response 50-200 us later, next send 5-30 us later.
  // Records are produced in time order across sessions, as a capture sees
  // them; a response is emitted when its time comes.
  struct Pending { Nanos resp; bool open; };
  while (out.size() < n) {
    int s = 0;
    for (int k = 1; k < kSessions; ++k)
      if (next_send[k] < next_send[s]) s = k;
    Nanos send = next_send[s];
    Nanos resp = send + 50'000 + static_cast<Nanos>(rng() % 150'001);
    out.push_back({send, resp, static_cast<uint32_t>(s + 1), static_cast<uint32_t>(1 + rng() % 1'000'000)});
    next_send[s] = resp + 5'000 + static_cast<Nanos>(rng() % 25'001);
  }
  return out;
}

std::vector<BlockEv> gen_block(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(1.0 / 50'000.0);  // ~20k IOPS
  const uint64_t blocks = (100ull << 30) / 8192;
  std::vector<BlockEv> out;
  out.reserve(n);
  Nanos t = 1'000'000'000'000;
  for (size_t i = 0; i < n; ++i) {
    t += static_cast<Nanos>(gap(rng));
    bool w = rng() % 10 < 3;
    Nanos lat = w ? 20'000 + static_cast<Nanos>(rng() % 100'001) : 80'000 + static_cast<Nanos>(rng() % 320'001);
    int32_t pid = w ? 210 + static_cast<int32_t>(rng() % 2) : 4000 + static_cast<int32_t>(rng() % 16) * 7;
    out.push_back({t, t + lat, (rng() % blocks) * 8192, pid, w});
  }
  return out;
}

// Throughput is measured in CPU time of this thread, so that other load on
// the machine does not count against the code under test ("one core").
struct CpuClock {
  static double now() {
    return static_cast<double>(tierlab::clock_ns(CLOCK_THREAD_CPUTIME_ID)) * 1e-9;
  }
};
double seconds_since(double t0) { return CpuClock::now() - t0; }

struct Timing {
  uint64_t records = 0;
  uint64_t bytes = 0;
  double write_s = 0, read_s = 0;
};

// Reads back what `mem` holds into res.bytes and res.read_s (the reader
// gets the bytes moved, not copied into the timing), summing `touch` of
// each record so that the reading is not optimised away; a count that is
// not res.records ends the program.
template <class Touch>
void time_read(Timing& res, MemorySink& mem, const char* what, Touch&& touch) {
  res.bytes = mem.bytes().size();
  std::vector<uint8_t> bytes = std::move(mem.bytes());
  const double t0 = CpuClock::now();
  Reader r(memory_source(std::move(bytes)));
  Record rec;
  uint64_t n = 0, check = 0;
  while (r.next(rec)) {
    ++n;
    check += touch(rec);
  }
  res.read_s = seconds_since(t0);
  if (n != res.records) {
    std::fprintf(stderr, "%s: read %llu of %llu records\n", what, static_cast<unsigned long long>(n),
                 static_cast<unsigned long long>(res.records));
    std::exit(1);
  }
  if (check == 42) std::puts("");  // keep the loop
}


// Writes the statement stream as a capture would (responses interleaved in
// time order), then reads it back.
Timing run_statements(const std::vector<StmtEv>& evs, const WriterOptions& opts) {
  auto sink = std::make_unique<MemorySink>();
  MemorySink* mem = sink.get();
  mem->bytes().reserve(evs.size() * 32 + (1 << 20));
  Timing res;
  double t0 = CpuClock::now();
  Writer w(std::move(sink), opts);
  {
    // Session startup and the one Parse per session.
    static const uint32_t int4[] = {23};
    for (uint32_t s = 1; s <= 8; ++s) {
      w.write(evs.front().send - 1'000'000, s,
              SessionBegin{"bench", "bench", "pgbench", "127.0.0.1:40000", static_cast<int32_t>(5000 + s), 0});
      w.write(evs.front().send - 900'000, s,
              Parse{"P0_1", "SELECT abalance FROM pgbench_accounts WHERE aid = $1;", int4});
    }
    // Pending responses, a small ring ordered by time (at most one per session).
    struct Resp { Nanos ts; uint32_t session; };
    Resp pending[16];
    size_t npending = 0;
    char digits[16];
    Param prm;
    auto flush_until = [&](Nanos t) {
      for (;;) {
        size_t best = npending;
        for (size_t i = 0; i < npending; ++i)
          if (pending[i].ts <= t && (best == npending || pending[i].ts < pending[best].ts)) best = i;
        if (best == npending) return;
        w.write(pending[best].ts, pending[best].session, Result{"SELECT", true, 1});
        w.write(pending[best].ts, pending[best].session, Ready{'I'});
        pending[best] = pending[--npending];
      }
    };
    for (const StmtEv& e : evs) {
      flush_until(e.send);
      auto [end, ec] = std::to_chars(digits, digits + sizeof digits, e.aid);
      (void)ec;
      prm.value = std::string_view(digits, static_cast<size_t>(end - digits));
      w.write(e.send, e.session, Bind{"", "P0_1", std::span<const Param>(&prm, 1), {}});
      w.write(e.send, e.session, Execute{"", 0});
      w.write(e.send, e.session, Sync{});
      pending[npending++] = {e.resp, e.session};
    }
    flush_until(INT64_MAX);
    w.close();
    res.records = w.records_written();
  }
  res.write_s = seconds_since(t0);
  time_read(res, *mem, "statement stream", [](const Record& rec) { return static_cast<uint64_t>(rec.ts); });
  return res;
}

Timing run_block(const std::vector<BlockEv>& evs, const WriterOptions& opts) {
  auto sink = std::make_unique<MemorySink>();
  MemorySink* mem = sink.get();
  mem->bytes().reserve(evs.size() * 24 + (1 << 20));
  Timing res;
  double t0 = CpuClock::now();
  Writer w(std::move(sink), opts);
  {
    for (const BlockEv& e : evs)
      w.write(e.issue, 0,
              BlockIo{e.complete, kDevice, e.offset, 8192, e.write ? IoOp::Write : IoOp::Read, 0, e.pid});
    w.close();
    res.records = w.records_written();
  }
  res.write_s = seconds_since(t0);
  time_read(res, *mem, "block stream", [](const Record& rec) { return std::get<BlockIo>(rec.body).offset; });
  return res;
}

// --- peer text forms ---------------------------------------------------------

void fmt_time(char* buf, size_t len, Nanos ns, int decimals) {
  // Wall-clock form "2026-11-30 06:00:00.123 UTC" starting at a fixed date.
  time_t sec = 1'795'000'000 + static_cast<time_t>(ns / 1'000'000'000);
  struct tm tm;
  gmtime_r(&sec, &tm);
  char base[32];
  std::strftime(base, sizeof base, "%Y-%m-%d %H:%M:%S", &tm);
  long frac = static_cast<long>(ns % 1'000'000'000);
  if (decimals == 3)
    std::snprintf(buf, len, "%s.%03ld UTC", base, frac / 1'000'000);
  else
    std::snprintf(buf, len, "%s UTC", base);
}

// A PostgreSQL 15 csvlog of the statement stream. duration = false: as
// written with log_statement = 'all' (one "execute" line per execution, what
// pgreplay reads); true: with log_min_duration_statement = 0 (a "bind" and an
// "execute" line with their durations per execution).
void write_csvlog(const std::string& path, const std::vector<StmtEv>& st, bool duration) {
  const char* sql = "SELECT abalance FROM pgbench_accounts WHERE aid = $1;";
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::perror(path.c_str());
    std::exit(1);
  }
  uint64_t line[9] = {};
  char ts[64], start[64];
  fmt_time(start, sizeof start, 0, 0);
  Nanos t0 = st.front().send;
  // log_connections, log_disconnections: pgreplay needs them to know the
  // sessions; the Parse of the prepared statement, once per session.
  auto session_line = [&](uint32_t s, Nanos t, const char* tag, const std::string& msg) {
    fmt_time(ts, sizeof ts, t, 3);
    std::fprintf(f,
                 "%s,\"bench\",\"bench\",%u,\"127.0.0.1:%u\",6565a1b2.%x,%llu,\"%s\",%s,%u/0,0,LOG,00000,"
                 "\"%s\",,,,,,,,,\"pgbench\",\"client backend\",,0\n",
                 ts, 5000 + s, 40000 + s, 5000 + s, static_cast<unsigned long long>(++line[s]), tag, start, s + 2,
                 msg.c_str());
  };
  for (uint32_t s = 1; s <= 8; ++s) {
    session_line(s, 0, "authentication", "connection authorized: user=bench database=bench application_name=pgbench");
    if (duration) session_line(s, 0, "PARSE", std::string("duration: 0.050 ms  parse P0_1: ") + sql);
  }
  char dur[64] = "";
  for (const StmtEv& e : st) {
    uint32_t pid = 5000 + e.session;
    for (int phase = duration ? 0 : 1; phase < 2; ++phase) {
      uint64_t ln = ++line[e.session];
      fmt_time(ts, sizeof ts, (phase ? e.resp : e.send) - t0, 3);
      if (duration)
        std::snprintf(dur, sizeof dur, "duration: %.3f ms  ",
                      phase ? static_cast<double>(e.resp - e.send) / 1e6 : 0.012);
      std::fprintf(f,
                   "%s,\"bench\",\"bench\",%u,\"127.0.0.1:%u\",6565a1b2.%x,%llu,\"%s\",%s,%u/%llu,0,"
                   "LOG,00000,\"%s%s P0_1: %s\",\"parameters: $1 = '%u'\",,,,,,,,"
                   "\"pgbench\",\"client backend\",,0\n",
                   ts, pid, 40000 + e.session, pid, static_cast<unsigned long long>(ln),
                   phase ? "SELECT" : "BIND", start, e.session + 2, static_cast<unsigned long long>(ln),
                   dur, phase ? "execute" : "bind", sql, e.aid);
    }
  }
  for (uint32_t s = 1; s <= 8; ++s)
    session_line(s, st.back().resp - t0, "idle",
                 "disconnection: session time: 0:00:10.000 user=bench database=bench host=127.0.0.1 port=" +
                     std::to_string(40000 + s));
  std::fclose(f);
}

void write_peers(const std::string& dir, const std::vector<StmtEv>& st, const std::vector<BlockEv>& bl) {
  write_csvlog(dir + "/statements.csvlog", st, false);
  write_csvlog(dir + "/statements-duration.csvlog", st, true);
  FILE* f;
  f = std::fopen((dir + "/block.blkparse").c_str(), "w");
  FILE* io = std::fopen((dir + "/block.iolog").c_str(), "w");
  std::fprintf(io, "fio version 3 iolog\n/dev/nvme0n1p1 add\n/dev/nvme0n1p1 open\n");
  Nanos b0 = bl.front().issue;
  uint64_t seq = 0;
  for (const BlockEv& e : bl) {
    uint64_t sector = e.offset / 512;
    for (int phase = 0; phase < 2; ++phase) {
      Nanos t = (phase ? e.complete : e.issue) - b0;
      unsigned long long n = ++seq;
      int cpu = static_cast<int>(n % 2);
      if (phase == 0)
        std::fprintf(f, "259,1    %d %8llu %5lld.%09lld %5d  D  %s %llu + 16 [postgres]\n",
                     cpu, n,
                     static_cast<long long>(t / 1'000'000'000), static_cast<long long>(t % 1'000'000'000),
                     e.pid, e.write ? "WS" : "R", static_cast<unsigned long long>(sector));
      else
        std::fprintf(f, "259,1    %d %8llu %5lld.%09lld     0  C  %s %llu + 16 [0]\n",
                     cpu, n,
                     static_cast<long long>(t / 1'000'000'000), static_cast<long long>(t % 1'000'000'000),
                     e.write ? "WS" : "R", static_cast<unsigned long long>(sector));
    }
    std::fprintf(io, "%lld /dev/nvme0n1p1 %s %llu 8192\n", static_cast<long long>((e.issue - b0) / 1'000'000),
                 e.write ? "write" : "read", static_cast<unsigned long long>(e.offset));
  }
  std::fprintf(io, "/dev/nvme0n1p1 close\n");
  std::fclose(f);
  std::fclose(io);
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: tierlab_bench_trace_throughput [--executions N] [--block-ios N] [--level L]\n"
               "                                      [--chunk-bytes N] [--peers DIR]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  size_t executions = 2'000'000, block_ios = 5'000'000;
  WriterOptions opts;
  std::string peers;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) usage();
    std::string v = argv[++i];
    if (a == "--executions") executions = std::stoull(v);
    else if (a == "--block-ios") block_ios = std::stoull(v);
    else if (a == "--level") opts.compression_level = std::stoi(v);
    else if (a == "--chunk-bytes") opts.chunk_bytes = std::stoull(v);
    else if (a == "--peers") peers = v;
    else usage();
  }
  if (executions == 0 || block_ios == 0) usage();

  auto st = gen_statements(executions, 42);
  auto bl = gen_block(block_ios, 43);
  Timing rs = run_statements(st, opts);
  Timing rb = run_block(bl, opts);

  std::printf("trace format v1, zstd level %d, chunks of %zu bytes, in memory, records/s per CPU-second of one thread\n",
              opts.compression_level, opts.chunk_bytes);
  std::printf("%-11s %10s %12s %9s %14s %12s %12s\n", "stream", "records", "bytes", "B/record",
              "B/unit", "write rec/s", "read rec/s");
  auto row = [](const char* name, const Timing& r, double per_unit, const char* unit) {
    char unit_s[32];
    std::snprintf(unit_s, sizeof unit_s, "%.2f/%s", per_unit, unit);
    std::printf("%-11s %10llu %12llu %9.2f %14s %12.0f %12.0f\n", name,
                static_cast<unsigned long long>(r.records), static_cast<unsigned long long>(r.bytes),
                static_cast<double>(r.bytes) / static_cast<double>(r.records), unit_s,
                static_cast<double>(r.records) / r.write_s, static_cast<double>(r.records) / r.read_s);
  };
  row("statements", rs, static_cast<double>(rs.bytes) / static_cast<double>(executions), "exec");
  row("block", rb, static_cast<double>(rb.bytes) / static_cast<double>(block_ios), "io");
  // Machine-readable line for the script.
  std::printf("RESULT statements_executions=%zu statements_bytes=%llu block_ios=%zu block_bytes=%llu\n",
              executions, static_cast<unsigned long long>(rs.bytes), block_ios,
              static_cast<unsigned long long>(rb.bytes));
  if (!peers.empty()) write_peers(peers, st, bl);
  return 0;
}
