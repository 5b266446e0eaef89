// A PostgreSQL on a device `tierlab iosim emulate` serves: a read cap held
// under pgbench -S, and a server killed with SIGKILL mid tpcb-like that
// recovers every commit pgbench saw acknowledged. Needs root, /dev/fuse,
// loop devices, mkfs.ext4 and the PostgreSQL 15 binaries (skips without
// them).
#include "support/background.h"
#include "support/support.h"

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

using tierlab::test::Background;
using tierlab::test::TempDir;

namespace {

const char* kEmulatePgBin = "/usr/lib/postgresql/15/bin";

// An emulator of `tier` (from `tiers`) on a 512 MiB image in `dir`, with
// ext4 on its device mounted at dir/mnt and a data directory there whose
// server (port `port`, socket and logs in dir/logs, off the device) holds
// pgbench's tables at `scale`. The destructor stops the server, unmounts
// and stops the emulator, whatever failed.
class EmulatedServer {
 public:
  EmulatedServer(const TempDir& dir, const std::string& tiers, const std::string& tier, int scale)
      : dir_(dir) {
    tierlab::test::require_root("iosim emulate under PostgreSQL (FUSE mount, loop device)");
    if (::access("/dev/fuse", R_OK | W_OK) != 0) tierlab::test::skip("/dev/fuse is missing: no FUSE");
    if (::access("/dev/loop-control", R_OK | W_OK) != 0) tierlab::test::skip("/dev/loop-control is missing");
    if (tierlab::test::shell_output("command -v mkfs.ext4").empty()) tierlab::test::skip("mkfs.ext4 is missing");
    if (::access((std::string(kEmulatePgBin) + "/postgres").c_str(), X_OK) != 0) tierlab::test::skip("no PostgreSQL 15");
    ::chmod(dir.path().c_str(), 0755);
    std::ofstream(dir.file("tiers.json")) << tiers;
    mnt_ = dir.file("mnt");
    data_ = mnt_ + "/data";
    logs_ = dir.file("logs");
    port_ = std::to_string(20000 + ::getpid() % 20000);
    pg_ = "runuser -u postgres -- " + std::string(kEmulatePgBin);
    ::mkdir(mnt_.c_str(), 0755);
    ::mkdir(logs_.c_str(), 0755);
    tierlab::test::shell_output("chown postgres " + logs_);
    emu_ = std::make_unique<Background>(
        std::vector<std::string>{TIERLAB_BINARY, "iosim", "emulate", "--tier", tier, "--tiers-file",
                                 dir.file("tiers.json"), "--image", dir.file("img"), "--size", "512M", "--stats",
                                 "1s"},
        dir.file("dev"));
    INFO(emu_->err());
    REQUIRE(emu_->wait_for("SIGINT or SIGTERM detaches it\n"));
    ready_ = std::chrono::steady_clock::now();
    dev_ = tierlab::test::shell_output("cat " + dir.file("dev"));
    while (!dev_.empty() && dev_.back() == '\n') dev_.pop_back();
    REQUIRE(dev_.rfind("/dev/loop", 0) == 0);
    const std::string setup = tierlab::test::shell_output(
        "set -e; mkfs.ext4 -q -F " + dev_ + "; mount " + dev_ + " " + mnt_ + "; mkdir " + data_ +
        "; chown postgres " + data_ + "; " + pg_ + "/initdb -D " + data_ + " -A trust -U postgres >/dev/null; " +
        start_command() + "; " + kEmulatePgBin + "/pgbench -q -h " + logs_ + " -p " + port_ + " -U postgres -i -s " +
        std::to_string(scale) + " postgres 2>/dev/null; echo ok");
    INFO("setup: " << setup << tierlab::test::slurp(logs_ + "/pg.log"));
    REQUIRE(setup.find("ok") != std::string::npos);
  }
  ~EmulatedServer() {
    tierlab::test::shell_output(stop_command("immediate") + " >/dev/null 2>&1; " + umount_command());
    if (emu_) emu_->stop(SIGTERM);
  }

  // pg_ctl start, logging to logs/pg.log.
  std::string start_command() const {
    return pg_ + "/pg_ctl -D " + data_ + " -w -l " + logs_ + "/pg.log -o \"-p " + port_ + " -k " + logs_ +
           " -c listen_addresses=''\" start >/dev/null";
  }
  std::string stop_command(const char* mode) const { return pg_ + "/pg_ctl -D " + data_ + " -w -m " + mode + " stop"; }
  std::string umount_command() const {
    return "for i in $(seq 50); do umount " + mnt_ + " 2>/dev/null && break; mountpoint -q " + mnt_ +
           " || break; sleep 0.2; done; mountpoint -q " + mnt_ + " && umount -l " + mnt_ + "; true";
  }
  // pgbench against the server with `args`, its output in dir/NAME.
  std::string pgbench(const std::string& args, const std::string& name) const {
    return std::string(kEmulatePgBin) + "/pgbench -h " + logs_ + " -p " + port_ + " -U postgres " + args + " postgres >" +
           dir_.file(name) + " 2>&1";
  }
  std::string psql(const std::string& sql) const {
    return tierlab::test::shell_output(std::string(kEmulatePgBin) + "/psql -h " + logs_ + " -p " + port_ +
                                       " -U postgres -Atc '" + sql + "' postgres 2>&1");
  }
  // Reads the emulator's stderr up to a --stats line for an interval that
  // began after this call: every interval before it is then in err().
  void drain_stats() {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - ready_).count();
    emu_->wait_for("stats: " + std::to_string(long(s) + 2) + ".0 s:", 5000);
  }
  const std::string& device() const { return dev_; }
  const std::string& data() const { return data_; }
  const std::string& mnt() const { return mnt_; }
  const std::string& logs() const { return logs_; }
  Background& emulator() { return *emu_; }

