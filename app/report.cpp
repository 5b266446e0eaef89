// tierlab report FILE [--replay REPLAY.json ...] [--tier A ...] [--load ...]
// --html OUT: the capture, its replays and its projection as one
// self-contained HTML file (and the terminal view). tierlab report merge:
// the shards' --json reports of one replay as one report, printed as a
// single replay prints it.
#include "app/command.h"
#include "app/project.h"
#include "app/replay_json.h"
#include "common/error.h"
#include "models/profile.h"
#include "models/report.h"
#include "models/synth.h"
#include "replay/replay.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

namespace tierlab::app {
namespace {

struct MergeOptions {
  std::vector<std::string> files;
  std::string json;
};

replay::Report read_report(const std::string& path, double* max_rate) {
  std::ifstream in(path);
  if (!in) throw InputError(errno_message(path, errno));
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not JSON: " + e.what());
  }
  return report_from_json(j, path, max_rate);
}

// What the report shows of a replay, from its --json report.
models::ReplayView replay_view(const std::string& path) {
  double max_rate = 0;
  const replay::Report r = read_report(path, &max_rate);
  models::ReplayView v;
  v.source = path;
  char speed[32];
  std::snprintf(speed, sizeof speed, "%gx", r.speed);
  v.speed = r.max_speed ? "max" : speed;
  v.sessions = r.sessions;
  v.sessions_failed = r.sessions_failed;
  v.transactions = r.transactions;
  v.statements = r.statements;
  v.errors = r.errors;
  v.tps = r.tps;
  v.duration_s = r.duration_s;
  v.captured_duration_s = r.captured_duration_s;
  v.lat_avg_ms = r.lat_avg_ms;
  v.lat_p50_ms = r.lat_p50_ms;
  v.lat_p99_ms = r.lat_p99_ms;
  v.divergence_error_status = r.divergence_error_status;
  v.divergence_row_count = r.divergence_row_count;
  v.divergence_new_errors = r.divergence_new_errors;
  v.divergence_rate = r.divergence_rate;
  v.errors_by_sqlstate = r.errors_by_sqlstate;
  for (const auto& e : r.first_errors) v.first_errors.emplace_back(e.sqlstate, e.message);
  for (const auto& f : r.fingerprints) {
    const double n = static_cast<double>(std::max<uint64_t>(1, f.pairs));
    v.templates.push_back({f.sql, f.count, f.pairs, f.captured_ns / n / 1e6, f.replay_ns / n / 1e6});
  }
  // The statements that took the capture the most time first.
  std::stable_sort(v.templates.begin(), v.templates.end(), [](const auto& a, const auto& b) {
    return a.captured_ms * static_cast<double>(a.pairs) > b.captured_ms * static_cast<double>(b.pairs);
  });
  return v;
}

bool is_json_file(const std::string& path) {
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0;
}

// The report of a trace or profile without a projection: the capture, the
// replays, the profile and the miss-ratio curve; the profile on the
// terminal.
void run_report(const ProjectCliOptions& o, std::vector<models::ReplayView> replays) {
  OutputFile html(o.html_out, "--html");
  const bool is_json = is_json_file(o.trace);
  models::Profile profile = is_json ? models::read_profile_json(o.trace) : models::profile_file(o.trace);
  std::optional<models::CaptureTimeline> capture;
  if (!is_json) capture = models::capture_timeline(o.trace);
  models::ReportInput in;
  in.profile = &profile;
  in.capture = capture ? &*capture : nullptr;
  in.replays = std::move(replays);
  in.profile_section = true;
  const std::string page = models::report_html(in);
  if (o.html_out != "-") models::print_profile(std::cout, profile);
  std::cout.flush();
  html.write(page);
}

void run_merge(const MergeOptions& o) {
  OutputFile json(o.json, "--json");
  std::ostream& text = o.json == "-" ? std::cerr : std::cout;
  std::vector<replay::Report> reports;
  double max_rate = 0;
  for (size_t i = 0; i < o.files.size(); ++i) {
    double rate = 0;
    reports.push_back(read_report(o.files[i], &rate));
    if (i == 0) max_rate = rate;
  }
  replay::Report m = replay::merge_reports(reports, o.files);
  replay::print_report(text, m);
  json.write(report_json(m, max_rate).dump(2) + "\n");
  if (m.merged_shards.size() < m.shard.count) {
    std::string missing;
    for (uint32_t k = 0, i = 0; k < m.shard.count; ++k) {
      if (i < m.merged_shards.size() && m.merged_shards[i] == k) {
        ++i;
        continue;
      }
      missing += (missing.empty() ? "" : ", ") + std::to_string(k);
    }
    std::cerr << "tierlab: report merge: shard(s) " << missing << " of " << m.shard.count
              << " not given: the report covers " << m.merged_shards.size() << " of the " << m.shard.count
              << " shards\n";
  }
  // As replay exits after its report: what makes the replay incomplete or
  // past --max-divergence (the first report's) fails the merge too.
  if (m.sessions_failed)
    throw RuntimeError("report merge: " + std::to_string(m.sessions_failed) + " of " + std::to_string(m.sessions) +
                       " sessions failed (" + m.first_session_error + "); the results are incomplete");
  if (m.divergence_rate > max_rate) {
    char pct[32];
    std::snprintf(pct, sizeof pct, "%g%%", max_rate * 100);
    throw RuntimeError("report merge: divergence " + replay::percent(m.divergence_rate) +
                       " of statements above --max-divergence " + pct + " (" +
                       std::to_string(m.divergence_new_errors) + " of " + std::to_string(m.statements) +
                       " failed that succeeded at capture; errors by SQLSTATE above)");
  }
}

}  // namespace

