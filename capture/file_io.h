// File I/O recorder: the server's read, write and sync system calls, from
// the kernel's syscall tracepoints in tracefs, become FileIo records of a
// trace.
//
// PostgreSQL reads and writes its relation files and WAL with pread64 and
// pwrite64 (WAL segments are zero-filled with pwritev) and makes them
// durable with fdatasync (WAL) and fsync (relation files at a checkpoint).
// Every such call of the server's process tree is recorded, whether the OS
// cache then answered it or the device did: the page reference stream below
// shared_buffers, from which the profile builds the miss-ratio curve that
// `project --memory` reads. Traced: sys_enter/sys_exit of pread64,
// pwrite64, preadv, pwritev, preadv2, pwritev2 (where the kernel has them),
// fdatasync and fsync, and sys_enter_close.
//
// An entry is paired with its exit by thread id: the record's ts is the
// entry, latency_ns the time to the exit, length the bytes the call
// returned (0 for a sync). A call that failed is counted, not recorded. A
// file is named once per (pid, fd), from /proc/PID/fd/N when its first call
// is read (within 0.1 s); a close forgets the name. Paths under the data
// directory are written relative to it ("base/16384/16397",
// "pg_wal/000000010000000000000001"). A descriptor closed (or its process
// gone) before its first call is read cannot be named: it is "fd:N", and
// one closed and reused for another file by then is named after the newer
// file. PostgreSQL keeps its relation files and WAL segments open far
// longer than that.
//
// FileIo.op: Read, Write, or Flush for fdatasync and fsync; fsync (which
// also writes the file's metadata) carries kIoMeta in flags.
//
// The recorder works in its own tracing instance (instances/tierlab-
// fileio-PID; capture/tracefs.h), beside the block recorder's. Events the
// kernel could not buffer are counted and written as a Loss{EventsLost}
// record. Needs root.
#pragma once

#include "trace/record.h"
#include "trace/writer.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

namespace tierlab::capture {

// Throws RuntimeError saying why file I/O cannot be recorded here: not
// root, no tracefs, or a kernel without the syscall tracepoints
// (CONFIG_FTRACE_SYSCALLS). Returns the tracefs mount.
std::string require_file_io_tracing(const std::string& tracefs);

struct FileIoCaptureOptions {
  // Record only the calls of this process and its descendants (new
  // backends included). 0 = every process.
  int32_t process_tree = 0;
  // Paths under this directory are written relative to it; "" = absolute.
  std::string data_dir;
  trace::Nanos duration_ns = 0;  // 0 = until *stop is set
  uint32_t buffer_kb = 8192;     // per-CPU ring buffer of the instance
  std::string tracefs;           // "" = /sys/kernel/tracing (mounted if needed)
  // When set, the calls recorded so far, updated every batch (0.1 s at
  // most), for a status line on another thread.
  std::atomic<uint64_t>* live_calls = nullptr;
};

struct FileIoCaptureStats {
  uint64_t reads = 0, writes = 0, flushes = 0;  // FileIo records written
  uint64_t read_bytes = 0, write_bytes = 0;
  uint64_t failed = 0;      // calls that returned an error, not recorded
  uint64_t others = 0;      // calls of processes outside the tree, not recorded
  uint64_t unpaired = 0;    // an entry without its exit or an exit without its entry
  uint64_t unnamed = 0;     // records whose file is "fd:N"
  uint64_t lost = 0;        // events the kernel dropped
  uint64_t events = 0;      // events read
};

// One line without a newline: "R reads (B), W writes (B), F syncs, ..."
std::string describe(const FileIoCaptureStats& st);

// Records until duration_ns has passed or *stop becomes true (checked every
// 100 ms at most). `ready` is called once the events are enabled. Writes
// Meta("capture.file_io.processes") with a process tree, the FileIo records
// and a Loss record if any events were lost. Throws RuntimeError.
FileIoCaptureStats capture_file_io(const FileIoCaptureOptions& opts, trace::Writer& out,
                                   const std::atomic<bool>* stop = nullptr,
                                   const std::function<void()>& ready = {});

}  // namespace tierlab::capture
