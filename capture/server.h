// The capture commands' own connection to the server they record: what the
// server is (version, settings, data directory) and, for `capture run`, its
// counters over time. The connection goes straight to the server, never
// through the proxy, and passive capture leaves its client address out of
// the recorded sessions, so its queries are never part of the workload.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

struct pg_conn;

namespace tierlab::capture {

// "host=H port=P dbname=postgres ..." from HOST:PORT or DIR[:PORT] (the
// form of --upstream).
std::string conninfo_for(const std::string& upstream);

// One libpq connection. A failed connection is not an exception: ok() is
// false and error() says why, in one line.
class PgSampler {
 public:
  explicit PgSampler(const std::string& conninfo);
  ~PgSampler();
  PgSampler(const PgSampler&) = delete;
  PgSampler& operator=(const PgSampler&) = delete;
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  // The client end of the connection when it is TCP, so that passive capture
  // can leave the sampler's own queries out of the recorded sessions.
  bool tcp_client(std::string& addr, uint16_t& port) const;

  // First column of the first row, or "" on failure.
  std::string value(const char* sql);

  // The connection still works (it was made and has not been lost).
  bool connected() const;

  // The server_version_num, 0 when unknown.
  int version_num();

  // Runs `sql`; on success returns true and fills `rows` (each row its
  // columns' text, "" for NULL, and `nulls` marks them). On failure returns
  // false and sets `error` to the server's message in one line.
  bool rows(const char* sql, std::vector<std::vector<std::string>>& rows, std::string& error);

  // Whether the server runs on this machine: a Unix socket, or a TCP peer
  // address this machine owns. False for a remote or managed server (RDS,
  // Aurora, Cloud SQL), whose processes and devices a capture cannot see.
  bool server_on_this_machine(std::string* peer = nullptr) const;

 private:
  pg_conn* conn_;
  std::string error_;
};

// PostgreSQL's own statistics, sampled over SQL every --sample-interval of
// `capture run`: all a capture has of a server it does not run beside (a
// managed one). Each view is a group of Sample records:
//   pg.blks_read, pg.blks_hit, pg.xact_commit, pg.xact_rollback,
//     pg.tup_returned/fetched/inserted/updated/deleted, pg.temp_bytes,
//     pg.blk_read_time_ms, pg.blk_write_time_ms  (pg_stat_database, summed)
//   pg.wal_bytes                                 (pg_current_wal_lsn())
//   pg.buffers_checkpoint, pg.buffers_clean, pg.buffers_backend,
//     pg.bgwriter.COLUMN                         (pg_stat_bgwriter)
//   pg.checkpointer.COLUMN                       (pg_stat_checkpointer, 17+;
//                                                 pg.buffers_checkpoint from
//                                                 its buffers_written)
//   pg.wal.COLUMN                                (pg_stat_wal, 14+)
//   pg.io.BACKEND_TYPE.OBJECT.CONTEXT.COLUMN     (pg_stat_io, 16+; spaces
//                                                 in the backend type as _)
//   pg.stmt.QUERYID.{calls,time_ms,rows,shared_blks_read,shared_blks_hit}
//                                                (pg_stat_statements, when
//                                                 installed; its text as
//                                                 Meta "pg.stmt.QUERYID")
// Every numeric column of the views is taken (to_jsonb), so a server
// version that adds columns adds samples. A view the server lacks or the
// role may not read is named once through `say` and left out; the others go
// on. Works with the privileges of pg_monitor.
class CounterSampler {
 public:
  CounterSampler(PgSampler& pg, std::function<void(const std::string&)> say);
  ~CounterSampler();
  CounterSampler(const CounterSampler&) = delete;
  CounterSampler& operator=(const CounterSampler&) = delete;
  // One round: appends (name, value) per counter, and to `meta` the texts
  // of statements not seen before. False when the connection is lost (said
  // once through `say`) or no view is left to read.
  bool sample(std::vector<std::pair<std::string, double>>& out,
              std::vector<std::pair<std::string, std::string>>& meta);
  // The groups still sampled ("pg_stat_database", "pg_stat_io", ...).
  std::vector<std::string> sampled() const;

 private:
  struct Group;
  PgSampler& pg_;
  std::function<void(const std::string&)> say_;
  std::vector<Group> groups_;
  std::set<std::string> stmt_seen_;
};

// The settings a projection of a host-less capture needs beside
// durability_settings(): effective_cache_size, max_connections,
// track_io_timing, server_version_num. As Meta records ("setting.NAME").
std::vector<std::pair<std::string, std::string>> projection_settings(PgSampler& pg);

// The settings that decide whether and how a commit waits for the device,
// and what the server caches: fsync, synchronous_commit, wal_sync_method,
// full_page_writes, commit_delay, checkpoint_timeout, max_wal_size,
// shared_buffers. As Meta records ("setting.NAME", SHOW's value), in that
// order; empty when the query fails.
std::vector<std::pair<std::string, std::string>> durability_settings(PgSampler& pg);

// For capture proxy and sniff: connects with `conninfo`, returns
// durability_settings() and closes the connection again. When it cannot
// connect, returns nothing and sets *why (one line); the capture goes on.
std::vector<std::pair<std::string, std::string>> server_meta(const std::string& conninfo, std::string* why);

}  // namespace tierlab::capture
