// tierlab capture proxy with TLS on both sides, end to end: a throwaway
// PostgreSQL with ssl = on, a self-signed certificate made here with the
// openssl tool, and pg_hba allowing only `hostssl ... scram-sha-256` on
// TCP; real clients (pgbench, psql) connecting to the proxy with TLS.
#include "app/command.h"
#include "support/support.h"
#include "support/tls_server.h"
#include "replay/replay.h"
#include "trace/reader.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace tierlab;
using tierlab::test::TempDir;

using tierlab::test::slurp;

namespace {

constexpr const char* kPassword = test::kTlsPassword;
using test::TlsServer;

// `tierlab capture proxy` as a child process.
class TlsProxyProcess {
 public:
  // `command`: "proxy" or "run" (capture run, through the proxy).
  TlsProxyProcess(const TempDir& dir, const std::string& upstream, std::vector<std::string> extra = {},
               const std::string& command = "proxy")
      : out_(dir.file("proxy.out")), err_(dir.file("proxy.err")), trace_(dir.file("capture.tlt")) {
    std::vector<std::string> args = {TIERLAB_BINARY, "capture", command, "--listen", "127.0.0.1:0", "--upstream",
                                     upstream, "--out", trace_};
    if (command == "proxy") args.insert(args.end(), {"--compress-level", "0"});
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
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL("tierlab capture proxy exited early: " << err);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    FAIL("tierlab capture proxy did not start: " << slurp(err_));
  }
  ~TlsProxyProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  std::string port_str() const { return std::to_string(port_); }
  const std::string& trace_path() const { return trace_; }
  std::string err() const { return slurp(err_); }
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
  std::string out_, err_, trace_;
  pid_t pid_ = -1;
  int port_ = 0;
};

struct TlsRec {
  trace::Kind kind = trace::Kind::Meta;
  uint64_t session = 0;
  std::string a, b, c;
  int64_t n = 0;
};

std::vector<TlsRec> load_tls_trace(const std::string& path) {
  auto rd = trace::open_reader(path);
  std::vector<TlsRec> out;
  trace::Record r;
  while (rd->next(r)) {
    TlsRec x;
    x.kind = r.kind();
    x.session = r.session;
    std::visit(
        [&x](const auto& b) {
          using T = std::decay_t<decltype(b)>;
          if constexpr (std::is_same_v<T, trace::SessionBegin>) {
            x.a = b.user;
            x.c = b.application_name;
            x.n = b.backend_pid;
          } else if constexpr (std::is_same_v<T, trace::SessionEnd>) {
            x.n = static_cast<int>(b.reason);
          } else if constexpr (std::is_same_v<T, trace::Query> || std::is_same_v<T, trace::Parse>) {
            x.a = b.sql;
          } else if constexpr (std::is_same_v<T, trace::Bind>) {
            for (const auto& p : b.params) x.a += std::string(p.value) + ",";
          } else if constexpr (std::is_same_v<T, trace::Error>) {
            x.a = b.sqlstate;
            x.b = b.severity;
            x.c = b.message;
          } else if constexpr (std::is_same_v<T, trace::Meta>) {
            x.a = b.key;
            x.b = b.value;
          }
        },
        r.body);
    out.push_back(std::move(x));
  }
  return out;
}

long pgbench_figure(const std::string& out, const char* what) {
  std::smatch m;
  if (std::regex_search(out, m, std::regex(std::string(what) + ": ([0-9]+)"))) return std::stol(m[1]);
  return -1;
}

// Lines of `text` that contain `what`.
size_t lines_with(const std::string& text, const std::string& what) {
  size_t n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += line.find(what) != std::string::npos;
  return n;
}

// A client's conninfo to the proxy over TLS.
std::string via(const TlsProxyProcess& px, const std::string& more = "") {
  return "host=127.0.0.1 port=" + px.port_str() + " dbname=postgres sslmode=require " + more;
}

void pgbench_over_tls(const std::string& mode) {
  TlsServer srv;
  auto& pg = srv.pg;
  std::string out;
  REQUIRE(pg.run_tool("pgbench", {"-i", "-q", "-s", "1", "-h", pg.socket_dir()}, &out) == 0);
  TempDir dir;
  TlsProxyProcess px(dir, srv.upstream(), {"--upstream-sslmode", "require"});
  // The proxy made its own certificate and said so.
  CHECK(lines_with(px.err(), "self-signed certificate made now, SHA-256 fingerprint ") == 1);
  const int clients = 8, per_client = 40;
  out.clear();
  // channel_binding=disable: a client that supports channel binding and is
  // not offered it is refused by a TLS server (the SCRAM test below).
  setenv("PGSSLMODE", "require", 1);
  setenv("PGCHANNELBINDING", "disable", 1);
  int rc = pg.run_tool("pgbench", {"-n", "-M", mode, "-c", std::to_string(clients), "-j", "2", "-t",
                                   std::to_string(per_client), "-h", "127.0.0.1", "-p", px.port_str()},
                       &out);
  unsetenv("PGSSLMODE");
  unsetenv("PGCHANNELBINDING");
  INFO(out);
  INFO(px.err());
  REQUIRE(rc == 0);
  CHECK(pgbench_figure(out, "actually processed") == clients * per_client);
  CHECK(pgbench_figure(out, "number of failed transactions") == 0);
  REQUIRE(px.stop() == 0);
  INFO(px.out_text);

  auto recs = load_tls_trace(px.trace_path());
  auto rd = trace::open_reader(px.trace_path());
  auto sum = trace::summarize(*rd);
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
  CHECK(other == 2);  // pgbench's setup connection
  CHECK(sum.statements == static_cast<uint64_t>(clients * per_client) * 7 + other);
  CHECK(sum.errors == 0);
  CHECK(sum.sessions == clients + 1);
  if (mode == "prepared") {
    size_t parses = 0;
    for (const auto& r : recs) parses += r.kind == trace::Kind::Parse;
    CHECK(parses == static_cast<size_t>(clients) * 7);
  }
  // Each session: a begin with its backend pid, and the TLS version and
  // cipher of both sides in a Meta record named after it.
  std::map<uint64_t, std::string> tls;
  std::regex key("session\\.([0-9]+)\\.tls");
  for (const auto& r : recs) {
    std::smatch m;
    if (r.kind == trace::Kind::SessionBegin) CHECK(r.n > 0);
    if (r.kind == trace::Kind::Meta && std::regex_match(r.a, m, key)) tls[std::stoull(m[1])] = r.b;
    if (r.kind == trace::Kind::SessionEnd) CHECK(r.n == static_cast<int>(trace::EndReason::Clean));
  }
  CHECK(tls.size() == static_cast<size_t>(clients + 1));
  for (auto& [s, v] : tls) {
    INFO(v);
    CHECK(per_session.count(s) == 1);
    CHECK(std::regex_match(v, std::regex("client=TLSv1\\.3/TLS_[A-Z0-9_]+ server=TLSv1\\.3/TLS_[A-Z0-9_]+")));
  }
  // No password and no SASL message in the trace (stored uncompressed:
  // the bytes themselves are searched).
  std::string raw = slurp(px.trace_path());
  CHECK(raw.find(kPassword) == std::string::npos);
  CHECK(raw.find("SCRAM-SHA-256") == std::string::npos);
  CHECK(raw.find("n,,n=") == std::string::npos);  // SASLInitialResponse
  CHECK(raw.find("c=biws") == std::string::npos);  // SASLResponse
  CHECK(raw.find(",s=") == std::string::npos);     // the server's SASL challenge (salt)
}

}  // namespace

