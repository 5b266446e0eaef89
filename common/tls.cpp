#include "common/tls.h"

#include "common/error.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstring>

namespace tierlab {

// --- SendQueue ---------------------------------------------------------------

uint8_t* SendQueue::reserve(uint32_t n) {
  if (fill_.cap - fill_len_ < n) {
    uint32_t cap = std::max<uint32_t>(16384, fill_.cap);
    while (cap - fill_len_ < n) cap *= 2;
    std::unique_ptr<uint8_t[]> p(new uint8_t[cap]);
    if (fill_len_) std::memcpy(p.get(), fill_.p.get(), fill_len_);
    fill_.p = std::move(p);
    fill_.cap = cap;
  }
  return fill_.p.get() + fill_len_;
}

void SendQueue::append(const uint8_t* p, uint32_t n) {
  if (n == 0) return;
  std::memcpy(reserve(n), p, n);
  fill_len_ += n;
}

const uint8_t* SendQueue::take(uint32_t* len) {
  if (flight_len_ != 0 || fill_len_ == 0) {
    *len = 0;
    return nullptr;
  }
  std::swap(fill_, flight_);
  flight_len_ = flight_left_ = fill_len_;
  fill_len_ = 0;
  *len = flight_len_;
  return flight_.p.get();
}

void SendQueue::done(uint32_t left) {
  assert(left <= flight_left_);
  flight_left_ = left;
  if (left == 0) flight_len_ = 0;
}

// --- sslmode -----------------------------------------------------------------

namespace {
constexpr const char* kModes[] = {"disable", "allow", "prefer", "require", "verify-ca", "verify-full"};

std::string ssl_errors() {
  std::string s;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    const char* reason = ERR_reason_error_string(e);
    if (!s.empty()) s += "; ";
    s += reason ? reason : buf;
  }
  return s.empty() ? "unknown OpenSSL error" : s;
}

std::string hex_fingerprint(X509* cert) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  X509_digest(cert, EVP_sha256(), md, &n);
  std::string s;
  char b[4];
  for (unsigned i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, i ? ":%02X" : "%02X", md[i]);
    s += b;
  }
  return s;
}

SSL_CTX* new_ctx(bool server) {
  SSL_CTX* c = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (!c) throw RuntimeError("TLS: " + ssl_errors());
  // PostgreSQL's own floor (ssl_min_protocol_version's default).
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // Compression and renegotiation are refused, as PostgreSQL does.
  SSL_CTX_set_options(c, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  return c;
}
}  // namespace

bool parse_sslmode(const std::string& s, SslMode* out) {
  for (size_t i = 0; i < std::size(kModes); ++i)
    if (s == kModes[i]) {
      *out = static_cast<SslMode>(i);
      return true;
    }
  return false;
}

const char* sslmode_name(SslMode m) { return kModes[static_cast<size_t>(m)]; }

// --- TlsContext --------------------------------------------------------------

TlsContext::~TlsContext() {
  if (ctx_) SSL_CTX_free(ctx_);
}

std::unique_ptr<TlsContext> TlsContext::server(const std::string& cert_file, const std::string& key_file) {
  std::unique_ptr<TlsContext> t(new TlsContext);
  t->server_ = true;
  t->ctx_ = new_ctx(true);
  ERR_clear_error();
  if (SSL_CTX_use_certificate_chain_file(t->ctx_, cert_file.c_str()) != 1)
    throw InputError(cert_file + ": not a readable PEM certificate (" + ssl_errors() + ")");
  if (SSL_CTX_use_PrivateKey_file(t->ctx_, key_file.c_str(), SSL_FILETYPE_PEM) != 1)
    throw InputError(key_file + ": not a readable PEM private key (" + ssl_errors() + ")");
  if (SSL_CTX_check_private_key(t->ctx_) != 1)
    throw InputError(key_file + ": does not match the certificate " + cert_file);
  t->fingerprint_ = hex_fingerprint(SSL_CTX_get0_certificate(t->ctx_));
  return t;
}

std::unique_ptr<TlsContext> TlsContext::server_self_signed() {
  std::unique_ptr<TlsContext> t(new TlsContext);
  t->server_ = true;
  t->ctx_ = new_ctx(true);
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  bool ok = key && cert;
  if (ok) {
    unsigned char serial[16];
    FILE* r = std::fopen("/dev/urandom", "rb");
    ok = r && std::fread(serial, 1, sizeof serial, r) == sizeof serial;
    if (r) std::fclose(r);
    serial[0] &= 0x7f;
    BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
    ok = ok && bn && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert));
    BN_free(bn);
    X509_NAME* name = X509_get_subject_name(cert);
    ok = ok && X509_set_version(cert, 2) &&
         X509_gmtime_adj(X509_getm_notBefore(cert), -3600) &&
         X509_gmtime_adj(X509_getm_notAfter(cert), 365L * 24 * 3600) && X509_set_pubkey(cert, key) &&
         X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                    reinterpret_cast<const unsigned char*>("tierlab capture proxy"), -1, -1, 0) &&
         X509_set_issuer_name(cert, name) && X509_sign(cert, key, EVP_sha256()) > 0 &&
         SSL_CTX_use_certificate(t->ctx_, cert) == 1 && SSL_CTX_use_PrivateKey(t->ctx_, key) == 1;
  }
  if (ok) t->fingerprint_ = hex_fingerprint(cert);
  X509_free(cert);
  EVP_PKEY_free(key);
  if (!ok) throw RuntimeError("TLS: making a self-signed certificate: " + ssl_errors());
  return t;
}

