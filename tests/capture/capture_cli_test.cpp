// The capture commands through the tierlab binary: bad flags are refused
// before the output is touched, a failed import leaves the trace it would
// have replaced, the proxy never takes over a live server's socket.
#include "capture/proxy.h"
#include "common/error.h"
#include "support/background.h"
#include "support/support.h"
#include "trace/reader.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <tuple>

using tierlab::test::run_tierlab;
using tierlab::test::TempDir;

using tierlab::test::slurp;

namespace {

void spit(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// A good, closed trace at `path` (one Meta record); returns its bytes.
std::string good_trace(const std::string& path) {
  auto w = tierlab::trace::open_writer(path);
  w->write(tierlab::now_ns(), 0, tierlab::trace::Meta{"kept", "yes"});
  w->close();
  return slurp(path);
}

void require_refused(const tierlab::test::RunResult& r, const std::string& flag) {
  INFO("stderr: " << r.err << "\nstdout: " << r.out);
  CHECK(r.status == 2);
  CHECK(tierlab::test::count_lines(r.err) == 1);
  CHECK(r.err.find(flag) != std::string::npos);
}

// A unix stream socket listening at `path`; -1 on failure.
int listen_unix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::strncpy(un.sun_path, path.c_str(), sizeof un.sun_path - 1);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&un), sizeof un) != 0 || ::listen(fd, 8) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

bool connects(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::strncpy(un.sun_path, path.c_str(), sizeof un.sun_path - 1);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&un), sizeof un) == 0;
  ::close(fd);
  return ok;
}

// A TCP port nothing listens on, for --listen (bound and released).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

TEST_CASE("capture proxy --listen-unix leaves a live server's socket and refuses", "[proxy][cli]") {
  TempDir dir;
  const int port = free_port();
  const std::string sock = dir.file(".s.PGSQL." + std::to_string(port));
  int server = listen_unix(sock);
  REQUIRE(server >= 0);
  const std::string out = dir.file("x.tlt");
  auto r = run_tierlab({"capture", "proxy", "--listen", "127.0.0.1:" + std::to_string(port), "--listen-unix",
                        dir.path(), "--upstream", "127.0.0.1:1", "--out", out, "--duration", "1s"});
  require_refused(r, "--listen-unix");
  CHECK(r.err.find("in use") != std::string::npos);
  CHECK(connects(sock));  // the server's socket is still there and still its own
  CHECK_FALSE(std::filesystem::exists(out));
  ::close(server);
}

TEST_CASE("capture proxy --listen-unix refuses a socket whose lock file names a live process",
          "[proxy][cli]") {
  TempDir dir;
  const int port = free_port();
  const std::string sock = dir.file(".s.PGSQL." + std::to_string(port));
  // A socket nobody accepts on, as PostgreSQL's would look to a proxy that
  // cannot connect to it, and PostgreSQL's lock file beside it: its first
  // line is the postmaster's pid (here the test's own, alive).
  int s = listen_unix(sock);
  REQUIRE(s >= 0);
  ::close(s);
  spit(sock + ".lock", std::to_string(::getpid()) + "\n/data\n");
  auto r = run_tierlab({"capture", "proxy", "--listen", "127.0.0.1:" + std::to_string(port), "--listen-unix",
                        dir.path(), "--upstream", "127.0.0.1:1", "--out", dir.file("x.tlt"), "--duration", "1s"});
  require_refused(r, "--listen-unix");
  CHECK(r.err.find(std::to_string(::getpid())) != std::string::npos);
  struct stat st;
  CHECK(::lstat(sock.c_str(), &st) == 0);
}

TEST_CASE("capture proxy --listen-unix replaces a stale socket and removes only its own", "[proxy][cli]") {
  TempDir dir;
  const int port = free_port();
  const std::string sock = dir.file(".s.PGSQL." + std::to_string(port));
  int s = listen_unix(sock);
  REQUIRE(s >= 0);
  ::close(s);  // stale: connecting is refused
  auto r = run_tierlab({"capture", "proxy", "--listen", "127.0.0.1:" + std::to_string(port), "--listen-unix",
                        dir.path(), "--upstream", "127.0.0.1:1", "--out", dir.file("x.tlt"), "--duration",
                        "300ms"});
  INFO(r.err);
  CHECK(r.status == 0);
  struct stat st;
  CHECK(::lstat(sock.c_str(), &st) != 0);  // the proxy's socket went with it
}

TEST_CASE("a failed capture import leaves the existing trace as it was", "[import][cli]") {
  TempDir dir;
  const std::string keep = dir.file("keep.tlt");
  const std::string before = good_trace(keep);
  SECTION("fio iolog") {
    spit(dir.file("f2.log"), "fio version 2 iolog\n/dev/x add\n/dev/x open\n/dev/x read abc 4096\n");
    auto r = run_tierlab({"capture", "import", "--fio-iolog", dir.file("f2.log"), "--out", keep});
    require_refused(r, "f2.log:4");
  }
  SECTION("blkparse") {
    spit(dir.file("b.txt"),
         "  8,0    3       11     0.009507758   697  D   W 223490 + 8 [kjournald]\n"
         "  8,0    3       12     0.0x9520542   697  C   W 223490 + 8 [0]\n");
    auto r = run_tierlab({"capture", "import", "--blkparse", dir.file("b.txt"), "--out", keep});
    require_refused(r, "b.txt:2");
  }
  CHECK(slurp(keep) == before);
  // Nothing left beside it either.
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  CHECK(files == 2);
}