TEST_CASE("proxy tls: pgbench -M simple with TLS on both sides and SCRAM records every statement", "[proxy][tls][parallel]") {
  pgbench_over_tls("simple");
}

TEST_CASE("proxy tls: pgbench -M extended with TLS on both sides and SCRAM records every statement",
          "[proxy][tls][parallel]") {
  pgbench_over_tls("extended");
}

TEST_CASE("proxy tls: pgbench -M prepared with TLS on both sides and SCRAM records every statement",
          "[proxy][tls][parallel]") {
  pgbench_over_tls("prepared");
}

TEST_CASE("proxy tls: verify-full takes the right host name and refuses a wrong one in one line", "[proxy][tls][parallel]") {
  TlsServer srv;
  auto& pg = srv.pg;
  TempDir dir;
  {
    // The right name, and the proxy's own certificate from files, which the
    // client verifies in turn.
    TlsProxyProcess px(dir, srv.upstream("localhost"),
                    {"--upstream-sslmode", "verify-full", "--upstream-sslrootcert", srv.cert, "--tls-cert", srv.cert,
                     "--tls-key", pg.data_dir() + "/server.key"});
    CHECK(lines_with(px.err(), "fingerprint") == 0);
    std::string out;
    int rc = pg.run_tool("psql", {"-X", "-At", "-d",
                                  "host=localhost port=" + px.port_str() +
                                      " dbname=postgres sslmode=verify-full channel_binding=disable sslrootcert=" +
                                      srv.cert,
                                  "-c", "select 'verified'"},
                         &out);
    INFO(out << px.err());
    CHECK(rc == 0);
    CHECK(out == "verified\n");
    REQUIRE(px.stop() == 0);
  }
  {
    // 127.0.0.1 is not a name the certificate carries.
    TempDir dir2;
    TlsProxyProcess px(dir2, srv.upstream("127.0.0.1"),
                    {"--upstream-sslmode", "verify-full", "--upstream-sslrootcert", srv.cert});
    std::string out;
    int rc = pg.run_tool("psql", {"-X", "-At", "-d", via(px, "channel_binding=disable"), "-c", "select 1"}, &out);
    INFO(out);
    CHECK(rc != 0);
    CHECK(out.find("tierlab capture proxy: upstream server 127.0.0.1:") != std::string::npos);
    CHECK(out.find("certificate verify failed: IP address mismatch") != std::string::npos);
    std::string err = px.err();
    INFO(err);
    CHECK(lines_with(err, "certificate verify failed") == 1);
    CHECK(lines_with(err, "session ") == 1);
  }
  {
    // require with a root certificate verifies the chain, as libpq does:
    // a root the server's certificate is not under is refused.
    TempDir dir3;
    REQUIRE(test::shell_output("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 "
                               "-subj /CN=other -keyout " + dir3.file("other.key") + " -out " +
                               dir3.file("other.crt") + " 2>/dev/null && echo ok") == "ok");
    TlsProxyProcess px(dir3, srv.upstream("127.0.0.1"),
                    {"--upstream-sslmode", "require", "--upstream-sslrootcert", dir3.file("other.crt")});
    std::string out;
    int rc = pg.run_tool("psql", {"-X", "-At", "-d", via(px, "channel_binding=disable"), "-c", "select 1"}, &out);
    INFO(out);
    CHECK(rc != 0);
    CHECK(out.find("certificate verify failed") != std::string::npos);
    CHECK(lines_with(px.err(), "certificate verify failed") == 1);
  }
  {
    // sslmode require against a server that does not do TLS on this port
    // (its unix socket: never TLS) goes on in plaintext as libpq does; and
    // a bad root certificate file is one line, exit 2.
    auto r = test::run_tierlab({"capture", "proxy", "--upstream", srv.upstream(), "--out", dir.file("x.tlt"),
                                "--upstream-sslmode", "verify-ca", "--upstream-sslrootcert", dir.file("none.pem")});
    CHECK(r.status == 2);
    CHECK(test::count_lines(r.err) == 1);
    CHECK(r.err.find("--upstream-sslrootcert") != std::string::npos);
    r = test::run_tierlab({"capture", "proxy", "--upstream", srv.upstream(), "--out", dir.file("x.tlt"),
                           "--upstream-sslmode", "verify-full"});
    CHECK(r.status == 2);
    CHECK(test::count_lines(r.err) == 1);
    CHECK(r.err.find("--upstream-sslrootcert") != std::string::npos);
    r = test::run_tierlab({"capture", "proxy", "--upstream", srv.upstream(), "--out", dir.file("x.tlt"),
                           "--tls-cert", srv.cert});
    CHECK(r.status == 2);
    CHECK(test::count_lines(r.err) == 1);
    CHECK(r.err.find("--tls-cert: give --tls-key with it") != std::string::npos);
  }
}