std::unique_ptr<TlsContext> TlsContext::client(const TlsClientOptions& o) {
  std::unique_ptr<TlsContext> t(new TlsContext);
  t->ctx_ = new_ctx(false);
  ERR_clear_error();
  // As libpq: a root certificate given makes allow, prefer and require
  // verify the chain too (require then acts as verify-ca).
  const bool verify = o.mode == SslMode::VerifyCa || o.mode == SslMode::VerifyFull || !o.root_cert.empty();
  if (!o.root_cert.empty()) {
    if (SSL_CTX_load_verify_locations(t->ctx_, o.root_cert.c_str(), nullptr) != 1)
      throw InputError(o.root_cert + ": not a readable PEM file of CA certificates (" + ssl_errors() + ")");
  }
  if (verify) {
    if (o.root_cert.empty())
      throw InputError(std::string("sslmode ") + sslmode_name(o.mode) +
                       " needs a root certificate file to verify the server against");
    SSL_CTX_set_verify(t->ctx_, SSL_VERIFY_PEER, nullptr);
  } else {
    SSL_CTX_set_verify(t->ctx_, SSL_VERIFY_NONE, nullptr);
  }
  t->verify_host_ = o.mode == SslMode::VerifyFull;
  if (o.cert.empty() != o.key.empty())
    throw InputError("a client certificate needs both its certificate and its key file");
  if (!o.cert.empty()) {
    if (SSL_CTX_use_certificate_chain_file(t->ctx_, o.cert.c_str()) != 1)
      throw InputError(o.cert + ": not a readable PEM certificate (" + ssl_errors() + ")");
    if (SSL_CTX_use_PrivateKey_file(t->ctx_, o.key.c_str(), SSL_FILETYPE_PEM) != 1)
      throw InputError(o.key + ": not a readable PEM private key (" + ssl_errors() + ")");
    if (SSL_CTX_check_private_key(t->ctx_) != 1)
      throw InputError(o.key + ": does not match the certificate " + o.cert);
  }
  return t;
}

// --- TlsStage ----------------------------------------------------------------

TlsStage::~TlsStage() { reset(); }

void TlsStage::reset() {
  if (adopted_) {
    // Each slot holds one reference: the owner's BIOs take theirs back,
    // the memory BIOs are freed.
    SSL_set0_rbio(ssl_, own_rbio_);
    SSL_set0_wbio(ssl_, own_wbio_);
    own_rbio_ = own_wbio_ = nullptr;
    adopted_ = false;
  } else if (ssl_) {
    SSL_free(ssl_);  // frees both BIOs
  }
  ssl_ = nullptr;
  rbio_ = wbio_ = nullptr;
  established_ = peer_closed_ = false;
  error_[0] = 0;
  q_.clear();
}

bool TlsStage::start(const TlsContext& ctx, const std::string& host) {
  reset();
  ERR_clear_error();
  ssl_ = SSL_new(ctx.ctx());
  rbio_ = BIO_new(BIO_s_mem());
  wbio_ = BIO_new(BIO_s_mem());
  if (!ssl_ || !rbio_ || !wbio_) {
    if (rbio_) BIO_free(rbio_);
    if (wbio_) BIO_free(wbio_);
    if (ssl_) SSL_free(ssl_);
    ssl_ = nullptr;
    rbio_ = wbio_ = nullptr;
    return fail("cannot start TLS", 0);
  }
  // An empty memory BIO means "no more yet", not end of file.
  BIO_set_mem_eof_return(rbio_, -1);
  SSL_set_bio(ssl_, rbio_, wbio_);
  if (ctx.is_server()) {
    SSL_set_accept_state(ssl_);
    return true;
  }
  SSL_set_connect_state(ssl_);
  if (!host.empty()) {
    unsigned char ip[16];
    const bool is_ip = inet_pton(AF_INET, host.c_str(), ip) == 1 || inet_pton(AF_INET6, host.c_str(), ip) == 1;
    if (!is_ip) SSL_set_tlsext_host_name(ssl_, host.c_str());
    if (ctx.verify_host()) {
      X509_VERIFY_PARAM* vp = SSL_get0_param(ssl_);
      if (is_ip) X509_VERIFY_PARAM_set1_ip_asc(vp, host.c_str());
      else SSL_set1_host(ssl_, host.c_str());
    }
  }
  return handshake();
}

