// tierlab iosim emulate: a block device that behaves like a tier.
#include "app/command.h"
#include "app/stop_signals.h"

#include "common/clock.h"
#include "common/error.h"
#include "common/units.h"
#include "iosim/emulate.h"
#include "tiers/tiers.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

namespace tierlab::app {
namespace {

struct EmulateOpts {
  std::string tier;
  std::string tiers_file;
  std::string image;
  std::string size;   // "" = the image's size (it must exist)
  std::string stats;  // "" = no interval lines
  uint64_t seed = 1;
};

constexpr const char* kDefaultSize = "20G";

// The tier's IOPS caps, as the stats lines compare with them.
std::string caps(const tiers::Tier& t) {
  std::string s;
  auto add = [&](const char* what, double v) {
    if (v <= 0) return;
    char b[64];
    std::snprintf(b, sizeof b, "%s%s %.0f", s.empty() ? "" : ", ", what, v);
    s += b;
  };
  add("iops", t.total_iops);
  add("read", t.read_iops);
  add("write", t.write_iops);
  if (t.burst.enabled()) add("burst", t.burst.burst_iops);
  return s.empty() ? "no IOPS cap" : "cap " + s;
}

void print_interval(const iosim::EmulateInterval& iv, double at_s, const std::string& cap) {
  const double secs = iv.ns > 0 ? iv.ns / 1e9 : 1e-9;
  const uint64_t ios = iv.ios[0] + iv.ios[1] + iv.ios[2];
  std::fprintf(stderr,
               "stats: %.1f s: %.0f counted IOPS (%s), %.0f requests/s (r %.0f, w %.0f, flush %.0f), "
               "%.1f MiB/s, throttled %.0f%%, QD %u (max %u), lat p50 %.3f p99 %.3f max %.3f ms",
               at_s, iv.counted_ios / secs, cap.c_str(), ios / secs, iv.ios[0] / secs, iv.ios[1] / secs,
               iv.ios[2] / secs, (iv.bytes[0] + iv.bytes[1]) / secs / 1048576.0, 100.0 * iv.throttled_ns / iv.ns,
               iv.queue_depth, iv.max_queue_depth, iv.lat.quantile(0.5) / 1e6, iv.lat.quantile(0.99) / 1e6,
               iv.lat.max() / 1e6);
  if (iv.slower_than_tier) std::fprintf(stderr, ", %llu slower than the tier", (unsigned long long)iv.slower_than_tier);
  if (iv.errors) std::fprintf(stderr, ", %llu errors", (unsigned long long)iv.errors);
  std::fputc('\n', stderr);
}

void run_emulate(const EmulateOpts& o) {
  const tiers::Catalog catalog = tiers::load_catalog(o.tiers_file);
  const tiers::Tier& tier = catalog.get(o.tier);
  iosim::EmulateOptions eo;
  eo.image = o.image;
  eo.seed = o.seed;
  if (!o.size.empty()) {
    eo.size = parse_size("--size", o.size);
    if (eo.size == 0) throw InputError("--size: must be above 0");
  } else if (struct stat sb{}; ::stat(o.image.c_str(), &sb) != 0) {
    eo.size = parse_size("--size", kDefaultSize);
  }
  const int64_t stats_ns = o.stats.empty() ? 0 : parse_positive_duration("--stats", o.stats);

  StopSignals signals;  // before any thread starts: the workers inherit the mask
  std::unique_ptr<iosim::Emulator> emu_ptr;
  try {
    emu_ptr = std::make_unique<iosim::Emulator>(tier, eo);
  } catch (const InputError& e) {
    throw InputError(std::string("--image ") + e.what());  // the image, or its size
  }
  iosim::Emulator& emu = *emu_ptr;
  for (const std::string& l : emu.leftovers()) std::fprintf(stderr, "tierlab: iosim emulate: %s\n", l.c_str());
  if (const std::string w = iosim::faster_than_disk(tier, emu.disk(), emu.round_trip_ns()); !w.empty())
    std::fprintf(stderr, "tierlab: iosim emulate: %s\n", w.c_str());
  std::printf("%s\n", emu.device().c_str());
  std::fflush(stdout);
  std::fprintf(stderr,
               "tierlab: iosim emulate: %s emulates %s on %s (%s, %u-byte blocks; FUSE file on %s, loop device "
               "with direct I/O; round trip %.0f us, replied that much before the tier's time; the image's disk: "
               "read p50 %.0f us, %.0f IOPS at QD 32); SIGINT or SIGTERM detaches it\n",
               emu.device().c_str(), tier.name.c_str(), o.image.c_str(), format_bytes(double(emu.size())).c_str(),
               emu.block_size(), emu.mountpoint().c_str(), emu.round_trip_ns() / 1e3, emu.disk().read_p50_ns / 1e3,
               emu.disk().read_iops);

  const std::string cap = caps(tier);
  const int64_t start = now_ns();
  int64_t next = start + stats_ns;
  int sig = 0;
  while (!sig) {
    long wait = 200'000'000;
    if (stats_ns) wait = long(std::max<int64_t>(1, std::min<int64_t>(wait, next - now_ns())));
    sig = signals.wait(wait);
    if (stats_ns && now_ns() >= next) {
      print_interval(emu.take_interval(), double(next - start) / 1e9, cap);
      next += stats_ns;
    }
  }

  emu.detach_loop();
  bool said = false;
  int64_t asked = now_ns();
  while (!emu.loop_detached()) {
    if (!said && now_ns() - asked > 1'000'000'000) {
      std::fprintf(stderr,
                   "tierlab: iosim emulate: %s is still in use (mounted or open): it detaches when its last user "
                   "closes it, and is served until then (%s again: stop now, its I/O then fails)\n",
                   emu.device().c_str(), signal_name(sig));
      said = true;
    }
    if (signals.wait(50'000'000)) {
      std::fprintf(stderr, "tierlab: iosim emulate: stopping with %s still attached\n", emu.device().c_str());
      break;
    }
  }
  emu.shutdown();
  const iosim::EmulateInterval t = emu.totals();
  std::fprintf(stderr,
               "tierlab: iosim emulate: detached %s after %.1f s (%s): read %llu I/Os %llu bytes, write %llu I/Os "
               "%llu bytes, flush %llu; %llu counted I/Os; lat p50 %.3f p99 %.3f ms; %llu slower than the tier; "
               "%llu errors\n",
               emu.device().c_str(), t.ns / 1e9, signal_name(sig), (unsigned long long)t.ios[0],
               (unsigned long long)t.bytes[0], (unsigned long long)t.ios[1], (unsigned long long)t.bytes[1],
               (unsigned long long)t.ios[2], (unsigned long long)t.counted_ios, t.lat.quantile(0.5) / 1e6,
               t.lat.quantile(0.99) / 1e6, (unsigned long long)t.slower_than_tier, (unsigned long long)t.errors);
}

}  // namespace

void setup_iosim_emulate(CLI::App& parent) {
  auto& io = group(parent, "iosim");
  auto* sub = io.add_subcommand(
      "emulate",
      "a block device (printed on stdout) that behaves like a tier: every request is admitted by the tier's "
      "shaper, its I/O goes to --image with O_DIRECT and it completes at the tier's time (root; FUSE and a "
      "loop device). Runs until SIGINT or SIGTERM, then detaches the device");
  auto opt = std::make_shared<EmulateOpts>();
  sub->add_option("--tier", opt->tier, "the tier to emulate (tierlab tiers list)")->required();
  sub->add_option("--tiers-file", opt->tiers_file, "JSON file with more tiers");
  sub->add_option("--image", opt->image, "the file holding the device's data (created with --size if missing)")
      ->required();
  sub->add_option("--size", opt->size,
                  std::string("the device's size: a missing image is created, a smaller one grown (default for a "
                              "new image: ") +
                      kDefaultSize + "; otherwise the image's size)");
  sub->add_option("--stats", opt->stats,
                  "print on stderr every interval (1s) the counted IOPS against the cap, the time throttled, "
                  "the queue depth and latency percentiles");
  sub->add_option("--seed", opt->seed, "seed of the tier's latency draws")->capture_default_str();
  sub->callback([opt] { run_emulate(*opt); });
}

}  // namespace tierlab::app
