// tierlab profile synth pgbench --scale S --mode M --clients N --memory SIZE
// --vcpus V [--calibrate TRACE] [--json OUT]: the workload profile of a
// pgbench run computed from its schema and access pattern (models/synth.h),
// for `tierlab project` to read like a captured one.
#include "app/command.h"
#include "common/error.h"
#include "common/units.h"
#include "models/profile.h"
#include "models/synth.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <iostream>
#include <memory>

namespace tierlab::app {
namespace {

struct SynthCliOptions {
  std::string workload;
  double scale = 0;
  std::string mode = "select-only";
  int clients = 0;
  std::string memory;
  std::string shared_buffers;
  int vcpus = 0;
  std::string calibrate;
  std::string script;
  std::vector<std::string> defines;
  double checkpoint_tps = 5000;
  std::string json_out;
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

void run_synth(const SynthCliOptions& o) {
  if (o.workload != "pgbench")
    throw InputError("profile synth: unknown workload '" + o.workload + "' (known: pgbench)");
  models::SynthOptions so;
  if (o.mode == "select-only")
    so.mode = models::PgbenchMode::SelectOnly;
  else if (o.mode == "tpcb-like")
    so.mode = models::PgbenchMode::TpcbLike;
  else
    throw InputError("--mode: expected select-only or tpcb-like, got '" + o.mode + "'");
  if (!(o.scale > 0) || o.scale > 1e7) throw InputError("--scale: expected 1e-5 to 1e7, got " + fmt("%g", o.scale));
  so.scale = o.scale;
  if (o.clients < 1 || o.clients > 100000) throw InputError("--clients: expected 1 to 100000");
  so.clients = o.clients;
  if (o.vcpus < 1 || o.vcpus > 4096) throw InputError("--vcpus: expected 1 to 4096");
  so.vcpus = o.vcpus;
  so.memory_bytes = static_cast<double>(parse_size("--memory", o.memory));
  if (so.memory_bytes <= 0) throw InputError("--memory: expected a size above 0");
  if (!o.shared_buffers.empty()) {
    so.shared_buffers_bytes = static_cast<double>(parse_size("--shared-buffers", o.shared_buffers));
    if (!(so.shared_buffers_bytes > 0) || !(so.shared_buffers_bytes < so.memory_bytes))
      throw InputError("--shared-buffers " + o.shared_buffers + ": expected a size above 0 and below --memory");
  }
  so.checkpoint_tps = o.checkpoint_tps;
  if (!o.script.empty()) {
    std::vector<std::pair<std::string, double>> vars{{"scale", o.scale}};
    for (const auto& d : o.defines) {
      auto eq = d.find('=');
      double v = 0;
      size_t pos = 0;
      try {
        if (eq != std::string::npos) v = std::stod(d.substr(eq + 1), &pos);
      } catch (const std::exception&) {
        pos = 0;
      }
      if (eq == std::string::npos || eq == 0 || pos == 0 || eq + 1 + pos != d.size())
        throw InputError("-D " + d + ": expected NAME=NUMBER");
      vars.emplace_back(d.substr(0, eq), v);
    }
    std::ifstream in(o.script);
    if (!in) throw InputError("--script " + o.script + ": cannot read");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    models::ScriptAccess sa = models::parse_pgbench_script(text, vars, o.script);
    so.aid = sa.aid;
    so.mode = sa.updates_accounts ? models::PgbenchMode::TpcbLike : models::PgbenchMode::SelectOnly;
  } else if (!o.defines.empty()) {
    throw InputError("-D: only with --script");
  }
  OutputFile json(o.json_out, "--json");

  models::SynthCalibration cal = o.calibrate.empty()
                                     ? models::default_calibration(so.mode)
                                     : models::calibration_from(models::profile_file(o.calibrate));
  models::SynthResult r = models::synth_pgbench(so, cal);
  const models::Profile& p = r.profile;

  if (o.json_out != "-") {
    std::cout << p.source << ", " << so.clients << " clients, " << so.vcpus << " vcpus, memory "
              << fmt("%.1f GiB", so.memory_bytes / 1073741824.0) << "\n";
    std::cout << "per transaction: reads from the OS " << fmt("%.3f", r.os_reads_per_tx) << ", device reads "
              << fmt("%.3f", r.reads_per_tx) << ", cpu "
              << fmt("%.1f us", p.cpu_s_per_tx * 1e6);
    if (so.mode == models::PgbenchMode::TpcbLike)
      std::cout << ", background writes " << fmt("%.3f", r.dirty_writes_per_tx) << ", WAL "
                << fmt("%.0f B", r.wal_bytes_per_tx) << ", commit flushes 1";
    std::cout << "\n";
    for (const auto& a : r.assumptions) std::cout << "  " << a << "\n";
    if (cal.source == "defaults")
      std::cout << "  not calibrated: CPU and round trips are defaults (give --calibrate TRACE, a capture of the "
                   "same run at a small scale)\n";
  }
  if (!o.json_out.empty()) {
    nlohmann::json j = nlohmann::json::parse(models::profile_json(p));
    j["vcpus"] = p.vcpus;  // the target's, which `project` takes as the capture's
    json.write(j.dump(2) + "\n");
  }
}

}  // namespace

void setup_profile_synth(CLI::App& parent) {
  auto* profile = parent.get_subcommand("profile");
  auto opts = std::make_shared<SynthCliOptions>();
  auto* sub = profile->add_subcommand(
      "synth",
      "a workload profile of a pgbench run at any scale, computed from pgbench's schema and access pattern "
      "against the cache the memory leaves, without running it; `tierlab project` reads its --json like "
      "any profile");
  sub->add_option("WORKLOAD", opts->workload, "the benchmark: pgbench")->required();
  sub->add_option("--scale", opts->scale, "pgbench -i scale factor (100,000 accounts rows each)")->required();
  sub->add_option("--mode", opts->mode, "select-only (pgbench -S) or tpcb-like (the default script)")
      ->capture_default_str();
  sub->add_option("--clients", opts->clients, "pgbench -c")->required();
  sub->add_option("--memory", opts->memory,
                  "the server's memory (or its cgroup's limit), e.g. 64GB: shared_buffers, the OS page cache "
                  "and what holds no data pages (40 MiB and 1 MiB per client)")
      ->required();
  sub->add_option("--shared-buffers", opts->shared_buffers,
                  "the server's shared_buffers, e.g. 16GB (default: a quarter of --memory)");
  sub->add_option("--vcpus", opts->vcpus, "the server's CPUs")->required();
  sub->add_option("--calibrate", opts->calibrate,
                  "trace of a small local run of the same script (`capture run`): CPU per transaction, "
                  "round trips and think time from it (default: built-in figures, said in the output)");
  sub->add_option("--script", opts->script,
                  "a custom pgbench script (-f): the distribution of the key its pgbench_accounts statements "
                  "look up by 'aid = :var' (\\set var random / random_gaussian / random_exponential); "
                  "writes as tpcb-like when it updates pgbench_accounts (replaces --mode)");
  sub->add_option("-D", opts->defines, "NAME=VALUE for the script's :NAME (pgbench -D; :scale is --scale)");
  sub->add_option("--checkpoint-tps", opts->checkpoint_tps,
                  "tpcb-like: transactions per second assumed over a 300 s checkpoint interval, for how often "
                  "a dirtied page is written again")
      ->capture_default_str()
      ->check(positive_number());
  sub->add_option("--json", opts->json_out, "write the profile as JSON to this file (- : JSON on stdout only)");
  sub->callback([opts] { run_synth(*opts); });
}

}  // namespace tierlab::app
