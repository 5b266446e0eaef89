// tierlab iosim simulate: re-time an I/O stream under storage tier models,
// with no I/O done. Side by side, one column per tier, read like fio's summary.
#include "app/command.h"

#include "common/error.h"
#include "common/units.h"
#include "iosim/pattern.h"
#include "iosim/sim.h"
#include "tiers/tiers.h"
#include "trace/reader.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tierlab::app {
namespace {

struct SimulateOptions {
  std::string trace;
  std::string records = "block";
  std::string rw = "randread";
  std::string bs = "4k";
  std::string size = "1g";
  std::string offset = "0";
  unsigned rwmixread = 50;
  uint32_t iodepth = 0;  // 0: 1 for a closed loop (fio's default), 32 for an open one (iosim run's)
  std::string think = "0";
  std::string runtime;
  uint64_t ios = 0;
  std::optional<double> rate_iops;  // set: open loop at this rate
  std::string rate_process = "linear";
  std::vector<std::string> tiers;
  std::string tiers_file;
  uint64_t seed = 1;
  std::string json_out;
};

// "16.0k", "425k", "1.20M": fio-like short numbers.
std::string short_num(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e4) std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else if (v >= 100) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string us(double ns) {
  char buf[32];
  if (ns >= 1e7) std::snprintf(buf, sizeof buf, "%.0f", ns / 1e3);
  else std::snprintf(buf, sizeof buf, "%.1f", ns / 1e3);
  return buf;
}

std::string fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

nlohmann::ordered_json lat_json(const Histogram& h) {
  nlohmann::ordered_json j;
  j["p50"] = h.quantile(0.50);
  j["p90"] = h.quantile(0.90);
  j["p99"] = h.quantile(0.99);
  j["p999"] = h.quantile(0.999);
  j["max"] = h.max();
  j["mean"] = h.mean();
  return j;
}

nlohmann::ordered_json op_json(const iosim::OpResult& op, Nanos elapsed) {
  nlohmann::ordered_json j;
  double secs = elapsed > 0 ? static_cast<double>(elapsed) / 1e9 : 0;
  j["ios"] = op.ios;
  j["iops"] = secs > 0 ? static_cast<double>(op.ios) / secs : 0.0;
  j["bw_bytes"] = secs > 0 ? static_cast<double>(op.bytes) / secs : 0.0;
  j["lat_ns"] = lat_json(op.lat);
  return j;
}

nlohmann::ordered_json result_json(const iosim::SimResult& r) {
  nlohmann::ordered_json j;
  j["tier"] = r.tier;
  j["ios"] = r.ios;
  j["bytes"] = r.bytes;
  j["elapsed_ns"] = r.elapsed_ns;
  j["iops"] = r.iops;
  j["bw_bytes"] = r.bw_bytes;
  j["lat_ns"] = lat_json(r.lat);
  j["read"] = op_json(r.read, r.elapsed_ns);
  j["write"] = op_json(r.write, r.elapsed_ns);
  if (r.other.ios) j["flush_discard"] = op_json(r.other, r.elapsed_ns);
  j["throttled_ns"] = r.shaper.throttled_ns;
  j["throttled_ios"] = r.shaper.throttled_ios;
  j["throttle_wait_ns"] = r.shaper.throttle_wait_ns;
  j["slot_wait_ns"] = r.shaper.slot_wait_ns;
  j["counted_ios"] = r.shaper.counted_ios;
  j["merged_ios"] = r.shaper.merged_ios;
  j["mean_queue_depth"] = r.mean_queue_depth;
  j["max_queue_depth"] = r.max_queue_depth;
  auto series = nlohmann::ordered_json::array();
  for (const auto& p : r.qd_series)
    series.push_back({{"t_ns", p.t},
                      {"width_ns", p.width},
                      {"mean_qd", p.mean_qd},
                      {"iops", static_cast<double>(p.completed) / (static_cast<double>(p.width) / 1e9)}});
  j["qd_series"] = series;
  if (r.recorded_ios > 0) {
    nlohmann::ordered_json b;
    b["recorded_ios"] = r.recorded_ios;
    b["ios_behind"] = r.behind_ios;
    b["mean"] = r.mean_behind_ns;
    b["p50"] = r.behind.quantile(0.50);
    b["p99"] = r.behind.quantile(0.99);
    b["max"] = r.behind.max();
    b["end"] = r.end_behind_ns;
    j["behind_ns"] = b;
  }
  if (r.open_loop) {
    j["late_arrivals"] = r.late_arrivals;
    j["slot_waits"] = r.slot_waits;
    j["issue_lag_ns"] = {{"p50", r.issue_lag.quantile(0.5)}, {"p99", r.issue_lag.quantile(0.99)},
                         {"max", r.issue_lag.max()}};
    j["late_issues"] = {{"threshold_ns", iosim::SimResult::kLateIssueNs},
                        {"ios", r.late_issues},
                        {"stalls", r.issue_stalls}};
  }
  return j;
}

// Mean queue depth and IOPS over slice [a, b) of the run (fractions), from
// the series (intervals cut by the slice count pro rata).
std::pair<double, double> slice(const iosim::SimResult& r, double a, double b) {
  const double t0 = a * static_cast<double>(r.elapsed_ns), t1 = b * static_cast<double>(r.elapsed_ns);
  double area = 0, done = 0;
  for (const auto& p : r.qd_series) {
    double lo = std::max(t0, static_cast<double>(p.t));
    double hi = std::min(t1, static_cast<double>(p.t + p.width));
    if (hi > lo) {
      area += p.mean_qd * (hi - lo);
      done += static_cast<double>(p.completed) * (hi - lo) / static_cast<double>(p.width);
    }
  }
  if (t1 <= t0) return {0, 0};
  return {area / (t1 - t0), done / ((t1 - t0) / 1e9)};
}

void print_table(const std::string& heading, const std::vector<iosim::SimResult>& rs) {
  std::printf("%s\n\n", heading.c_str());
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  auto row = [&](const std::string& name, auto fn) {
    std::vector<std::string> cells;
    for (const auto& r : rs) cells.push_back(fn(r));
    rows.push_back({name, cells});
  };
  using R = iosim::SimResult;
  auto secs = [](const R& r) { return r.elapsed_ns > 0 ? static_cast<double>(r.elapsed_ns) / 1e9 : 1.0; };
  row("tier", [](const R& r) { return r.tier; });
  row("ios", [](const R& r) { return std::to_string(r.ios); });
  row("run (s)", [&](const R& r) { return fixed(static_cast<double>(r.elapsed_ns) / 1e9, 3); });
  row("IOPS", [](const R& r) { return short_num(r.iops); });
  row("BW (MiB/s)", [](const R& r) { return fixed(r.bw_bytes / 1048576.0, 1); });
  row("read IOPS", [&](const R& r) { return short_num(static_cast<double>(r.read.ios) / secs(r)); });
  row("write IOPS", [&](const R& r) { return short_num(static_cast<double>(r.write.ios) / secs(r)); });
  row("clat avg (us)", [](const R& r) { return us(r.lat.mean()); });
  row("clat p50 (us)", [](const R& r) { return us(static_cast<double>(r.lat.quantile(0.5))); });
  row("clat p90 (us)", [](const R& r) { return us(static_cast<double>(r.lat.quantile(0.9))); });
  row("clat p99 (us)", [](const R& r) { return us(static_cast<double>(r.lat.quantile(0.99))); });
  row("clat p99.9 (us)", [](const R& r) { return us(static_cast<double>(r.lat.quantile(0.999))); });
  row("clat max (us)", [](const R& r) { return us(static_cast<double>(r.lat.max())); });
  bool reads = false, writes = false;
  for (const auto& r : rs) reads = reads || r.read.ios, writes = writes || r.write.ios;
  if (reads && writes) {
    row("read p50/p99 (us)", [](const R& r) {
      return us(static_cast<double>(r.read.lat.quantile(0.5))) + "/" + us(static_cast<double>(r.read.lat.quantile(0.99)));
    });
    row("write p50/p99 (us)", [](const R& r) {
      return us(static_cast<double>(r.write.lat.quantile(0.5))) + "/" + us(static_cast<double>(r.write.lat.quantile(0.99)));
    });
  }
  row("counted I/Os", [](const R& r) { return std::to_string(r.shaper.counted_ios); });
  row("throttled (s)", [](const R& r) { return fixed(static_cast<double>(r.shaper.throttled_ns) / 1e9, 3); });
  row("throttled (% run)", [&](const R& r) {
    return fixed(100.0 * static_cast<double>(r.shaper.throttled_ns) / 1e9 / secs(r), 1);
  });
  row("mean QD", [](const R& r) { return fixed(r.mean_queue_depth, 2); });
  row("max QD", [](const R& r) { return std::to_string(r.max_queue_depth); });
  for (int s = 0; s < 4; ++s) {
    char name[32];
    std::snprintf(name, sizeof name, "IOPS %d-%d%%", s * 25, (s + 1) * 25);
    row(name, [&](const R& r) { return short_num(slice(r, s / 4.0, (s + 1) / 4.0).second); });
  }
  for (int s = 0; s < 4; ++s) {
    char name[32];
    std::snprintf(name, sizeof name, "QD %d-%d%%", s * 25, (s + 1) * 25);
    row(name, [&](const R& r) { return fixed(slice(r, s / 4.0, (s + 1) / 4.0).first, 2); });
  }
  if (!rs.empty() && rs[0].open_loop) {
    row("slot waits", [](const R& r) { return std::to_string(r.slot_waits); });
    row("late issues", [](const R& r) { return std::to_string(r.late_issues); });
    row("issue lag max (us)", [](const R& r) { return us(static_cast<double>(r.issue_lag.max())); });
  }
  if (!rs.empty() && rs[0].recorded_ios > 0) {
    row("behind I/Os", [](const R& r) { return std::to_string(r.behind_ios); });
    row("behind p50 (us)", [](const R& r) { return us(static_cast<double>(r.behind.quantile(0.5))); });
    row("behind p99 (us)", [](const R& r) { return us(static_cast<double>(r.behind.quantile(0.99))); });
    row("behind max (us)", [](const R& r) { return us(static_cast<double>(r.behind.max())); });
    row("end behind (ms)", [](const R& r) { return fixed(static_cast<double>(r.end_behind_ns) / 1e6, 3); });
  }
  size_t w0 = 0;
  std::vector<size_t> w(rs.size(), 0);
  for (const auto& [name, cells] : rows) {
    w0 = std::max(w0, name.size());
    for (size_t i = 0; i < cells.size(); ++i) w[i] = std::max(w[i], cells[i].size());
  }
  for (const auto& [name, cells] : rows) {
    std::printf("%-*s", static_cast<int>(w0), name.c_str());
    for (size_t i = 0; i < cells.size(); ++i)
      std::printf("  %*s", static_cast<int>(w[i]), cells[i].c_str());
    std::printf("\n");
  }
}

void run_simulate(const SimulateOptions& o) {
  if (o.tiers.empty()) throw InputError("--tier: give at least one tier (see tierlab tiers list)");
  auto catalog = tiers::load_catalog(o.tiers_file);
  std::vector<const tiers::Tier*> tiers;
  for (const auto& name : o.tiers) tiers.push_back(&catalog.get(name));
  OutputFile json(o.json_out, "--json");  // "-": stdout, at the end, instead of the table

  iosim::SimOptions sopt;
  sopt.seed = o.seed;
  if (o.iodepth) sopt.open_iodepth = o.iodepth;
  // --runtime: not 0, which would mean nothing to simulate.
  const Nanos runtime_given = o.runtime.empty() ? 0 : parse_positive_duration("--runtime", o.runtime);
  std::vector<iosim::SimResult> results;
  results.reserve(tiers.size());
  std::string heading;
  nlohmann::ordered_json workload;

  if (!o.trace.empty()) {
    iosim::TraceRecords which;
    if (o.records == "block") which = iosim::TraceRecords::Block;
    else if (o.records == "file") which = iosim::TraceRecords::File;
    else if (o.records == "all") which = iosim::TraceRecords::All;
    else throw InputError("--records: unknown \"" + o.records + "\" (known: block, file, all)");
    sopt.open_runtime_ns = runtime_given;
    for (const auto* t : tiers) {
      auto reader = trace::open_reader(o.trace);
      iosim::TraceArrivals arrivals(*reader, which);
      results.push_back(iosim::simulate_open(*t, arrivals, sopt));
      if (results.back().ios == 0)
        throw InputError(o.trace + ": no " + o.records + " I/O records to simulate (it has " +
                         std::to_string(arrivals.block_records()) + " block_io and " +
                         std::to_string(arrivals.file_records()) + " file_io records; see --records)");
    }
    heading = "tierlab iosim simulate: open loop from " + o.trace + " (" + o.records +
              " I/O records at their recorded issue times" +
              (runtime_given ? std::string(", the first ") + o.runtime : std::string()) + "), iodepth " +
              std::to_string(sopt.open_iodepth) + " at most, seed " + std::to_string(o.seed);
    workload = {{"mode", "open"}, {"trace", o.trace}, {"records", o.records}, {"iodepth", sopt.open_iodepth},
                {"runtime_ns", runtime_given}};
  } else {
    iosim::PatternSpec spec;
    spec.rw = for_flag("--rw", [&] { return iosim::parse_rw(o.rw); });
    spec.bs = parse_size("--bs", o.bs);
    spec.size = parse_size("--size", o.size);
    spec.offset = parse_size("--offset", o.offset);
    spec.rwmixread = o.rwmixread;
    spec.seed = o.seed;
    for_flag("--bs", [&] { iosim::check_bs(spec.bs); });
    for_flag("--size", [&] { iosim::check_region(spec.size, spec.bs); });
    for_flag("--rwmixread", [&] { iosim::check_rwmixread(spec.rwmixread); });
    Nanos runtime = runtime_given;
    if (runtime == 0 && o.ios == 0) runtime = 10'000'000'000;  // fio-like default run
    Nanos think = parse_duration("--think", o.think);
    std::string desc = std::string(iosim::rw_name(spec.rw));
    if (spec.rw == iosim::Rw::RandRw || spec.rw == iosim::Rw::ReadWrite)
      desc += " " + std::to_string(spec.rwmixread) + "/" + std::to_string(100 - spec.rwmixread);
    desc += ", bs " + o.bs + ", size " + o.size;
    desc += o.ios ? ", " + std::to_string(o.ios) + " ios" : std::string();
    desc += runtime ? ", runtime " + (o.runtime.empty() ? std::string("10s") : o.runtime) : std::string();
    workload = {{"rw", std::string(iosim::rw_name(spec.rw))}, {"bs", spec.bs}, {"size", spec.size},
                {"rwmixread", spec.rwmixread}, {"runtime_ns", runtime}, {"ios", o.ios}};
    if (o.rate_iops) {
      bool poisson;
      if (o.rate_process == "poisson") poisson = true;
      else if (o.rate_process == "linear") poisson = false;
      else throw InputError("--rate-process: unknown \"" + o.rate_process + "\" (known: linear, poisson)");
      sopt.open_runtime_ns = runtime;
      for (const auto* t : tiers) {
        iosim::PatternArrivals arrivals(spec, *o.rate_iops, poisson, o.ios, runtime);
        results.push_back(iosim::simulate_open(*t, arrivals, sopt));
      }
      heading = "tierlab iosim simulate: open loop, " + desc + ", " + short_num(*o.rate_iops) +
                " IOPS offered (" + o.rate_process + "), iodepth " + std::to_string(sopt.open_iodepth) +
                " at most, seed " + std::to_string(o.seed);
      workload["mode"] = "open";
      workload["iodepth"] = sopt.open_iodepth;
      workload["rate_iops"] = *o.rate_iops;
      workload["rate_process"] = o.rate_process;
    } else {
      iosim::ClosedLoop loop;
      loop.pattern = spec;
      loop.iodepth = o.iodepth ? o.iodepth : 1;
      loop.think_ns = think;
      loop.runtime_ns = runtime;
      loop.ios = o.ios;
      for (const auto* t : tiers) results.push_back(iosim::simulate_closed(*t, loop, sopt));
      heading = "tierlab iosim simulate: closed loop, " + desc + ", iodepth " +
                std::to_string(loop.iodepth) + (think ? ", think " + o.think : std::string()) + ", seed " +
                std::to_string(o.seed);
      workload["mode"] = "closed";
      workload["iodepth"] = loop.iodepth;
      workload["think_ns"] = think;
    }
  }

  nlohmann::ordered_json doc;
  doc["workload"] = workload;
  doc["seed"] = o.seed;
  doc["tiers"] = nlohmann::ordered_json::array();
  for (const auto& r : results) doc["tiers"].push_back(result_json(r));

  if (o.json_out != "-") print_table(heading, results);
  std::cout.flush();
  json.write(doc.dump(2) + "\n");
}

}  // namespace

