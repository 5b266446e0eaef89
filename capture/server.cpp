#include "capture/server.h"

#include <arpa/inet.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string_view>

namespace tierlab::capture {

std::string conninfo_for(const std::string& upstream) {
  std::string host = upstream, port = "5432";
  auto colon = upstream.rfind(':');
  if (colon != std::string::npos) {
    host = upstream.substr(0, colon);
    port = upstream.substr(colon + 1);
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return "host='" + host + "' port='" + port + "' dbname=postgres connect_timeout=5 application_name=tierlab_sampler";
}

namespace {

// The counters' connection as root: PostgreSQL refuses to run as root, so
// a role named root is rare, and libpq's default user (the OS user) would
// cost the capture its settings, the server's pid, CPU samples and file
// I/O. Without a user in the conninfo or PGUSER, root connects as postgres.
std::string with_default_user(const std::string& conninfo) {
  if (::geteuid() != 0 || std::getenv("PGUSER")) return conninfo;
  if (conninfo.rfind("postgres://", 0) == 0 || conninfo.rfind("postgresql://", 0) == 0) return conninfo;  // a URI names its user
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(conninfo.c_str(), &err);
  if (!opts) {
    PQfreemem(err);
    return conninfo;  // PQconnectdb says what is wrong with it
  }
  bool has_user = false;
  for (PQconninfoOption* o = opts; o->keyword; ++o)
    if (std::string_view(o->keyword) == "user" && o->val && *o->val) has_user = true;
  PQconninfoFree(opts);
  return has_user ? conninfo : conninfo + " user=postgres";
}

}  // namespace

PgSampler::PgSampler(const std::string& conninfo) : conn_(PQconnectdb(with_default_user(conninfo).c_str())) {
  if (PQstatus(conn_) != CONNECTION_OK) {
    error_ = PQerrorMessage(conn_);
    while (!error_.empty() && (error_.back() == '\n' || error_.back() == ' ')) error_.pop_back();
    for (auto& c : error_)
      if (c == '\n') c = ' ';
    if (error_.empty()) error_ = "cannot connect";
  }
}

PgSampler::~PgSampler() { PQfinish(conn_); }

bool PgSampler::tcp_client(std::string& addr, uint16_t& port) const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (!ok() || ::getsockname(PQsocket(conn_), reinterpret_cast<sockaddr*>(&ss), &len) != 0) return false;
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr))
      inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], buf, sizeof buf);
    else
      inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    port = ntohs(a->sin6_port);
  } else {
    return false;  // a unix socket never reaches a network interface
  }
  addr = buf;
  return true;
}

std::string PgSampler::value(const char* sql) {
  PGresult* r = PQexec(conn_, sql);
  std::string v;
  if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0 && !PQgetisnull(r, 0, 0)) v = PQgetvalue(r, 0, 0);
  PQclear(r);
  return v;
}

bool PgSampler::connected() const { return ok() && PQstatus(conn_) == CONNECTION_OK; }

int PgSampler::version_num() {
  std::string v = value("SHOW server_version_num");
  return v.empty() ? 0 : std::atoi(v.c_str());
}

namespace {

std::string one_line(const char* msg) {
  std::string e = msg ? msg : "";
  while (!e.empty() && (e.back() == '\n' || e.back() == ' ')) e.pop_back();
  if (auto nl = e.find('\n'); nl != std::string::npos) e.resize(nl);
  return e.empty() ? std::string("failed") : e;
}

}  // namespace

bool PgSampler::rows(const char* sql, std::vector<std::vector<std::string>>& out, std::string& error) {
  out.clear();
  PGresult* r = PQexec(conn_, sql);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) {
    error = one_line(r ? PQresultErrorMessage(r) : PQerrorMessage(conn_));
    PQclear(r);
    return false;
  }
  for (int i = 0; i < PQntuples(r); ++i) {
    auto& row = out.emplace_back();
    for (int c = 0; c < PQnfields(r); ++c) row.emplace_back(PQgetisnull(r, i, c) ? "" : PQgetvalue(r, i, c));
  }
  PQclear(r);
  return true;
}

bool PgSampler::server_on_this_machine(std::string* peer) const {
  if (!ok()) return false;
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(PQsocket(conn_), reinterpret_cast<sockaddr*>(&ss), &len) != 0) return false;
  if (ss.ss_family == AF_UNIX) {
    if (peer) *peer = "unix socket";
    return true;
  }
  if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) return false;
  char buf[INET6_ADDRSTRLEN] = {};
  const void* addr = ss.ss_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&ss)->sin_addr)
                                             : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr);
  inet_ntop(ss.ss_family, addr, buf, sizeof buf);
  if (peer) *peer = buf;
  // An address this machine owns is one a socket can be bound to.
  int fd = ::socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  if (ss.ss_family == AF_INET)
    reinterpret_cast<sockaddr_in*>(&ss)->sin_port = 0;
  else
    reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = 0;
  bool local = ::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0;
  ::close(fd);
  return local;
}

