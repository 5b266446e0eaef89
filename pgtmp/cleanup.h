// Private to pgtmp: the process-wide registry of live servers that a
// SIGINT/SIGTERM/SIGHUP handler stops and removes before the process dies.
//
// The handler only makes async-signal-safe calls: it sends SIGQUIT
// (immediate shutdown) to each registered postmaster, waits for it (bounded,
// then SIGKILL), removes its temp dir with unlinkat/getdents64, and then
// hands the signal on: to the handler that was installed before (if it was a
// function) or to the default action (the process dies of the same signal).
// Servers registered by another process (the parent of a fork) are left
// alone. A signal that was ignored when the first server started stays
// ignored. A program that wants its own graceful stop on SIGINT either blocks
// the signal and waits for it (sigwait: blocked signals never reach the
// handler) or installs its own handler after starting the server.
#pragma once

#include <sys/types.h>

#include <string>

namespace tierlab::pgtmp::detail {

// Registers a temp dir; returns a slot number. Installs the handlers on
// first use. Throws RuntimeError when the registry is full.
int register_server(const std::string& temp_dir);
// Sets (or clears with 0) the postmaster pid of a slot.
void set_postmaster(int slot, pid_t pid);
void unregister_server(int slot);

}  // namespace tierlab::pgtmp::detail
