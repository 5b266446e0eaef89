// tierlab replay: re-drive a captured transaction stream against PostgreSQL.
#include "app/command.h"
#include "app/stop_signals.h"
#include "common/error.h"
#include "common/units.h"
#include "replay/replay.h"
#include "trace/reader.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>

namespace tierlab::app {
namespace {

struct ReplayOptions {
  std::string file;
  std::string db;
  double speed = 1.0;
  bool max_speed = false;
  int threads = 0;
  double progress_s = 0;
  std::string json;
  bool dry_run = false;
  std::string begin;
  std::string end;
  std::string database;
  std::string user;
  std::string user_map;
  bool rt = false;
  bool no_pm_qos = false;
  std::string wire = "direct";
  std::string io = "auto";
  std::string log;
  std::string max_divergence = "0";
};

// --max-divergence: a fraction ("0.01") or a percentage ("1%") from 0 to
// 1; nullopt for anything else.
std::optional<double> parse_rate(const std::string& text) {
  std::string t = text;
  const bool pct = !t.empty() && t.back() == '%';
  if (pct) t.pop_back();
  const char* b = t.c_str();
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(b, &end);
  if (end == b || *end != 0 || errno != 0 || !std::isfinite(v)) return std::nullopt;
  if (pct) v /= 100;
  if (v < 0 || v > 1) return std::nullopt;
  return v;
}

std::string printf_string(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string seconds(trace::Nanos ns) { return printf_string("%.3f s", static_cast<double>(ns) / 1e9); }

CLI::Validator rate_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return parse_rate(text) ? "" : text + " is not a fraction from 0 to 1 or a percentage from 0% to 100%";
      },
      "");
}

nlohmann::json deltas_json(const std::vector<replay::FingerprintDelta>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& d : v)
    a.push_back({{"sql", d.sql}, {"count", d.count}, {"captured_ms", d.captured_ms},
                 {"replay_ms", d.replay_ms}, {"delta_ms", d.replay_ms - d.captured_ms}});
  return a;
}

nlohmann::json report_json(const replay::Report& r, double max_rate) {
  nlohmann::json errs = nlohmann::json::object();
  for (const auto& [state, n] : r.errors_by_sqlstate) errs[state] = n;
  // The first error of each SQLSTATE: the target's message, and the
  // statement (normalised) it answered, null when none did.
  nlohmann::json firsts = nlohmann::json::object();
  for (const auto& e : r.first_errors)
    firsts[e.sqlstate] = {{"message", e.message},
                          {"statement", e.statement.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.statement)}};
  nlohmann::json j = {
      {"sessions", r.sessions},
      {"sessions_failed", r.sessions_failed},
      {"sessions_stopped", r.sessions_stopped},
      {"stopped", r.stopped.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.stopped)},
      {"sessions_direct", r.sessions_direct},
      {"first_session_error", r.first_session_error},
      {"threads", r.threads},
      {"realtime", r.realtime},
      {"slice_ms", r.slice_ms},
      {"io", r.io},
      {"cpu_latency_held", r.cpu_latency_held},
      {"speed", r.max_speed ? nlohmann::json("max") : nlohmann::json(r.speed)},
      {"transactions", r.transactions},
      {"failed_transactions", r.failed_transactions},
      {"statements", r.statements},
      {"errors", r.errors},
      {"tps", r.tps},
      {"duration_s", r.duration_s},
      {"captured_duration_s", r.captured_duration_s},
      {"connect_s", r.connect_s},
      {"cpu_s", r.cpu_s},
      {"cpu_us_per_transaction",
       r.cpu_us_per_transaction() >= 0 ? nlohmann::json(r.cpu_us_per_transaction()) : nlohmann::json(nullptr)},
      {"latency_ms",
       {{"avg", r.lat_avg_ms}, {"stddev", r.lat_stddev_ms}, {"p50", r.lat_p50_ms},
        {"p90", r.lat_p90_ms}, {"p99", r.lat_p99_ms}, {"p999", r.lat_p999_ms}, {"max", r.lat_max_ms}}},
      {"lag_ms",
       {{"avg", r.lag_avg_ms}, {"p99", r.lag_p99_ms}, {"max", r.lag_max_ms},
        {"tierlab_p99", r.own_lag_p99_ms}, {"tierlab_max", r.own_lag_max_ms}}},
      {"errors_by_sqlstate", errs},
      {"first_errors", firsts},
      {"divergence",
       {{"error_status", r.divergence_error_status},
        {"row_count", r.divergence_row_count},
        {"failed_ok_at_capture", r.divergence_new_errors},
        {"rate", r.divergence_rate},
        {"max_rate", max_rate}}},
      {"unsupported", r.unsupported},
      {"slowed", deltas_json(r.slowed)},
      {"sped_up", deltas_json(r.sped_up)},
  };
  if (!r.log_path.empty()) j["log"] = {{"path", r.log_path}, {"lines", r.log_lines}, {"error", r.log_error}};
  return j;
}

