// tierlab capture proxy end to end: the real binary as a child process,
// between real clients (pgbench, psql, libpq) and a throwaway PostgreSQL.
#include "support/support.h"
#include "trace/reader.h"

#include <catch2/catch.hpp>
#include <libpq-fe.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace tierlab;
using tierlab::test::TempDir;

using tierlab::test::slurp;

namespace {

// `tierlab capture proxy` running as a child process.
class ProxyProcess {
 public:
  ProxyProcess(const TempDir& dir, const std::string& upstream, std::vector<std::string> extra = {})
      : out_(dir.file("proxy.out")), err_(dir.file("proxy.err")), trace_(dir.file("capture.tlt")) {
    std::vector<std::string> args = {TIERLAB_BINARY, "capture", "proxy", "--listen", "127.0.0.1:0",
                                     "--upstream", upstream, "--out", trace_};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = test::spawn_to_files(args, out_, err_);
    REQUIRE(pid_ >= 0);
    // Wait for "listening on 127.0.0.1:PORT".
    std::regex re("listening on 127\\.0\\.0\\.1:([0-9]+)");
    for (int i = 0; i < 400; ++i) {
      std::smatch m;
      std::string err = slurp(err_);
      if (std::regex_search(err, m, re)) {
        port_ = std::stoi(m[1]);
        return;
      }
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL("tierlab capture proxy exited early: " << err);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    FAIL("tierlab capture proxy did not start: " << slurp(err_));
  }
  ~ProxyProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  int port() const { return port_; }
  std::string port_str() const { return std::to_string(port_); }
  const std::string& trace_path() const { return trace_; }
  std::string err() const { return slurp(err_); }

  // Sends `sig` and waits; returns the exit status (128 + signal if killed).
  int stop(int sig = SIGINT) {
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    out_text = slurp(out_);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string out_text;

 private:
  std::string out_, err_, trace_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// A record with its strings copied out of the reader.
struct Rec {
  trace::Kind kind = trace::Kind::Meta;
  uint64_t session = 0;
  std::string a, b, c;
  int64_t n = 0;
};

std::vector<Rec> load(const std::string& path, trace::ReadStats* stats = nullptr) {
  auto rd = trace::open_reader(path);
  std::vector<Rec> out;
  trace::Record r;
  while (rd->next(r)) {
    Rec x;
    x.kind = r.kind();
    x.session = r.session;
    std::visit(
        [&x](const auto& b) {
          using T = std::decay_t<decltype(b)>;
          if constexpr (std::is_same_v<T, trace::SessionBegin>) {
            x.a = b.user;
            x.b = b.database;
            x.c = b.application_name;
            x.n = b.backend_pid;
          } else if constexpr (std::is_same_v<T, trace::SessionEnd>) {
            x.n = static_cast<int>(b.reason);
          } else if constexpr (std::is_same_v<T, trace::Query>) {
            x.a = b.sql;
          } else if constexpr (std::is_same_v<T, trace::Parse>) {
            x.a = b.sql;
          } else if constexpr (std::is_same_v<T, trace::Bind>) {
            for (const auto& p : b.params) x.a += std::string(p.value) + ",";
          } else if constexpr (std::is_same_v<T, trace::Error>) {
            x.a = b.sqlstate;
            x.b = b.severity;
            x.c = b.message;
          } else if constexpr (std::is_same_v<T, trace::Result>) {
            x.a = b.tag;
            x.n = static_cast<int64_t>(b.rows);
          } else if constexpr (std::is_same_v<T, trace::CopyData>) {
            x.a = b.data;
            x.n = static_cast<int>(b.dir);
          } else if constexpr (std::is_same_v<T, trace::Ready>) {
            x.n = b.status;
          } else if constexpr (std::is_same_v<T, trace::Meta>) {
            x.a = b.key;
            x.b = b.value;
          }
        },
        r.body);
    out.push_back(std::move(x));
  }
  if (stats) *stats = rd->stats();
  return out;
}

size_t count(const std::vector<Rec>& v, trace::Kind k) {
  return static_cast<size_t>(std::count_if(v.begin(), v.end(), [k](const Rec& r) { return r.kind == k; }));
}

std::string upstream_of(const pgtmp::Server& pg) { return pg.host() + ":" + std::to_string(pg.port()); }

// pgbench's own figures.
struct PgbenchResult {
  long processed = -1, failed = -1;
};
PgbenchResult parse_pgbench(const std::string& out) {
  PgbenchResult r;
  std::smatch m;
  if (std::regex_search(out, m, std::regex("actually processed: ([0-9]+)"))) r.processed = std::stol(m[1]);
  if (std::regex_search(out, m, std::regex("number of failed transactions: ([0-9]+)"))) r.failed = std::stol(m[1]);
  return r;
}

// Why the proxy cannot run its io_uring loop here ("" when it can): what
// `--io io_uring` says when it refuses. Asked once.
const std::string& uring_unsupported() {
  static const std::string why = [] {
    TempDir probe;
    auto r = test::run_tierlab({"capture", "proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1", "--io",
                                "io_uring", "--out", probe.file("probe.tlt"), "--duration", "10ms"});
    return r.status != 0 && r.err.find("io_uring") != std::string::npos ? r.err : std::string();
  }();
  return why;
}

// io_flag: the --io event loop to ask for ("" = the default).
void pgbench_through_proxy(const std::string& mode, const std::string& io_flag = "") {
  auto& pg = test::shared_server();
  std::string out;
  REQUIRE(pg.run_tool("pgbench", {"-i", "-q", "-s", "1"}, &out) == 0);
  TempDir dir;
  std::vector<std::string> extra;
  if (!io_flag.empty()) extra = {"--io", io_flag};
  ProxyProcess px(dir, upstream_of(pg), extra);
  const int clients = 8, per_client = 40;
  out.clear();
  int rc = pg.run_tool("pgbench", {"-n", "-M", mode, "-c", std::to_string(clients), "-j", "2", "-t",
                                   std::to_string(per_client), "-h", "127.0.0.1", "-p", px.port_str()},
                       &out);
  INFO(out);
  REQUIRE(rc == 0);
  auto pr = parse_pgbench(out);
  CHECK(pr.processed == clients * per_client);
  CHECK(pr.failed == 0);
  REQUIRE(px.stop() == 0);
  INFO(px.out_text);

  auto recs = load(px.trace_path());
  auto rd = trace::open_reader(px.trace_path());
  auto sum = trace::summarize(*rd);
  CHECK(sum.read.terminated);
  // tpcb-like: BEGIN, 3 UPDATEs, SELECT, INSERT, END = 7 statements per
  // transaction, each one Query (simple) or one Execute (extended, prepared).
  std::map<uint64_t, uint64_t> per_session;
  for (const auto& r : recs)
    if (r.kind == trace::Kind::Query || r.kind == trace::Kind::Execute) ++per_session[r.session];
  int bench_sessions = 0;
  uint64_t other = 0;
  for (auto [s, n] : per_session) {
    if (n == static_cast<uint64_t>(per_client) * 7) ++bench_sessions;
    else other += n;
  }
  CHECK(bench_sessions == clients);
  // pgbench's setup connection asks for the scale and partitioning: two queries.
  CHECK(other == 2);
  CHECK(sum.statements == static_cast<uint64_t>(pr.processed) * 7 + other);
  CHECK(sum.transactions == static_cast<uint64_t>(pr.processed) + (other ? 2 : 0));
  CHECK(sum.errors == 0);
  CHECK(sum.sessions == clients + 1);
  // The summary the proxy printed agrees with the trace.
  CHECK(px.out_text.find("statements: " + std::to_string(sum.statements) + "\n") != std::string::npos);
  CHECK(px.out_text.find("dropped records: 0") != std::string::npos);
  // Every session began with user/database and a backend pid, and ended cleanly.
  for (const auto& r : recs) {
    if (r.kind == trace::Kind::SessionBegin) {
      CHECK(r.a == pg.superuser());
      CHECK(r.c == "pgbench");
      CHECK(r.n > 0);
    }
    if (r.kind == trace::Kind::SessionEnd) CHECK(r.n == static_cast<int>(trace::EndReason::Clean));
  }
  CHECK(count(recs, trace::Kind::SessionEnd) == clients + 1);
  bool version = false;
  for (const auto& r : recs) version |= r.kind == trace::Kind::Meta && r.a == "server_version" && !r.b.empty();
  CHECK(version);
  // Which event loop ran: io_uring where the kernel has it, epoll where it
  // does not, unless asked otherwise (--io, TIERLAB_PROXY_IO).
  const std::string io_asked = io_flag;
  std::string io;
  for (const auto& r : recs)
    if (r.kind == trace::Kind::Meta && r.a == "io") io = r.b;
  if (const char* forced = std::getenv("TIERLAB_PROXY_IO"); forced && *forced && std::string(forced) != "auto")
    CHECK(io == forced);
  else
    CHECK(io == (io_asked.empty() || io_asked == "auto" ? (uring_unsupported().empty() ? "io_uring" : "epoll")
                                                        : io_asked));
  if (mode == "prepared") {
    CHECK(count(recs, trace::Kind::Parse) == static_cast<size_t>(clients) * 7);
    CHECK(count(recs, trace::Kind::Bind) == static_cast<size_t>(pr.processed) * 7);
  }
}

}  // namespace

TEST_CASE("proxy: pgbench -M simple through the proxy records every statement", "[proxy][parallel]") {
  pgbench_through_proxy("simple");
}

TEST_CASE("proxy: pgbench -M extended through the proxy records every statement", "[proxy][parallel]") {
  pgbench_through_proxy("extended");
}

TEST_CASE("proxy: pgbench -M prepared through the proxy records every statement", "[proxy][parallel]") {
  pgbench_through_proxy("prepared");
}

TEST_CASE("proxy: pgbench -M prepared through the io_uring event loop (--io io_uring) records every statement",
          "[proxy][loop][parallel]") {
  if (std::string why = uring_unsupported(); !why.empty()) test::skip(why);
  pgbench_through_proxy("prepared", "io_uring");
  pgbench_through_proxy("extended", "io_uring");
}

TEST_CASE("proxy: pgbench through the epoll event loop (--io epoll) records every statement", "[proxy][loop][parallel]") {
  pgbench_through_proxy("simple", "epoll");
  pgbench_through_proxy("prepared", "epoll");
}

TEST_CASE("proxy: libpq pipeline mode through the proxy records every statement", "[proxy][parallel]") {
  auto& pg = test::shared_server();
  TempDir dir;
  {
    std::ofstream f(dir.file("pipeline.sql"));
    f << "\\set v random(1, 1000)\n\\startpipeline\nselect :v;\nselect :v + 1;\nselect :v + 3;\n"
         "select :v + 2;\n\\endpipeline\n";
  }
  ProxyProcess px(dir, upstream_of(pg));
  std::string out;
  int rc = pg.run_tool("pgbench", {"-n", "-M", "extended", "-f", dir.file("pipeline.sql"), "-c", "2", "-j", "2",
                                   "-t", "50", "-h", "127.0.0.1", "-p", px.port_str()},
                       &out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(parse_pgbench(out).failed == 0);
  REQUIRE(px.stop() == 0);
  auto recs = load(px.trace_path());
  std::map<uint64_t, uint64_t> executes, syncs;
  for (const auto& r : recs) {
    if (r.kind == trace::Kind::Execute) ++executes[r.session];
    if (r.kind == trace::Kind::Sync) ++syncs[r.session];
  }
  int full = 0;
  for (auto [s, n] : executes)
    if (n == 50 * 4) {
      ++full;
      CHECK(syncs[s] == 50);  // one Sync per pipeline: four statements sent before any reply
    }
  CHECK(full == 2);
}

TEST_CASE("proxy: a scram-sha-256 user logs in and no secret reaches the trace", "[proxy][parallel]") {
  pgtmp::Options o = test::fast_server_options();
  o.host_auth = "scram-sha-256";
  pgtmp::Server pg(o);
  pg.sql("set password_encryption = 'scram-sha-256'; create role alice login password 'sekrit-Pa55'");
  TempDir dir;
  ProxyProcess px(dir, upstream_of(pg));
  setenv("PGPASSWORD", "sekrit-Pa55", 1);
  std::string out;
  int rc = pg.run_tool("psql", {"-X", "-At", "-h", "127.0.0.1", "-p", px.port_str(), "-U", "alice", "-d",
                                "postgres", "-c", "select current_user"},
                       &out);
  CHECK(rc == 0);
  CHECK(out.find("alice") != std::string::npos);
  setenv("PGPASSWORD", "wrong-sekrit", 1);
  out.clear();
  rc = pg.run_tool("psql", {"-X", "-At", "-h", "127.0.0.1", "-p", px.port_str(), "-U", "alice", "-d",
                            "postgres", "-c", "select 1"},
                   &out);
  unsetenv("PGPASSWORD");
  CHECK(rc != 0);
  CHECK(out.find("password authentication failed") != std::string::npos);
  REQUIRE(px.stop() == 0);
  auto recs = load(px.trace_path());
  bool failed_auth = false, query = false;
  for (const auto& r : recs) {
    for (const std::string* s : {&r.a, &r.b, &r.c}) CHECK(s->find("sekrit") == std::string::npos);
    if (r.kind == trace::Kind::Error && r.a == "28P01" && r.b == "FATAL") failed_auth = true;
    if (r.kind == trace::Kind::Query && r.a == "select current_user") query = true;
  }
  CHECK(failed_auth);
  CHECK(query);
}

TEST_CASE("proxy: psql copy in and out through the proxy keeps every row", "[proxy][parallel]") {
  auto& pg = test::shared_server();
  pg.sql("create table copied (id int, name text)");
  TempDir dir;
  {
    std::ofstream f(dir.file("in.tsv"));
    for (int i = 0; i < 2000; ++i) f << i << "\tname " << i << " with some text\n";
  }
  ProxyProcess px(dir, upstream_of(pg));
  std::string out;
  auto psql = [&](const std::string& cmd) {
    out.clear();
    return pg.run_tool("psql", {"-X", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", px.port_str(), "-c", cmd},
                       &out);
  };
  REQUIRE(psql("\\copy copied from '" + dir.file("in.tsv") + "'") == 0);
  REQUIRE(psql("\\copy (select * from copied order by id) to '" + dir.file("out.tsv") + "'") == 0);
  CHECK(slurp(dir.file("out.tsv")) == slurp(dir.file("in.tsv")));
  CHECK(pg.sql("select count(*) from copied") == "2000");
  REQUIRE(px.stop() == 0);
  auto recs = load(px.trace_path());
  std::string in, outd;
  uint64_t copy_rows = 0;
  for (const auto& r : recs) {
    if (r.kind == trace::Kind::CopyData) (r.n == 0 ? in : outd) += r.a;
    if (r.kind == trace::Kind::Result && r.a == "COPY") copy_rows += static_cast<uint64_t>(r.n);
  }
  CHECK(in == slurp(dir.file("in.tsv")));
  CHECK(outd == slurp(dir.file("in.tsv")));
  CHECK(copy_rows == 4000);
  CHECK(count(recs, trace::Kind::CopyDone) == 2);
}

TEST_CASE("proxy: a failing statement is recorded with its SQLSTATE", "[proxy][parallel]") {
  auto& pg = test::shared_server();
  TempDir dir;
  ProxyProcess px(dir, upstream_of(pg));
  std::string out;
  int rc = pg.run_tool("psql", {"-X", "-h", "127.0.0.1", "-p", px.port_str(), "-c", "select 1/0"}, &out);
  CHECK(rc != 0);
  CHECK(out.find("division by zero") != std::string::npos);
  out.clear();
  rc = pg.run_tool("psql", {"-X", "-h", "127.0.0.1", "-p", px.port_str(), "-c", "select * from no_such_table"}, &out);
  CHECK(rc != 0);
  REQUIRE(px.stop() == 0);
  auto recs = load(px.trace_path());
  std::vector<std::string> errs;
  for (const auto& r : recs)
    if (r.kind == trace::Kind::Error) errs.push_back(r.a + " " + r.b + " " + r.c);
  REQUIRE(errs.size() == 2);
  CHECK(errs[0] == "22012 ERROR division by zero");
  CHECK(errs[1] == "42P01 ERROR relation \"no_such_table\" does not exist");
  CHECK(px.out_text.find("errors: 2") != std::string::npos);
}

TEST_CASE("proxy: a client killed mid-transaction ends its session and the proxy keeps serving", "[proxy][parallel]") {
  auto& pg = test::shared_server();
  pg.sql("create table if not exists kills (v int)");
  TempDir dir;
  ProxyProcess px(dir, upstream_of(pg));
  std::string conninfo = "host=127.0.0.1 port=" + px.port_str() + " dbname=postgres user=" + pg.superuser() +
                         " application_name=victim";
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    PGconn* c = PQconnectdb(conninfo.c_str());
    if (PQstatus(c) != CONNECTION_OK) _exit(1);
    PQclear(PQexec(c, "begin"));
    PQclear(PQexec(c, "insert into kills values (1)"));
    (void)!write(ready[1], "x", 1);
    pause();
    _exit(0);
  }
  char b;
  REQUIRE(read(ready[0], &b, 1) == 1);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  // The server's backend goes away: the proxy closed the upstream side.
  std::string left;
  for (int i = 0; i < 100; ++i) {
    left = pg.sql("select count(*) from pg_stat_activity where application_name = 'victim'");
    if (left == "0") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(left == "0");
  CHECK(pg.sql("select count(*) from kills") == "0");  // rolled back
  std::string out;
  out.clear();
  CHECK(pg.run_tool("psql", {"-X", "-At", "-h", "127.0.0.1", "-p", px.port_str(), "-c", "select 42"}, &out) == 0);
  CHECK(out == "42\n");
  REQUIRE(px.stop() == 0);
  auto recs = load(px.trace_path());
  uint64_t victim = 0;
  for (const auto& r : recs)
    if (r.kind == trace::Kind::SessionBegin && r.c == "victim") victim = r.session;
  REQUIRE(victim != 0);
  int end = -1;
  bool inserted = false;
  for (const auto& r : recs) {
    if (r.session != victim) continue;
    if (r.kind == trace::Kind::SessionEnd) end = static_cast<int>(r.n);
    if (r.kind == trace::Kind::Result && r.a == "INSERT" && r.n == 1) inserted = true;
  }
  CHECK(end == static_cast<int>(trace::EndReason::ClientAbort));
  CHECK(inserted);
}

TEST_CASE("proxy: upstream restarted or down gives clients errors and later sessions work", "[proxy][parallel]") {
  pgtmp::Server pg(test::fast_server_options());
  TempDir dir;
  ProxyProcess px(dir, upstream_of(pg));
  std::string conninfo = "host=127.0.0.1 port=" + px.port_str() + " dbname=postgres user=" + pg.superuser();
  PGconn* a = PQconnectdb((conninfo + " application_name=before_restart").c_str());
  PGconn* b = PQconnectdb((conninfo + " application_name=before_restart").c_str());
  REQUIRE(PQstatus(a) == CONNECTION_OK);
  REQUIRE(PQstatus(b) == CONNECTION_OK);
  PQclear(PQexec(b, "begin"));
  pg.restart();
  for (PGconn* c : {a, b}) {
    PGresult* r = PQexec(c, "select 1");
    CHECK(PQresultStatus(r) != PGRES_TUPLES_OK);
    PQclear(r);
    PQfinish(c);
  }
  PGconn* after = PQconnectdb((conninfo + " application_name=after_restart").c_str());
  REQUIRE(PQstatus(after) == CONNECTION_OK);
  PGresult* r = PQexec(after, "select 7");
  CHECK(PQresultStatus(r) == PGRES_TUPLES_OK);
  PQclear(r);
  PQfinish(after);

  // Upstream down: the client gets a FATAL 08001 from the proxy. (In
  // plaintext: with libpq's sslmode prefer, an error over TLS makes libpq
  // try once more without it, a second session.)
  pg.stop();
  PGconn* refused = PQconnectdb((conninfo + " application_name=refused sslmode=disable").c_str());
  CHECK(PQstatus(refused) == CONNECTION_BAD);
  std::string msg = PQerrorMessage(refused);
  CHECK(msg.find("could not connect to upstream server") != std::string::npos);
  PQfinish(refused);
  pg.start();
  PGconn* back = PQconnectdb((conninfo + " application_name=back").c_str());
  CHECK(PQstatus(back) == CONNECTION_OK);
  PQfinish(back);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the Terminate arrive

  REQUIRE(px.stop() == 0);
  auto recs = load(px.trace_path());
  std::map<uint64_t, std::string> app;
  std::map<std::string, std::vector<int>> ends;
  std::map<std::string, std::vector<std::string>> errors;
  for (const auto& r : recs) {
    if (r.kind == trace::Kind::SessionBegin) app[r.session] = r.c;
    if (r.kind == trace::Kind::SessionEnd) ends[app[r.session]].push_back(static_cast<int>(r.n));
    if (r.kind == trace::Kind::Error) errors[app[r.session]].push_back(r.a + " " + r.b);
  }
  CHECK(ends["before_restart"] == std::vector<int>{2, 2});  // ServerClosed
  CHECK(errors["before_restart"] == std::vector<std::string>{"57P01 FATAL", "57P01 FATAL"});
  CHECK(ends["after_restart"] == std::vector<int>{0});
  CHECK(ends["refused"] == std::vector<int>{2});
  CHECK(errors["refused"] == std::vector<std::string>{"08001 FATAL"});
  CHECK(ends["back"] == std::vector<int>{0});
  CHECK(px.err().find("could not connect to upstream server") != std::string::npos);
}

TEST_CASE("proxy: a malformed or oversized message closes only that session", "[proxy][parallel]") {
  auto& pg = test::shared_server();
  TempDir dir;
  ProxyProcess px(dir, upstream_of(pg), {"--max-message-size", "64kB"});
  // A raw client: valid startup, then a message of an unknown type.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(px.port()));
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  std::string body = std::string("\x00\x03\x00\x00", 4) + "user" + '\0' + pg.superuser() + '\0' + "database" +
                     '\0' + "postgres" + '\0' + "application_name" + '\0' + "raw" + '\0' + '\0';
  uint32_t len = htonl(static_cast<uint32_t>(body.size() + 4));
  std::string pkt(reinterpret_cast<const char*>(&len), 4);
  pkt += body;
  REQUIRE(write(fd, pkt.data(), pkt.size()) == static_cast<ssize_t>(pkt.size()));
  // Read until ReadyForQuery ('Z' 0 0 0 5 'I').
  std::string got;
  char buf[4096];
  while (got.find(std::string("Z\0\0\0\x05I", 6)) == std::string::npos) {
    ssize_t n = read(fd, buf, sizeof buf);
    REQUIRE(n > 0);
    got.append(buf, static_cast<size_t>(n));
  }
  const char junk[] = {'\x01', 0, 0, 0, 8, 'a', 'b', 'c', 'd'};
  REQUIRE(write(fd, junk, sizeof junk) == static_cast<ssize_t>(sizeof junk));
  // The proxy tells the client why, then closes.
  std::string told;
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) told.append(buf, static_cast<size_t>(n));
  CHECK(told.find("08P01") != std::string::npos);
  CHECK(told.find("unknown message type") != std::string::npos);
  close(fd);

  // Oversized: a 100 kB query against --max-message-size 64kB.
  std::string out;
  std::string big = "select '" + std::string(100000, 'x') + "'";
  CHECK(pg.run_tool("psql", {"-X", "-h", "127.0.0.1", "-p", px.port_str(), "-c", big}, &out) != 0);
  CHECK(out.find("exceeds the maximum message size") != std::string::npos);  // told why
  // Others carry on.
  out.clear();
  CHECK(pg.run_tool("psql", {"-X", "-At", "-h", "127.0.0.1", "-p", px.port_str(), "-c", "select 5"}, &out) == 0);
  CHECK(out == "5\n");
  REQUIRE(px.stop() == 0);
  std::string err = px.err();
  CHECK(err.find("client message 0x01 at byte") != std::string::npos);
  CHECK(err.find("unknown message type") != std::string::npos);
  CHECK(err.find("exceeds the maximum message size 65536") != std::string::npos);
  auto recs = load(px.trace_path());
  std::set<uint64_t> protocol_ends;
  for (const auto& r : recs)
    if (r.kind == trace::Kind::SessionEnd && r.n == static_cast<int>(trace::EndReason::ProtocolError))
      protocol_ends.insert(r.session);
  CHECK(protocol_ends.size() == 2);
  // What the proxy told each client is in that session's record, with its SQLSTATE.
  std::set<uint64_t> told_sessions;
  std::vector<std::string> told_why;
  for (const auto& r : recs)
    if (r.kind == trace::Kind::Error && r.a == "08P01") {
      CHECK(r.b == "FATAL");
      CHECK(protocol_ends.count(r.session) == 1);
      told_sessions.insert(r.session);
      told_why.push_back(r.c);
    }
  CHECK(told_sessions == protocol_ends);
  REQUIRE(told_why.size() == 2);
  CHECK(told_why[0].find("unknown message type") != std::string::npos);
  CHECK(told_why[1].find("exceeds the maximum message size") != std::string::npos);
  // The summary counts them as errors too.
  CHECK(px.out_text.find("errors: 2\n") != std::string::npos);
}

TEST_CASE("proxy: a client that reads slowly still gets every row (back-pressure)", "[proxy][parallel]") {
  auto& pg = test::shared_server();
  TempDir dir;
  ProxyProcess px(dir, upstream_of(pg));
  std::string conninfo = "host=127.0.0.1 port=" + px.port_str() + " dbname=postgres user=" + pg.superuser();
  PGconn* c = PQconnectdb(conninfo.c_str());
  REQUIRE(PQstatus(c) == CONNECTION_OK);
  // About 20 MB of rows, far more than the proxy queues per direction: the
  // proxy must stop reading the server while the client does not read.
  REQUIRE(PQsendQuery(c, "select g, repeat('x', 2000) from generate_series(1, 10000) g") == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  PGresult* res = PQgetResult(c);
  REQUIRE(res);
  CHECK(PQresultStatus(res) == PGRES_TUPLES_OK);
  CHECK(PQntuples(res) == 10000);
  CHECK(std::string(PQgetvalue(res, 9999, 0)) == "10000");
  CHECK(std::string(PQgetvalue(res, 9999, 1)) == std::string(2000, 'x'));
  PQclear(res);
  while ((res = PQgetResult(c))) PQclear(res);
  // And the session goes on.
  res = PQexec(c, "select 42");
  CHECK(std::string(PQgetvalue(res, 0, 0)) == "42");
  PQclear(res);
  PQfinish(c);
  REQUIRE(px.stop() == 0);
  auto recs = load(px.trace_path());
  std::vector<int64_t> rows;
  for (const auto& r : recs)
    if (r.kind == trace::Kind::Result) rows.push_back(r.n);
  CHECK(rows == std::vector<int64_t>{10000, 1});
  CHECK(count(recs, trace::Kind::SessionEnd) == 1);
}

TEST_CASE("proxy: SIGKILL leaves a trace readable up to its last chunk", "[proxy][parallel]") {
  auto& pg = test::shared_server();
  std::string out;
  REQUIRE(pg.run_tool("pgbench", {"-i", "-q", "-s", "1"}, &out) == 0);
  TempDir dir;
  ProxyProcess px(dir, upstream_of(pg));
  REQUIRE(pg.run_tool("pgbench", {"-n", "-S", "-c", "4", "-j", "2", "-t", "200", "-h", "127.0.0.1", "-p",
                                  px.port_str()},
                      &out) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // the writer flushes every 100 ms
  CHECK(px.stop(SIGKILL) == 128 + SIGKILL);
  trace::ReadStats st;
  auto recs = load(px.trace_path(), &st);
  CHECK_FALSE(st.terminated);
  CHECK(st.chunks >= 1);
  // Everything pgbench did was flushed before the kill.
  size_t statements = count(recs, trace::Kind::Query);
  CHECK(statements >= 800);
}

TEST_CASE("proxy: unix socket listener and SSL refusal and duration and bad addresses", "[proxy][parallel]") {
  auto& pg = test::shared_server();
  TempDir dir;
  std::string sock = dir.file("sock");
  ::mkdir(sock.c_str(), 0777);
  {
    ProxyProcess px(dir, pg.socket_dir() + ":" + std::to_string(pg.port()),
                    {"--listen-unix", sock, "--threads", "1", "--client-tls", "disable"});
    std::string out;
    CHECK(pg.run_tool("psql", {"-X", "-At", "-h", sock, "-p", px.port_str(), "-c", "select 'via unix'"}, &out) == 0);
    CHECK(out == "via unix\n");
    // sslmode=require under --client-tls disable: the proxy answers the
    // SSLRequest with 'N'.
    out.clear();
    CHECK(pg.run_tool("psql", {"-X", "-At", "-d",
                               "host=127.0.0.1 port=" + px.port_str() + " sslmode=require dbname=postgres",
                               "-c", "select 1"},
                      &out) != 0);
    CHECK(out.find("server does not support SSL") != std::string::npos);
    REQUIRE(px.stop(SIGTERM) == 0);
    // The refused client is said in words, not only counted as a connection.
    INFO(px.out_text);
    CHECK(px.out_text.find("connections without a session: 1 (a cancel request; a client that asked for TLS "
                           "(under --client-tls disable)") != std::string::npos);
    auto recs = load(px.trace_path());
    bool unix_begin = false;
    for (const auto& r : recs) unix_begin |= r.kind == trace::Kind::Query && r.a == "select 'via unix'";
    CHECK(unix_begin);
  }
  {
    auto r = test::run_tierlab({"capture", "proxy", "--listen", "127.0.0.1:0", "--upstream",
                                upstream_of(pg), "--out", dir.file("d.tlt"), "--duration", "500ms"});
    CHECK(r.status == 0);
    CHECK(r.out.find("duration reached") != std::string::npos);
    CHECK(r.out.find("sessions: 0") != std::string::npos);
  }
  for (std::string level : {"0", "-3", "19"}) {  // uncompressed, a fast level, a slow level
    std::string t = dir.file("level" + level + ".tlt");
    auto r = test::run_tierlab({"capture", "proxy", "--listen", "127.0.0.1:0", "--upstream", upstream_of(pg),
                                "--out", t, "--duration", "300ms", "--compress-level", level});
    INFO(level << ": " << r.err);
    CHECK(r.status == 0);
    bool upstream_meta = false;
    for (const auto& rec : load(t))
      if (rec.kind == trace::Kind::Meta && rec.a == "upstream") upstream_meta = true;
    CHECK(upstream_meta);
  }
  auto bad = [&](std::vector<std::string> args, const std::string& what) {
    std::vector<std::string> full = {"capture", "proxy", "--out", dir.file("x.tlt")};
    full.insert(full.end(), args.begin(), args.end());
    auto r = test::run_tierlab(full);
    CHECK(r.status == 2);
    CHECK(test::count_lines(r.err) == 1);
    CHECK(r.err.find(what) != std::string::npos);
  };
  bad({"--upstream", "127.0.0.1"}, "--upstream 127.0.0.1: expected HOST:PORT");
  bad({"--upstream", "127.0.0.1:99999"}, "bad port");
  bad({"--upstream", "no-such-host.invalid:5432"}, "--upstream no-such-host.invalid:5432");
  bad({"--upstream", "/no/such/dir"}, "not a directory");
  bad({"--upstream", upstream_of(pg), "--listen", "localhost"}, "--listen localhost: expected HOST:PORT");
  bad({"--upstream", upstream_of(pg), "--listen", "127.0.0.1:" + std::to_string(pg.port())}, "Address already in use");
  bad({"--upstream", upstream_of(pg), "--on-overflow", "maybe"}, "--on-overflow maybe");
  bad({"--upstream", upstream_of(pg), "--compress-level", "23"},
      "--compress-level: 23: must be -100 to 22 (0 writes the trace uncompressed)");
}

TEST_CASE("proxy: capture run --io picks the proxy's event loop and is a proxy flag", "[proxy][parallel]") {
  auto& pg = test::shared_server();
  TempDir dir;
  std::string t = dir.file("run.tlt");
  for (std::string io : {"epoll", "io_uring"}) {
    auto r = test::run_tierlab({"capture", "run", "--listen", "127.0.0.1:0", "--upstream", upstream_of(pg), "--io",
                                io, "--conninfo", pg.conninfo(), "--out", t, "--duration", "500ms",
                                "--sample-interval", "100ms"});
    INFO(r.out << r.err);
    if (io == "io_uring" && r.status != 0 && r.err.find("io_uring") != std::string::npos) continue;  // not here
    REQUIRE(r.status == 0);
    std::string got;
    for (const auto& rec : load(t))
      if (rec.kind == trace::Kind::Meta && rec.a == "io") got = rec.b;
    const char* forced = std::getenv("TIERLAB_PROXY_IO");
    CHECK(got == (forced && *forced && std::string(forced) != "auto" ? std::string(forced) : io));
  }
  auto r = test::run_tierlab({"capture", "run", "--upstream", upstream_of(pg), "--io", "poll", "--out", t});
  CHECK(r.status == 2);
  CHECK(test::count_lines(r.err) == 1);
  CHECK(r.err.find("--io") != std::string::npos);
  r = test::run_tierlab({"capture", "run", "--io", "epoll", "--interface", "lo", "--port", "5432", "--out", t});
  CHECK(r.status == 2);
  CHECK(test::count_lines(r.err) == 1);
  CHECK(r.err.find("not both") != std::string::npos);
}

namespace {

// A raw client through the proxy: startup as `user`, read to ReadyForQuery.
int raw_client(int port, const std::string& user) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  std::string body = std::string("\x00\x03\x00\x00", 4) + "user" + '\0' + user + '\0' + "database" + '\0' +
                     "postgres" + '\0' + '\0';
  uint32_t len = htonl(static_cast<uint32_t>(body.size() + 4));
  std::string pkt(reinterpret_cast<const char*>(&len), 4);
  pkt += body;
  REQUIRE(write(fd, pkt.data(), pkt.size()) == static_cast<ssize_t>(pkt.size()));
  std::string got;
  char buf[4096];
  while (got.find(std::string("Z\0\0\0\x05I", 6)) == std::string::npos) {
    ssize_t n = read(fd, buf, sizeof buf);
    REQUIRE(n > 0);
    got.append(buf, static_cast<size_t>(n));
  }
  return fd;
}

void write_all(int fd, const std::string& s, size_t from, size_t to) {
  while (from < to) {
    ssize_t n = write(fd, s.data() + from, to - from);
    REQUIRE(n > 0);
    from += static_cast<size_t>(n);
  }
}

// Reads the answer to a query up to ReadyForQuery; its bytes.
size_t read_answer(int fd) {
  std::string got;
  char buf[65536];
  while (got.size() < 6 || got.compare(got.size() - 6, 6, std::string("Z\0\0\0\x05I", 6)) != 0) {
    ssize_t n = read(fd, buf, sizeof buf);
    REQUIRE(n > 0);
    got.append(buf, static_cast<size_t>(n));
  }
  return got.size();
}

}  // namespace

TEST_CASE("proxy: two sessions reassembling large queries at once beyond --decoder-memory: one is a counted gap",
          "[proxy][parallel]") {
  auto& pg = test::shared_server();
  TempDir dir;
  ProxyProcess px(dir, upstream_of(pg), {"--threads", "1", "--max-message-size", "1MiB", "--decoder-memory", "1MiB"});
  // Two Query messages of about 900 KiB, each sent in halves: both first
  // halves are held at once (about 386 KiB each beyond the 64 KiB a
  // direction keeps), the second's second half does not fit beside them.
  const std::string sql = "select length('" + std::string(900 << 10, 'x') + "')";
  std::string q = "Q";
  const uint32_t len = htonl(static_cast<uint32_t>(sql.size() + 1 + 4));
  q.append(reinterpret_cast<const char*>(&len), 4);
  q += sql;
  q += '\0';
  const size_t half = q.size() / 2;
  int a = raw_client(px.port(), pg.superuser()), b = raw_client(px.port(), pg.superuser());
  write_all(a, q, 0, half);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  write_all(b, q, 0, half);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  write_all(b, q, half, q.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  write_all(a, q, half, q.size());
  // Both forwarded and answered.
  CHECK(read_answer(a) > 0);
  CHECK(read_answer(b) > 0);
  close(a);
  close(b);
  REQUIRE(px.stop() == 0);
  const std::string err = px.err();
  INFO("stdout:\n" << px.out_text << "stderr:\n" << err);
  size_t lines = 0;
  for (size_t at = err.find("decoder memory full"); at != std::string::npos; at = err.find("decoder memory full", at + 1))
    ++lines;
  CHECK(lines == 1);
  CHECK(err.find("decoder memory full (--decoder-memory 1MiB)") != std::string::npos);
  CHECK(px.out_text.find("messages not recorded, decoder memory full (--decoder-memory 1MiB): 1 (") != std::string::npos);
  // One of the two is in the trace whole, the other is a stream gap.
  auto recs = load(px.trace_path());
  int big = 0, gaps = 0;
  for (const auto& r : recs) {
    if (r.kind == trace::Kind::Query && r.a == sql) ++big;
    if (r.kind == trace::Kind::Loss) ++gaps;
  }
  CHECK(big == 1);
  CHECK(gaps == 1);
}
