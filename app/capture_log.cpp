// tierlab capture log: PostgreSQL server logs (stderr, csvlog, jsonlog) -> trace.
#include "app/command.h"
#include "capture/log.h"
#include "common/error.h"
#include "trace/writer.h"

#include <iostream>
#include <memory>

namespace tierlab::app {
namespace {

struct LogOptions {
  std::vector<std::string> files;
  std::string out;
  std::string format = "auto";
  std::string prefix;
  std::string begin, end;
  std::string database, user;
  int compress_level = 1;
};

std::optional<int64_t> time_flag(const std::string& v, const char* flag) {
  if (v.empty()) return std::nullopt;
  auto t = capture::parse_log_time(v);
  if (!t)
    throw InputError(std::string("capture log: ") + flag + " '" + v +
                     "': expected a time as the log writes it, 'YYYY-MM-DD HH:MM:SS[.fff][ UTC]', "
                     "or seconds since the epoch");
  return t;
}

void run_log(const LogOptions& o) {
  capture::LogOptions lo;
  try {
    lo.format = capture::parse_log_format(o.format);
  } catch (const InputError& e) {
    throw InputError(std::string("capture log: --format: ") + e.what());
  }
  lo.prefix = o.prefix;
  lo.begin = time_flag(o.begin, "--begin");
  lo.end = time_flag(o.end, "--end");
  lo.database = o.database;
  lo.user = o.user;
  // Reading a log takes a while: the trace is written beside --out and
  // replaces it only once whole.
  PendingFile target(o.out, "--out");
  std::unique_ptr<trace::Writer> writer;
  trace::WriterOptions wo;
  wo.compression_level = o.compress_level;
  std::unique_ptr<capture::LogCapture> made;
  try {
    made = std::make_unique<capture::LogCapture>(lo, [&](int64_t realtime_start) -> trace::Writer& {
      // The trace's clock starts at the first logged message: ts 0 is that
      // wall-clock time.
      wo.start_mono_ns = 0;
      wo.realtime_offset_ns = realtime_start;
      writer = trace::open_writer(target.path(), wo);
      return *writer;
    });
  } catch (const InputError& e) {
    throw InputError(std::string("capture log: --log-line-prefix: ") + e.what());
  }
  capture::LogCapture& capture = *made;
  capture::LogStats st;
  try {
    for (const std::string& f : o.files) capture.read_file(f);
    st = capture.finish();
  } catch (const SettingError& e) {
    // No line matched the prefix: the flag that gives the server's.
    if (e.setting() != "log_line_prefix") throw;
    throw InputError(std::string(e.what()) + " (give the server's with --log-line-prefix)");
  }
  writer->close();
  writer.reset();
  target.commit();
  std::cout << "capture log: " << st.files << " file" << (st.files == 1 ? "" : "s") << ", " << st.lines
            << " lines -> " << o.out << ": " << st.sessions << " sessions (" << st.sessions_unknown_start
            << " begun before the log), " << st.queries << " queries, " << st.executes
            << " executions, " << st.transactions << " transactions, " << st.errors << " errors, "
            << st.durations << " durations\n";
  if (!st.prefix.empty()) std::cout << "  log_line_prefix '" << st.prefix << "'\n";
  std::cout << "  skipped: " << st.unparsed << " unparsed lines, " << st.truncated << " truncated, "
            << st.filtered << " messages of other databases/users, " << st.outside_window
            << " outside --begin/--end, " << st.other << " other messages; " << st.unlogged_statements
            << " statements known only from their error\n";
  std::cout << "  not in a log: row counts, result sizes, parameter types; times at the log's precision\n";
}

}  // namespace

void setup_capture_log(CLI::App& parent) {
  auto& cap = group(parent, "capture");
  auto* sub = cap.add_subcommand(
      "log", "read PostgreSQL server logs (stderr, csvlog, jsonlog; gzip'd too) written with "
             "log_statement = all or log_min_duration_statement = 0, or pgreplay's replay files, into a trace");
  auto opt = std::make_shared<LogOptions>();
  sub->add_option("files", opt->files, "log files (or pgreplay replay files), in the order they were written")
      ->required();
  sub->add_option("--out,-o", opt->out, "trace file to write")->required();
  sub->add_option("--format", opt->format,
                  "stderr, csvlog, jsonlog or pgreplay (a pgreplay -f replay file) (default: a replay file by "
                  "its content, else by file name: .csv, .json, else stderr)");
  sub->add_option("--log-line-prefix", opt->prefix,
                  "the server's log_line_prefix, for a stderr log (default: recognise '%m [%p] ', "
                  "RDS's '%t:%r:%u@%d:[%p]:' or pgreplay's '%m|%u|%d|%c|')");
  sub->add_option("--begin", opt->begin, "only messages logged at or after this time ('YYYY-MM-DD HH:MM:SS')");
  sub->add_option("--end", opt->end, "only messages logged before this time");
  sub->add_option("--database", opt->database, "only sessions of this database");
  sub->add_option("--user", opt->user, "only sessions of this user");
  add_compress_level(*sub, opt->compress_level);
  sub->callback([opt] { run_log(*opt); });
}

}  // namespace tierlab::app
