// tierlab project FILE --tier A [--tier B ...]: throughput and latency of a
// captured workload on other storage tiers (closed queueing model).
#include "app/command.h"
#include "app/project.h"
#include "common/error.h"
#include "common/units.h"
#include "models/capacity.h"
#include "models/profile.h"
#include "models/project.h"
#include "models/synth.h"
#include "tiers/tiers.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>

#include <sys/ioctl.h>
#include <unistd.h>

namespace tierlab::app {
namespace {


// A positive finite number, for `flag`.
double parse_positive(const std::string& text, const std::string& flag, const char* what) {
  std::string s = text;
  if (!s.empty() && (s.back() == 'x' || s.back() == 'X')) s.pop_back();
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (s.empty() || pos != s.size() || !(v > 0) || !std::isfinite(v) || v > 1e6)
    throw InputError(flag + ": expected " + what + " more than 0, got '" + text + "'");
  return v;
}

// Columns of the terminal stdout is, else $COLUMNS, else 0 (no plot).
int terminal_width() {
  winsize ws{};
  if (::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS")) return std::atoi(c);
  return 0;
}

int parse_count(const std::string& s, const std::string& what) {
  size_t pos = 0;
  long v = 0;
  try {
    v = std::stol(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos != s.size() || v < 1 || v > 100000)
    throw InputError(what + ": expected a count from 1 to 100000, got '" + s + "'");
  return static_cast<int>(v);
}

std::string format_seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", s);
  return b;
}

}  // namespace

void run_project(const ProjectCliOptions& o) {
  models::ProjectOptions po;
  if (!o.clients.empty()) {
    auto dots = o.clients.find("..");
    if (dots == std::string::npos) {
      po.clients_lo = po.clients_hi = parse_count(o.clients, "--clients");
    } else {
      po.clients_lo = parse_count(o.clients.substr(0, dots), "--clients");
      po.clients_hi = parse_count(o.clients.substr(dots + 2), "--clients");
      if (po.clients_lo > po.clients_hi)
        throw InputError("--clients: range '" + o.clients + "' is empty");
    }
  }
  // Leaving a flag out means "as captured"; 0 given is no size or count.
  if (o.vcpus && (*o.vcpus < 1 || *o.vcpus > 4096))
    throw InputError("--vcpus: expected 1 to 4096, got " + std::to_string(*o.vcpus));
  po.vcpus = o.vcpus.value_or(0);
  auto memory = [](const char* flag, const std::string& text) {
    double bytes = static_cast<double>(parse_size(flag, text));
    if (bytes <= 0) throw InputError(std::string(flag) + ": '" + text + "' must be more than 0");
    return bytes;
  };
  if (!o.memory.empty()) po.memory_bytes = memory("--memory", o.memory);
  if (!o.capture_memory.empty()) po.capture_memory_bytes = memory("--capture-memory", o.capture_memory);
  po.kernel_writes_uncapped = o.kernel_uncapped;
  if (!o.data_growth.empty()) po.data_growth = parse_positive(o.data_growth, "--data-growth", "a factor");
  models::CapacityOptions cap;
  if (!o.loads.empty()) {
    size_t start = 0;
    while (true) {
      size_t comma = o.loads.find(',', start);
      cap.loads.push_back(parse_positive(o.loads.substr(start, comma - start), "--load", "a load multiple"));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  if (o.load_by != "think" && o.load_by != "clients")
    throw InputError("--load-by: expected think or clients, got '" + o.load_by + "'");
  cap.by = o.load_by == "clients" ? models::LoadBy::Clients : models::LoadBy::Think;
  if (!o.slo_p99.empty()) cap.slo_p99_s = parse_positive(o.slo_p99, "--slo-p99", "milliseconds") / 1e3;
  const bool capacity = !cap.loads.empty() || cap.slo_p99_s > 0;

  // Tiers first: a typo should not wait for a long trace to be read.
  tiers::Catalog catalog = tiers::load_catalog(o.tiers_file);
  std::vector<tiers::Tier> tiers;
  for (const auto& name : o.tiers) tiers.push_back(catalog.get(name));
  if (!o.captured_on.empty() && o.captured_iops_cap != 0)
    throw InputError("--captured-on and --captured-iops-cap: give one of them");
  if (!o.captured_on.empty()) {
    const tiers::Tier* t = catalog.find(o.captured_on);
    if (!t) throw InputError("--captured-on " + o.captured_on + ": no such tier (known: " + catalog.names() + ")");
    po.captured_tier = *t;
  }
  if (!(o.captured_iops_cap >= 0) || o.captured_iops_cap > 1e9)
    throw InputError("--captured-iops-cap: expected IOPS from 1 to 1e9, got " + std::to_string(o.captured_iops_cap));
  po.captured_iops_cap = o.captured_iops_cap;

  // The outputs next, as iosim simulate does: a path that cannot be written
  // fails before the trace is read. "-" puts that output alone on stdout,
  // at the end, instead of the table.
  if (o.json_out == "-" && o.html_out == "-")
    throw InputError("--json - and --html -: only one of them can go to stdout");
  OutputFile json(o.json_out, "--json");
  OutputFile html(o.html_out, "--html");

  // A profile JSON (`profile --json`, `profile synth --json`) or a trace.
  const bool is_json = o.trace.size() > 5 && o.trace.compare(o.trace.size() - 5, 5, ".json") == 0;
  models::Profile profile = is_json ? models::read_profile_json(o.trace) : models::profile_file(o.trace);
  // The options the model checks, by their flags.
  const std::vector<SettingFlag> settings = {{"tiers", "--tier"},
                                             {"clients", "--clients"},
                                             {"memory", "--memory"},
                                             {"data_growth", "--data-growth"},
                                             {"capture_memory", "--capture-memory"}};
  models::Projection p = for_settings(settings, [&] { return models::project(profile, tiers, po); });
  if (capacity) {
    // A load beyond the clients' limit is the flag's.
    try {
      models::add_capacity(p, profile, tiers, po, cap);
    } catch (const InputError& e) {
      throw InputError(std::string("--load: ") + e.what());
    }
  }
  // A host-less capture's figures come from counters: each says which.
  if (profile.io_from_counters)
    for (const auto& [figure, from] : profile.sources) p.notes.push_back("source of " + figure + ": " + from);
  // The interval: each window of the capture projected alone. A profile
  // JSON has no capture to split: no windows, and nothing to say about them.
  if (is_json && o.windows)
    throw InputError("--windows: " + o.trace + " is a profile, not a trace: windows need the capture itself");
  int n = is_json ? 1 : o.windows.value_or(models::windows_for(profile));
  if (o.windows && n >= 2 && models::windows_for(profile, n) < n)
    throw InputError("--windows: " + o.trace + " holds " + std::to_string(profile.transactions) +
                     " transactions in " + format_seconds(profile.duration_s) + ", too few for " +
                     std::to_string(n) + " windows of at least " + std::to_string(models::kMinWindowTransactions) +
                     " transactions and " + std::to_string(static_cast<int>(models::kMinWindowSeconds)) + " s");
  if (n >= 2) {
    auto windows = models::profile_windows(o.trace, profile, n);
    for_settings(settings, [&] { models::add_windows(p, windows, tiers, po); });
    for (const auto& w : models::steadiness(profile, windows).warnings(profile)) p.notes.push_back(w);
  } else if (!o.windows && !is_json) {
    for (const auto& w : models::steadiness(profile, {}).warnings(profile)) p.notes.push_back(w);
  }
  const std::string json_text = o.json_out.empty() ? "" : models::projection_json(p) + "\n";
  const std::string html_text = o.html_out.empty()   ? ""
                                : o.html_view        ? o.html_view(p, profile)
                                                     : models::projection_html(p, profile);
  if (o.json_out != "-" && o.html_out != "-") {
    // First, before the table: a capture whose commits did not wait for the
    // device projects every tier's commits alike.
    if (!p.durability_warning.empty()) std::cout << "WARNING: " << p.durability_warning << "\n";
    models::print_projection(std::cout, p);
    models::print_capacity(std::cout, p, terminal_width());
  }
  std::cout.flush();
  json.write(json_text);  // nothing for ""
  html.write(html_text);
}

void add_projection_flags(CLI::App* sub, ProjectCliOptions* opts) {
  sub->add_option("FILE", opts->trace,
                  "trace file (.tlt) with transactions and, ideally, block I/O and samples; or a profile "
                  "as JSON (*.json: `profile --json`, `profile synth --json`)");
  sub->add_option("--tier", opts->tiers, "tier to project onto (repeatable; see `tierlab tiers`)");
  sub->add_option("--tiers-file", opts->tiers_file, "JSON file adding or replacing tiers");
  sub->add_option("--clients", opts->clients,
                  "clients N, or a range LO..HI for a throughput curve (default: as captured)");
  sub->add_option("--vcpus", opts->vcpus, "CPUs of the target server (default: as captured)");
  sub->add_option("--memory", opts->memory,
                  "memory for shared_buffers + OS cache on the target, e.g. 8GB (default: as captured); "
                  "reads follow the trace's miss-ratio curve");
  sub->add_option("--capture-memory", opts->capture_memory,
                  "memory at capture, when the trace does not record it");
  sub->add_flag("--kernel-writes-uncapped", opts->kernel_uncapped,
                "leave the kernel's own writes (writeback of buffered writes, journal) out of the IOPS caps "
                "and count only what the server's processes submit, as cgroup v1 blkio throttling does");
  sub->add_option("--captured-on", opts->captured_on,
                  "the tier the capture ran on (a name from the catalog or --tiers-file): a capture that ran at "
                  "its caps waited for them, and each projected tier replaces that wait with its own");
  sub->add_option("--captured-iops-cap", opts->captured_iops_cap,
                  "the capture's device was capped at N IOPS (reads and writes together); "
                  "without this or --captured-on, a cap the profile detects is used");
  sub->add_option("--windows", opts->windows,
                  "split the capture into N windows, project each and print the lowest-highest beside each "
                  "figure (default: up to 4, each with at least 200 transactions and 2 s; 1: no interval)")
      ->check(CLI::Range(1, 1000));
  sub->add_option("--load", opts->loads,
                  "project at these multiples of today's arrival rate, e.g. 1,1.5,2,3, and give each tier's "
                  "headroom: the load at which it saturates");
  sub->add_option("--load-by", opts->load_by,
                  "how a load multiple is made: think (the clients think less; more clients once think time is "
                  "gone) or clients (the client count scaled)")
      ->default_str("think");
  sub->add_option("--data-growth", opts->data_growth,
                  "the data grows this many times, e.g. 2: the cache holds what memory / 2 holds today, and "
                  "reads follow the trace's miss-ratio curve");
  sub->add_option("--slo-p99", opts->slo_p99,
                  "p99 latency target in ms: a tier's headroom ends where its p99 estimate crosses it");
  sub->add_option("--json", opts->json_out, "also write the projection as JSON to this file (- : JSON on stdout only)");
  sub->add_option("--html", opts->html_out,
                  "also write a self-contained HTML report to this file (- : HTML on stdout only): from project "
                  "the projection and the miss-ratio curve, from report every section it is given");
}

void setup_project(CLI::App& parent) {
  auto opts = std::make_shared<ProjectCliOptions>();
  auto* sub = parent.add_subcommand(
      "project",
      "project a captured workload onto storage tiers: TPS, latency, IOPS and bottleneck per tier");
  add_projection_flags(sub, opts.get());
  sub->get_option("FILE")->required();
  sub->get_option("--tier")->required();
  sub->callback([opts] { run_project(*opts); });
}

}  // namespace tierlab::app
