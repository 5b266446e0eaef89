// A throwaway PostgreSQL that takes TCP clients only over TLS with
// scram-sha-256 (ssl = on, a self-signed certificate made with the openssl
// tool for CN and SAN DNS:localhost, pg_hba `hostssl ... scram-sha-256`);
// its unix socket still trusts, for a test's own setup. PGPASSWORD is set to
// the superuser's password for the clients the test starts.
//
//   tierlab::test::TlsServer srv;
//   srv.pg.run_tool("psql", {"-d", "host=localhost port=... sslmode=verify-full sslrootcert=" + srv.cert, ...});
#pragma once

#include "support/support.h"

#include <catch2/catch.hpp>

#include <pwd.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

namespace tierlab::test {

inline constexpr const char* kTlsPassword = "sekrit-Pa55-tls";

struct TlsServer {
  pgtmp::Server pg;
  std::string cert;  // the server's certificate, which is also its own root

  TlsServer() : pg(options()) {
    const std::string dd = pg.data_dir();
    cert = dd + "/server.crt";
    std::string cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 "
                      "-subj /CN=localhost -addext subjectAltName=DNS:localhost -keyout " +
                      dd + "/server.key -out " + cert + " 2>/dev/null && echo ok";
    REQUIRE(shell_output(cmd) == "ok");
    ::chmod((dd + "/server.key").c_str(), 0600);
    if (::geteuid() == 0) {
      passwd* pw = ::getpwnam("postgres");
      REQUIRE(pw);
      REQUIRE(::chown((dd + "/server.key").c_str(), pw->pw_uid, pw->pw_gid) == 0);
      REQUIRE(::chown(cert.c_str(), pw->pw_uid, pw->pw_gid) == 0);
    }
    {
      std::ofstream hba(dd + "/pg_hba.conf", std::ios::trunc);
      hba << "local all all trust\n"
          << "hostssl all all 127.0.0.1/32 scram-sha-256\n";
    }
    pg.sql("alter system set ssl = on");
    pg.sql("set password_encryption = 'scram-sha-256'; alter role " + pg.superuser() + " password '" +
           kTlsPassword + "'");
    pg.sql("select pg_reload_conf()");
    // The reload is asynchronous: wait until the server says ssl is on.
    for (int i = 0; i < 100 && pg.sql("show ssl").rfind("on", 0) != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    REQUIRE(pg.sql("show ssl").rfind("on", 0) == 0);
    setenv("PGPASSWORD", kTlsPassword, 1);
  }
  static pgtmp::Options options() {
    pgtmp::Options o = fast_server_options();
    o.host_auth = "scram-sha-256";
    return o;
  }
  std::string upstream(const std::string& host = "127.0.0.1") const { return host + ":" + std::to_string(pg.port()); }
  // A conninfo over TCP to `host` with these settings (sslmode=..., ...).
  std::string conninfo(const std::string& more, const std::string& host = "127.0.0.1") const {
    return "host=" + host + " port=" + std::to_string(pg.port()) + " dbname=postgres user=" + pg.superuser() + " " +
           more;
  }
};

}  // namespace tierlab::test
