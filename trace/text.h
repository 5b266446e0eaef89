// Traces as text: the line `tierlab trace dump` prints per record and the
// export formats (jsonl, csv) of `tierlab trace export`. The block I/O of a
// trace as a fio iolog is capture::write_fio_iolog_v3 (capture/import.h).
#pragma once

#include "trace/reader.h"
#include "trace/record.h"

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tierlab::trace {

// Stable names of a session's end reason and of a loss kind, as dump and
// the exports print them ("client_abort", "queue_overflow", ...).
std::string_view reason_name(EndReason r);
std::string_view loss_name(LossKind k);

// The dump line of `r` (replacing `line`, newline included): time in
// seconds from `origin` (the trace's start), session, kind and its fields.
void dump_line(std::string& line, const Record& r, Nanos origin);

// One export format. begin() is called once before the first record, end()
// after the last; each writes into `line` (replacing it), which the caller
// outputs.
class Exporter {
 public:
  virtual ~Exporter() = default;
  virtual void begin(std::string& line, const Header&) { line.clear(); }
  virtual void record(std::string& line, const Record& r) = 0;
  virtual void end(std::string& line) { line.clear(); }
};

struct ExportFormat {
  const char* name;  // "jsonl", "csv"
  std::function<std::unique_ptr<Exporter>()> make;
};

// The export formats, in the order --help lists them: a new format is one
// more Exporter and one more line there.
const std::vector<ExportFormat>& export_formats();

// What the csv columns hold per record kind (the help of `trace export`).
extern const char* const kCsvHelp;

}  // namespace tierlab::trace
