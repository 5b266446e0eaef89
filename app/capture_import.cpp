// tierlab capture import: fio iolog (v2/v3) or blkparse text -> trace.
#include "app/command.h"
#include "capture/import.h"
#include "common/error.h"
#include "trace/writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>

namespace tierlab::app {
namespace {

struct ImportOptions {
  std::string fio_iolog;
  std::string blkparse;
  std::string out;
};

void run_import(const ImportOptions& o) {
  if (o.fio_iolog.empty() == o.blkparse.empty())
    throw InputError("capture import: give exactly one of --fio-iolog FILE or --blkparse FILE");
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
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  wo.realtime_offset_ns = trace::Nanos(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
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

void setup_import(CLI::App& parent) {
  auto& cap = group(parent, "capture");
  auto* sub = cap.add_subcommand("import", "import a fio iolog (v2/v3) or blkparse text output into a trace");
  auto opt = std::make_shared<ImportOptions>();
  auto* f = sub->add_option("--fio-iolog", opt->fio_iolog, "fio iolog version 2 or 3 (fio --write_iolog)");
  auto* b = sub->add_option("--blkparse", opt->blkparse, "blkparse default text output");
  f->excludes(b);
  sub->add_option("--out,-o", opt->out, "trace file to write")->required();
  sub->callback([opt] { run_import(*opt); });
}

const Registration reg{"capture-import", 32, &setup_import};

}  // namespace
}  // namespace tierlab::app
