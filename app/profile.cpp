// tierlab profile FILE [--json] [--html OUT]: the workload profile of a
// trace.
#include "app/command.h"
#include "common/error.h"
#include "models/profile.h"
#include "models/report.h"

#include <iostream>
#include <memory>

namespace tierlab::app {
namespace {

struct ProfileOptions {
  std::string trace;
  bool json = false;
  std::string html;  // the report's profile view: capture, profile, miss-ratio curve
};

void run_profile(const ProfileOptions& o) {
  if (o.trace.empty()) throw InputError("profile: FILE is required");
  if (o.json && o.html == "-") throw InputError("--json and --html -: only one of them can go to stdout");
  OutputFile html(o.html, "--html");
  models::Profile p = models::profile_file(o.trace);
  // Too short or unsteady to project from: the capture's windows say.
  const auto windows = models::profile_windows(o.trace, p, models::windows_for(p));
  const auto steady = models::steadiness(p, windows);
  std::string page;
  if (!o.html.empty()) {
    const models::CaptureTimeline capture = models::capture_timeline(o.trace);
    models::ReportInput in;
    in.profile = &p;
    in.capture = &capture;
    in.profile_section = true;
    page = models::report_html(in);
  }
  if (o.json) {
    std::cout << models::profile_json(p, steady) << "\n";
    html.write(page);
    return;
  }
  if (o.html == "-") {
    html.write(page);
    return;
  }
  // First, before any figure: without device waits at commit the figures
  // below say nothing about storage.
  if (const std::string w = models::commit_durability_warning(p); !w.empty()) std::cout << "WARNING: " << w << "\n";
  models::print_profile(std::cout, p);
  models::print_steadiness(std::cout, p, steady);
  std::cout.flush();
  html.write(page);
}

}  // namespace

void setup_profile(CLI::App& parent) {
  auto opts = std::make_shared<ProfileOptions>();
  auto* sub = parent.add_subcommand(
      "profile",
      "workload profile of a trace: transaction templates, CPU and device I/O per transaction, "
      "think time, device latency, miss-ratio curve; a warning when the capture is too short or unsteady "
      "to project from (docs/projection.md)");
  // FILE is checked when it runs: `profile synth` (app/profile_synth.cpp)
  // runs without one.
  sub->add_option("FILE", opts->trace, "trace file (.tlt)");
  sub->add_flag("--json", opts->json, "print JSON instead of text");
  sub->add_option("--html", opts->html,
                  "also write the report's profile view to this file (- : HTML on stdout only): the capture "
                  "over time, statements by template, block I/O, transaction templates, miss-ratio curve "
                  "(`tierlab report` for the whole report)");
  sub->callback([opts, sub] {
    if (sub->get_subcommands().empty()) run_profile(*opts);
  });
}

}  // namespace tierlab::app