TEST_CASE("proxy tls: --client-tls require refuses a plaintext client with one line", "[proxy][tls][parallel]") {
  TlsServer srv;
  auto& pg = srv.pg;
  TempDir dir;
  TlsProxyProcess px(dir, srv.upstream(), {"--client-tls", "require"});
  std::string out;
  int rc = pg.run_tool("psql", {"-X", "-At", "-d",
                                "host=127.0.0.1 port=" + px.port_str() + " dbname=postgres sslmode=disable", "-c",
                                "select 1"},
                       &out);
  INFO(out);
  CHECK(rc != 0);
  // The proxy speaks of what it requires, not of its flags.
  CHECK(out.find("tierlab capture proxy: this proxy requires TLS of its clients: connect with sslmode=require") !=
        std::string::npos);
  CHECK(out.find("--client-tls") == std::string::npos);
  out.clear();
  rc = pg.run_tool("psql", {"-X", "-At", "-d", via(px, "channel_binding=disable"), "-c", "select 'over tls'"}, &out);
  CHECK(rc == 0);
  CHECK(out == "over tls\n");
  REQUIRE(px.stop() == 0);
  std::string err = px.err();
  INFO(err);
  CHECK(lines_with(err, "refused a client without TLS (TLS required of clients)") == 1);
  CHECK(lines_with(err, "--client-tls") == 0);
  CHECK(lines_with(err, "session ") == 1);
}