bool TlsStage::adopt(SSL* ssl) {
  reset();
  ERR_clear_error();
  if (!ssl || !SSL_is_init_finished(ssl)) return fail("TLS: the connection's handshake has not ended", 0);
  rbio_ = BIO_new(BIO_s_mem());
  wbio_ = BIO_new(BIO_s_mem());
  if (!rbio_ || !wbio_) {
    if (rbio_) BIO_free(rbio_);
    if (wbio_) BIO_free(wbio_);
    rbio_ = wbio_ = nullptr;
    return fail("cannot take over TLS", 0);
  }
  BIO_set_mem_eof_return(rbio_, -1);
  // The SSL object holds one reference per slot (two when one BIO serves
  // both, as libpq's does); SSL_set0_* drops the old slot's: keep ours.
  own_rbio_ = SSL_get_rbio(ssl);
  own_wbio_ = SSL_get_wbio(ssl);
  if (own_rbio_) BIO_up_ref(own_rbio_);
  if (own_wbio_) BIO_up_ref(own_wbio_);
  SSL_set0_rbio(ssl, rbio_);
  SSL_set0_wbio(ssl, wbio_);
  ssl_ = ssl;
  adopted_ = true;
  established_ = true;
  return true;
}

bool TlsStage::fail(const char* what, int ssl_err) {
  std::string detail;
  if (ssl_ && SSL_get_verify_result(ssl_) != X509_V_OK && ssl_err == SSL_ERROR_SSL)
    detail = std::string("certificate verify failed: ") +
             X509_verify_cert_error_string(SSL_get_verify_result(ssl_));
  else if (ssl_err == SSL_ERROR_SSL || ssl_err == 0)
    detail = ssl_errors();
  else
    detail = "OpenSSL error " + std::to_string(ssl_err);
  ERR_clear_error();
  std::snprintf(error_, sizeof error_, "%s: %s", what, detail.c_str());
  return false;
}

// Moves what OpenSSL wrote to the memory BIO into the send queue.
void TlsStage::drain() {
  for (;;) {
    size_t n = BIO_ctrl_pending(wbio_);
    if (n == 0) return;
    uint32_t want = static_cast<uint32_t>(std::min<size_t>(n, 1u << 20));
    int got = BIO_read(wbio_, q_.reserve(want), static_cast<int>(want));
    if (got <= 0) return;
    q_.commit(static_cast<uint32_t>(got));
  }
}

bool TlsStage::handshake() {
  int rc = SSL_do_handshake(ssl_);
  drain();
  if (rc == 1) {
    established_ = true;
    return true;
  }
  int err = SSL_get_error(ssl_, rc);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return true;
  return fail("TLS handshake", err);
}

int64_t TlsStage::decrypt(const uint8_t* p, uint32_t n, uint8_t* out, uint32_t cap) {
  if (!ssl_) return -1;
  if (n > 0 && BIO_write(rbio_, p, static_cast<int>(n)) != static_cast<int>(n)) {
    fail("TLS", 0);
    return -1;
  }
  if (!established_) {
    if (!handshake()) return -1;
    if (!established_) return 0;
  }
  if (peer_closed_) return 0;
  size_t got = 0;
  int rc, err;
  for (;;) {
    rc = SSL_read_ex(ssl_, out, cap, &got);
    drain();  // session tickets, key updates, alerts
    if (rc == 1) return static_cast<int64_t>(got);
    err = SSL_get_error(ssl_, rc);
    // A record that carried no data (a ticket) was taken: try the rest.
    if (err == SSL_ERROR_WANT_READ && BIO_ctrl_pending(rbio_) > 0) continue;
    break;
  }
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return 0;
  if (err == SSL_ERROR_ZERO_RETURN) {
    peer_closed_ = true;
    return 0;
  }
  fail("TLS", err);
  return -1;
}

bool TlsStage::encrypt(const uint8_t* p, uint32_t n) {
  if (!ssl_ || !established_) return fail("TLS: data to send before the handshake ended", 0);
  while (n > 0) {
    size_t put = 0;
    int rc = SSL_write_ex(ssl_, p, n, &put);
    drain();
    if (rc != 1) return fail("TLS", SSL_get_error(ssl_, rc));
    p += put;
    n -= static_cast<uint32_t>(put);
  }
  return true;
}

const char* TlsStage::version() const { return ssl_ ? SSL_get_version(ssl_) : ""; }

const char* TlsStage::cipher() const {
  const char* c = ssl_ ? SSL_get_cipher_name(ssl_) : nullptr;
  return c ? c : "";
}

}  // namespace tierlab
