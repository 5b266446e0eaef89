// trace export --format fio-iolog, replayed by the real fio (3.33 on
// Debian 12) on a scratch file: fio exits 0, reports no line it could not
// read, and issues exactly the I/O the export wrote.
#include "support/support.h"

#include "trace/record.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>

using tierlab::test::run_tierlab;
using namespace tierlab;

namespace {

// The export's lines by action (read, write, sync, ...).
std::map<std::string, uint64_t> actions(const std::string& iolog) {
  std::map<std::string, uint64_t> n;
  std::istringstream in(iolog);
  std::string line;
  std::getline(in, line);  // version
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string t, file, act;
    l >> t >> file >> act;
    ++n[act];
  }
  return n;
}

}  // namespace

TEST_CASE("fio-iolog export replays with fio on a scratch file, I/O for I/O", "[fio][export]") {
  if (std::system("fio --version >/dev/null 2>&1") != 0) tierlab::test::skip("fio is not installed");
  // /var/tmp: a real file system (fio needs O_DIRECT-capable files for --direct; we replay buffered, but a tmpfs
  // would still do); fio runs with this directory as its working directory.
  char tmpl[] = "/var/tmp/tierlab-fio-export-XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  const std::string dir = tmpl;
  struct Rm {
    std::string d;
    ~Rm() { std::filesystem::remove_all(d); }
  } rm{dir};

  // A trace as `capture block` records it: reads, writes, trims and
  // flushes on a block device. Not the root disk's number: were the export
  // to name the device, the replay below must not find a real one.
  const uint32_t dev = (7u << 20) | 1000;  // loop1000
  constexpr uint64_t kBlocks = 1024;  // 4 MiB
  uint64_t want_reads = 0, want_writes = 0, want_trims = 0, want_sync = 0, want_datasync = 0;
  {
    trace::WriterOptions wo;
    wo.start_mono_ns = 0;
    auto w = trace::open_writer(dir + "/cap.tlt", wo);
    std::mt19937_64 rng(7);
    trace::Nanos t = 1'000'000;
    for (int i = 0; i < 400; ++i, t += 50'000) {
      trace::BlockIo b;
      b.device = dev;
      b.complete_ns = t + 20'000;
      b.pid = 100;
      uint64_t k = rng() % 20;
      if (k == 0) {
        b.op = trace::IoOp::Flush;
        b.flags = (rng() & 1) ? trace::kIoMeta : 0;
        ++((b.flags & trace::kIoMeta) ? want_sync : want_datasync);
      } else {
        b.op = k < 3 ? trace::IoOp::Discard : k < 9 ? trace::IoOp::Write : trace::IoOp::Read;
        b.offset = (rng() % kBlocks) * 4096;
        b.length = 4096u << (rng() % 3);
        if (b.offset + b.length > kBlocks * 4096) b.offset = kBlocks * 4096 - b.length;
        ++(b.op == trace::IoOp::Discard ? want_trims : b.op == trace::IoOp::Write ? want_writes : want_reads);
      }
      w->write(t, 0, b);
    }
    w->close();
  }
  REQUIRE(want_trims > 0);
  REQUIRE(want_sync + want_datasync > 0);

  auto r = run_tierlab({"trace", "export", dir + "/cap.tlt", "--format", "fio-iolog", "--out", dir + "/cap.iolog"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  std::ifstream f(dir + "/cap.iolog");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string iolog = ss.str();
  // Nothing names the captured device (fatal: fio is not run on an iolog
  // that names one); the trims are left out and counted.
  REQUIRE(iolog.find("/dev/") == std::string::npos);
  CHECK(r.err.find("not the trace's /dev/") != std::string::npos);
  CHECK(r.err.find(std::to_string(want_trims) + " trims left out") != std::string::npos);
  auto n = actions(iolog);
  CHECK(n["read"] == want_reads);
  CHECK(n["write"] == want_writes);
  CHECK(n["sync"] == want_sync);
  CHECK(n["datasync"] == want_datasync);
  CHECK(n.count("trim") == 0);

  // fio reads every line: issued reads, writes and syncs match ("datasync"
  // is not in fio's issued counts), and every sync and datasync is timed
  // (at queue depth 1: deeper, fio 3.33 times only some of them).
  auto replay = [&](const std::string& extra) {
    std::string cmd = "cd " + dir + " && fio --name=replay --read_iolog=cap.iolog --ioengine=io_uring --iodepth=1 " +
                      extra + " --output-format=json --output=fio.json 2>fio.err";
    int rc = std::system(cmd.c_str());
    std::string err = tierlab::test::shell_output("cat " + dir + "/fio.err");
    INFO(cmd << "\n" << err);
    REQUIRE(rc == 0);
    CHECK(err.find("bad") == std::string::npos);  // "bad ddir", "bad iolog"
    std::ifstream jf(dir + "/fio.json");
    auto j = nlohmann::json::parse(jf)["jobs"][0];
    CHECK(j["error"] == 0);
    CHECK(j["read"]["total_ios"] == want_reads);
    CHECK(j["write"]["total_ios"] == want_writes);
    CHECK(j["trim"]["total_ios"] == 0);
    CHECK(j["sync"]["total_ios"] == want_sync);
    CHECK(j["sync"]["lat_ns"]["N"] == want_sync + want_datasync);
  };
  SECTION("redirected to a scratch file of the size stderr gives") {
    std::ofstream(dir + "/scratch.img").close();
    std::filesystem::resize_file(dir + "/scratch.img", kBlocks * 4096);
    CHECK(r.err.find("at least " + std::to_string(kBlocks * 4096) + " bytes") != std::string::npos);
    replay("--replay_redirect=" + dir + "/scratch.img");
    CHECK(!std::filesystem::exists(dir + "/tierlab-replay.img"));
  }
  SECTION("as exported: fio creates the placeholder in its working directory") {
    replay("");
    CHECK(std::filesystem::exists(dir + "/tierlab-replay.img"));
  }
}

TEST_CASE("fio-iolog export refuses a mounted loop device and the file behind it", "[fio][export]") {
  tierlab::test::require_root("losetup and mount");
  for (const char* tool : {"losetup", "mkfs.ext4", "mount", "umount"})
    if (std::system((std::string("command -v ") + tool + " >/dev/null 2>&1").c_str()) != 0)
      tierlab::test::skip(std::string(tool) + " is not installed");
  char tmpl[] = "/var/tmp/tierlab-fio-loop-XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  const std::string dir = tmpl;
  const std::string img = dir + "/disk.img", mnt = dir + "/mnt";
  std::filesystem::create_directory(mnt);
  REQUIRE(std::system(("truncate -s 32M " + img + " && mkfs.ext4 -q -F " + img + " >/dev/null 2>&1").c_str()) == 0);
  const std::string loop = tierlab::test::shell_output("losetup -f --show " + img + " 2>/dev/null");
  if (loop.empty()) {
    std::filesystem::remove_all(dir);
    tierlab::test::skip("no free loop device");
  }
  struct Undo {
    std::string dir, loop, mnt;
    bool mounted = false;
    ~Undo() {
      if (mounted) (void)std::system(("umount " + mnt).c_str());
      (void)std::system(("losetup -d " + loop).c_str());
      std::filesystem::remove_all(dir);
    }
  } undo{dir, loop, mnt};
  if (std::system(("mount " + loop + " " + mnt + " 2>/dev/null").c_str()) != 0)
    tierlab::test::skip("cannot mount " + loop);
  undo.mounted = true;

  {
    std::ofstream f(dir + "/in.iolog");
    f << "fio version 3 iolog\n0 /x add\n0 /x open\n5 /x write 0 4096\n9 /x close\n";
  }
  REQUIRE(run_tierlab({"capture", "import", "--fio-iolog", dir + "/in.iolog", "--out", dir + "/t.tlt"}).status == 0);
  auto exp = [&](const std::string& target) {
    return run_tierlab({"trace", "export", dir + "/t.tlt", "--format", "fio-iolog", "--fio-file", target});
  };
  auto r = exp(loop);
  CHECK(r.status == 2);
  CHECK(r.err == "tierlab: --fio-file " + loop + ": " + loop + " is mounted on " + mnt +
                     "; fio replaying the iolog would write to it (--allow-device to export anyway)\n");
  r = exp(img);
  CHECK(r.status == 2);
  CHECK(tierlab::test::count_lines(r.err) == 1);
  CHECK(r.err.find("--fio-file " + img + ": it backs " + loop + ": " + loop + " is mounted on " + mnt) !=
        std::string::npos);
  // Unmounted, the same device and file may be named.
  REQUIRE(std::system(("umount " + mnt).c_str()) == 0);
  undo.mounted = false;
  r = exp(loop);
  CHECK(r.status == 0);
  CHECK(r.out.find("0 " + loop + " write 0 4096\n") != std::string::npos);
  CHECK(exp(img).status == 0);
}
