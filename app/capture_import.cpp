// tierlab capture import: fio iolog (v2/v3), blkparse text or a cloud
// provider's metrics (aws cloudwatch get-metric-data) -> trace.
#include "app/command.h"
#include "capture/cloudwatch.h"
#include "capture/import.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/units.h"
#include "trace/writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <iostream>
#include <memory>

namespace tierlab::app {
namespace {

struct ImportOptions {
  std::string fio_iolog;
  std::string blkparse;
  std::string cloudwatch;
  int vcpus = 0;
  std::string memory;
  std::string out;
};

void run_cloudwatch(const ImportOptions& o) {
  std::ifstream in(o.cloudwatch);
  if (!in) throw InputError(errno_message(o.cloudwatch, errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  capture::CloudWatchData d = capture::parse_cloudwatch(text, o.cloudwatch);
  if (o.vcpus > 0) d.vcpus = o.vcpus;
  if (!o.memory.empty()) d.memory_bytes = static_cast<double>(parse_size("--memory", o.memory));
  PendingFile target(o.out, "--out");
  // The metrics carry wall-clock times: the trace's clock starts at the
  // first datapoint, which is its realtime anchor, so `trace merge` lines
  // it up with a capture of the same window.
  trace::WriterOptions wo;
  wo.start_mono_ns = 0;
  wo.realtime_offset_ns = d.first_ns;
  auto writer = trace::open_writer(target.path(), wo);
  capture::write_cloudwatch(d, *writer, d.first_ns);
  writer->close();
  writer.reset();
  target.commit();
  size_t known = 0;
  for (const auto& s : d.series) known += s.known;
  const time_t first = static_cast<time_t>(d.first_ns / 1'000'000'000),
               last = static_cast<time_t>(d.last_ns / 1'000'000'000);
  char a[32], b[32];
  std::strftime(a, sizeof a, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&first));
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&last));
  std::cout << "capture import: " << o.cloudwatch << " -> " << o.out << ": " << d.series.size() << " metrics ("
            << known << " the models use), " << d.datapoints() << " datapoints from " << a << " to " << b
            << ", period " << d.period_s << " s; vcpus "
            << (d.vcpus > 0 ? std::to_string(d.vcpus) : std::string("unknown (give --vcpus)")) << ", memory "
            << (d.memory_bytes > 0 ? format_bytes(d.memory_bytes) : std::string("unknown (give --memory)")) << "\n";
  for (const auto& n : d.notes) std::cout << "note: " << n << "\n";
}

void run_import(const ImportOptions& o) {
  if (!o.fio_iolog.empty() + !o.blkparse.empty() + !o.cloudwatch.empty() != 1)
    throw InputError("capture import: give exactly one of --fio-iolog FILE, --blkparse FILE or --cloudwatch FILE");
  if (o.cloudwatch.empty() && (o.vcpus != 0 || !o.memory.empty()))
    throw InputError("capture import: --vcpus and --memory go with --cloudwatch");
  if (o.vcpus < 0) throw InputError("--vcpus " + std::to_string(o.vcpus) + ": must be > 0");
  if (!o.cloudwatch.empty()) return run_cloudwatch(o);
  const std::string& path = o.fio_iolog.empty() ? o.blkparse : o.fio_iolog;
  std::ifstream in(path);
  if (!in) throw InputError(errno_message(path, errno));
  // An import takes moments: it is written beside --out and replaces it
  // only once the trace is whole.
  PendingFile target(o.out, "--out");
  // The logs' times count from the start of the job or trace (0) and carry
  // no date: the trace starts at 0 on its clock, and its wall-clock start is
  // the import's (the header's meaning: docs/trace-format.md).
  trace::WriterOptions wo;
  wo.start_mono_ns = 0;
  wo.realtime_offset_ns = clock_ns(CLOCK_REALTIME);
  auto writer = trace::open_writer(target.path(), wo);
  capture::ImportStats st = o.fio_iolog.empty() ? capture::import_blkparse(in, path, *writer)
                                                : capture::import_fio_iolog(in, path, *writer);
  writer->close();
  writer.reset();
  target.commit();
  std::cout << "capture import: " << path << " -> " << o.out << ": " << st.ios << " I/Os";
  if (st.version) std::cout << " (fio iolog v" << st.version << ", " << st.file_actions << " file actions)";
  if (!o.blkparse.empty())
    std::cout << " (" << st.incomplete << " without completion, " << st.orphans << " completions without issue)";
  std::cout << "\n";
}

}  // namespace

void setup_capture_import(CLI::App& parent) {
  auto& cap = group(parent, "capture");
  auto* sub = cap.add_subcommand(
      "import",
      "import a fio iolog (v2/v3), blkparse text output, or a managed database's metrics (the JSON of\n"
      "aws cloudwatch get-metric-data: ReadIOPS, WriteIOPS, ReadLatency, WriteLatency, ReadThroughput,\n"
      "WriteThroughput, DiskQueueDepth, CPUUtilization, FreeableMemory) into a trace; `trace merge`\n"
      "puts metrics beside a capture of the same window");
  auto opt = std::make_shared<ImportOptions>();
  auto* f = sub->add_option("--fio-iolog", opt->fio_iolog, "fio iolog version 2 or 3 (fio --write_iolog)");
  auto* b = sub->add_option("--blkparse", opt->blkparse, "blkparse default text output");
  auto* c = sub->add_option("--cloudwatch", opt->cloudwatch, "JSON printed by aws cloudwatch get-metric-data");
  f->excludes(b);
  c->excludes(f)->excludes(b);
  sub->add_option("--vcpus", opt->vcpus,
                  "cloudwatch: the instance's vCPUs (CPU per transaction is CPUUtilization x vCPUs; default: "
                  "the file's \"vcpus\" key)");
  sub->add_option("--memory", opt->memory, "cloudwatch: the instance's memory (16GiB; default: the file's \"memory\" key)");
  sub->add_option("--out,-o", opt->out, "trace file to write")->required();
  sub->callback([opt] { run_import(*opt); });
}

}  // namespace tierlab::app
