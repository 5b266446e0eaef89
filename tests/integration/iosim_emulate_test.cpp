// tierlab iosim emulate as the real binary: a loop device over a FUSE file
// whose requests the tier's shaper admits and times. Needs root, /dev/fuse
// and loop devices (skips without them), no PostgreSQL.
#include "support/background.h"
#include "support/support.h"

#include "common/realtime.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

using tierlab::test::Background;
using tierlab::test::TempDir;

namespace {

const char* kTiers = R"({"tiers": [
  {"name": "lat2ms", "latency": {"read": {"dist": "fixed", "p50_us": 2000},
                                 "write": {"dist": "fixed", "p50_us": 2000},
                                 "flush": {"dist": "fixed", "p50_us": 100}}},
  {"name": "cap2k", "iops": 2000, "io_unit_kib": 256, "merge_sequential": true},
  {"name": "counting", "io_unit_kib": 256, "merge_sequential": true},
  {"name": "lat20ms", "latency": {"read": {"dist": "fixed", "p50_us": 20000},
                                  "write": {"dist": "fixed", "p50_us": 20000},
                                  "flush": {"dist": "fixed", "p50_us": 100}}},
  {"name": "lat400us", "latency": {"read": {"dist": "fixed", "p50_us": 400},
                                   "write": {"dist": "fixed", "p50_us": 400},
                                   "flush": {"dist": "fixed", "p50_us": 100}}},
  {"name": "fast", "iops": 10000000, "latency": {"read": {"dist": "fixed", "p50_us": 1},
                                                 "write": {"dist": "fixed", "p50_us": 1},
                                                 "flush": {"dist": "fixed", "p50_us": 1}}}
]})";

