// The capture proxy's TLS flags, shared by `capture proxy` and `capture run`
// (capture/proxy.h, ProxyOptions, says what each does).
#pragma once

#include "app/command.h"
#include "capture/proxy.h"
#include "common/error.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace tierlab::app {

struct ProxyTlsFlags {
  std::string client_tls = "allow";
  std::string tls_cert, tls_key;
  std::string upstream_sslmode = "prefer";
  std::string upstream_sslrootcert, upstream_sslcert, upstream_sslkey;
};

// Adds the flags to cmd; `prefix` starts each description ("proxy: " or "").
// Returns how many of them the command line gave, through `given`.
inline void add_proxy_tls_flags(CLI::App& cmd, ProxyTlsFlags& f, const std::string& prefix,
                                std::vector<CLI::Option*>* given = nullptr) {
  std::vector<CLI::Option*> v;
  v.push_back(cmd.add_option("--client-tls", f.client_tls,
                             prefix + "TLS with clients: disable (SSLRequest answered 'N'), allow (the client "
                                      "chooses) or require (plaintext clients refused)")
                  ->check(CLI::IsMember({"disable", "allow", "require"}))
                  ->capture_default_str());
  v.push_back(cmd.add_option("--tls-cert", f.tls_cert,
                             prefix + "the proxy's certificate (PEM) for TLS with clients (default: a self-signed "
                                      "one made at start, its SHA-256 fingerprint printed)"));
  v.push_back(cmd.add_option("--tls-key", f.tls_key, prefix + "the key (PEM) of --tls-cert"));
  v.push_back(cmd.add_option("--upstream-sslmode", f.upstream_sslmode,
                             prefix + "TLS to the server, as libpq's sslmode: disable, allow, prefer, require, "
                                      "verify-ca or verify-full (never on a unix socket)")
                  ->check(CLI::IsMember({"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}))
                  ->capture_default_str());
  v.push_back(cmd.add_option("--upstream-sslrootcert", f.upstream_sslrootcert,
                             prefix + "CA certificates (PEM) to verify the server with (needed by verify-ca and "
                                      "verify-full; with require, as libpq, it makes require verify the chain)"));
  v.push_back(cmd.add_option("--upstream-sslcert", f.upstream_sslcert,
                             prefix + "a client certificate (PEM) for the server's cert authentication"));
  v.push_back(cmd.add_option("--upstream-sslkey", f.upstream_sslkey, prefix + "the key (PEM) of --upstream-sslcert"));
  if (given) *given = v;
}

// The capture::ProxyOptions members that capture proxy and capture run set
// from flags, with those flags (for_settings; a flag that ends in ':' is
// followed by the library's message as it is).
inline const std::vector<SettingFlag> kProxyFlags = {
    {"listen", "--listen"},
    {"listen_unix", "--listen-unix"},
    {"upstream", "--upstream"},
    {"threads", "--threads"},
    {"max_message", "--max-message-size"},
    {"client_tls", "--client-tls"},
    {"tls_cert", "--tls-cert"},
    {"tls_key", "--tls-key"},
    {"tls_cert_key", "--tls-cert/--tls-key:"},
    {"upstream_sslmode", "--upstream-sslmode"},
    {"upstream_sslrootcert", "--upstream-sslrootcert:"},
    {"upstream_sslcert_key", "--upstream-sslcert/--upstream-sslkey:"},
};

// The TLS flags that only make sense together, checked by their names
// (capture::Proxy checks the same of ProxyOptions, naming the values).
inline void apply_proxy_tls_flags(const ProxyTlsFlags& f, capture::ProxyOptions& po) {
  if (f.tls_cert.empty() != f.tls_key.empty())
    throw InputError(f.tls_cert.empty() ? "--tls-key: give --tls-cert with it" : "--tls-cert: give --tls-key with it");
  if (f.client_tls == "disable" && !f.tls_cert.empty())
    throw InputError("--tls-cert: client TLS is disabled (--client-tls disable)");
  po.client_tls = f.client_tls;
  po.tls_cert = f.tls_cert;
  po.tls_key = f.tls_key;
  po.upstream_sslmode = f.upstream_sslmode;
  po.upstream_sslrootcert = f.upstream_sslrootcert;
  po.upstream_sslcert = f.upstream_sslcert;
  po.upstream_sslkey = f.upstream_sslkey;
}

// One line on stderr when the proxy made its own certificate.
inline void say_tls_fingerprint(const char* who, const capture::Proxy& proxy) {
  std::string fp = proxy.tls_fingerprint();
  if (fp.empty()) return;
  std::fprintf(stderr, "tierlab %s: TLS with clients on a self-signed certificate made now, SHA-256 fingerprint %s\n",
               who, fp.c_str());
}

}  // namespace tierlab::app