TEST_CASE("proxy tls: a client that insists on channel binding gets an error naming the proxy's TLS termination",
          "[proxy][tls][parallel]") {
  TlsServer srv;
  auto& pg = srv.pg;
  TempDir dir;
  TlsProxyProcess px(dir, srv.upstream(), {"--upstream-sslmode", "require"});
  // channel_binding=require: libpq refuses by itself, the proxy says why.
  std::string out;
  int rc = pg.run_tool("psql", {"-X", "-At", "-d", via(px, "channel_binding=require"), "-c", "select 1"}, &out);
  INFO(out);
  CHECK(rc != 0);
  CHECK(out.find("channel binding is required, but server did not offer an authentication method that supports "
                 "channel binding") != std::string::npos);
  // channel_binding=prefer (libpq's default) over TLS: the server refuses
  // the client's "supports channel binding" flag; the client is told why
  // by the proxy.
  out.clear();
  rc = pg.run_tool("psql", {"-X", "-At", "-d", via(px, "channel_binding=prefer"), "-c", "select 1"}, &out);
  INFO(out);
  CHECK(rc != 0);
  CHECK(out.find("tierlab capture proxy: SCRAM channel binding cannot pass this proxy, which terminates TLS") !=
        std::string::npos);
  // libpq's defaults (sslmode prefer, channel_binding prefer): after that
  // error over TLS libpq tries once more without TLS, and SCRAM passes.
  out.clear();
  rc = pg.run_tool("psql", {"-X", "-At", "-d", "host=127.0.0.1 port=" + px.port_str() + " dbname=postgres", "-c",
                            "select 'defaults'"},
                   &out);
  CHECK(rc == 0);
  CHECK(out == "defaults\n");
  // Without TLS to the proxy the client does not flag channel binding, and
  // SCRAM passes.
  out.clear();
  rc = pg.run_tool("psql", {"-X", "-At", "-d",
                            "host=127.0.0.1 port=" + px.port_str() + " dbname=postgres sslmode=disable", "-c",
                            "select 'scram through'"},
                   &out);
  CHECK(rc == 0);
  CHECK(out == "scram through\n");
  REQUIRE(px.stop() == 0);
  std::string err = px.err();
  INFO(err);
  CHECK(lines_with(err, "SCRAM-SHA-256-PLUS cannot pass it") == 1);
  CHECK(lines_with(err, "channel binding, which cannot pass the proxy (it terminates TLS)") == 2);
  std::string raw = slurp(px.trace_path());
  CHECK(raw.find(kPassword) == std::string::npos);
  CHECK(raw.find("SCRAM-SHA-256") == std::string::npos);
}