// --- counters -------------------------------------------------------------

struct CounterSampler::Group {
  enum Kind { Database, WalLsn, Bgwriter, Checkpointer, Wal, Io, Statements };
  Kind kind;
  std::string name;  // the view, as named to the user
  std::string sql;
  bool on = true;
};

namespace {

// Every number of a to_jsonb() row, as (column, value).
template <class F>
void numbers(const std::string& text, F&& f) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) return;
  for (const auto& [k, v] : j.items())
    if (v.is_number()) f(k, static_cast<double>(v));
}

std::string underscored(std::string s) {
  for (auto& c : s)
    if (c == ' ' || c == '.') c = '_';
  return s;
}

}  // namespace

CounterSampler::CounterSampler(PgSampler& pg, std::function<void(const std::string&)> say)
    : pg_(pg), say_(std::move(say)) {
  using G = Group;
  const int v = pg_.version_num();
  groups_.push_back({G::Database, "pg_stat_database",
                     "SELECT sum(blks_read), sum(blks_hit), sum(xact_commit), sum(xact_rollback),"
                     " sum(tup_returned), sum(tup_fetched), sum(tup_inserted), sum(tup_updated),"
                     " sum(tup_deleted), sum(temp_bytes), sum(blk_read_time), sum(blk_write_time)"
                     " FROM pg_stat_database"});
  groups_.push_back({G::WalLsn, "the WAL position (pg_current_wal_lsn)",
                     "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"});
  groups_.push_back({G::Bgwriter, "pg_stat_bgwriter", "SELECT to_jsonb(b) FROM pg_stat_bgwriter b"});
  const std::string ver = v > 0 ? "PostgreSQL " + std::to_string(v / 10000) : "this server";
  if (v >= 170000)
    groups_.push_back({G::Checkpointer, "pg_stat_checkpointer", "SELECT to_jsonb(c) FROM pg_stat_checkpointer c"});
  if (v >= 140000)
    groups_.push_back({G::Wal, "pg_stat_wal", "SELECT to_jsonb(w) FROM pg_stat_wal w"});
  else
    say_("pg_stat_wal not sampled: " + ver + " has none (14 and later)");
  if (v >= 160000) {
    groups_.push_back({G::Io, "pg_stat_io", "SELECT to_jsonb(s) FROM pg_stat_io s"});
    if (pg_.value("SELECT current_setting('track_io_timing', true)") == "off")
      say_("pg_stat_io times not sampled: track_io_timing is off");
  } else {
    say_("pg_stat_io not sampled: " + ver + " has none (16 and later); reads from the OS come from "
         "pg_stat_database's blks_read");
  }
  std::vector<std::vector<std::string>> r;
  std::string err;
  if (pg_.rows("SELECT to_regclass('pg_stat_statements') IS NOT NULL", r, err) && !r.empty() && r[0][0] == "t") {
    const char* time = v >= 130000 ? "total_exec_time" : "total_time";
    groups_.push_back({G::Statements, "pg_stat_statements",
                       std::string("SELECT queryid, sum(calls), sum(") + time +
                           "), sum(rows), sum(shared_blks_read), sum(shared_blks_hit), min(left(query, 300))"
                           " FROM pg_stat_statements WHERE queryid IS NOT NULL GROUP BY queryid"
                           " ORDER BY sum(calls) DESC LIMIT 100"});
  } else {
    say_("pg_stat_statements not sampled: not installed in the database sampled");
  }
}

CounterSampler::~CounterSampler() = default;

std::vector<std::string> CounterSampler::sampled() const {
  std::vector<std::string> out;
  for (const auto& g : groups_)
    if (g.on) out.push_back(g.name);
  return out;
}