 private:
  const TempDir& dir_;
  std::string mnt_, data_, logs_, port_, pg_, dev_;
  std::unique_ptr<Background> emu_;
  std::chrono::steady_clock::time_point ready_;
};

// The read requests per second of each --stats line in `err`.
std::vector<double> read_rates(const std::string& err) {
  std::vector<double> out;
  const std::regex line("stats: [0-9.]+ s: .*\\(r ([0-9]+), w [0-9]+, flush [0-9]+\\)");
  for (auto it = std::sregex_iterator(err.begin(), err.end(), line); it != std::sregex_iterator(); ++it)
    out.push_back(std::stod((*it)[1]));
  return out;
}

}  // namespace

TEST_CASE("iosim emulate: a read IOPS cap holds under pgbench -S on a cold cache", "[iosim][emulate]") {
  TempDir dir;
  // Reads capped at 300 a second (one count per request), writes not.
  EmulatedServer pg(dir, R"({"name": "read300", "read_iops": 300})", "read300", 10);
  // A cold page cache: the file system mounted again. pgbench_accounts
  // (scale 10: 1,000,000 rows, 128 MiB) then comes from the device, at
  // far more than 300 reads a second if nothing held it.
  const std::string cycle = tierlab::test::shell_output(
      pg.stop_command("fast") + " >/dev/null && umount " + pg.mnt() + " && mount " + pg.device() + " " + pg.mnt() +
      " && " + pg.start_command() + " && echo ok");
  INFO("remount: " << cycle);
  REQUIRE(cycle.find("ok") != std::string::npos);
  pg.drain_stats();
  const size_t before = read_rates(pg.emulator().err()).size();
  tierlab::test::shell_output(pg.pgbench("-n -S -c 4 -j 2 -T 6", "select.out"));
  const std::string bench = tierlab::test::slurp(dir.file("select.out"));
  INFO("pgbench: " << bench);
  REQUIRE(bench.find("number of transactions actually processed") != std::string::npos);
  pg.drain_stats();
  std::vector<double> rates = read_rates(pg.emulator().err());
  INFO("emulator: " << pg.emulator().err());
  REQUIRE(rates.size() > before + 4);
  // The intervals of the run: those that read (before: the restart's few).
  std::vector<double> run(rates.begin() + long(before), rates.end());
  run.erase(std::remove_if(run.begin(), run.end(), [](double r) { return r < 30; }), run.end());
  REQUIRE(run.size() >= 4);
  // No interval above the cap (its bucket banks 1 ms: 0.3 of a read; the
  // intervals are cut by a timer, so a little slack)...
  CHECK(*std::max_element(run.begin(), run.end()) <= 300 * 1.05);
  // ...and the cap binds: the middle interval at it.
  std::sort(run.begin(), run.end());
  CHECK(run[run.size() / 2] >= 300 * 0.9);
}

TEST_CASE("iosim emulate: PostgreSQL killed with SIGKILL mid tpcb-like recovers every acknowledged commit",
          "[iosim][emulate][durability]") {
  TempDir dir;
  EmulatedServer pg(dir, R"({"name": "quick", "latency": {
      "read": {"dist": "fixed", "p50_us": 200}, "write": {"dist": "fixed", "p50_us": 200},
      "flush": {"dist": "fixed", "p50_us": 500}}})",
                    "quick", 1);
  const std::string pm = tierlab::test::shell_output("head -1 " + pg.data() + "/postmaster.pid | tr -d '\\n'");
  REQUIRE(!pm.empty());
  Background bench({"/bin/sh", "-c", pg.pgbench("-c 4 -T 30", "tpcb.out")}, dir.file("tpcb.sh.out"));
  std::this_thread::sleep_for(std::chrono::seconds(3));
  // The postmaster and every process it started, at once.
  tierlab::test::shell_output("kill -9 " + pm + " $(ps -o pid= --ppid " + pm + ")");
  const auto t0 = std::chrono::steady_clock::now();
  bench.stop(0);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string out = tierlab::test::slurp(dir.file("tpcb.out"));
  INFO("pgbench: " << out);
  CHECK(secs < 20);  // pgbench saw its connections go and ended: nothing hung
  std::smatch m;
  REQUIRE(std::regex_search(out, m, std::regex("number of transactions actually processed: (\\d+)")));
  const long acked = std::stol(m[1]);
  CHECK(acked > 0);
  tierlab::test::shell_output("for i in $(seq 100); do kill -0 " + pm + " 2>/dev/null || break; sleep 0.1; done; rm -f " +
                              pg.data() + "/postmaster.pid");

  // Started again on the same device: crash recovery replays the WAL.
  const std::string count = tierlab::test::shell_output(pg.start_command() + " && echo started");
  INFO("restart: " << count << tierlab::test::slurp(pg.logs() + "/pg.log"));
  REQUIRE(count.find("started") != std::string::npos);
  CHECK(tierlab::test::slurp(pg.logs() + "/pg.log").find("automatic recovery in progress") != std::string::npos);
  const std::string rows = pg.psql("select count(*) from pgbench_history");
  INFO("history rows: " << rows);
  REQUIRE(std::regex_search(rows, m, std::regex("^(\\d+)")));
  const long kept = std::stol(m[1]);
  CHECK(kept >= acked);     // every acknowledged commit is there
  CHECK(kept <= acked + 4); // and at most the 4 clients' commits in flight besides
  pg.drain_stats();
  INFO("emulator: " << pg.emulator().err());
  CHECK(pg.emulator().err().find(" errors") == std::string::npos);  // the device failed no request
}