TEST_CASE("proxy tls: --upstream-sslmode disable, allow and prefer against a server that takes only TLS",
          "[proxy][tls][parallel]") {
  TlsServer srv;
  auto& pg = srv.pg;
  for (std::string mode : {"disable", "allow", "prefer"}) {
    TempDir dir;
    TlsProxyProcess px(dir, srv.upstream(), {"--upstream-sslmode", mode});
    std::string out;
    int rc = pg.run_tool("psql", {"-X", "-At", "-d", via(px, "channel_binding=disable"), "-c",
                                  "select 'in " + mode + "'"},
                         &out);
    INFO(mode << ": " << out << px.err());
    if (mode == "disable") {
      // The server's own refusal reaches the client.
      CHECK(rc != 0);
      CHECK(out.find("no encryption") != std::string::npos);
    } else {
      // allow: the plaintext attempt is refused, the proxy tries again with
      // TLS; prefer: TLS first.
      CHECK(rc == 0);
      CHECK(out == "in " + mode + "\n");
    }
    REQUIRE(px.stop() == 0);
    // One record of the session's TLS, naming the side that ended up
    // without it.
    std::vector<std::string> tls;
    for (const auto& r : load_tls_trace(px.trace_path()))
      if (r.kind == trace::Kind::Meta && r.a.find(".tls") != std::string::npos) tls.push_back(r.b);
    REQUIRE(tls.size() == 1);
    CHECK(tls[0].rfind("client=TLSv1.3/", 0) == 0);
    if (mode == "disable") CHECK(tls[0].find(" server=none") != std::string::npos);
    else CHECK(tls[0].find(" server=TLSv1.3/") != std::string::npos);
  }
}

TEST_CASE("proxy tls: capture run proxies with TLS on both sides", "[proxy][tls][parallel]") {
  TlsServer srv;
  auto& pg = srv.pg;
  TempDir dir;
  TlsProxyProcess px(dir, srv.upstream("localhost"),
                  {"--upstream-sslmode", "verify-full", "--upstream-sslrootcert", srv.cert, "--conninfo",
                   pg.conninfo_unix(), "--sample-interval", "100ms"},
                  "run");
  CHECK(lines_with(px.err(), "self-signed certificate made now, SHA-256 fingerprint ") == 1);
  std::string out;
  int rc = pg.run_tool("psql", {"-X", "-At", "-d", via(px, "channel_binding=disable"), "-c", "select 'via run'"}, &out);
  INFO(out << px.err());
  CHECK(rc == 0);
  CHECK(out == "via run\n");
  REQUIRE(px.stop() == 0);
  bool query = false, tls_meta = false;
  for (const auto& r : load_tls_trace(px.trace_path())) {
    query |= r.kind == trace::Kind::Query && r.a == "select 'via run'";
    if (r.kind == trace::Kind::Meta && r.a.find(".tls") != std::string::npos)
      tls_meta = r.b.find("client=TLSv1.3/") == 0 && r.b.find(" server=TLSv1.3/") != std::string::npos;
  }
  CHECK(query);
  CHECK(tls_meta);
  // The TLS flags are proxy flags: not with passive capture.
  auto r = test::run_tierlab({"capture", "run", "--upstream-sslmode", "require", "--interface", "lo", "--port",
                              "5432", "--out", dir.file("x.tlt")});
  CHECK(r.status == 2);
  CHECK(test::count_lines(r.err) == 1);
  CHECK(r.err.find("not both") != std::string::npos);
}