TEST_CASE("capture import replaces the existing trace once the import is whole", "[import][cli]") {
  TempDir dir;
  const std::string keep = dir.file("keep.tlt");
  const std::string before = good_trace(keep);
  spit(dir.file("one.log"), "fio version 3 iolog\n5 /dev/x read 0 4096\n");
  auto r = run_tierlab({"capture", "import", "--fio-iolog", dir.file("one.log"), "--out", keep});
  REQUIRE(r.status == 0);
  CHECK(slurp(keep) != before);
  struct stat st;
  REQUIRE(::stat(keep.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
}

TEST_CASE("an imported trace starts at 0 and its wall clock at the import", "[import][cli]") {
  TempDir dir;
  spit(dir.file("one.log"), "fio version 3 iolog\n5 /dev/x read 0 4096\n");
  spit(dir.file("b.txt"),
       "  8,0    3       11  7200.009507758   697  D   W 223490 + 8 [kjournald]\n"
       "  8,0    3       12  7200.009520542   697  C   W 223490 + 8 [0]\n");
  const time_t now = ::time(nullptr);
  for (const auto& [flag, in, first] : {std::tuple<std::string, std::string, int64_t>{"--fio-iolog", "one.log", 5000},
                                        {"--blkparse", "b.txt", 7200009507758}}) {
    INFO(flag);
    const std::string out = dir.file(in + ".tlt");
    REQUIRE(run_tierlab({"capture", "import", flag, dir.file(in), "--out", out}).status == 0);
    auto rd = tierlab::trace::open_reader(out);
    CHECK(rd->header().start_mono_ns == 0);
    int64_t start_rt = rd->header().start_mono_ns + rd->header().realtime_offset_ns;
    CHECK(std::llabs(start_rt / 1'000'000'000 - now) < 60);
    auto dump = run_tierlab({"trace", "dump", out});
    REQUIRE(dump.status == 0);
    // No negative times: every record is shown at its time in the log.
    CHECK(dump.out.find("\n-") == std::string::npos);
    CHECK(dump.out.rfind("-", 0) != 0);
    char want[64];
    std::snprintf(want, sizeof want, "%lld.%06lld ", static_cast<long long>(first / 1'000'000'000),
                  static_cast<long long>(first % 1'000'000'000 / 1000));
    CHECK(dump.out.find(want) != std::string::npos);
  }
}

// The proxy is a library: it names the options member and the value, and
// the commands put their flag in front (app::for_settings).
TEST_CASE("capture proxy's option checks name the member and the value, not a flag", "[proxy][cli]") {
  TempDir dir;
  tierlab::capture::ProxyOptions po;
  po.listen = "127.0.0.1:0";
  po.upstream = "127.0.0.1";
  po.out = dir.file("never.tlt");
  auto refused = [&](const std::string& setting, const std::string& what) {
    try {
      tierlab::capture::Proxy p(po);
      FAIL("accepted");
    } catch (const tierlab::SettingError& e) {
      CHECK(e.setting() == setting);
      CHECK(std::string(e.what()) == what);
    }
  };
  refused("upstream", "127.0.0.1: expected HOST:PORT");
  po.threads = 300;
  refused("threads", "300: at most 256");
  po.threads = 1;
  po.upstream = "127.0.0.1:1";
  po.client_tls = "sometimes";
  refused("client_tls", "sometimes: expected disable, allow or require");
  // Through the command, the same value with its flag in front.
  auto r = run_tierlab({"capture", "proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1", "--out",
                        dir.file("never.tlt")});
  require_refused(r, "tierlab: --upstream 127.0.0.1: expected HOST:PORT\n");
  CHECK(!std::filesystem::exists(dir.file("never.tlt")));
}

TEST_CASE("capture flags checked late no longer overwrite an existing trace", "[cli]") {
  TempDir dir;
  const std::string keep = dir.file("keep.tlt");
  const std::string before = good_trace(keep);
  SECTION("sniff --max-connections 0") {
    auto r = run_tierlab({"capture", "sniff", "-i", "lo", "-p", "5432", "--max-connections", "0", "-T", "1s",
                          "--out", keep});
    require_refused(r, "tierlab: capture sniff: --max-connections 0: must be 1 to ");
  }
  SECTION("sniff --interface that does not exist") {
    auto r = run_tierlab({"capture", "sniff", "-i", "nosuchif9", "-p", "5432", "-T", "1s", "--out", keep});
    require_refused(r, "tierlab: capture sniff: --interface nosuchif9: no such interface");
  }
  SECTION("block --buffer-kb 0") {
    auto r = run_tierlab({"capture", "block", "--device", "/", "--buffer-kb", "0", "--duration", "1s", "--out", keep});
    require_refused(r, "tierlab: --buffer-kb 0: must be 1 to ");
  }
  SECTION("block and run --device that names no disk") {
    auto r = run_tierlab(
        {"capture", "block", "--device", "no-such-disk9", "--duration", "1s", "--out", keep});
    require_refused(r, "tierlab: --device no-such-disk9: ");
    auto run = run_tierlab({"capture", "run", "--upstream", "127.0.0.1:1", "--device", "no-such-disk9",
                            "--duration", "1s", "--out", keep});
    require_refused(run, "tierlab: --device no-such-disk9: ");
  }
  SECTION("block --buffer-kb larger than memory") {
    auto r = run_tierlab(
        {"capture", "block", "--device", "/", "--buffer-kb", "1048576000", "--duration", "1s", "--out", keep});
    require_refused(r, "--buffer-kb");
  }
  SECTION("block --pid -5, as capture run refuses it") {
    auto r = run_tierlab({"capture", "block", "--device", "/", "--pid", "-5", "--duration", "1s", "--out", keep});
    require_refused(r, "--pid -5: must be a process id");
  }
  SECTION("run --listen that cannot be bound") {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 1) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    auto r = run_tierlab({"capture", "run", "--listen", "127.0.0.1:" + std::to_string(ntohs(a.sin_port)),
                          "--upstream", "127.0.0.1:1", "--duration", "1s", "--out", keep});
    ::close(fd);
    require_refused(r, "tierlab: --listen 127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + ": Address already in use\n");
    CHECK(r.err.find("Address already in use") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(keep + ".proxy.part"));
    CHECK_FALSE(std::filesystem::exists(keep + ".samples.part"));
  }
  CHECK(slurp(keep) == before);
}

TEST_CASE("capture run --pid and capture block --pid refuse a negative pid alike", "[cli]") {
  TempDir dir;
  auto run = run_tierlab({"capture", "run", "--upstream", "127.0.0.1:1", "--pid", "-3", "--out", dir.file("r.tlt")});
  auto block = run_tierlab({"capture", "block", "--device", "/", "--pid", "-3", "--out", dir.file("b.tlt")});
  require_refused(run, "--pid -3: must be a process id");
  CHECK(run.err == block.err);
}

TEST_CASE("a capture written to a device completes: /dev/null is not synced", "[import][cli]") {
  TempDir dir;
  spit(dir.file("one.log"), "fio version 3 iolog\n5 /dev/x read 0 4096\n");
  struct stat before, after;
  REQUIRE(::stat("/dev/null", &before) == 0);
  auto r = run_tierlab({"capture", "import", "--fio-iolog", dir.file("one.log"), "--out", "/dev/null"});
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(r.out.find("1 I/Os") != std::string::npos);
  REQUIRE(::stat("/dev/null", &after) == 0);
  CHECK(S_ISCHR(after.st_mode));           // still the device, not a file renamed over it
  CHECK(after.st_mode == before.st_mode);  // and its mode left alone
  // A null device of mode 0666 of our own (as /dev/null should be): written,
  // its mode kept.
  const std::string dev = dir.file("null");
  if (::mknod(dev.c_str(), S_IFCHR | 0666, ::makedev(1, 3)) == 0) {
    ::chmod(dev.c_str(), 0666);
    auto d = run_tierlab({"capture", "import", "--fio-iolog", dir.file("one.log"), "--out", dev});
    CHECK(d.status == 0);
    REQUIRE(::stat(dev.c_str(), &after) == 0);
    CHECK(S_ISCHR(after.st_mode));
    CHECK((after.st_mode & 0777) == 0666);
  }
  auto p = run_tierlab({"capture", "proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1", "--out",
                        "/dev/null", "--duration", "200ms"});
  INFO(p.err);
  CHECK(p.status == 0);
  CHECK(p.out.find("trace: /dev/null") != std::string::npos);
}

TEST_CASE("a signal that ends a capture import removes its temporary file", "[import][cli]") {
  TempDir dir;
  const std::string fifo = dir.file("in.iolog");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string keep = dir.file("keep.tlt");
  const std::string before = good_trace(keep);
  auto temporary_files = [&] {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path()))
      n += e.path().filename().string().find(".tmp-") != std::string::npos;
    return n;
  };
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    INFO("signal " << sig);
    tierlab::test::Background import({TIERLAB_BINARY, "capture", "import", "--fio-iolog", fifo, "--out", keep},
                                     dir.file("import.out"));
    // The import reads its log from the FIFO, writing the trace beside
    // --out meanwhile: give it the start of a log and wait for that file.
    int w = -1;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while ((w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC)) < 0 &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    REQUIRE(w >= 0);
    const std::string head = "fio version 2 iolog\n/dev/x add\n/dev/x open\n/dev/x read 0 4096\n";
    REQUIRE(::write(w, head.data(), head.size()) == static_cast<ssize_t>(head.size()));
    while (temporary_files() == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    REQUIRE(temporary_files() == 1);
    // Ended by the signal as before, with nothing left behind.
    CHECK(import.stop(sig) == 128 + sig);
    ::close(w);
    CHECK(temporary_files() == 0);
    CHECK(slurp(keep) == before);
  }
}
