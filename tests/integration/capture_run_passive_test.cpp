// capture run in passive mode (--interface/--port) against a real PostgreSQL
// on 127.0.0.1: pgbench's transactions taken from loopback packets, with the
// samplers (and the block recorder) on the same clock in the same trace.
// Loopback capture needs root (CAP_NET_RAW); without it the capture test
// skips. The flag checks run as anyone.
#include "support/background.h"
#include "support/support.h"

#include "trace/reader.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace tierlab;

namespace {

using tierlab::test::Background;

struct Session {
  uint32_t flags = 0;
  std::string application_name;
  uint64_t statements = 0, transactions = 0, unit = 0;
};

struct Counts {
  std::map<uint64_t, Session> sessions;
  uint64_t statements = 0, transactions = 0, gaps = 0, block_ios = 0;
  std::map<std::string, uint64_t> samples;  // name -> count
  trace::Nanos tx_first = INT64_MAX, tx_last = INT64_MIN, sample_first = INT64_MAX, sample_last = INT64_MIN;
  std::map<std::string, std::string> meta;
};

Counts count_passive(const std::string& path) {
  auto reader = trace::open_reader(path);
  Counts c;
  trace::Record r;
  while (reader->next(r)) {
    Session* s = r.session ? &c.sessions[r.session] : nullptr;
    std::visit(
        [&](const auto& b) {
          using T = std::decay_t<decltype(b)>;
          if constexpr (std::is_same_v<T, trace::SessionBegin>) {
            s->flags = b.flags;
            s->application_name = b.application_name;
          } else if constexpr (std::is_same_v<T, trace::Query> || std::is_same_v<T, trace::Execute>) {
            ++s->statements;
            ++s->unit;
            ++c.statements;
          } else if constexpr (std::is_same_v<T, trace::Ready>) {
            if (b.status == 'I' && s->unit > 0) {
              ++s->transactions;
              ++c.transactions;
              c.tx_first = std::min(c.tx_first, r.ts);
              c.tx_last = std::max(c.tx_last, r.ts);
            }
            if (b.status == 'I') s->unit = 0;
          } else if constexpr (std::is_same_v<T, trace::Sample>) {
            ++c.samples[std::string(b.name)];
            c.sample_first = std::min(c.sample_first, r.ts);
            c.sample_last = std::max(c.sample_last, r.ts);
          } else if constexpr (std::is_same_v<T, trace::BlockIo>) {
            ++c.block_ios;
          } else if constexpr (std::is_same_v<T, trace::Loss>) {
            if (b.what == trace::LossKind::StreamGap) ++c.gaps;
          } else if constexpr (std::is_same_v<T, trace::Meta>) {
            c.meta[std::string(b.key)] = std::string(b.value);
          }
        },
        r.body);
  }
  return c;
}

uint64_t number_after(const std::string& text, const std::string& label) {
  std::smatch m;
  REQUIRE(std::regex_search(text, m, std::regex(label + ": ([0-9]+)")));
  return std::stoull(m[1]);
}

constexpr int kClients = 4;
constexpr int kTxPerClient = 150;
constexpr uint64_t kStatementsPerTx = 7;  // tpcb-like: BEGIN, 3 UPDATE, SELECT, INSERT, END

}  // namespace

