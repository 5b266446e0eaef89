// tierlab replay: re-drive a captured transaction stream against PostgreSQL.
#include "app/command.h"
#include "app/replay_json.h"
#include "app/stop_signals.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/units.h"
#include "replay/replay.h"
#include "replay/start_at.h"
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
  std::string sync = "commit";
  std::string sync_timeout = "10s";
  std::string shard;
  std::string start_at;
};

// --shard K/N, or /N with K from the environment an orchestrator sets for
// each process: JOB_COMPLETION_INDEX (a Kubernetes Indexed Job's pod), else
// SLURM_PROCID (a Slurm task). Both count from 0, as --shard does.
replay::Shard parse_shard(const std::string& text) {
  auto number = [&](std::string_view v, const std::string& what) -> uint32_t {
    uint32_t n = 0;
    if (v.empty() || v.size() > 9) throw InputError("--shard " + text + ": " + what + " is not a number");
    for (char c : v) {
      if (c < '0' || c > '9') throw InputError("--shard " + text + ": " + what + " is not a number");
      n = n * 10 + static_cast<uint32_t>(c - '0');
    }
    return n;
  };
  const size_t slash = text.find('/');
  if (slash == std::string::npos)
    throw InputError("--shard " + text + ": expected K/N (shard K of N, K from 0) or /N");
  replay::Shard s;
  s.count = number(std::string_view(text).substr(slash + 1), "N");
  if (s.count == 0) throw InputError("--shard " + text + ": N must be at least 1");
  if (slash > 0) {
    s.index = number(std::string_view(text).substr(0, slash), "K");
  } else {
    const char* env = nullptr;
    const char* name = nullptr;
    for (const char* n : {"JOB_COMPLETION_INDEX", "SLURM_PROCID"})
      if ((env = std::getenv(n)) && *env) {
        name = n;
        break;
      }
    if (!name)
      throw InputError("--shard " + text +
                       ": K is not given and neither JOB_COMPLETION_INDEX nor SLURM_PROCID is set");
    const std::string value = env;
    if (value.empty() || value.size() > 9 || value.find_first_not_of("0123456789") != std::string::npos)
      throw InputError("--shard " + text + ": " + name + "=" + value + " is not a shard index");
    s.index = static_cast<uint32_t>(std::stoul(value));
  }
  if (s.index >= s.count)
    throw InputError("--shard " + text + ": shard " + std::to_string(s.index) + " does not exist in " +
                     std::to_string(s.count) + " (K counts from 0 to N-1)");
  return s;
}

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
      {"commit_points", s.commit_points},
      {"shard", {{"index", s.shard.index}, {"count", s.shard.count}}},
      {"trace_sessions", s.trace_sessions},
  };
}

