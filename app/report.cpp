// tierlab report FILE --tier A [--tier B ...] [--load ...] --html OUT: the
// projection of a trace or a profile as one self-contained HTML file (and
// the terminal table). tierlab report merge: the shards' --json reports of
// one replay as one report, printed as a single replay prints it.
#include "app/command.h"
#include "app/project.h"
#include "app/replay_json.h"
#include "common/error.h"
#include "replay/replay.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
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
      "report", "one self-contained HTML report of a projection (FILE --tier ... --html OUT), or `report merge` "
                "of replay reports");
  report->require_subcommand(0, 1);
  auto po = std::make_shared<ProjectCliOptions>();
  add_projection_flags(report, po.get());
  report->footer(
      "Usage: tierlab report FILE --tier A [--tier B ...] [--load 1,2,4 ...] --html OUT\n"
      "The HTML file holds the projection `project` prints: per tier TPS, ratio to the first tier and to the\n"
      "capture, mean and p99 latency, IOPS, bottleneck and where the time goes, the curves against clients,\n"
      "with --load the TPS and p99 against load and each tier's headroom, and the notes (the capture's tier,\n"
      "memory, steadiness). Inline CSS and SVG only: no scripts, nothing fetched from the network.");
  report->callback([report, po] {
    if (report->got_subcommand("merge")) return;
    if (po->trace.empty()) throw InputError("report: FILE: a trace or a profile JSON is required (or `report merge`)");
    if (po->tiers.empty()) throw InputError("report: --tier: at least one tier is required");
    if (po->html_out.empty()) throw InputError("report: --html: the HTML file to write is required");
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