void setup_iosim_simulate(CLI::App& parent) {
  auto& iosim = group(parent, "iosim");
  auto o = std::make_shared<SimulateOptions>();
  auto* cmd = iosim.add_subcommand(
      "simulate",
      "re-time an I/O stream under storage tier models (discrete-event simulation, no I/O)");
  auto* trace = cmd->add_option("--trace", o->trace, "open loop: the block/file I/O of a trace, at recorded times");
  cmd->add_option("--records", o->records, "with --trace: which records are I/Os: block, file or all")
      ->capture_default_str();
  std::vector<CLI::Option*> pattern;
  pattern.push_back(cmd->add_option("--rw", o->rw, "randread|randwrite|read|write|randrw|readwrite")
                        ->capture_default_str());
  pattern.push_back(cmd->add_option("--bs", o->bs, "block size (4k, 16k, 1m)")->capture_default_str());
  pattern.push_back(cmd->add_option("--size", o->size, "region the I/Os fall in (1g)")->capture_default_str());
  pattern.push_back(cmd->add_option("--offset", o->offset, "start of the region")->capture_default_str());
  pattern.push_back(cmd->add_option("--rwmixread", o->rwmixread, "percent reads of randrw/readwrite")
                        ->capture_default_str()
                        ->check(CLI::Range(0u, 100u)));
  cmd->add_option("--iodepth", o->iodepth,
                  "closed loop: I/Os in flight (default 1); open loop: at most this many outstanding, "
                  "later arrivals wait for a completion, as in iosim run (default 32)")
      ->check(CLI::Range(1u, 1u << 20));
  pattern.push_back(cmd->add_option("--think", o->think, "closed loop: pause between a completion and the next issue")
                        ->capture_default_str());
  pattern.push_back(cmd->add_option("--rate-iops", o->rate_iops,
                                    "open loop: offer this many IOPS instead of a closed loop")
                        ->check(CLI::Validator(
                            [](std::string& v) -> std::string {
                              double x = 0;
                              try {
                                x = std::stod(v);
                              } catch (const std::exception&) {
                                return "'" + v + "' is not a number";
                              }
                              return x > 0 && std::isfinite(x) ? "" : "must be above 0, got " + v;
                            },
                            "", "")));
  pattern.push_back(cmd->add_option("--rate-process", o->rate_process, "with --rate-iops: linear or poisson")
                        ->capture_default_str());
  cmd->add_option("--runtime", o->runtime,
                  "simulated time to issue I/Os for, above 0 (10s, 500ms; default 10s, or the whole trace)");
  cmd->add_option("--ios", o->ios, "stop after this many I/Os (fio's number_ios)");
  for (auto* p : pattern) trace->excludes(p);
  cmd->add_option("--tier", o->tiers, "tier to simulate; repeat for a side-by-side comparison")->required();
  cmd->add_option("--tiers-file", o->tiers_file, "JSON file with more tiers (see docs/tiers.md)");
  cmd->add_option("--seed", o->seed, "seed of the pattern and the latency jitter")->capture_default_str();
  cmd->add_option("--json", o->json_out, "also write the results as JSON to this file (- : JSON on stdout only)");
  cmd->callback([o] { run_simulate(*o); });
}

}  // namespace tierlab::app
