// The TLS stage (common/tls.h) between two memory peers: handshake, data both
// ways in pieces of any size, version and cipher, verification of the
// server's certificate and host name, and the send queue's one piece in
// flight; a stage that takes over the TLS of a connection another owner made
// (libpq's, for the replay) and gives it back.
#include "common/tls.h"

#include "common/error.h"
#include "support/support.h"

#include <catch2/catch.hpp>

#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace tierlab;

namespace {

// Moves what `from` queued to `to`, in pieces of `chunk` bytes, collecting
// the plaintext `to` gives back. False when `to` failed.
bool pump(TlsStage& from, TlsStage& to, std::string* plain, uint32_t chunk = 1u << 20) {
  uint32_t len = 0;
  const uint8_t* p = from.output(&len);
  if (!p) return true;
  uint8_t out[4096];
  for (uint32_t off = 0; off < len;) {
    uint32_t n = std::min(chunk, len - off);
    int64_t k = to.decrypt(p + off, n, out, sizeof out);
    for (;;) {
      if (k < 0) return false;
      plain->append(reinterpret_cast<char*>(out), static_cast<size_t>(k));
      if (k == 0) break;
      k = to.decrypt(nullptr, 0, out, sizeof out);
    }
    off += n;
  }
  from.sent(len);
  return true;
}

// Runs the handshake to its end (or a failure): false when either side failed.
bool handshake(TlsStage& c, TlsStage& s, uint32_t chunk = 1u << 20) {
  std::string junk;
  for (int i = 0; i < 20 && !(c.established() && s.established()); ++i) {
    if (!pump(c, s, &junk, chunk)) return false;
    if (!pump(s, c, &junk, chunk)) return false;
  }
  return c.established() && s.established() && junk.empty();
}

// A handshake between new stages of `server` and `client` (naming `host`):
// "" when it ends, else why the client failed.
std::string handshake_error(const TlsContext& server, const TlsContext& client, const std::string& host) {
  TlsStage c, s;
  REQUIRE(s.start(server));
  REQUIRE(c.start(client, host));
  if (handshake(c, s)) return "";
  return std::string(c.error()).empty() ? "failed" : c.error();
}

// A certificate for `name` signed by itself, as PEM files in dir.
void make_cert(const test::TempDir& dir, const std::string& name) {
  std::string cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=" +
                    name + " -addext subjectAltName=DNS:" + name + " -keyout " + dir.file("key.pem") +
                    " -out " + dir.file("cert.pem") + " 2>/dev/null && echo ok";
  REQUIRE(test::shell_output(cmd) == "ok");
}

}  // namespace

TEST_CASE("tls: a self-signed server and a client exchange data through memory, in any piece size", "[tls]") {
  auto server_ctx = TlsContext::server_self_signed();
  CHECK(server_ctx->fingerprint().size() == 32 * 3 - 1);
  auto client_ctx = TlsContext::client({});
  for (uint32_t chunk : {1u, 7u, 1500u, 1u << 20}) {
    TlsStage c, s;
    REQUIRE(s.start(*server_ctx));
    REQUIRE(c.start(*client_ctx, "db.example.test"));
    INFO(chunk << ": " << c.error() << " / " << s.error());
    REQUIRE(handshake(c, s, chunk));
    CHECK(std::string(c.version()) == "TLSv1.3");
    CHECK(std::string(s.cipher()) == c.cipher());
    CHECK(!std::string(s.cipher()).empty());
    std::string big(100000, 'x');
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 26);
    REQUIRE(c.encrypt(reinterpret_cast<const uint8_t*>(big.data()), static_cast<uint32_t>(big.size())));
    std::string got;
    REQUIRE(pump(c, s, &got, chunk));
    CHECK(got == big);
    REQUIRE(s.encrypt(reinterpret_cast<const uint8_t*>("pong"), 4));
    got.clear();
    REQUIRE(pump(s, c, &got, chunk));
    CHECK(got == "pong");
  }
}

