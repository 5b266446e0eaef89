// A throwaway PostgreSQL server: initdb into a fresh temp dir, start on a unix
// socket and a free TCP port on 127.0.0.1, wait until it accepts connections,
// and always clean up (destructor, test failure, SIGINT/SIGTERM, and the
// death of the process that started it).
//
// Used by the tests, scripts/demo and `tierlab sandbox`.
//
// PostgreSQL refuses to run as root. When the caller is root, the data
// directory is owned by, and the server runs as, an unprivileged user
// (Options::run_as, default "postgres").
//
// Cleanup guarantees:
// - the destructor stops the server (immediate shutdown: the data is thrown
//   away) and removes the temp dir;
// - SIGINT, SIGTERM and SIGHUP stop every server of the process and remove
//   their dirs before the signal takes its course (the previously installed
//   handler runs next, or the default action). A program that wants its own
//   graceful stop blocks these signals and waits for them (sigwait), or
//   installs its handler after starting the server;
// - if the process dies anyway (SIGKILL), the kernel sends the postmaster
//   SIGQUIT (PR_SET_PDEATHSIG) and it exits; only the temp dir remains.
//   That signal fires when the *thread* that started the server exits: start
//   servers (and call start()/restart()) from the main thread, or from a
//   thread that outlives them.
// - a forked copy of the process never stops or removes its parent's servers.
//
// Defaults in postgresql.conf (caller settings come after and win):
// listen_addresses=127.0.0.1, the port, unix_socket_directories=<temp dir>,
// max_connections=2500, shared_buffers=32MB; the server log goes to
// <temp dir>/server.log. Durability is the server's own default (fsync on,
// synchronous_commit on): tests that want speed pass {"fsync", "off"}. Bootstrap superuser "postgres", database "postgres".
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tierlab::pgtmp {

struct Options {
  // Server binaries; empty: `pg_config --bindir`, then the newest
  // /usr/lib/postgresql/*/bin.
  std::string bindir;
  // TCP port on 127.0.0.1; 0 picks a free one.
  int port = 0;
  // Unprivileged user to run as when started by root.
  std::string run_as = "postgres";
  // Extra postgresql.conf settings, e.g. {"shared_buffers", "16MB"}.
  std::vector<std::pair<std::string, std::string>> settings;
  // Authentication for TCP connections from 127.0.0.1 ("trust",
  // "scram-sha-256", "md5"). The unix socket always trusts.
  std::string host_auth = "trust";
  // Parent of the temp dir; empty: $TMPDIR or /tmp.
  std::string tmp_parent;
  // Seconds to wait for the server to accept connections.
  int start_timeout_s = 60;
  // Copy a cached initdb result instead of running initdb (seconds on a busy
  // machine) each time. The cache is $TMPDIR/tierlab-pg-cache-<euid>
  // (mode 0700; ~40 MB per PostgreSQL build), filled by the first initdb.
  bool reuse_initdb = true;
  // Wrap the postmaster in this command prefix (e.g. {"cgexec","-g","blkio:x"});
  // empty: none.
  std::vector<std::string> exec_prefix;
};

class Server {
 public:
  // Starts a server; throws RuntimeError naming what failed (binaries not
  // found, initdb failed with its output, did not start in time).
  explicit Server(Options opts = {});
  ~Server();  // stops the server (immediate shutdown) and removes the temp dir
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  const std::string& host() const;        // "127.0.0.1"
  const std::string& socket_dir() const;  // unix socket directory
  const std::string& data_dir() const;
  const std::string& bindir() const;
  const std::string& superuser() const;   // bootstrap superuser name
  int postmaster_pid() const;              // 0 when stopped
  const std::string& temp_dir() const;    // holds data dir, socket and log
  const std::string& log_path() const;    // server log (stdout+stderr of postgres)

  // libpq conninfo over TCP: "host=127.0.0.1 port=N dbname=DB user=SUPERUSER".
  std::string conninfo(const std::string& dbname = "postgres") const;
  // The same over the unix socket.
  std::string conninfo_unix(const std::string& dbname = "postgres") const;

  // Runs SQL through libpq on the unix socket; returns the first column of
  // every row, one per line. Throws RuntimeError with the server's message.
  std::string sql(const std::string& query, const std::string& dbname = "postgres") const;

  // Environment for client tools (PGHOST, PGPORT, PGUSER, PGDATABASE) as
  // "NAME=value" strings; host is 127.0.0.1.
  std::vector<std::string> client_env() const;

  // Runs a program from bindir (e.g. "pgbench", "psql") with args, with
  // client_env() set, as the current user; captures stdout+stderr into *out
  // when given. Returns the exit status.
  int run_tool(const std::string& tool, const std::vector<std::string>& args,
               std::string* out = nullptr) const;

  // Stops the server (immediate if `immediate`) and starts it again on the
  // same port and data dir.
  void restart(bool immediate = false);
  void stop(bool immediate = false);
  void start();
  bool running() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Finds the server binaries as Options::bindir describes; throws RuntimeError.
std::string find_bindir();

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();

}  // namespace tierlab::pgtmp