void run_replay(const ReplayOptions& o) {
  replay::Window window;
  if (!o.begin.empty()) window.begin = parse_duration("--begin", o.begin);
  if (!o.end.empty()) window.end = parse_duration("--end", o.end);
  if (window.end <= window.begin) throw InputError("--end must be after --begin");
  const double max_rate = *parse_rate(o.max_divergence);  // checked by rate_check()
  if (!o.dry_run && o.db.empty()) throw InputError("--db CONNINFO is required (the target PostgreSQL)");
  const replay::Shard shard = o.shard.empty() ? replay::Shard{} : parse_shard(o.shard);
  replay::Options opts;
  opts.conninfo = o.db;
  opts.speed = o.speed;
  opts.max_speed = o.max_speed;
  opts.threads = o.threads;
  opts.progress_s = o.progress_s;
  opts.realtime = o.rt;
  opts.hold_cpu_latency = !o.no_pm_qos;
  opts.direct = o.wire == "direct";
  opts.io = io_choice(o.io, "TIERLAB_REPLAY_IO");
  opts.log_path = o.log;
  opts.sync = o.sync != "none";
  opts.sync_all = o.sync == "all";
  opts.sync_timeout_ns = parse_duration("--sync-timeout", o.sync_timeout);
  if (!o.start_at.empty()) {
    const int64_t now = clock_ns(CLOCK_REALTIME);
    opts.start_at_ns = replay::parse_start_at("--start-at", o.start_at, now);
    if (opts.start_at_ns < now)
      throw InputError("--start-at " + o.start_at + " (" + replay::format_realtime(opts.start_at_ns) + ") is " +
                       seconds(now - opts.start_at_ns) + " past");
  }
  opts.database = o.database;
  opts.user = o.user;
  if (!o.user_map.empty()) opts.user_map = for_flag("--user-map", [&] { return replay::load_user_map(o.user_map); });

  OutputFile json(o.json, "--json");
  // With the JSON on standard output, the text goes to standard error.
  std::ostream& text = o.json == "-" ? std::cerr : std::cout;
  // The trace is streamed (read twice, its units held only while they are
  // replayed), and commit order planned as it is read; a trace whose
  // records are out of time order is loaded for it.
  replay::Workload w = [&] {
    const bool sync = opts.sync && !o.dry_run;
    replay::Workload s = replay::stream(o.file, window, shard, sync);
    if (!sync || s.sync_unplanned().empty()) return s;
    std::cerr << "tierlab: replay: " << o.file << ": " << s.sync_unplanned() << "; --sync " << o.sync
              << " plans over the whole trace, loaded (memory grows with its length)\n";
    auto reader = trace::open_reader(o.file);
    return replay::load(*reader, window, shard);
  }();
  if (window.begin > w.summary().trace_end_ns)
    throw InputError("--begin " + o.begin + " is past the end of the trace: " + o.file + " is " +
                     seconds(w.summary().trace_end_ns) + " long");
  if (o.dry_run) {
    replay::print_dry_run(text, w.summary());
    json.write(dry_run_json(w.summary()).dump(2) + "\n");
    return;
  }
  // An empty shard is not an error: its report (all zeros) still merges.
  if (w.summary().sessions == 0 && (shard.count == 1 || w.summary().trace_sessions == 0))
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
  check_rt(o.rt);
  replay::Report r;
  try {
    r = for_settings({{"log_path", "--log"}}, [&] { return replay::run(w, opts, &std::cerr); });
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

}  // namespace

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
      "libpq opens every connection (TLS as --db says); tierlab then sends each captured request\n"
      "itself, a Query or the extended-protocol messages up to a Sync as the client sent them\n"
      "(statement and portal names, row limits, formats), and reads the answers. --wire libpq\n"
      "leaves that to libpq, as GSS-encrypted sessions always do: libpq's calls in pipeline mode,\n"
      "the unnamed portal, one result format, a named Close as DEALLOCATE, and Executes that\n"
      "resume a portal counted as not replayable. COPY FROM STDIN sends the captured data,\n"
      "whether a Query or an Execute started it.");
  cmd->add_option("file", o->file, "trace file (.tlt)")->required();
  cmd->add_option("--db", o->db, "target: libpq conninfo or URI");
  auto* speed = cmd->add_option("--speed", o->speed, "replay speed factor (2 = twice as fast)")
                    ->check(positive_number());
  cmd->add_flag("--max-speed", o->max_speed, "no waits: as fast as the target allows")->excludes(speed);
  cmd->add_option("--threads", o->threads, "worker threads (default: the CPUs the replay may use: its affinity, capped by its cgroup CPU quota, rounded up)")
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
  cmd->add_option("--shard", o->shard,
                  "replay shard K of N only (K from 0 to N-1): the sessions whose id hashes to K; the N "
                  "shards together are the whole trace. /N alone takes K from JOB_COMPLETION_INDEX "
                  "(Kubernetes Indexed Job) or SLURM_PROCID (Slurm), both 0-based; merge the shards' "
                  "--json reports with tierlab report merge")
      ->type_name("K/N");
  cmd->add_option("--start-at", o->start_at,
                  "begin the schedule (with --max-speed: the first connections) at this wall-clock time, "
                  "shared by the shards on every host: ISO 8601 with a zone (2026-12-03T14:00:00Z), "
                  "@UNIX_SECONDS, or +30s from now (for one process; for N hosts compute one absolute time "
                  "once and pass it to all). The report gives the clock (NTP synchronised or not) and how "
                  "far after it this process began")
      ->type_name("TIME");
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
                  "the workers' event loop: io_uring, epoll, or auto (io_uring where the kernel has it and "
                  "sessions are driven directly, else epoll)")
      ->check(CLI::IsMember({"auto", "io_uring", "epoll"}))
      ->capture_default_str();
  cmd->add_option("--sync", o->sync,
                  "commit: a transaction or autocommit statement waits until every transaction that "
                  "committed before it began at capture, changed data or schema, and touched a relation "
                  "(or row key) it touches in a way where order matters, has committed in the replay; "
                  "all: it, and a session's start, wait for every such transaction, whatever it touched "
                  "(for links the SQL text does not show: triggers, views, functions); none: sessions "
                  "race, keeping only their own order. The trace is streamed (memory does not grow with "
                  "its length); commit and all load a trace whose records are out of time order)")
      ->check(CLI::IsMember({"commit", "all", "none"}))
      ->capture_default_str();
  cmd->add_option("--sync-timeout", o->sync_timeout,
                  "with --sync commit or all: a wait for other sessions' commits longer than this (30s, 500ms; "
                  "0: no limit) goes on and is counted")
      ->type_name("DURATION")
      ->capture_default_str();
  cmd->callback([o] { run_replay(*o); });
}

}  // namespace tierlab::app