TEST_CASE("tls: verify-full accepts the right host name and refuses a wrong one", "[tls]") {
  test::TempDir dir;
  make_cert(dir, "db.example.test");
  auto server_ctx = TlsContext::server(dir.file("cert.pem"), dir.file("key.pem"));
  TlsClientOptions o;
  o.mode = SslMode::VerifyFull;
  o.root_cert = dir.file("cert.pem");
  auto client_ctx = TlsContext::client(o);
  {
    TlsStage c, s;
    REQUIRE(s.start(*server_ctx));
    REQUIRE(c.start(*client_ctx, "db.example.test"));
    CHECK(handshake(c, s));
  }
  {
    TlsStage c, s;
    REQUIRE(s.start(*server_ctx));
    REQUIRE(c.start(*client_ctx, "other.example.test"));
    CHECK_FALSE(handshake(c, s));
    CHECK(std::string(c.error()).find("certificate verify failed: hostname mismatch") != std::string::npos);
  }
  // verify-ca checks the chain only; without the root it is refused.
  o.mode = SslMode::VerifyCa;
  auto ca_ctx = TlsContext::client(o);
  {
    TlsStage c, s;
    REQUIRE(s.start(*server_ctx));
    REQUIRE(c.start(*ca_ctx, "other.example.test"));
    CHECK(handshake(c, s));
  }
  auto self = TlsContext::server_self_signed();
  {
    TlsStage c, s;
    REQUIRE(s.start(*self));
    REQUIRE(c.start(*ca_ctx, "db.example.test"));
    CHECK_FALSE(handshake(c, s));
    CHECK(std::string(c.error()).find("certificate verify failed") != std::string::npos);
  }
  // require with a root certificate verifies the chain, as libpq does
  // (verify-ca in effect): the self-signed server not under that root is
  // refused, the one signed by it passes whatever its name.
  o.mode = SslMode::Require;
  auto require_ctx = TlsContext::client(o);
  CHECK(handshake_error(*self, *require_ctx, "db.example.test").find("certificate verify failed") !=
        std::string::npos);
  CHECK(handshake_error(*server_ctx, *require_ctx, "other.example.test").empty());
  // Without one, require takes any certificate.
  o.root_cert.clear();
  auto any_ctx = TlsContext::client(o);
  CHECK(handshake_error(*self, *any_ctx, "db.example.test").empty());
  o.mode = SslMode::VerifyCa;
  CHECK_THROWS_WITH(TlsContext::client(o), Catch::Contains("needs a root certificate"));
  CHECK_THROWS_WITH(TlsContext::server(dir.file("nope.pem"), dir.file("key.pem")), Catch::Contains("nope.pem"));
  CHECK_THROWS_WITH(TlsContext::server(dir.file("cert.pem"), dir.file("cert.pem")), Catch::Contains("cert.pem"));
}

TEST_CASE("tls: the send queue keeps one piece in flight and fills the next behind it", "[tls]") {
  SendQueue q;
  uint32_t len = 0;
  CHECK(q.take(&len) == nullptr);
  q.append(reinterpret_cast<const uint8_t*>("abc"), 3);
  const uint8_t* p = q.take(&len);
  REQUIRE(p);
  CHECK(len == 3);
  q.append(reinterpret_cast<const uint8_t*>("defg"), 4);
  CHECK(q.take(&len) == nullptr);  // one piece at a time
  CHECK(q.pending() == 7);
  CHECK(std::memcmp(p, "abc", 3) == 0);  // the piece in flight stays put
  q.done(1);
  CHECK(q.pending() == 5);
  q.done(0);
  p = q.take(&len);
  REQUIRE(p);
  CHECK(std::string(reinterpret_cast<const char*>(p), len) == "defg");
  q.sent(4);
  CHECK(q.pending() == 0);
  CHECK_FALSE(q.in_flight());
}

