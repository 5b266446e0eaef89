// What the server's backends wait on, sampled from pg_stat_activity during
// `capture run`: per sampling round, how many client backends were in a
// transaction and, of them, how many in each wait event (or running). The
// profile turns the counts into where a transaction's time goes (waits on
// data file I/O, on the WAL's flush at commit, on locks, on the client, on
// the CPU; models/profile.h, Profile::waits).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tierlab::capture {

// Runs one SQL query: true and its rows (each row its columns' text, "" for
// NULL), or false and the server's message in one line. The connection is
// the caller's (app/capture_server.h's PgSampler).
using SqlQuery =
    std::function<bool(const char* sql, std::vector<std::vector<std::string>>& rows, std::string& error)>;

// The query one round runs: (wait_event_type, wait_event, backends) of the
// client backends in a transaction other than the sampler's own, "CPU" and
// "running" for those in no wait. Other users' backends show their state
// and waits only to a role with pg_read_all_stats (pg_monitor has it).
extern const char* const kActivitySql;

// The samples of one round from the query's rows: "pg.activity.backends"
// (their sum, present even when 0, so that every round counts) and
// "pg.activity.TYPE.EVENT" per row (spaces and dots in names as '_'). A row
// that is not (text, text, count) is left out.
std::vector<std::pair<std::string, double>> activity_samples(const std::vector<std::vector<std::string>>& rows);

class ActivitySampler {
 public:
  // `say` gets each line a user should see, once: the view could not be
  // read, or the role sees only its own backends.
  ActivitySampler(SqlQuery query, std::function<void(const std::string&)> say);
  // One round, appended to `out`. False once the view cannot be read (said
  // once); the sampler then stays off.
  bool sample(std::vector<std::pair<std::string, double>>& out);
  bool on() const { return on_; }

 private:
  SqlQuery query_;
  std::function<void(const std::string&)> say_;
  std::vector<std::vector<std::string>> rows_;
  bool on_ = true;
  bool checked_privileges_ = false;
};

}  // namespace tierlab::capture
