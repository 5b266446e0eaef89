#include "app/capture_server.h"

#include <arpa/inet.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstdlib>

namespace tierlab::app {

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

PgSampler::PgSampler(const std::string& conninfo) : conn_(PQconnectdb(conninfo.c_str())) {
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

bool PgSampler::counters(std::vector<std::pair<const char*, double>>& out) {
  static const char* kNames[] = {"pg.blks_read", "pg.blks_hit", "pg.xact_commit", "pg.xact_rollback",
                                 "pg.buffers_checkpoint", "pg.buffers_clean", "pg.buffers_backend",
                                 "pg.wal_bytes"};
  PGresult* r = PQexec(conn_,
                       "SELECT (SELECT sum(blks_read) FROM pg_stat_database),"
                       " (SELECT sum(blks_hit) FROM pg_stat_database),"
                       " (SELECT sum(xact_commit) FROM pg_stat_database),"
                       " (SELECT sum(xact_rollback) FROM pg_stat_database),"
                       " b.buffers_checkpoint, b.buffers_clean, b.buffers_backend,"
                       " pg_current_wal_lsn() - '0/0'::pg_lsn"
                       " FROM pg_stat_bgwriter b");
  bool good = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
  out.clear();
  if (good)
    for (int i = 0; i < 8; ++i)
      if (!PQgetisnull(r, 0, i)) out.push_back({kNames[i], std::strtod(PQgetvalue(r, 0, i), nullptr)});
  PQclear(r);
  return good;
}

std::vector<std::pair<std::string, std::string>> durability_settings(PgSampler& pg) {
  static const char* const kNames[] = {"fsync",        "synchronous_commit", "wal_sync_method",
                                       "full_page_writes", "commit_delay", "checkpoint_timeout",
                                       "max_wal_size", "shared_buffers"};
  std::vector<std::pair<std::string, std::string>> out;
  if (!pg.ok()) return out;
  for (const char* name : kNames) {
    const std::string sql = std::string("SELECT current_setting('") + name + "', true)";
    std::string v = pg.value(sql.c_str());
    if (!v.empty()) out.push_back({std::string("setting.") + name, v});
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> server_meta(const std::string& conninfo, std::string* why) {
  PgSampler pg(conninfo);
  if (!pg.ok()) {
    *why = pg.error();
    return {};
  }
  return durability_settings(pg);
}

void say_settings_skipped(const char* cmd, const std::string& why) {
  std::fprintf(stderr, "tierlab %s: durability settings not recorded: %s\n", cmd, why.c_str());
  std::fflush(stderr);
}

}  // namespace tierlab::app
