// tierlab tiers list|show: the storage tier catalog.
#include "app/command.h"

#include "tiers/tiers.h"

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

namespace tierlab::app {
namespace {

struct TiersOptions {
  std::string tiers_file;
  std::string name;
  bool json = false;
};

std::string iops_text(const tiers::Tier& t) {
  char buf[96];
  auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.0f", v);
    return std::string(b);
  };
  std::string s;
  if (t.total_iops > 0) s = num(t.total_iops);
  if (t.read_iops > 0) s += (s.empty() ? "" : " ") + std::string("r:") + num(t.read_iops);
  if (t.write_iops > 0) s += (s.empty() ? "" : " ") + std::string("w:") + num(t.write_iops);
  if (t.burst.enabled()) {
    std::snprintf(buf, sizeof buf, "%s%s burst %s", s.empty() ? "" : " ",
                  num(t.burst.refill_iops).c_str(), num(t.burst.burst_iops).c_str());
    s += buf;
  }
  return s.empty() ? "-" : s;
}

std::string mibs_text(double bytes_per_sec) {
  if (bytes_per_sec <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", bytes_per_sec / (1024.0 * 1024.0));
  return buf;
}

std::string latency_text(const tiers::Latency& l) {
  char buf[64];
  if (l.dist == tiers::LatencyDist::Lognormal)
    std::snprintf(buf, sizeof buf, "%.0f/%.0f", l.p50_ns / 1000.0, l.p99_ns / 1000.0);
  else
    std::snprintf(buf, sizeof buf, "%.0f", l.p50_ns / 1000.0);
  return buf;
}

// How the caps count I/Os, in short: "1/io" or "256KiB" per counted I/O,
// "+merge" for sequential merging, "+flush" when flushes count.
std::string counting_text(const tiers::Tier& t) {
  std::string s = t.io_unit_bytes ? std::to_string(t.io_unit_bytes / 1024) + "KiB" : "1/io";
  if (t.io_unit_bytes && t.merge_sequential) s += "+merge";
  if (t.count_flushes) s += "+flush";
  return s;
}

void run_list(const TiersOptions& o) {
  auto catalog = tiers::load_catalog(o.tiers_file);
  std::printf("%-22s %-18s %9s %-14s %-14s %-14s %5s %-18s  %s\n", "TIER", "IOPS", "MiB/s", "READ p50/p99us",
              "WRITE p50/p99us", "FLUSH p50/p99us", "PAR", "COUNTING", "DESCRIPTION");
  for (const auto& t : catalog.tiers()) {
    std::printf("%-22s %-18s %9s %-14s %-14s %-14s %5s %-18s  %s\n", t.name.c_str(), iops_text(t).c_str(),
                mibs_text(t.bytes_per_sec).c_str(), latency_text(t.read).c_str(),
                latency_text(t.write).c_str(), latency_text(t.flush).c_str(),
                t.parallelism ? std::to_string(t.parallelism).c_str() : "-", counting_text(t).c_str(),
                t.description.c_str());
  }
}

void print_latency(const char* op, const tiers::Latency& l) {
  std::printf("  %-6s %s", op, std::string(tiers::dist_name(l.dist)).c_str());
  std::printf(", p50 %.1f us", l.p50_ns / 1000.0);
  if (l.dist == tiers::LatencyDist::Lognormal) std::printf(", p99 %.1f us", l.p99_ns / 1000.0);
  std::printf("\n");
}

void run_show(const TiersOptions& o) {
  auto catalog = tiers::load_catalog(o.tiers_file);
  const auto& t = catalog.get(o.name);
  if (o.json) {
    std::cout << tiers::to_json(t) << "\n";
    return;
  }
  std::printf("%s: %s\n", t.name.c_str(), t.description.c_str());
  std::printf("IOPS cap:     %s\n", iops_text(t).c_str());
  std::printf("throughput:   %s MiB/s\n", mibs_text(t.bytes_per_sec).c_str());
  if (t.io_unit_bytes)
    std::printf("I/O counting: up to %llu KiB counts as one%s\n",
                static_cast<unsigned long long>(t.io_unit_bytes / 1024),
                t.merge_sequential ? "; sequential I/Os merge" : "");
  else
    std::printf("I/O counting: every I/O counts as one\n");
  std::printf("flushes:      %s\n", t.count_flushes ? "count as one write I/O against the IOPS caps (count_flushes)"
                                                      : "not counted against the IOPS caps (count_flushes false)");
  std::printf("bucket depth: %.3f ms of tokens\n", t.bucket_ns / 1e6);
  std::printf("parallelism:  %s\n", t.parallelism ? std::to_string(t.parallelism).c_str() : "unlimited");
  if (t.burst.enabled())
    std::printf("burst:        %.0f credits, %.0f IOPS while they last, refill %.0f IOPS\n",
                t.burst.credits, t.burst.burst_iops, t.burst.refill_iops);
  std::printf("latency:\n");
  print_latency("read", t.read);
  print_latency("write", t.write);
  print_latency("flush", t.flush);
}

}  // namespace

void setup_tiers(CLI::App& parent) {
  auto* tiers = parent.add_subcommand("tiers", "list and show the storage tier models");
  tiers->require_subcommand(1);

  auto lo = std::make_shared<TiersOptions>();
  auto* list = tiers->add_subcommand("list", "list the known storage tiers");
  list->add_option("--tiers-file", lo->tiers_file, "JSON file with more tiers (see docs/tiers.md)");
  list->callback([lo] { run_list(*lo); });

  auto so = std::make_shared<TiersOptions>();
  auto* show = tiers->add_subcommand("show", "show one tier's figures");
  show->add_option("name", so->name, "tier name (see tierlab tiers list)")->required();
  show->add_flag("--json", so->json, "print the tier as JSON, in the --tiers-file format");
  show->add_option("--tiers-file", so->tiers_file, "JSON file with more tiers (see docs/tiers.md)");
  show->callback([so] { run_show(*so); });
}

}  // namespace tierlab::app