// One emulator run: started, its device read from stdout once it says it is
// ready; stop() sends a signal and reads its last line's totals.
class Emulated {
 public:
  Emulated(const TempDir& dir, const std::string& tier, const std::vector<std::string>& extra = {}) {
    tierlab::test::require_root("iosim emulate (FUSE mount, loop device)");
    if (::access("/dev/fuse", R_OK | W_OK) != 0) tierlab::test::skip("/dev/fuse is missing: no FUSE");
    if (::access("/dev/loop-control", R_OK | W_OK) != 0) tierlab::test::skip("/dev/loop-control is missing");
    std::ofstream(dir.file("tiers.json")) << kTiers;
    std::vector<std::string> argv{TIERLAB_BINARY, "iosim", "emulate", "--tier", tier, "--tiers-file",
                                  dir.file("tiers.json"), "--image", dir.file("img"), "--size", "128M"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    run_ = std::make_unique<Background>(argv, dir.file("emulate.out"));
    const bool ready = run_->wait_for("SIGINT or SIGTERM detaches it\n");
    INFO("stderr: " << run_->err());
    if (!ready && run_->err().find("FUSE: cannot mount") != std::string::npos)
      tierlab::test::skip("FUSE cannot mount here: " + run_->err());
    REQUIRE(ready);
    device_ = run_->out();
    while (!device_.empty() && device_.back() == '\n') device_.pop_back();
    REQUIRE(device_.rfind("/dev/loop", 0) == 0);
    std::smatch m;
    const std::string& e = run_->err();
    REQUIRE(std::regex_search(e, m, std::regex("FUSE file on (\\S+),")));
    mountpoint_ = m[1];
  }
  const std::string& device() const { return device_; }
  const std::string& mountpoint() const { return mountpoint_; }
  Background& process() { return *run_; }

  struct Totals {
    int status = -1;
    uint64_t reads = 0, read_bytes = 0, counted = 0;
    std::string err;
  };
  // Sends `sig` (0: none, it is ending by itself) and waits for the exit.
  Totals stop(int sig = SIGTERM) {
    Totals t;
    t.status = run_->stop(sig);
    t.err = run_->err();
    std::smatch m;
    if (std::regex_search(t.err, m, std::regex("read (\\d+) I/Os (\\d+) bytes.*; (\\d+) counted I/Os"))) {
      t.reads = std::stoull(m[1]);
      t.read_bytes = std::stoull(m[2]);
      t.counted = std::stoull(m[3]);
    }
    return t;
  }

 private:
  std::unique_ptr<Background> run_;
  std::string device_, mountpoint_;
};

// An O_DIRECT read of `len` bytes at `off` from `dev`; its seconds.
struct DirectReader {
  int fd = -1;
  void* buf = nullptr;
  explicit DirectReader(const std::string& dev) {
    fd = ::open(dev.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::posix_memalign(&buf, 4096, 1 << 20) == 0);
  }
  ~DirectReader() {
    ::close(fd);
    std::free(buf);
  }
  double read(uint64_t off, size_t len) {
    auto t0 = std::chrono::steady_clock::now();
    REQUIRE(::pread(fd, buf, len, off_t(off)) == ssize_t(len));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

bool mounted(const std::string& path) {
  std::ifstream f("/proc/self/mounts");
  std::string line;
  while (std::getline(f, line))
    if (line.find(" " + path + " ") != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("iosim emulate: a fixed-latency tier seen by a single reader", "[iosim][emulate]") {
  TempDir dir;
  Emulated emu(dir, "lat2ms");
  // The reader wakes as a database backend would on an idle CPU: with a
  // short slice it does not wait behind a busy machine's other tasks, which
  // would add their time slices to what it measures.
  tierlab::request_short_slice(tierlab::kShortestSliceNs);
  std::vector<double> lat;
  {
    DirectReader r(emu.device());
    for (int i = 0; i < 150; ++i) lat.push_back(r.read(uint64_t(i * 7919 % 30000) * 4096, 4096));
  }
  std::sort(lat.begin(), lat.end());
  const double p50 = lat[lat.size() / 2];
  INFO("p10 " << lat[lat.size() / 10] * 1e3 << " ms, p50 " << p50 * 1e3 << " ms, min " << lat.front() * 1e3
              << " ms; " << emu.process().err());
  // The emulator replies the round trip it measured at start (loop device,
  // FUSE, the wake-ups) before the tier's time, so the reader sees the
  // tier's 2 ms: within 5% at the median, as the issue asks (2.01-2.07 ms at
  // a load average of 12 on two CPUs; uncompensated, 2.16-2.22 ms; a
  // latency applied twice, 4 ms).
  CHECK(p50 > 0.002 * 0.95);
  CHECK(p50 < 0.002 * 1.05);
  CHECK(lat[lat.size() / 10] > 0.002 * 0.9);
  auto t = emu.stop();
  CHECK(t.status == 0);
  CHECK(t.reads == 150);
}

TEST_CASE("iosim emulate: a tier faster than the image's disk is named at start, in one line",
          "[iosim][emulate]") {
  TempDir dir;
  {
    Emulated emu(dir, "fast");
    const std::string err = emu.process().err();
    INFO(err);
    const auto at = err.find("tierlab: iosim emulate: tier faster than the disk: fast reads at a p50 of 1 us, ");
    REQUIRE(at != std::string::npos);
    const std::string line = err.substr(at, err.find('\n', at) - at);
    CHECK(line.find("; it caps reads at 10000000 IOPS, the image's disk delivers ") != std::string::npos);
    CHECK(line.find("those I/Os run at the machine's speed") != std::string::npos);
    CHECK(emu.stop().status == 0);
  }
  Emulated slow(dir, "lat2ms");
  INFO(slow.process().err());
  CHECK(slow.process().err().find("faster than the disk") == std::string::npos);
  CHECK(std::regex_search(slow.process().err(), std::regex("the image's disk: read p50 [1-9][0-9]* us, [1-9][0-9]* IOPS at QD 32")));
  CHECK(slow.stop().status == 0);
}

TEST_CASE("iosim emulate: an IOPS cap holds at QD 32", "[iosim][emulate]") {
  TempDir dir;
  Emulated emu(dir, "cap2k");
  auto r = tierlab::test::run_tierlab({"iosim", "run", "--target", emu.device(), "--direct", "--rw", "randread",
                                       "--bs", "4k", "--iodepth", "32", "--runtime", "3s", "--json", "-"});
  INFO("iosim run: " << r.out << r.err);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  const double iops = j["iops"].get<double>();
  CHECK(iops > 2000 * 0.97);
  CHECK(iops < 2000 * 1.03);
  auto t = emu.stop();
  CHECK(t.status == 0);
  CHECK(t.counted == t.reads);  // 4 KiB random reads: one counted I/O each
  CHECK(t.reads >= j["ios"].get<uint64_t>());
}

TEST_CASE("iosim emulate: more requests in flight than worker threads", "[iosim][emulate]") {
  TempDir dir;
  Emulated emu(dir, "lat20ms");
  // 128 reads in flight, each held 20 ms by the tier: 6,400 IOPS when all
  // are held at once; a worker held per request would give 64 / 20 ms.
  auto r = tierlab::test::run_tierlab({"iosim", "run", "--target", emu.device(), "--direct", "--rw", "randread",
                                       "--bs", "4k", "--iodepth", "128", "--runtime", "3s", "--json", "-"});
  INFO("iosim run: " << r.out << r.err);
  REQUIRE(r.status == 0);
  const double iops = nlohmann::json::parse(r.out)["iops"].get<double>();
  CHECK(iops > 64 / 0.020 * 1.5);
  CHECK(iops < 128 / 0.020 * 1.02);
  auto t = emu.stop();
  INFO(t.err);
  CHECK(t.status == 0);
}

TEST_CASE("iosim emulate: I/Os are counted in 256 KiB units with sequential merge", "[iosim][emulate]") {
  TempDir dir;
  SECTION("one 1 MiB read counts 4") {
    Emulated emu(dir, "counting");
    DirectReader(emu.device()).read(0, 1 << 20);
    auto t = emu.stop();
    INFO(t.err);
    CHECK(t.read_bytes == 1u << 20);
    CHECK(t.counted == 4);
  }
  SECTION("8 sequential 32 KiB reads count 1") {
    Emulated emu(dir, "counting");
    {
      DirectReader r(emu.device());
      for (int i = 0; i < 8; ++i) r.read(64u * 1048576 + uint64_t(i) * 32768, 32768);
    }
    auto t = emu.stop();
    INFO(t.err);
    CHECK(t.reads == 8);
    CHECK(t.counted == 1);
  }
}

namespace {

// fio on `target` with `args`; its JSON report's first job. Skips without fio.
nlohmann::json fio(const std::string& target, const std::string& args) {
  if (std::system("fio --version >/dev/null 2>&1") != 0) tierlab::test::skip("fio is not installed");
  const std::string out = tierlab::test::shell_output("fio --name=t --filename=" + target +
                                                      " --direct=1 --output-format=json " + args + " 2>/dev/null");
  INFO("fio: " << out);
  const auto j = nlohmann::json::parse(out.substr(std::min(out.find('{'), out.size())), nullptr, false);
  REQUIRE(!j.is_discarded());
  return j["jobs"][0];
}

}  // namespace

TEST_CASE("iosim emulate: fio's 1 MiB sequential read counts 4 and its 8 sequential 32 KiB reads count 1",
          "[iosim][emulate]") {
  TempDir dir;
  Emulated emu(dir, "counting");
  fio(emu.device(), "--ioengine=psync --rw=read --bs=1m --offset=0 --size=1m");
  fio(emu.device(), "--ioengine=psync --rw=read --bs=32k --offset=64m --size=256k");
  auto t = emu.stop();
  INFO(t.err);
  CHECK(t.reads == 4 + 8);  // the 1 MiB read reaches the emulator as four of 256 KiB
  CHECK(t.read_bytes == (1u << 20) + 8 * 32768);
  CHECK(t.counted == 4 + 1);
}

namespace {

// The voluntary context switches of every thread of process `pid` so far:
// how often its threads went to sleep to wait for something.
uint64_t voluntary_switches(const std::string& pid) {
  uint64_t n = 0;
  const std::string out = tierlab::test::shell_output("cat /proc/" + pid + "/task/*/status 2>/dev/null");
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("voluntary_ctxt_switches:", 0) == 0) n += std::stoull(line.substr(line.find(':') + 1));
  return n;
}

}  // namespace

TEST_CASE("iosim emulate: a request costs the emulator less than half a wake-up at QD 32", "[iosim][emulate]") {
  TempDir dir;
  Emulated emu(dir, "lat400us");  // replies held for the tier's time, as on any tier with a latency
  std::string pid;
  std::ifstream(emu.mountpoint() + ".lock") >> pid;  // the emulator's pid, written beside its mount point
  REQUIRE(!pid.empty());
  const uint64_t before = voluntary_switches(pid);
  fio(emu.device(), "--ioengine=io_uring --rw=randread --bs=4k --iodepth=32 --runtime=3 --time_based");
  const uint64_t after = voluntary_switches(pid);
  auto t = emu.stop();
  INFO(t.err);
  REQUIRE(t.reads > 1000);
  const double per_request = double(after - before) / double(t.reads);
  INFO("voluntary context switches per request: " << per_request << " (" << after - before << " for " << t.reads
                                                  << " requests)");
  // One thread takes the requests queued since it last looked, puts their
  // backing I/O in one ring submission and waits once for whatever comes
  // next: 0.33 per request here at a load average of 22 on two CPUs.
  // Worker threads that each take a request and sleep in its pread, with a
  // reply thread that sleeps until each held reply's time, made 0.67.
  CHECK(per_request < 0.5);
}

TEST_CASE("iosim emulate: rds-16k under fio's 4 KiB random reads at QD 32 holds its 16k IOPS cap and counts each read",
          "[iosim][emulate][throughput]") {
  TempDir dir;
  Emulated emu(dir, "rds-16k");
  // The cap holds whatever the machine's speed: fio never counts more than
  // 16,000 IOPS (3% for the bucket's start). How close the emulator comes to
  // the cap is a measurement: bench/emulate-overhead runs fio 20 s on rds-16k.
  const auto j = fio(emu.device(), "--ioengine=io_uring --rw=randread --bs=4k --iodepth=32 --runtime=4 --time_based");
  const double iops = j["read"]["iops"].get<double>();
  auto t = emu.stop();
  INFO("fio " << iops << " IOPS; " << t.err);
  CHECK(t.status == 0);
  CHECK(iops > 0);
  CHECK(iops < 16000 * 1.03);
  // 4 KiB random reads count one each, but for the few that happen to
  // start where the one before ended, which merge.
  CHECK(t.counted <= t.reads);
  CHECK(t.counted > t.reads * 0.99);
}

TEST_CASE("iosim emulate: SIGTERM or SIGINT detaches the device and unmounts", "[iosim][emulate][signal]") {
  TempDir dir;
  const int sig = GENERATE(SIGTERM, SIGINT);
  Emulated emu(dir, "lat2ms");
  const std::string dev = emu.device(), mnt = emu.mountpoint();
  const std::string sys = "/sys/block/" + dev.substr(5) + "/loop";
  REQUIRE(::access(sys.c_str(), F_OK) == 0);
  REQUIRE(mounted(mnt));
  {
    DirectReader r(emu.device());
    r.read(0, 4096);
  }
  auto t = emu.stop(sig);
  INFO(t.err);
  CHECK(t.status == 0);
  CHECK(t.err.find("detached " + dev) != std::string::npos);
  CHECK(::access(sys.c_str(), F_OK) != 0);  // no loop device left
  CHECK_FALSE(mounted(mnt));
  struct stat st{};
  CHECK(::stat(mnt.c_str(), &st) != 0);  // nor its mount point
}

TEST_CASE("iosim emulate: a device still open at SIGTERM is served until it is closed", "[iosim][emulate][signal]") {
  TempDir dir;
  Emulated emu(dir, "counting");
  const std::string dev = emu.device();
  const std::string sys = "/sys/block/" + dev.substr(5) + "/loop";
  {
    DirectReader r(dev);
    r.read(0, 4096);
    emu.process().signal(SIGTERM);
    REQUIRE(emu.process().wait_for("is still in use", 5000));
    r.read(4096, 4096);  // still served
    CHECK(::access(sys.c_str(), F_OK) == 0);
  }  // the last user closes it: detached, and the emulator ends by itself
  auto t = emu.stop(0);
  INFO(t.err);
  CHECK(t.status == 0);
  CHECK(t.reads == 2);
  CHECK(::access(sys.c_str(), F_OK) != 0);
  CHECK_FALSE(mounted(emu.mountpoint()));
}

TEST_CASE("iosim emulate: after a SIGKILL the device's I/O fails at once, and the next start removes the dead mount",
          "[iosim][emulate][signal]") {
  TempDir dir;
  std::string mnt;
  {
    Emulated emu(dir, "lat2ms");
    mnt = emu.mountpoint();
    DirectReader r(emu.device());  // holds the loop device, as a mounted file system would
    r.read(0, 4096);
    emu.stop(SIGKILL);
    const auto t0 = std::chrono::steady_clock::now();
    const ssize_t n = ::pread(r.fd, r.buf, 4096, 8192);
    const int e = errno;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO("pread " << n << " errno " << e << " after " << secs << " s");
    CHECK(n < 0);
    CHECK((e == EIO || e == ENOTCONN));
    CHECK(secs < 5);  // an error, not a hang
    CHECK(mounted(mnt));  // the dead mount is left behind
  }
  Emulated next(dir, "lat2ms");
  const std::string err = next.process().err();
  INFO(err);
  CHECK(err.find("tierlab: iosim emulate: unmounted the stale " + mnt + " of a killed emulator\n") !=
        std::string::npos);
  CHECK_FALSE(mounted(mnt));
  CHECK(::access(mnt.c_str(), F_OK) != 0);
  CHECK(::access((mnt + ".lock").c_str(), F_OK) != 0);
  CHECK(::access((next.mountpoint() + ".lock").c_str(), F_OK) == 0);  // the live one keeps its lock
  CHECK(next.stop().status == 0);
  CHECK(::access((next.mountpoint() + ".lock").c_str(), F_OK) != 0);
}

TEST_CASE("iosim emulate: a second signal stops at once though the device is open, and its I/O then fails",
          "[iosim][emulate][signal]") {
  TempDir dir;
  Emulated emu(dir, "counting");
  DirectReader r(emu.device());  // held open, as a mounted file system would
  r.read(0, 4096);
  emu.process().signal(SIGTERM);
  REQUIRE(emu.process().wait_for("is still in use", 5000));
  const auto t0 = std::chrono::steady_clock::now();
  auto t = emu.stop(SIGTERM);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(t.err);
  CHECK(t.status == 0);
  CHECK(secs < 5);
  CHECK(t.err.find("stopping with " + emu.device() + " still attached") != std::string::npos);
  CHECK(t.err.find("detached " + emu.device()) != std::string::npos);
  CHECK(::pread(r.fd, r.buf, 4096, 8192) < 0);  // EIO: nobody serves it
  CHECK_FALSE(mounted(emu.mountpoint()));
}

TEST_CASE("iosim emulate: bad flags fail in one line naming the flag", "[iosim][emulate]") {
  TempDir dir;
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--tier", "nvme-local", "--image", dir.file("i"), "--stats", "0"}, "--stats"},
      {{"--tier", "nvme-local", "--image", dir.file("i"), "--size", "0"}, "--size"},
      {{"--tier", "nvme-local", "--image", dir.file("i"), "--size", "1q"}, "--size"},
      {{"--tier", "no-such-tier", "--image", dir.file("i")}, "unknown tier \"no-such-tier\""},
      {{"--tier", "nvme-local"}, "--image"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args{"iosim", "emulate"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto r = tierlab::test::run_tierlab(args);
    INFO(r.err);
    CHECK(r.status == 2);
    CHECK(r.err.find(c.says) != std::string::npos);
    CHECK(tierlab::test::count_lines(r.err) == 1);
  }
  struct stat st{};
  CHECK(::stat(dir.file("i").c_str(), &st) != 0);  // nothing created

  tierlab::test::require_root("iosim emulate on a directory as --image");
  auto r = tierlab::test::run_tierlab({"iosim", "emulate", "--tier", "nvme-local", "--image", dir.path()});
  INFO(r.err);
  CHECK(r.status == 2);
  CHECK(r.err == "tierlab: --image " + dir.path() + ": not a regular file\n");
}

TEST_CASE("iosim emulate: without root it fails in one line", "[iosim][emulate]") {
  tierlab::test::require_root("changing to an unprivileged user");
  TempDir dir;
  ::chmod(dir.path().c_str(), 0777);
  const std::string out = tierlab::test::shell_output(
      std::string("setpriv --reuid=65534 --regid=65534 --clear-groups ") + TIERLAB_BINARY +
      " iosim emulate --tier nvme-local --image " + dir.file("img") + " --size 16M 2>&1; echo status=$?");
  INFO(out);
  CHECK(out.find("needs root") != std::string::npos);
  CHECK(out.find("status=1") != std::string::npos);
  CHECK(tierlab::test::count_lines(out) == 2);
}
