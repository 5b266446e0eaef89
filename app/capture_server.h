// The capture commands' own connection to the server they record: what the
// server is (version, settings, data directory) and, for `capture run`, its
// counters over time. The connection goes straight to the server, never
// through the proxy, and passive capture leaves its client address out of
// the recorded sessions, so its queries are never part of the workload.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

struct pg_conn;

namespace tierlab::app {

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

  // Names and values of the counters, or false if the query failed.
  bool counters(std::vector<std::pair<const char*, double>>& out);

 private:
  pg_conn* conn_;
  std::string error_;
};

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

// The line a capture prints when server_meta() could not connect.
void say_settings_skipped(const char* cmd, const std::string& why);

}  // namespace tierlab::app