bool CounterSampler::sample(std::vector<std::pair<std::string, double>>& out,
                            std::vector<std::pair<std::string, std::string>>& meta) {
  static const char* const kDatabase[] = {"pg.blks_read",    "pg.blks_hit",      "pg.xact_commit",
                                          "pg.xact_rollback", "pg.tup_returned",  "pg.tup_fetched",
                                          "pg.tup_inserted", "pg.tup_updated",    "pg.tup_deleted",
                                          "pg.temp_bytes",   "pg.blk_read_time_ms", "pg.blk_write_time_ms"};
  static const char* const kStmt[] = {"calls", "time_ms", "rows", "shared_blks_read", "shared_blks_hit"};
  out.clear();
  meta.clear();
  bool any = false;
  std::vector<std::vector<std::string>> rows;
  std::string err;
  auto num = [&](const std::string& name, const std::string& text) {
    if (!text.empty()) out.push_back({name, std::strtod(text.c_str(), nullptr)});
  };
  for (auto& g : groups_) {
    if (!g.on) continue;
    if (!pg_.rows(g.sql.c_str(), rows, err)) {
      if (!pg_.connected()) {
        say_("PostgreSQL counters stopped: the connection was lost (" + err + ")");
        return false;
      }
      g.on = false;
      say_(g.name + " not sampled: " + err);
      continue;
    }
    any = true;
    switch (g.kind) {
      case Group::Database:
        if (!rows.empty())
          for (size_t i = 0; i < std::size(kDatabase) && i < rows[0].size(); ++i) num(kDatabase[i], rows[0][i]);
        break;
      case Group::WalLsn:
        if (!rows.empty()) num("pg.wal_bytes", rows[0][0]);
        break;
      case Group::Bgwriter:
        if (!rows.empty())
          numbers(rows[0][0], [&](const std::string& k, double x) {
            out.push_back({"pg.bgwriter." + k, x});
            // The names of traces before these views were sampled whole.
            if (k == "buffers_checkpoint" || k == "buffers_clean" || k == "buffers_backend")
              out.push_back({"pg." + k, x});
          });
        break;
      case Group::Checkpointer:
        if (!rows.empty())
          numbers(rows[0][0], [&](const std::string& k, double x) {
            out.push_back({"pg.checkpointer." + k, x});
            if (k == "buffers_written") out.push_back({"pg.buffers_checkpoint", x});
          });
        break;
      case Group::Wal:
        if (!rows.empty())
          numbers(rows[0][0], [&](const std::string& k, double x) { out.push_back({"pg.wal." + k, x}); });
        break;
      case Group::Io:
        for (const auto& row : rows) {
          auto j = nlohmann::json::parse(row[0], nullptr, false);
          if (!j.is_object()) continue;
          auto str = [&](const char* k) {
            auto it = j.find(k);
            return it != j.end() && it->is_string() ? underscored(it->get<std::string>()) : std::string("?");
          };
          const std::string prefix = "pg.io." + str("backend_type") + "." + str("object") + "." + str("context") + ".";
          for (const auto& [k, x] : j.items())
            if (x.is_number() && k != "op_bytes") out.push_back({prefix + k, x.get<double>()});
        }
        break;
      case Group::Statements:
        for (const auto& row : rows) {
          if (row.size() < 7 || row[0].empty()) continue;
          const std::string prefix = "pg.stmt." + row[0];
          for (size_t i = 0; i < std::size(kStmt); ++i) num(prefix + "." + kStmt[i], row[i + 1]);
          if (stmt_seen_.insert(row[0]).second) meta.push_back({prefix, row[6]});
        }
        break;
    }
  }
  return any;
}

namespace {

// The settings `names` as Meta records ("setting.NAME"), in that order;
// those the server does not know are left out.
template <size_t N>
std::vector<std::pair<std::string, std::string>> settings(PgSampler& pg, const char* const (&names)[N]) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!pg.ok()) return out;
  for (const char* name : names) {
    const std::string sql = std::string("SELECT current_setting('") + name + "', true)";
    std::string v = pg.value(sql.c_str());
    if (!v.empty()) out.push_back({std::string("setting.") + name, v});
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> projection_settings(PgSampler& pg) {
  static const char* const kNames[] = {"effective_cache_size", "max_connections", "track_io_timing",
                                       "server_version_num"};
  return settings(pg, kNames);
}

std::vector<std::pair<std::string, std::string>> durability_settings(PgSampler& pg) {
  static const char* const kNames[] = {"fsync",        "synchronous_commit", "wal_sync_method",
                                       "full_page_writes", "commit_delay", "checkpoint_timeout",
                                       "max_wal_size", "shared_buffers"};
  return settings(pg, kNames);
}

std::vector<std::pair<std::string, std::string>> server_meta(const std::string& conninfo, std::string* why) {
  PgSampler pg(conninfo);
  if (!pg.ok()) {
    *why = pg.error();
    return {};
  }
  return durability_settings(pg);
}

}  // namespace tierlab::capture