namespace {

// Moves what waits on socket fd (non-blocking) into stage `to`, collecting
// its plaintext; false when `to` failed.
bool pump_socket(int fd, TlsStage& to, std::string* plain) {
  uint8_t b[16384], out[16384];
  for (ssize_t n; (n = ::recv(fd, b, sizeof b, MSG_DONTWAIT)) > 0;) {
    int64_t k = to.decrypt(b, static_cast<uint32_t>(n), out, sizeof out);
    for (; k > 0; k = to.decrypt(nullptr, 0, out, sizeof out))
      plain->append(reinterpret_cast<char*>(out), static_cast<size_t>(k));
    if (k < 0) return false;
  }
  return true;
}

// What stage `from` queued, written to socket fd.
void flush_socket(TlsStage& from, int fd) {
  uint32_t len = 0;
  const uint8_t* p = from.output(&len);
  if (!p) return;
  REQUIRE(::send(fd, p, len, 0) == static_cast<ssize_t>(len));
  from.sent(len);
}

}  // namespace

TEST_CASE("tls: a stage takes over a socket connection's TLS and gives it back to its owner", "[tls]") {
  // The owner: an SSL object on a socket BIO (as libpq's), handshaking
  // with a stage on the other end of a socket pair.
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
  auto server_ctx = TlsContext::server_self_signed();
  auto client_ctx = TlsContext::client({});
  TlsStage s;
  REQUIRE(s.start(*server_ctx));
  SSL* ssl = SSL_new(client_ctx->ctx());
  REQUIRE(ssl);
  REQUIRE(SSL_set_fd(ssl, sv[0]) == 1);  // one BIO in both slots
  SSL_set_connect_state(ssl);
  std::string plain;
  for (int i = 0; i < 50 && SSL_do_handshake(ssl) != 1; ++i) {
    REQUIRE(pump_socket(sv[1], s, &plain));
    flush_socket(s, sv[1]);
  }
  REQUIRE(SSL_is_init_finished(ssl));
  REQUIRE(pump_socket(sv[1], s, &plain));  // the client's Finished
  flush_socket(s, sv[1]);                  // session tickets
  REQUIRE(s.established());
  BIO* owners = SSL_get_rbio(ssl);

  {
    TlsStage a;
    REQUIRE(a.adopt(ssl));
    CHECK(a.established());
    CHECK(SSL_get_rbio(ssl) != owners);
    // The session tickets the server sent after the handshake come through
    // the stage now, as a replay's first answer would.
    std::string theirs;
    uint8_t buf[16384];
    ssize_t n = ::recv(sv[0], buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      uint8_t out[16384];
      int64_t k = a.decrypt(buf, static_cast<uint32_t>(n), out, sizeof out);
      REQUIRE(k >= 0);
    }
    // Both ways through the stage, with the owner's keys.
    REQUIRE(a.encrypt(reinterpret_cast<const uint8_t*>("from the stage"), 14));
    flush_socket(a, sv[0]);
    REQUIRE(pump_socket(sv[1], s, &plain));
    CHECK(plain == "from the stage");
    REQUIRE(s.encrypt(reinterpret_cast<const uint8_t*>("to the stage"), 12));
    flush_socket(s, sv[1]);
    REQUIRE(pump_socket(sv[0], a, &theirs));
    CHECK(theirs == "to the stage");
  }  // given back

  CHECK(SSL_get_rbio(ssl) == owners);
  CHECK(SSL_get_wbio(ssl) == owners);
  // The owner goes on over its socket, in step with the peer.
  plain.clear();
  REQUIRE(SSL_write(ssl, "owner again", 11) == 11);
  REQUIRE(pump_socket(sv[1], s, &plain));
  CHECK(plain == "owner again");
  SSL_free(ssl);  // frees the owner's BIO once: no reference left behind or taken twice
  ::close(sv[0]);
  ::close(sv[1]);

  // A connection still handshaking is not taken.
  SSL* fresh = SSL_new(client_ctx->ctx());
  TlsStage b;
  CHECK_FALSE(b.adopt(fresh));
  CHECK(std::string(b.error()).find("handshake has not ended") != std::string::npos);
  SSL_free(fresh);
}
