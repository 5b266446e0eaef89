// TLS over tierlab's event loop (common/loop.h): OpenSSL with memory BIOs,
// no socket and no thread of its own, so the same code serves every loop
// backend.
//
//   TlsContext: one SSL_CTX, made at start-up: the server side (a
//   certificate and key from files, or a self-signed one made in memory) or
//   the client side (libpq's sslmode meanings: verification of the chain,
//   of the host name, a client certificate).
//   TlsStage: one connection's TLS (a Stage of loop.h). Ciphertext received
//   goes to decrypt(), plaintext to send goes to encrypt(); what must go out
//   (handshake records, alerts, encrypted data) collects in the stage's
//   SendQueue, which the owner hands to Loop::send_ext.
//   SendQueue: bytes waiting to be sent with send_ext: one piece in flight
//   (its bytes stay where they are until the loop has sent them), the next
//   one filling behind it. Its buffers grow to the largest backlog seen and
//   are kept, so a warm queue does not allocate.
//
// Allocation: a TlsStage allocates its SSL object (and OpenSSL its record
// buffers and BIO memory) per connection, at the handshake; OpenSSL's
// memory BIOs may grow while a connection's backlog grows. Nothing else is
// allocated per record.
//
// Errors: setup problems (unreadable files, a key that does not match its
// certificate) throw InputError naming the file; a connection's failure
// (handshake refused, verification failed, a broken record) makes
// decrypt()/encrypt() fail and error() say why in one line.
#pragma once

#include "common/loop.h"

#include <cstdint>
#include <memory>
#include <string>

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;
typedef struct bio_st BIO;

namespace tierlab {

class SendQueue {
 public:
  SendQueue() = default;
  SendQueue(const SendQueue&) = delete;
  SendQueue& operator=(const SendQueue&) = delete;

  void append(const uint8_t* p, uint32_t n);
  // Room for n more bytes at the end of the filling piece; commit() says
  // how many were written there.
  uint8_t* reserve(uint32_t n);
  void commit(uint32_t n) { fill_len_ += n; }

  // The piece to hand to send_ext now: the filling bytes become the piece in
  // flight, valid until done() is told it is gone. nullptr (len 0) when a
  // piece is already in flight or nothing waits.
  const uint8_t* take(uint32_t* len);
  // The loop has `left` bytes of the piece in flight still to send
  // (Loop::queued); 0 ends the piece.
  void done(uint32_t left);
  // n bytes of the piece in flight went out.
  void sent(uint32_t n) { done(flight_left_ - n); }
  // Bytes not yet sent: in flight and filling.
  uint32_t pending() const { return flight_left_ + fill_len_; }
  bool in_flight() const { return flight_len_ != 0; }
  // Forgets everything (the connection is gone); keeps the buffers.
  void clear() { fill_len_ = flight_len_ = flight_left_ = 0; }

 private:
  struct Buf {
    std::unique_ptr<uint8_t[]> p;
    uint32_t cap = 0;
  };
  Buf fill_, flight_;
  uint32_t fill_len_ = 0, flight_len_ = 0, flight_left_ = 0;
};

// libpq's sslmode: what the client side asks of the server.
enum class SslMode : uint8_t { Disable, Allow, Prefer, Require, VerifyCa, VerifyFull };
// "disable", ... "verify-full"; false for anything else.
bool parse_sslmode(const std::string& s, SslMode* out);
const char* sslmode_name(SslMode m);

struct TlsClientOptions {
  SslMode mode = SslMode::Prefer;
  std::string root_cert;  // CA certificates (PEM): the chain is verified when given
  std::string cert, key;  // a client certificate and its key (PEM), or ""
};

class TlsContext {
 public:
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // The server side with a certificate (chain) and key from PEM files.
  static std::unique_ptr<TlsContext> server(const std::string& cert_file, const std::string& key_file);
  // The server side with a self-signed certificate made now (EC P-256,
  // valid a year, CN "tierlab capture proxy").
  static std::unique_ptr<TlsContext> server_self_signed();
  // The client side, verifying as o.mode says (verify-ca, verify-full need
  // o.root_cert). As libpq, a root certificate given with allow, prefer or
  // require verifies the chain too (require acts as verify-ca).
  static std::unique_ptr<TlsContext> client(const TlsClientOptions& o);

  bool is_server() const { return server_; }
  bool verify_host() const { return verify_host_; }
  // SHA-256 of the server side's certificate, "AB:CD:...".
  const std::string& fingerprint() const { return fingerprint_; }
  SSL_CTX* ctx() const { return ctx_; }

 private:
  TlsContext() = default;
  SSL_CTX* ctx_ = nullptr;
  bool server_ = false;
  bool verify_host_ = false;
  std::string fingerprint_;
};

class TlsStage final : public Stage {
 public:
  TlsStage() = default;
  ~TlsStage() override;
  TlsStage(const TlsStage&) = delete;
  TlsStage& operator=(const TlsStage&) = delete;

  // Starts a connection's TLS (ending any earlier one; the queue's buffers
  // are kept). Client side: `host` is the server's name, sent as SNI unless
  // it is an IP address, and checked against the certificate when the
  // context verifies host names; the ClientHello is queued at once.
  // False when OpenSSL cannot start one (error() says why).
  bool start(const TlsContext& ctx, const std::string& host = "");
  // Takes over `ssl`, an established connection's TLS that another owner
  // made and keeps (libpq's, PQsslStruct): its BIOs are set aside for the
  // stage's memory BIOs, so that the connection goes on over the loop with
  // the keys, sequence numbers and verification the owner negotiated.
  // reset() gives the SSL object back with its own BIOs (the owner then
  // ends the connection its own way, e.g. libpq's Terminate and
  // close_notify). False when OpenSSL cannot make the BIOs, or `ssl` has
  // not finished its handshake (error() says why).
  bool adopt(SSL* ssl);
  // Ends the connection's TLS: the SSL object is freed, or given back to
  // its owner when adopted.
  void reset();
  bool active() const { return ssl_ != nullptr; }

  // Stage: decrypt() takes ciphertext and gives back plaintext (0: none
  // yet, or the handshake is still going; call again with n = 0 while it
  // returns cap, more may be buffered); -1 on failure. Handshake output is
  // queued in queue() as a side effect.
  int64_t decrypt(const uint8_t* p, uint32_t n, uint8_t* out, uint32_t cap) override;
  bool encrypt(const uint8_t* p, uint32_t n) override;
  const uint8_t* output(uint32_t* len) override { return q_.take(len); }
  void sent(uint32_t n) override { q_.sent(n); }

  SendQueue& queue() { return q_; }
  bool established() const { return established_; }
  // The peer sent close_notify.
  bool peer_closed() const { return peer_closed_; }
  // "TLSv1.3", "TLS_AES_256_GCM_SHA384" once established.
  const char* version() const;
  const char* cipher() const;
  const char* error() const { return error_; }

 private:
  bool handshake();
  void drain();
  bool fail(const char* what, int ssl_err);

  SSL* ssl_ = nullptr;
  // adopt(): the owner's BIOs, one reference each, put back by reset().
  BIO* own_rbio_ = nullptr;
  BIO* own_wbio_ = nullptr;
  bool adopted_ = false;
  BIO* rbio_ = nullptr;  // ciphertext in (owned by ssl_)
  BIO* wbio_ = nullptr;  // ciphertext out (owned by ssl_)
  bool established_ = false;
  bool peer_closed_ = false;
  SendQueue q_;
  char error_[256] = {};
};

}  // namespace tierlab