namespace {

// A replay of `trace` against the TLS-only server with `conninfo`, its
// --json report read back.
nlohmann::json replay_json(const TempDir& dir, const std::string& trace, const std::string& conninfo,
                           std::vector<std::string> extra, test::RunResult* run) {
  const std::string json = dir.file("replay.json");
  std::vector<std::string> args = {"replay", trace, "--max-speed", "--json", json, "--db", conninfo};
  args.insert(args.end(), extra.begin(), extra.end());
  *run = test::run_tierlab(args);
  std::ifstream in(json);
  if (!in) return nlohmann::json::object();
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("proxy tls: a capture through TLS replays directly over TLS against the TLS-only server, on both loops",
          "[proxy][tls][replay]") {
  TlsServer srv;
  auto& pg = srv.pg;
  std::string out;
  REQUIRE(pg.run_tool("pgbench", {"-i", "-q", "-s", "1", "-h", pg.socket_dir()}, &out) == 0);
  TempDir dir;
  TlsProxyProcess px(dir, srv.upstream(), {"--upstream-sslmode", "require"});
  setenv("PGSSLMODE", "require", 1);
  setenv("PGCHANNELBINDING", "disable", 1);
  for (const char* mode : {"simple", "prepared"}) {
    int rc = pg.run_tool("pgbench", {"-n", "-M", mode, "-c", "4", "-j", "2", "-t", "20", "-h", "127.0.0.1", "-p",
                                     px.port_str()},
                         &out);
    INFO(out);
    REQUIRE(rc == 0);
  }
  unsetenv("PGSSLMODE");
  unsetenv("PGCHANNELBINDING");
  REQUIRE(px.stop() == 0);
  auto rd = trace::open_reader(px.trace_path());
  const auto sum = trace::summarize(*rd);
  REQUIRE(sum.sessions == 10);  // two setup connections, 4 clients twice
  REQUIRE(sum.errors == 0);

  // Every session through the directly driven path, over TLS (the server
  // takes TCP clients only with hostssl), on each backend of the loop,
  // with the counts of the capture and no error; libpq's path counts the
  // same. Channel binding too: libpq negotiates it before the replay takes
  // the connection over.
  std::vector<std::pair<std::string, std::vector<std::string>>> runs = {
      {"sslmode=require", {"--io", "epoll"}},
      {"sslmode=require channel_binding=require", {"--io", "io_uring"}},
      {"sslmode=verify-full sslrootcert=" + srv.cert, {"--io", "epoll"}},
      {"sslmode=prefer", {"--io", "epoll", "--wire", "libpq"}},
  };
  for (auto& [ssl, extra] : runs) {
    const bool uring = extra[1] == "io_uring";
    if (uring && !replay::uring_unsupported().empty()) {
      WARN("io_uring loop not run: " << replay::uring_unsupported());
      continue;
    }
    const bool direct = std::find(extra.begin(), extra.end(), "libpq") == extra.end();
    const std::string host = ssl.find("verify-full") != std::string::npos ? "localhost" : "127.0.0.1";
    test::RunResult r;
    auto j = replay_json(dir, px.trace_path(), srv.conninfo(ssl, host), extra, &r);
    INFO(ssl << " " << extra[1] << ": " << r.out << r.err);
    CHECK(r.status == 0);
    REQUIRE(j.contains("statements"));
    // The loop asked for, unless the epoll pass forces its own.
    CHECK(j["io"] == app::io_choice(extra[1], "TIERLAB_REPLAY_IO"));
    CHECK(j["sessions"] == sum.sessions);
    CHECK(j["sessions_failed"] == 0);
    CHECK(j["sessions_direct"] == (direct ? sum.sessions : 0));
    CHECK(j["statements"] == sum.statements);
    CHECK(j["errors"] == 0);
    CHECK(j["failed_transactions"] == 0);
  }

  // verify-full against a name the certificate does not carry: refused
  // before anything is replayed, in one line naming the target and why.
  test::RunResult r;
  replay_json(dir, px.trace_path(), srv.conninfo("sslmode=verify-full sslrootcert=" + srv.cert), {}, &r);
  INFO(r.out << r.err);
  CHECK(r.status == 1);
  CHECK(test::count_lines(r.err) == 1);
  CHECK(r.err.find("replay: cannot connect to ") != std::string::npos);
  CHECK(r.err.find("server certificate for \"localhost\"") != std::string::npos);
  CHECK(r.err.find("does not match host name \"127.0.0.1\"") != std::string::npos);
  // sslmode=disable: the server's refusal of a plaintext client, in one line.
  replay_json(dir, px.trace_path(), srv.conninfo("sslmode=disable"), {}, &r);
  CHECK(r.status == 1);
  CHECK(test::count_lines(r.err) == 1);
  CHECK(r.err.find("no encryption") != std::string::npos);
}

TEST_CASE("proxy tls: --upstream-sslcert logs the client in with the proxy's certificate (cert authentication)",
          "[proxy][tls][parallel]") {
  TlsServer srv;
  auto& pg = srv.pg;
  TempDir dir;
  // A self-signed client certificate for the superuser, which the server
  // trusts as its own CA; pg_hba then takes TCP clients only with it.
  std::string cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=" +
                    pg.superuser() + " -keyout " + dir.file("client.key") + " -out " + dir.file("client.crt") +
                    " 2>/dev/null && cp " + dir.file("client.crt") + " " + pg.data_dir() + "/root.crt && chmod 644 " +
                    pg.data_dir() + "/root.crt && echo ok";
  REQUIRE(test::shell_output(cmd) == "ok");
  if (::geteuid() == 0) {
    passwd* pw = ::getpwnam("postgres");
    REQUIRE(::chown((pg.data_dir() + "/root.crt").c_str(), pw->pw_uid, pw->pw_gid) == 0);
  }
  {
    std::ofstream hba(pg.data_dir() + "/pg_hba.conf", std::ios::trunc);
    hba << "local all all trust\n"
        << "hostssl all all 127.0.0.1/32 cert\n";
  }
  pg.sql("alter system set ssl_ca_file = 'root.crt'");
  pg.sql("select pg_reload_conf()");
  for (int i = 0; i < 100 && pg.sql("show ssl_ca_file").rfind("root.crt", 0) != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // pg_hba.conf is read with the same reload
  for (bool with_cert : {false, true}) {
    TempDir pdir;
    std::vector<std::string> extra = {"--upstream-sslmode", "require"};
    if (with_cert)
      extra.insert(extra.end(), {"--upstream-sslcert", dir.file("client.crt"), "--upstream-sslkey",
                                 dir.file("client.key")});
    TlsProxyProcess px(pdir, srv.upstream(), extra);
    std::string out;
    int rc = pg.run_tool("psql", {"-X", "-At", "-d", via(px), "-c", "select 'by certificate'"}, &out);
    INFO(with_cert << ": " << out << px.err());
    if (with_cert) {
      CHECK(rc == 0);
      CHECK(out == "by certificate\n");
    } else {
      CHECK(rc != 0);
      CHECK(out.find("certificate") != std::string::npos);
    }
  }
}

namespace {

// A raw TCP connection to 127.0.0.1:port.
int dial(const std::string& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(port)));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Everything the proxy sends until it closes the connection.
std::string read_all(int fd) {
  std::string got;
  char b[4096];
  for (ssize_t n; (n = ::recv(fd, b, sizeof b, 0)) > 0;) got.append(b, static_cast<size_t>(n));
  return got;
}

}  // namespace

TEST_CASE("proxy tls: bytes after an SSLRequest before the handshake, or no TLS after 'S', close only that session",
          "[proxy][tls][parallel]") {
  auto& pg = test::shared_server();
  TempDir dir;
  TlsProxyProcess px(dir, pg.host() + ":" + std::to_string(pg.port()));
  const unsigned char ssl_request[8] = {0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f};
  {
    // The request and a StartupMessage in one write: the plaintext after it
    // must not pass for data that came through TLS.
    int fd = dial(px.port_str());
    std::string b(reinterpret_cast<const char*>(ssl_request), 8);
    b += std::string("\0\0\0\x09\0\x03\0\0\0", 9);
    REQUIRE(::send(fd, b.data(), b.size(), 0) == static_cast<ssize_t>(b.size()));
    CHECK(read_all(fd) == "S");
    ::close(fd);
  }
  {
    // 'S', then bytes that are no TLS handshake.
    int fd = dial(px.port_str());
    REQUIRE(::send(fd, ssl_request, 8, 0) == 8);
    char s = 0;
    REQUIRE(::recv(fd, &s, 1, 0) == 1);
    CHECK(s == 'S');
    const char junk[] = "GET / HTTP/1.0\r\n\r\n";
    REQUIRE(::send(fd, junk, sizeof junk - 1, 0) == static_cast<ssize_t>(sizeof junk - 1));
    read_all(fd);  // closed (after a TLS alert)
    ::close(fd);
  }
  // The proxy goes on serving.
  std::string out;
  CHECK(pg.run_tool("psql", {"-X", "-At", "-d", via(px), "-c", "select 'still here'"}, &out) == 0);
  CHECK(out == "still here\n");
  REQUIRE(px.stop() == 0);
  std::string err = px.err();
  INFO(err);
  CHECK(lines_with(err, "data after SSLRequest before the TLS handshake") == 1);
  CHECK(lines_with(err, "closed: client TLS handshake") == 1);
}
