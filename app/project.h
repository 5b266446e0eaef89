// The projection's flags and run, shared by `tierlab project` and
// `tierlab report` (which writes the same projection as its HTML report).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace tierlab::models {
struct Profile;
struct Projection;
}  // namespace tierlab::models

namespace tierlab::app {

struct ProjectCliOptions {
  std::string trace;
  std::vector<std::string> tiers;
  std::string tiers_file;
  std::string clients;
  std::optional<int> vcpus;  // unset: as captured
  std::string memory;
  std::string capture_memory;
  bool kernel_uncapped = false;
  std::string captured_on;
  double captured_iops_cap = 0;
  std::string json_out;
  std::string html_out;
  std::optional<int> windows;  // unset: as many as fit, up to models::kDefaultWindows
  std::string loads;           // "1,1.5,2"
  std::string load_by = "think";
  std::string data_growth;
  std::string slo_p99;         // milliseconds
  // The page --html writes; unset: models::projection_html (the report's
  // projection view). `report` sets its own, with the capture and replays.
  std::function<std::string(const models::Projection&, const models::Profile&)> html_view;
};

// Declares FILE and every flag of `project` on `sub`, bound to *opts (which
// must outlive the parse).
void add_projection_flags(CLI::App* sub, ProjectCliOptions* opts);

// Reads FILE (a trace or a profile JSON), projects it, prints the table
// (unless --json - or --html - take stdout) and writes --json and --html.
void run_project(const ProjectCliOptions& o);

}  // namespace tierlab::app
