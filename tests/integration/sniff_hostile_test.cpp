// capture sniff on a pcap of hostile traffic: random payloads on the
// PostgreSQL port from 100,000 concurrent connections, some joined
// mid-stream, many with a hole in front of held-back data, none ever closed.
// The real binary reads it (no root: a file) with bounded memory, does not
// crash, and says which caps it hit. No server needed.
#include "capture/sniff_frames.h"
#include "support/support.h"
#include "trace/reader.h"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

using namespace tierlab;

using tierlab::test::slurp;

namespace {

struct Child {
  int status = -1;
  uint64_t peak_rss = 0;  // bytes
  std::string out, err;
};

// Runs tierlab with `args`; its exit status, peak RSS and output.
Child run_measured(const test::TempDir& dir, std::vector<std::string> args) {
  args.insert(args.begin(), TIERLAB_BINARY);
  const std::string out = dir.file("sniff.out"), err = dir.file("sniff.err");
  pid_t pid = test::spawn_to_files(args, out, err);
  REQUIRE(pid >= 0);
  Child c;
  rusage ru{};
  int status = 0;
  REQUIRE(wait4(pid, &status, 0, &ru) == pid);
  c.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  c.peak_rss = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  c.out = slurp(out);
  c.err = slurp(err);
  return c;
}

uint64_t number_matching(const std::string& text, const std::string& re) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(re))) return UINT64_MAX;
  return std::stoull(m[1]);
}

// `flows` connections from distinct clients to port 5432, all open at once:
// every fourth without a SYN (joined mid-stream), each sending 1-1400
// random bytes, every third also a random segment 3000 bytes ahead (held
// behind a hole that never fills), and a random answer from the server on
// every fifth. No FIN, no RST: every one is left half-open.
void write_hostile_pcap(const std::string& path, uint32_t flows) {
  test::PcapFile pcap(path, DLT_EN10MB);
  std::mt19937_64 rng(35);
  int64_t ns = 1'796'000'000'000'000'000;
  auto spec = [](uint32_t i) {
    test::FrameSpec f;
    f.src = "10." + std::to_string(1 + (i >> 16)) + "." + std::to_string((i >> 8) & 0xff) + "." +
            std::to_string(i & 0xff);
    f.sport = static_cast<uint16_t>(1024 + i % 60000);
    f.seq = 1000;
    return f;
  };
  auto random_bytes = [&](size_t n) {
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    return s;
  };
  for (uint32_t i = 0; i < flows; ++i) {
    if (i % 4 == 3) continue;
    test::FrameSpec f = spec(i);
    f.flags = 0x02;  // SYN
    pcap.add(test::build_frame(f), ns += 1000);
  }
  for (uint32_t i = 0; i < flows; ++i) {
    test::FrameSpec f = spec(i);
    f.seq = i % 4 == 3 ? 1000 : 1001;
    f.flags = 0x18;
    f.payload = random_bytes(1 + rng() % 1400);
    pcap.add(test::build_frame(f), ns += 1000);
    if (i % 3 == 0) {
      f.seq += 3000;
      f.payload = random_bytes(1 + rng() % 1400);
      pcap.add(test::build_frame(f), ns += 1000);
    }
    if (i % 5 == 0) {
      test::FrameSpec s = spec(i);
      std::swap(s.src, s.dst);
      std::swap(s.sport, s.dport);
      s.seq = 77;
      s.flags = 0x18;
      s.payload = random_bytes(1 + rng() % 1400);
      pcap.add(test::build_frame(s), ns += 1000);
    }
  }
  pcap.close();
}

}  // namespace

TEST_CASE("sniff: hostile pcap: 100,000 half-open connections of random bytes, bounded memory, caps counted",
          "[sniff][hostile]") {
  test::TempDir dir;
  const std::string pcap = dir.file("hostile.pcap"), out = dir.file("hostile.tlt");
  write_hostile_pcap(pcap, 100'000);

  // A small table and pool, so that the run shows every cap being hit.
  Child c = run_measured(dir, {"capture", "sniff", "--pcap", pcap, "--out", out, "--max-connections", "4096",
                               "--reassembly-buffer", "1MiB"});
  INFO("stdout:\n" << c.out << "stderr:\n" << c.err.substr(0, 4000));
  REQUIRE(c.status == 0);
  // Memory: the tables and pools sized by the flags, not by the 100,000
  // connections or the 95 MB of payload.
  CHECK(c.peak_rss < 160ull << 20);
  // Every cap that was hit is counted and reported.
  // Each SYN opens a connection, evicted before its data comes, which opens
  // one again (joined): more evictions than connections.
  CHECK(number_matching(c.out, "connections evicted: ([0-9]+)") >= 100'000 - 4096);
  const uint64_t pool_full = number_matching(c.out, "reassembly buffer full: [0-9]+ per connection, ([0-9]+) in all");
  CHECK(pool_full > 0);
  CHECK(pool_full != UINT64_MAX);
  // The trace reads back; whatever random bytes decoded as, sessions began and ended.
  auto rd = trace::open_reader(out);
  trace::Record r;
  uint64_t begins = 0, ends = 0;
  while (rd->next(r)) {
    begins += r.kind() == trace::Kind::SessionBegin;
    ends += r.kind() == trace::Kind::SessionEnd;
  }
  CHECK(rd->stats().terminated);
  CHECK(begins == ends);

  // The same traffic with the default caps: still bounded.
  Child d = run_measured(dir, {"capture", "sniff", "--pcap", pcap, "--out", out});
  INFO("default caps: stdout:\n" << d.out);
  REQUIRE(d.status == 0);
  CHECK(d.peak_rss < 512ull << 20);
  CHECK(number_matching(d.out, "connections evicted: ([0-9]+)") >= 100'000 - 16384);
}
