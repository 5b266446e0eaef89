// Importers of I/O logs written by other tools, and the fio iolog exporter.
//
// fio iolog (version 2 and 3) and blkparse's default text output become
// BlockIo records of a tierlab trace; a trace's BlockIo records become a fio
// iolog version 3 that `fio --read_iolog` replays.
//
// How a fio iolog is kept in a trace, so that importing and exporting again
// gives the same bytes:
//   - Meta "fio.iolog.version" = "2" or "3", at ts 0, first record;
//   - Meta "fio.file.add" / "fio.file.open" / "fio.file.close" = file name,
//     one per file-action line, at the line's time;
//   - one BlockIo per I/O line at the line's time: device = index of the
//     file (order of first appearance), offset and length as written, op
//     read/write/trim (Discard)/sync (Flush + kIoMeta)/datasync (Flush),
//     flags kIoIncomplete (an iolog records no completions);
//   - Meta "fio.file.N" = name, when file N is first seen (before its first
//     record), so the exporter can name it again.
// Timestamps: fio writes microseconds since the start of the job; the trace
// holds them as nanoseconds (t * 1000). blkparse's are seconds since the
// start of the block trace. Either way times count from 0, so the writer
// should be opened with start_mono_ns 0 (as `capture import` does). Version 2 has no timestamps except
// its "wait" lines, whose argument fio's reader treats as milliseconds since
// the start; they advance the clock of the following lines.
//
// Malformed input throws InputError "FILE:LINE: what is wrong".
#pragma once

#include "trace/reader.h"
#include "trace/writer.h"

#include <cstdint>
#include <istream>
#include <ostream>
#include <string>
#include <vector>

namespace tierlab::capture {

struct ImportStats {
  uint64_t lines = 0;
  uint64_t ios = 0;           // BlockIo records written
  uint64_t file_actions = 0;  // fio add/open/close lines
  uint64_t incomplete = 0;    // blkparse: issues with no completion seen
  uint64_t orphans = 0;       // blkparse: completions with no issue seen
  int version = 0;            // fio iolog version
};

// `name` is used in error messages (the path).
ImportStats import_fio_iolog(std::istream& in, const std::string& name, trace::Writer& out);
ImportStats import_blkparse(std::istream& in, const std::string& name, trace::Writer& out);

struct FioExportOptions {
  // Name every I/O with this file (replay against another target). Empty:
  // names from the trace (fio.file.N metadata), or the block device's node
  // (/dev/NAME from sysfs) for captured block I/O.
  std::string filename;
  // Write trim lines. fio 3.33 (Debian 12) refuses every one ("bad ddir:
  // 2") and replays the rest; false leaves them out and counts them.
  bool trims = true;
  // Appended to the version line after "  # ". fio compares only the start
  // of that line with "fio version 3 iolog" (and reads at most 255 bytes of
  // it: keep the comment short); import_fio_iolog() accepts it too.
  std::string comment;
};

struct FioExportStats {
  uint64_t ios = 0;            // I/O lines written (sync and datasync included)
  uint64_t trims_dropped = 0;  // trims left out (FioExportOptions::trims false)
  uint64_t syncs = 0;          // sync and datasync lines
  uint64_t end = 0;            // highest offset + length of a read, write or trim
  // The names the trace gives its files or devices (fio.file.N metadata, or
  // /dev/NAME of captured block I/O), in order of first I/O, whichever name
  // the export used.
  std::vector<std::string> sources;
};

// Writes the trace's BlockIo records as a fio iolog version 3. A trace
// imported from a fio iolog version 3, exported with no filename, no comment
// and trims, comes out byte for byte as it went in. Otherwise times are
// relative to the first I/O, each file gets "add" and "open" lines before
// its first I/O and "close" lines at the end (one file when renamed), lines
// are in issue-time order, and sync/datasync lines carry offset and length
// 0.
FioExportStats write_fio_iolog_v3(trace::Reader& in, std::ostream& out, const FioExportOptions& opts = {});

}  // namespace tierlab::capture