nlohmann::json dry_run_json(const replay::WorkloadSummary& s) {
  return {
      {"sessions", s.sessions},
      {"statements", s.statements},
      {"transactions", s.transactions},
      {"round_trips", s.units},
      {"captured_errors", s.captured_errors},
      {"copy_bytes", s.copy_bytes},
      {"duration_s", static_cast<double>(s.duration_ns) / 1e9},
      {"max_concurrency", s.max_concurrency},
      {"fingerprints", s.fingerprints},
      {"unsupported", s.unsupported},
      {"libpq_unsupported", s.libpq_unsupported},
      {"sessions_joined_in_transaction", s.joined_in_transaction},
  };
}

void run_replay(const ReplayOptions& o) {
  replay::Window window;
  if (!o.begin.empty()) window.begin = parse_duration("--begin", o.begin);
  if (!o.end.empty()) window.end = parse_duration("--end", o.end);
  if (window.end <= window.begin) throw InputError("--end must be after --begin");
  const double max_rate = *parse_rate(o.max_divergence);  // checked by rate_check()
  if (!o.dry_run && o.db.empty()) throw InputError("--db CONNINFO is required (the target PostgreSQL)");
  replay::Options opts;
  opts.conninfo = o.db;
  opts.speed = o.speed;
  opts.max_speed = o.max_speed;
  opts.threads = o.threads;
  opts.progress_s = o.progress_s;
  opts.realtime = o.rt;
  opts.hold_cpu_latency = !o.no_pm_qos;
  opts.direct = o.wire == "direct";
  opts.io = o.io;
  opts.log_path = o.log;
  opts.database = o.database;
  opts.user = o.user;
  if (!o.user_map.empty()) opts.user_map = replay::load_user_map(o.user_map);

  OutputFile json(o.json, "--json");
  // With the JSON on standard output, the text goes to standard error.
  std::ostream& text = o.json == "-" ? std::cerr : std::cout;
  auto reader = trace::open_reader(o.file);
  replay::Workload w = replay::load(*reader, window);
  if (window.begin > w.summary().trace_end_ns)
    throw InputError("--begin " + o.begin + " is past the end of the trace: " + o.file + " is " +
                     seconds(w.summary().trace_end_ns) + " long");
  if (o.dry_run) {
    replay::print_dry_run(text, w.summary());
    json.write(dry_run_json(w.summary()).dump(2) + "\n");
    return;
  }
  if (w.summary().sessions == 0)
    throw InputError(o.file + ": nothing to replay: " +
                     (o.begin.empty() && o.end.empty()
                          ? std::string("the trace holds no client session")
                          : "no client session sends anything in the window (--begin " +
                                (o.begin.empty() ? "0" : o.begin) + ", --end " + (o.end.empty() ? "none" : o.end) +
                                ")"));
  // SIGINT and SIGTERM stop the replay and leave its report (blocked here,
  // before the replay's threads start, so that they inherit the mask).
  StopSignals signals;
  int stopped_by = 0;
  opts.wait_stop = [&](long timeout_ns) -> const char* {
    int sig = signals.wait(timeout_ns);
    if (!sig) return nullptr;
    stopped_by = sig;
    return signal_name(sig);
  };
  // A stopped command exits 128 + the signal, as iosim run and a command
  // the signal ended do, after one line saying so.
  auto stopped = [&](const std::string& line) {
    std::cerr << "tierlab: " << line << "\n";
    set_exit_status(128 + stopped_by);
  };
  if (!o.max_speed) for_flag("--speed", [&] { replay::check_speed(w, o.speed); });
  replay::Report r;
  try {
    r = replay::run(w, opts, &std::cerr);
  } catch (const RuntimeError& e) {
    if (!stopped_by) throw;
    return stopped(e.what());  // stopped while connecting: nothing ran
  }
  replay::print_report(text, r);
  json.write(report_json(r, max_rate).dump(2) + "\n");
  // The report is out; what makes it incomplete fails the command.
  if (!r.log_error.empty())
    throw RuntimeError("--log " + r.log_path + ": " + r.log_error + " after " + std::to_string(r.log_lines) +
                       " lines; the rest of the round trips are not in it");
  if (stopped_by) return stopped("replay: stopped by " + r.stopped + "; the report covers what ran before it");
  if (r.sessions_failed)
    throw RuntimeError("replay: " + std::to_string(r.sessions_failed) + " of " + std::to_string(r.sessions) +
                       " sessions failed (" + r.first_session_error + "); the results are incomplete");
  if (r.divergence_rate > max_rate)
    throw RuntimeError("replay: divergence " + replay::percent(r.divergence_rate) + " of statements above " +
                       "--max-divergence " + printf_string("%g%%", max_rate * 100) + " (" +
                       std::to_string(r.divergence_new_errors) + " of " + std::to_string(r.statements) +
                       " failed that succeeded at capture; errors by SQLSTATE above)");
}