void setup_report(CLI::App& parent) {
  auto* report = parent.add_subcommand(
      "report", "one self-contained HTML report of a capture, its replays and its projection (FILE [--replay R] "
                "[--tier ...] --html OUT), or `report merge` of replay reports");
  report->require_subcommand(0, 1);
  auto po = std::make_shared<ProjectCliOptions>();
  auto replays = std::make_shared<std::vector<std::string>>();
  add_projection_flags(report, po.get());
  report->add_option("--replay", *replays,
                     "a `replay --json` report of this capture (repeatable): its latency per statement template "
                     "against the capture's, divergence and errors")
      ->check(CLI::ExistingFile);
  report->footer(
      "Usage: tierlab report FILE [--replay REPLAY.json ...] [--tier A ...] [--load 1,2,4 ...] --html OUT\n"
      "The HTML file holds, for what is given: the capture (transactions, statements and errors per second\n"
      "over time, statements by template with their time and count, block I/O requests and latency over\n"
      "time: FILE must be a trace); each replay (latency per statement template, capture against replay,\n"
      "divergence, errors by SQLSTATE); with --tier the projection `project` prints (per tier TPS, ratio,\n"
      "latency, IOPS, bottleneck, the curves against clients, with --load TPS and p99 against load and each\n"
      "tier's headroom); without --tier the workload profile; and the miss-ratio curve. Inline CSS and SVG\n"
      "only: no scripts, nothing fetched from the network. The terminal shows the projection (or profile).\n"
      "`project --html` and `profile --html` write the same page with their sections only.");
  report->callback([report, po, replays] {
    if (report->got_subcommand("merge")) return;
    if (po->trace.empty()) throw InputError("report: FILE: a trace or a profile JSON is required (or `report merge`)");
    if (po->html_out.empty()) throw InputError("report: --html: the HTML file to write is required");
    std::vector<models::ReplayView> views;
    for (const auto& r : *replays) views.push_back(replay_view(r));
    if (po->tiers.empty()) {
      for (const auto& [flag, given] : {std::pair<const char*, bool>{"--load", !po->loads.empty()},
                                        {"--slo-p99", !po->slo_p99.empty()},
                                        {"--data-growth", !po->data_growth.empty()},
                                        {"--json", !po->json_out.empty()},
                                        {"--memory", !po->memory.empty()},
                                        {"--clients", !po->clients.empty()},
                                        {"--vcpus", po->vcpus.has_value()},
                                        {"--windows", po->windows.has_value()},
                                        {"--captured-on", !po->captured_on.empty()}})
        if (given) throw InputError(std::string("report: ") + flag + ": needs a projection: give --tier");
      run_report(*po, std::move(views));
      return;
    }
    // The capture's timeline is read once the projection has read the
    // profile (a bad tier or flag fails first).
    const std::string trace = is_json_file(po->trace) ? std::string() : po->trace;
    po->html_view = [trace, views = std::move(views)](const models::Projection& p, const models::Profile& profile) {
      std::optional<models::CaptureTimeline> capture;
      if (!trace.empty()) capture = models::capture_timeline(trace);
      models::ReportInput in;
      in.profile = &profile;
      in.capture = capture ? &*capture : nullptr;
      in.replays = views;
      in.projection = &p;
      return models::report_html(in);
    };
    run_project(*po);
  });
  auto o = std::make_shared<MergeOptions>();
  auto* merge = report->add_subcommand(
      "merge", "merge the --json reports of the shards of one replay (replay --shard K/N) into one report, "
               "printed as one replay prints it");
  merge->footer(
      "Counts add up (sessions, statements, transactions, errors by SQLSTATE, divergence); the latency\n"
      "and lag percentiles come from the shards' histograms merged (fixed buckets: no loss), so they are\n"
      "those of every statement of every shard. The duration is the longest shard's (shards sharing\n"
      "--start-at end with the last), tps is the transactions over it. The first message of a SQLSTATE\n"
      "is the first report's that has one. Reports of different speeds or shard counts, or one shard\n"
      "twice, are refused; shards not given are named on stderr.\n"
      "Exit status 1, after the report and --json: sessions failed, or the divergence is above the\n"
      "first report's --max-divergence.");
  merge->add_option("reports", o->files, "the shards' replay --json reports")->required()->check(CLI::ExistingFile);
  merge->add_option("--json", o->json, "write the merged report as JSON to OUT ('-': stdout)");
  merge->callback([o] { run_merge(*o); });
}

}  // namespace tierlab::app