TEST_CASE("capture run --interface records pgbench from loopback packets with samples on the same clock",
          "[integration][capture_run]") {
  test::require_root("loopback packet capture");
  auto& pg = test::shared_server();
  std::string out;
  REQUIRE(pg.run_tool("pgbench", {"-i", "-q", "-s", "1"}, &out) == 0);
  test::TempDir dir;
  std::string trace_path = dir.file("passive.tlt");
  Background cap({TIERLAB_BINARY, "capture", "run", "--interface", "lo", "--port", std::to_string(pg.port()),
                  "--host", "127.0.0.1", "--device", pg.data_dir(), "--conninfo", pg.conninfo(),
                  "--sample-interval", "200ms", "--out", trace_path},
                 dir.file("capture.out"));
  REQUIRE(cap.wait_for("capturing on lo"));
  // At 500 transactions a second in all (-R), so that the run spans several
  // sample intervals however fast the machine: unthrottled, a quiet machine
  // ran it in 0.17 s, within one 200 ms interval, and the clients' CPU,
  // sampled only while their connections are open, had no sample.
  int rc = pg.run_tool("pgbench", {"-n", "-h", "127.0.0.1", "-p", std::to_string(pg.port()), "-c",
                                   std::to_string(kClients), "-j", "2", "-R", "500", "-t", std::to_string(kTxPerClient)},
                       &out);
  INFO(out);
  REQUIRE(rc == 0);
  std::smatch m;
  REQUIRE(std::regex_search(out, m, std::regex("actually processed: ([0-9]+)")));
  uint64_t processed = std::stoull(m[1]);
  REQUIRE(processed == static_cast<uint64_t>(kClients * kTxPerClient));
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // samples after the last transaction
  REQUIRE(cap.stop(SIGINT) == 0);
  std::string summary = cap.out();
  INFO(summary << cap.err());

  Counts c = count_passive(trace_path);
  // The pgbench clients: every statement and transaction pgbench reports,
  // none lost. The setup connection pgbench opens first runs a few single
  // statements; the sampler's own connection (TCP to the same port, opened
  // before the capture) is not recorded: nothing is joined mid-stream.
  uint64_t client_sessions = 0, tx = 0, st = 0, other_statements = 0;
  for (const auto& [id, s] : c.sessions) {
    INFO("session " << id << ": " << s.statements << " statements, " << s.transactions << " transactions");
    CHECK((s.flags & trace::kSessionUnknownStartup) == 0);
    CHECK(s.application_name != "tierlab_sampler");
    if (s.transactions == static_cast<uint64_t>(kTxPerClient)) {
      ++client_sessions;
      tx += s.transactions;
      st += s.statements;
    } else {
      other_statements += s.statements;
    }
  }
  CHECK(client_sessions == static_cast<uint64_t>(kClients));
  CHECK(tx == processed);
  CHECK(st == processed * kStatementsPerTx);
  CHECK(other_statements <= 4);
  CHECK(c.gaps == 0);
  // The summary agrees with the trace and says what could not be seen.
  CHECK(number_after(summary, "statements") == c.statements);
  CHECK(number_after(summary, "transactions") == c.transactions);
  CHECK(number_after(summary, "kernel drops") == 0);
  CHECK(number_after(summary, "stream gaps") == 0);
  CHECK(number_after(summary, "samples") > 0);
  CHECK(c.meta["capture"] == "sniff");

  // Samples: CPU of the server's process tree and PostgreSQL's counters,
  // taken all through the run, on the transactions' clock.
  CHECK(c.samples["cpu.user_ns"] >= 3);
  CHECK(c.samples["capture.cpu_ns"] >= 3);  // the capture's own CPU
  // pgbench runs on the server's machine: its CPU, found by its connections.
  CHECK(c.samples["clients.cpu_ns"] >= 3);
  CHECK(c.samples["pg.xact_commit"] >= 3);
  CHECK(c.samples["pg.wal_bytes"] >= 3);
  CHECK(c.sample_first <= c.tx_first);
  CHECK(c.sample_last >= c.tx_last - 400'000'000);
  CHECK(c.meta.count("postmaster_pid") == 1);
  CHECK(c.block_ios > 0);
  CHECK(number_after(summary, "block I/O") > 0);

  // The profile reads it like a proxy capture.
  auto prof = test::run_tierlab({"profile", "--json", trace_path});
  INFO(prof.err);
  REQUIRE(prof.status == 0);
  auto j = nlohmann::json::parse(prof.out);
  CHECK(j["clients"] == kClients);
  REQUIRE(j["templates"].size() >= 1);
  CHECK(j["templates"][0]["statements"] == kStatementsPerTx);
  CHECK(j["per_transaction"]["cpu_ms"].get<double>() > 0.01);
  // (/proc counts CPU time in clock ticks: a short pgbench run may show 0.)
  REQUIRE(j["per_transaction"]["client_cpu_ms"].is_number());
  CHECK(j["per_transaction"]["client_cpu_ms"].get<double>() >= 0.0);
  CHECK(j["per_transaction"]["client_cpu_ms"].get<double>() < 5.0);
}

TEST_CASE("capture run takes exactly one of the proxy and the passive mode", "[integration][capture_run]") {
  test::TempDir dir;
  std::string t = dir.file("x.tlt");
  auto one_line_2 = [&](const std::vector<std::string>& args, const std::string& says) {
    auto r = test::run_tierlab(args);
    INFO(r.out << r.err);
    CHECK(r.status == 2);
    CHECK(test::count_lines(r.err) == 1);
    CHECK(r.err.find(says) != std::string::npos);
    CHECK(access(t.c_str(), F_OK) != 0);
  };
  one_line_2({"capture", "run", "--out", t}, "--interface");
  one_line_2({"capture", "run", "--upstream", "127.0.0.1:5432", "--interface", "lo", "--port", "5432", "--out", t},
             "not both");
  one_line_2({"capture", "run", "--listen", "127.0.0.1:0", "--interface", "lo", "--port", "5432", "--out", t},
             "not both");
  one_line_2({"capture", "run", "--upstream", "127.0.0.1:5432", "--port", "5432", "--out", t}, "not both");
  one_line_2({"capture", "run", "--interface", "lo", "--out", t}, "--port");
  one_line_2({"capture", "run", "--interface", "lo", "--port", "5432", "--buffer-size", "lots", "--out", t},
             "--buffer-size");
  // Options the sniffer refuses are refused before the server checks run
  // (no PostgreSQL listens here, so those would print warnings first).
  one_line_2({"capture", "run", "--interface", "lo", "--port", "5432", "--buffer-size", "4k", "--out", t},
             "capture run: --buffer-size 4.0 KiB: must be 64 KiB to 1 GiB");
  one_line_2({"capture", "run", "--interface", "lo", "--port", "5432", "--host", "db.example", "--out", t},
             "capture run: --host 'db.example' is not an IPv4 or IPv6 address");
}