void setup_replay(CLI::App& parent) {
  auto o = std::make_shared<ReplayOptions>();
  auto* cmd = parent.add_subcommand(
      "replay", "replay a captured trace against a PostgreSQL server: one connection per captured session, "
                "on the captured schedule or as fast as it goes");
  cmd->footer(
      "Users and databases are the captured ones unless remapped: --user and --database send every\n"
      "session there, --user-map renames users one by one (a user or dbname in --db is used only\n"
      "where the capture has none; the replay says when sessions go elsewhere).\n"
      "Credentials come from --db, libpq's environment (PGPASSWORD, ...) and ~/.pgpass.\n"
      "SIGINT or SIGTERM stops the replay: the report and --json cover what ran (exit 128 + signal).\n"
      "Exit status 1, after the report and --json: sessions failed, or statements failed that\n"
      "succeeded at capture (divergence) in a share of the statements above --max-divergence.\n"
      "libpq opens every connection; on a plaintext one tierlab then sends each captured request\n"
      "itself, a Query or the extended-protocol messages up to a Sync as the client sent them\n"
      "(statement and portal names, row limits, formats), and reads the answers. --wire libpq\n"
      "leaves that to libpq, as TLS and GSS sessions always do: libpq's calls in pipeline mode,\n"
      "the unnamed portal, one result format, a named Close as DEALLOCATE, and Executes that\n"
      "resume a portal counted as not replayable. COPY FROM STDIN sends the captured data,\n"
      "whether a Query or an Execute started it.");
  cmd->add_option("file", o->file, "trace file (.tlt)")->required();
  cmd->add_option("--db", o->db, "target: libpq conninfo or URI");
  auto* speed = cmd->add_option("--speed", o->speed, "replay speed factor (2 = twice as fast)")
                    ->check(positive_number());
  cmd->add_flag("--max-speed", o->max_speed, "no waits: as fast as the target allows")->excludes(speed);
  cmd->add_option("--threads", o->threads, "worker threads (default: number of cores)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("-P,--progress", o->progress_s, "print a progress line every SEC seconds")
      ->check(non_negative_number());
  cmd->add_option("--json", o->json, "write the report (with --dry-run: the summary) as JSON to OUT ('-': stdout)");
  cmd->add_option("--log", o->log,
                  "write one line per round trip to FILE, in pgbench -l's columns (session, round trip, "
                  "latency us, 0, end time s and us, schedule lag us) then tierlab's share of the lag, the "
                  "captured latency and ok or the SQLSTATE");
  cmd->add_flag("--dry-run", o->dry_run, "print what would be replayed; do not connect");
  cmd->add_option("--begin", o->begin,
                  "replay from this time (seconds or 30s, 2m) after the trace start, as trace dump prints "
                  "times; a session then inside a captured transaction joins when it ends");
  cmd->add_option("--end", o->end,
                  "replay until this time after the trace start; a transaction still open then is rolled "
                  "back as its session closes");
  cmd->add_option("--database", o->database, "connect every session to this database");
  cmd->add_option("--user", o->user, "connect every session as this user");
  cmd->add_option("--user-map", o->user_map,
                  "file of captured=target user names, one per line ('#' comments)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--max-divergence", o->max_divergence,
                  "exit 0 although up to RATE of the statements (0.01 or 1%) failed that succeeded at "
                  "capture; above it the replay exits 1 after its report")
      ->check(rate_check())
      ->type_name("RATE")
      ->capture_default_str();
  cmd->add_flag("--rt", o->rt, "run the worker threads at real-time priority (SCHED_FIFO; root)");
  cmd->add_flag("--no-pm-qos", o->no_pm_qos,
                "timed replay: let idle CPUs sleep deeply (by default /dev/cpu_dma_latency is held at 0 "
                "during the run, as cyclictest does)");
  cmd->add_option("--wire", o->wire,
                  "plaintext sessions, once connected: direct (tierlab writes the requests and reads the "
                  "answers) or libpq")
      ->check(CLI::IsMember({"direct", "libpq"}))
      ->capture_default_str();
  cmd->add_option("--io", o->io,
                  "event loop of directly driven sessions: io_uring, epoll, or auto (io_uring where the "
                  "kernel has it, else epoll)")
      ->check(CLI::IsMember({"auto", "io_uring", "epoll"}))
      ->capture_default_str();
  cmd->callback([o] { run_replay(*o); });
}

const Registration reg{"replay", 30, &setup_replay};

}  // namespace
}  // namespace tierlab::app
