// tierlab capture proxy, capture run and capture sniff when the trace's
// disk fills: a small tmpfs as --out's directory (mounting it needs root).
// The proxy keeps forwarding every session, stops recording with one loud
// line, prints what it lost, and the trace written until then reads back
// (`tierlab trace info`/`dump`). capture run does the same and, with no room
// to merge its parts into the trace, keeps them and says how to join them.
// capture sniff goes on decoding a pcap to its end, counting what it lost.
#include "support/support.h"
#include "trace/reader.h"

#include <catch2/catch.hpp>
#include <libpq-fe.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace tierlab;
using tierlab::test::TempDir;

using tierlab::test::slurp;

namespace {

size_t count_occurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// `tierlab capture proxy` (or `capture run` through its proxy) as a child,
// stdout and stderr into files.
class DiskFullProxy {
 public:
  DiskFullProxy(const TempDir& dir, const std::vector<std::string>& extra, const std::string& command = "proxy")
      : out_(dir.file("proxy.out")), err_(dir.file("proxy.err")) {
    std::vector<std::string> args = {TIERLAB_BINARY, "capture", command, "--listen", "127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = test::spawn_to_files(args, out_, err_);
    REQUIRE(pid_ >= 0);
    std::regex re("listening on 127\\.0\\.0\\.1:([0-9]+)");
    for (int i = 0; i < 400; ++i) {
      std::smatch m;
      std::string err = slurp(err_);
      if (std::regex_search(err, m, re)) {
        port_ = std::stoi(m[1]);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    FAIL("tierlab capture proxy did not start: " << slurp(err_));
  }
  ~DiskFullProxy() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  std::string err() const { return slurp(err_); }
  // SIGINT, then the exit status.
  int stop() {
    kill(pid_, SIGINT);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    out_text = slurp(out_);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string out_text;

 private:
  std::string out_, err_;
  pid_t pid_ = -1;
  int port_ = 0;
};

PGconn* connect_to(int port, const pgtmp::Server& pg) {
  const std::string ci = "host=127.0.0.1 port=" + std::to_string(port) + " dbname=postgres user=" + pg.superuser();
  PGconn* c = PQconnectdb(ci.c_str());
  if (PQstatus(c) != CONNECTION_OK) FAIL("connect through the proxy: " << PQerrorMessage(c));
  return c;
}

// A statement whose answer is known: 8 KiB of text built from `i`, sent as
// a parameter and returned. Fails the test unless the answer comes back.
// The text is pseudo-random letters, so that a compressed trace fills its
// disk about as fast as an uncompressed one.
void round_trip(PGconn* c, int i) {
  std::string v(8192, 'a');
  uint32_t x = 2654435761u * static_cast<uint32_t>(i + 1);
  for (char& ch : v) {
    x = x * 1664525u + 1013904223u;
    ch = static_cast<char>('a' + (x >> 24) % 26);
  }
  const char* params[] = {v.c_str()};
  PGresult* r = PQexecParams(c, "SELECT $1::text || $1::text", 1, nullptr, params, nullptr, nullptr, 0);
  INFO("statement " << i << ": " << PQerrorMessage(c));
  REQUIRE(PQresultStatus(r) == PGRES_TUPLES_OK);
  REQUIRE(std::string(PQgetvalue(r, 0, 0)) == v + v);
  PQclear(r);
}

}  // namespace

// Round trips on `c` until the capture says RECORDING STOPPED (at most
// 60 s): the number made.
template <class Capture>
int fill_until_stopped(Capture& px, PGconn* c) {
  int i = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (px.err().find("RECORDING STOPPED") == std::string::npos) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    round_trip(c, i++);
  }
  return i;
}

TEST_CASE("proxy: the trace's disk fills: forwarding goes on, recording stops loudly, the trace reads back",
          "[proxy][disk-full][parallel]") {
  test::require_root("mounting a small tmpfs for the trace");
  auto& pg = test::shared_server();
  TempDir dir;
  test::SmallTmpfs full(dir, "512k");
  const std::string trace = full.file("capture.tlt");
  DiskFullProxy px(dir, {"--upstream", pg.host() + ":" + std::to_string(pg.port()), "--out", trace, "--compress-level",
                 "0"});

  // One session across the moment the disk fills; each statement records
  // about 24 KiB (its parameter, and the result twice as long), so a few
  // dozen fill 512 KiB.
  PGconn* c = connect_to(px.port(), pg);
  int i = fill_until_stopped(px, c);
  INFO(px.err());
  CHECK(i > 10);
  // Still served: the same session, and new ones.
  for (int k = 0; k < 50; ++k) round_trip(c, i++);
  PQfinish(c);
  for (int s = 0; s < 3; ++s) {
    PGconn* more = connect_to(px.port(), pg);
    for (int k = 0; k < 10; ++k) round_trip(more, i++);
    PQfinish(more);
  }

  const int status = px.stop();
  const std::string err = px.err();
  INFO("stdout:\n" << px.out_text << "stderr:\n" << err);
  // Exit 1: the trace is incomplete; one loud line when it happened, one
  // naming the trace at the end.
  CHECK(status == 1);
  CHECK(count_occurrences(err, "RECORDING STOPPED") == 1);
  CHECK(err.find("No space left on device") != std::string::npos);
  CHECK(err.find("--out " + trace) != std::string::npos);
  CHECK(err.find("is incomplete") != std::string::npos);
  std::smatch m;
  REQUIRE(std::regex_search(px.out_text, m, std::regex("not recorded: ([0-9]+) records.*, ([0-9]+) connections")));
  CHECK(std::stoull(m[1]) > 0);
  CHECK(std::stoull(m[2]) == 3);
  REQUIRE(std::regex_search(px.out_text, m, std::regex("\nrecords: ([0-9]+)\n")));
  const uint64_t said = std::stoull(m[1]);
  CHECK(px.out_text.find("recording stopped after ") != std::string::npos);

  // What was written reads back: every record the summary counts, up to the
  // last whole chunk, without an end record and without a damaged tail.
  auto rd = trace::open_reader(trace);
  trace::Record rec;
  uint64_t records = 0, queries = 0;
  while (rd->next(rec)) {
    ++records;
    queries += rec.kind() == trace::Kind::Execute;
  }
  CHECK(records == said);
  CHECK(queries > 5);
  CHECK(queries < static_cast<uint64_t>(i));
  CHECK_FALSE(rd->stats().terminated);
  CHECK(rd->stats().recovered_tail_bytes == 0);
  auto info = test::run_tierlab({"trace", "info", trace});
  INFO(info.err);
  CHECK(info.status == 0);
  auto dump = test::run_tierlab({"trace", "dump", trace});
  CHECK(dump.status == 0);
  CHECK(test::count_lines(dump.out) >= records);
}

namespace {

// Records in a trace (one cut back to its last whole chunk too), and of
// them the statements.
std::pair<uint64_t, uint64_t> count_records(const std::string& path) {
  auto rd = trace::open_reader(path);
  trace::Record rec;
  uint64_t records = 0, queries = 0;
  while (rd->next(rec)) {
    ++records;
    queries += rec.kind() == trace::Kind::Execute;
  }
  return {records, queries};
}

}  // namespace

TEST_CASE("capture run: the trace's disk fills: forwarding goes on, recording stops loudly, the parts are kept",
          "[capture_run][disk-full][parallel]") {
  test::require_root("mounting a small tmpfs for the trace");
  auto& pg = test::shared_server();
  TempDir dir;
  test::SmallTmpfs full(dir, "512k");
  const std::string trace = full.file("capture.tlt");
  DiskFullProxy px(dir,
           {"--upstream", pg.host() + ":" + std::to_string(pg.port()), "--out", trace, "--no-file-io",
            "--sample-interval", "200ms"},
           "run");

  PGconn* c = connect_to(px.port(), pg);
  int i = fill_until_stopped(px, c);
  INFO(px.err());
  CHECK(i > 10);
  // Still served: the same session, and a new one.
  for (int k = 0; k < 50; ++k) round_trip(c, i++);
  PQfinish(c);
  PGconn* more = connect_to(px.port(), pg);
  for (int k = 0; k < 10; ++k) round_trip(more, i++);
  PQfinish(more);

  const int status = px.stop();
  const std::string err = px.err();
  INFO("stdout:\n" << px.out_text << "stderr:\n" << err);
  CHECK(status == 1);
  CHECK(count_occurrences(err, "RECORDING STOPPED") == 1);
  CHECK(err.find("No space left on device") != std::string::npos);
  CHECK(err.find("--out " + trace + "'s disk cannot take more") != std::string::npos);
  // No room for the merged trace beside its parts: the parts stay, each
  // reads back, and `trace merge` joins them where there is room.
  CHECK(err.find("its parts are kept") != std::string::npos);
  CHECK(::access(trace.c_str(), F_OK) != 0);
  const std::string part_tx = trace + ".proxy.part", part_samples = trace + ".samples.part";
  CHECK(err.find("tierlab trace merge " + part_tx + " " + part_samples + " --out " + trace) != std::string::npos);
  auto [tx_records, queries] = count_records(part_tx);
  CHECK(queries > 5);
  CHECK(queries < static_cast<uint64_t>(i));
  const uint64_t sample_records = count_records(part_samples).first;
  const std::string merged = dir.file("merged.tlt");
  auto m = test::run_tierlab({"trace", "merge", part_tx, part_samples, "--out", merged});
  INFO(m.out << m.err);
  REQUIRE(m.status == 0);
  CHECK(count_records(merged).first == tx_records + sample_records);
}

TEST_CASE("capture sniff: the trace's disk fills: decoding goes on to the end, recording stops loudly",
          "[sniff][disk-full][parallel]") {
  test::require_root("tcpdump on loopback and a small tmpfs for the trace");
  const char* tcpdump = ::access("/usr/bin/tcpdump", X_OK) == 0    ? "/usr/bin/tcpdump"
                        : ::access("/usr/sbin/tcpdump", X_OK) == 0 ? "/usr/sbin/tcpdump"
                                                                  : nullptr;
  if (!tcpdump) test::skip("tcpdump is not installed");
  auto& pg = test::shared_server();
  TempDir dir;
  // A pcap of 300 statements of 16 KiB each way (the parameter and the
  // result twice as long): about 7 MiB of trace, far beyond 512 KiB.
  const std::string pcap = dir.file("pg.pcap");
  const pid_t dump = test::spawn_to_files({tcpdump, "-i", "lo", "-n", "-U", "-s", "0", "-w", pcap, "tcp", "port",
                                           std::to_string(pg.port())},
                                          dir.file("tcpdump.out"), dir.file("tcpdump.err"));
  REQUIRE(dump > 0);
  for (int k = 0; k < 400 && slurp(dir.file("tcpdump.err")).find("listening on") == std::string::npos; ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  const std::string ci = "host=127.0.0.1 port=" + std::to_string(pg.port()) + " dbname=postgres user=" + pg.superuser();
  PGconn* c = PQconnectdb(ci.c_str());
  REQUIRE(PQstatus(c) == CONNECTION_OK);
  const int statements = 300;
  for (int i = 0; i < statements; ++i) round_trip(c, i);
  PQfinish(c);
  // tcpdump hands over packets when a ring block fills or times out (1 s);
  // on SIGINT it writes what it has.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ::kill(dump, SIGINT);
  int ws = 0;
  ::waitpid(dump, &ws, 0);
  INFO(slurp(dir.file("tcpdump.err")));
  // -U wrote each packet as it came: the pcap holds the traffic whether or
  // not tcpdump printed its counts (a loaded machine may kill it first).
  struct stat st {};
  REQUIRE(::stat(pcap.c_str(), &st) == 0);
  REQUIRE(st.st_size > (4 << 20));

  test::SmallTmpfs full(dir, "512k");
  const std::string trace = full.file("sniff.tlt");
  auto r = test::run_tierlab({"capture", "sniff", "--pcap", pcap, "--port", std::to_string(pg.port()), "--out", trace,
                              "--compress-level", "0"});
  INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  CHECK(r.status == 1);
  CHECK(count_occurrences(r.err, "RECORDING STOPPED") == 1);
  CHECK(r.err.find("No space left on device") != std::string::npos);
  CHECK(r.err.find("the trace " + trace + " cannot take more") != std::string::npos);
  CHECK(r.err.find("is incomplete") != std::string::npos);
  // Decoding went on to the end of the file: the statements counted are
  // those of the pcap, far more than the trace holds.
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, std::regex("statements: ([0-9]+)")));
  const uint64_t decoded = std::stoull(m[1]);
  CHECK(decoded > static_cast<uint64_t>(statements) * 9 / 10);
  REQUIRE(std::regex_search(r.out, m, std::regex("records written: ([0-9]+)\n")));
  const uint64_t said = std::stoull(m[1]);
  REQUIRE(std::regex_search(r.out, m, std::regex("not recorded: ([0-9]+) records")));
  CHECK(std::stoull(m[1]) > 0);
  CHECK(r.out.find("recording stopped after ") != std::string::npos);
  // The trace so far reads back, every record the summary counts.
  auto [records, queries] = count_records(trace);
  CHECK(records == said);
  CHECK(queries > 5);
  CHECK(queries < decoded / 2);
  auto info = test::run_tierlab({"trace", "info", trace});
  INFO(info.err);
  CHECK(info.status == 0);
}
