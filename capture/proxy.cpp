#include "capture/proxy.h"

#include "capture/proxy_loop.h"
#include "capture/queue_impl.h"
#include "capture/wire.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/uring.h"
#include "trace/writer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <csignal>
#include <ctime>
#include <fstream>
#include <thread>
#include <vector>

namespace tierlab::capture {

namespace detail {

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string format_peer(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* in = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof host);
    port = ntohs(in->sin6_port);
    return std::string("[") + host + "]:" + std::to_string(port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

StartupStep startup_step(SessionDecoder& dec, uint8_t* buf, uint32_t& head, uint32_t& len, uint32_t max_startup,
                         bool offer_tls, char* answer, const char** why) {
  const uint8_t* b = buf + head;
  const uint32_t have = len - head;
  StartupPacket sp = classify_startup(b, have, max_startup);
  switch (sp.kind) {
    case StartupKind::Incomplete:
      return StartupStep::NeedMore;
    case StartupKind::SslRequest:
    case StartupKind::GssEncRequest: {
      head += sp.length;
      if (head == len) head = len = 0;
      if (offer_tls && sp.kind == StartupKind::SslRequest) {
        *answer = 'S';
        return StartupStep::Answer;
      }
      trace::Nanos ts = now_ns();
      if (!dec.feed(Direction::Frontend, b, sp.length, ts)) {
        *why = dec.error();
        return StartupStep::ProtocolError;
      }
      static const uint8_t no = 'N';
      dec.feed(Direction::Backend, &no, 1, ts);
      *answer = 'N';
      return StartupStep::Answer;
    }
    case StartupKind::Invalid:
    case StartupKind::Startup:
    case StartupKind::Cancel:
      if (!dec.feed(Direction::Frontend, b, have, now_ns())) {
        *why = dec.error();
        return StartupStep::ProtocolError;
      }
      if (sp.kind == StartupKind::Invalid) {
        *why = "invalid startup packet";
        return StartupStep::ProtocolError;
      }
      return StartupStep::Connect;
  }
  return StartupStep::NeedMore;
}

int upstream_socket(const Addr& a) {
  int fd = ::socket(a.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0 && !a.is_unix) set_nodelay(fd);
  return fd;
}

size_t proxy_error(SessionDecoder& dec, uint8_t* out, size_t cap, const char* sqlstate,
                   const char* message) {
  size_t n = make_error_response(out, cap, "FATAL", sqlstate, message);
  if (n) dec.note_error("FATAL", sqlstate, message, now_ns());
  return n;
}

}  // namespace detail

namespace {

using detail::Addr;

using trace::EndReason;
using trace::Nanos;

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 5 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Addr resolve(const std::string& setting, const std::string& value, bool passive) {
  std::string host, port;
  if (!value.empty() && value[0] == '[') {
    auto close = value.find(']');
    if (close == std::string::npos || close + 1 >= value.size() || value[close + 1] != ':')
      throw SettingError(setting, value + ": expected [HOST]:PORT");
    host = value.substr(1, close - 1);
    port = value.substr(close + 2);
  } else {
    auto colon = value.rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw SettingError(setting, value + ": expected HOST:PORT");
    host = value.substr(0, colon);
    port = value.substr(colon + 1);
  }
  if (!all_digits(port) || std::stoi(port) > 65535 || (!passive && std::stoi(port) == 0))
    throw SettingError(setting, value + ": bad port '" + port + "'");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) throw SettingError(setting, value + ": " + gai_strerror(rc));
  Addr a;
  std::memcpy(&a.ss, res->ai_addr, res->ai_addrlen);
  a.len = res->ai_addrlen;
  freeaddrinfo(res);
  a.text = value;
  a.host = host;
  a.port = std::stoi(port);
  return a;
}

Addr unix_addr(const std::string& setting, const std::string& dir, int port) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw SettingError(setting, dir + ": not a directory");
  Addr a;
  a.is_unix = true;
  a.port = port;
  a.text = dir + "/.s.PGSQL." + std::to_string(port);
  auto* un = reinterpret_cast<sockaddr_un*>(&a.ss);
  if (a.text.size() >= sizeof un->sun_path)
    throw SettingError(setting, dir + ": socket path too long");
  un->sun_family = AF_UNIX;
  std::memcpy(un->sun_path, a.text.c_str(), a.text.size() + 1);
  a.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + a.text.size() + 1);
  return a;
}

Addr parse_upstream(const std::string& value) {
  if (value.empty()) throw SettingError("upstream", "'': expected HOST:PORT or SOCKET_DIR[:PORT]");
  if (value[0] == '/') {
    std::string dir = value;
    int port = 5432;
    auto colon = value.rfind(':');
    if (colon != std::string::npos && value.find('/', colon) == std::string::npos) {
      std::string p = value.substr(colon + 1);
      if (!all_digits(p) || std::stoi(p) == 0 || std::stoi(p) > 65535)
        throw SettingError("upstream", value + ": bad port '" + p + "'");
      port = std::stoi(p);
      dir = value.substr(0, colon);
    }
    return unix_addr("upstream", dir, port);
  }
  return resolve("upstream", value, false);
}

// Makes the socket path of `a` free to bind, or refuses with SettingError
// of `setting` naming `dir`: a socket something accepts connections on (a
// PostgreSQL sharing the directory and port) or one whose PostgreSQL lock
// file (PATH.lock, the postmaster's pid on its first line) names a live
// process is in use and stays. A socket that refuses connections is stale
// (its server was killed) and is removed, as PostgreSQL itself does; a path
// that is not a socket is never removed.
void claim_unix_path(const Addr& a, const std::string& setting, const std::string& dir) {
  const std::string name = a.text.substr(a.text.rfind('/') + 1);
  const std::string where = dir + ": " + name;
  const std::string choose = "; choose another directory or port";
  {
    std::ifstream lock(a.text + ".lock");
    long pid = 0;
    if (lock >> pid) {
      if (pid < 0) pid = -pid;  // a standalone backend writes its pid negated
      if (pid > 0 && pid != ::getpid() && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM))
        throw SettingError(setting, where + " is in use by process " + std::to_string(pid) + " (named in " + name +
                         ".lock, a PostgreSQL's)" + choose);
    }
  }
  struct stat st;
  if (::lstat(a.text.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw SettingError(setting, errno_message(where, errno));
  }
  if (!S_ISSOCK(st.st_mode)) throw SettingError(setting, where + " exists and is not a socket");
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw RuntimeError(errno_message("socket", errno));
  int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&a.ss), a.len);
  int err = rc == 0 ? 0 : errno;
  ::close(fd);
  // Connected, or the listener's backlog is full: something accepts there.
  if (rc == 0 || err == EAGAIN || err == EINPROGRESS)
    throw SettingError(setting, where + " is in use (a server accepts connections on it)" + choose);
  if (err != ECONNREFUSED)
    throw SettingError(setting, errno_message(where + ": cannot tell whether the socket is in use", err));
  if (::unlink(a.text.c_str()) != 0 && errno != ENOENT)
    throw SettingError(setting, errno_message(where + ": cannot remove the stale socket", errno));
}

int listen_socket(const Addr& a, bool reuseport, const std::string& setting) {
  int fd = ::socket(a.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw RuntimeError(errno_message("socket", errno));
  int one = 1;
  if (!a.is_unix) {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (reuseport) setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  }
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a.ss), a.len) != 0) {
    int err = errno;
    ::close(fd);
    throw SettingError(setting, a.text + ": " + std::strerror(err));
  }
  if (::listen(fd, 4096) != 0) {
    int err = errno;
    ::close(fd);
    throw RuntimeError(errno_message("listen " + a.text, err));
  }
  return fd;
}

std::string realtime_iso() {
  const Nanos now = clock_ns(CLOCK_REALTIME);
  const time_t sec = static_cast<time_t>(now / 1'000'000'000);
  const long ms = static_cast<long>(now % 1'000'000'000 / 1'000'000);
  tm g;
  gmtime_r(&sec, &g);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", g.tm_year + 1900,
                g.tm_mon + 1, g.tm_mday, g.tm_hour, g.tm_min, g.tm_sec, ms);
  return buf;
}

}  // namespace

struct Proxy::Impl : detail::Shared {
  // First, so that it outlives the loops' decoders, which give back to it.
  std::unique_ptr<BufferBudget> budget;
  ~Impl() {
    for (int fd : tcp_fds)
      if (fd >= 0) ::close(fd);
    if (unix_fd >= 0) {
      ::close(unix_fd);
      // Only the socket this proxy bound: never one another process has
      // put at the path since.
      struct stat st;
      if (::lstat(unix_listen.text.c_str(), &st) == 0 && st.st_dev == unix_dev && st.st_ino == unix_ino)
        ::unlink(unix_listen.text.c_str());
    }
    if (stop_fd >= 0) ::close(stop_fd);
  }
  std::vector<int> tcp_fds;  // until each loop takes its own
  int threads = 1;
  Addr listen_addr;
  bool has_tcp = false;
  Addr unix_listen;
  dev_t unix_dev = 0;  // the socket file this proxy created
  ino_t unix_ino = 0;
  bool uring = false;
  std::unique_ptr<detail::Recorder> recorder;
  std::vector<std::unique_ptr<detail::EventLoop>> loops;
  bool started = false, stopped = false;
  Nanos t0 = 0, t1 = 0;
};

Proxy::Proxy(const ProxyOptions& opts) : impl_(std::make_unique<Impl>()) {
  Impl& px = *impl_;
  px.opts = opts;
  px.limits.max_message = opts.max_message;
  px.budget = std::make_unique<BufferBudget>(opts.decoder_memory);
  px.limits.budget = px.budget.get();
  if (opts.max_message < 1024) throw SettingError("max_message", std::to_string(opts.max_message) + " bytes: at least 1kB");
  px.threads = opts.threads > 0 ? opts.threads
                                  : static_cast<int>(std::max(1u, std::thread::hardware_concurrency() / 2));
  if (px.threads > 256) throw SettingError("threads", std::to_string(px.threads) + ": at most 256");
  if (opts.out.empty()) throw InputError("no trace file to write given");
  if (opts.listen.empty() && opts.listen_unix.empty())
    throw InputError("nothing to listen on: give a TCP address, a unix-domain socket directory or both");
  try {
    trace::check_compression_level(opts.compression_level);
  } catch (const InputError& e) {
    throw InputError(std::string("compression level ") + e.what());
  }
  if (opts.buffer_bytes < 16384 || opts.buffer_bytes > (1u << 30))
    throw InputError("forwarding buffer size out of range");
  px.upstream = parse_upstream(opts.upstream);
  // TLS contexts: bad files and modes are refused before anything binds.
  if (opts.client_tls == "disable") px.client_tls = Impl::ClientTls::Disable;
  else if (opts.client_tls == "allow") px.client_tls = Impl::ClientTls::Allow;
  else if (opts.client_tls == "require") px.client_tls = Impl::ClientTls::Require;
  else throw SettingError("client_tls", opts.client_tls + ": expected disable, allow or require");
  if (opts.tls_cert.empty() != opts.tls_key.empty())
    throw SettingError(opts.tls_cert.empty() ? "tls_key" : "tls_cert",
                       opts.tls_cert.empty() ? opts.tls_key + ": a key without its certificate"
                                             : opts.tls_cert + ": a certificate without its key");
  if (px.client_tls != Impl::ClientTls::Disable) {
    if (!opts.tls_cert.empty()) {
      try {
        px.client_ctx = TlsContext::server(opts.tls_cert, opts.tls_key);
      } catch (const InputError& e) {
        throw SettingError("tls_cert_key", e.what());
      }
    } else {
      px.client_ctx = TlsContext::server_self_signed();
      px.self_signed = true;
    }
  } else if (!opts.tls_cert.empty()) {
    throw SettingError("tls_cert", opts.tls_cert + ": client TLS is disabled");
  }
  if (!parse_sslmode(opts.upstream_sslmode, &px.upstream_mode))
    throw SettingError("upstream_sslmode", opts.upstream_sslmode +
                     ": expected disable, allow, prefer, require, verify-ca or verify-full");
  if (px.upstream_mode != SslMode::Disable) {
    TlsClientOptions to;
    to.mode = px.upstream_mode;
    to.root_cert = opts.upstream_sslrootcert;
    to.cert = opts.upstream_sslcert;
    to.key = opts.upstream_sslkey;
    try {
      px.upstream_ctx = TlsContext::client(to);
    } catch (const InputError& e) {
      std::string what = e.what();
      const char* setting = what.find("root certificate") != std::string::npos ? "upstream_sslrootcert"
                            : what.find("both") != std::string::npos       ? "upstream_sslcert_key"
                            : !to.root_cert.empty() && what.rfind(to.root_cert, 0) == 0 ? "upstream_sslrootcert"
                                                                                         : "upstream_sslcert_key";
      throw SettingError(setting, what + " (upstream sslmode " + opts.upstream_sslmode + ")");
    }
  }
  // "auto" is the io_uring loop where the kernel has what it needs
  // (DEFER_TASKRUN, provided buffer rings, multishot receive: Linux 6.1),
  // epoll otherwise. Measured on a 2-core KVM guest, Linux 6.18, the three
  // hops interleaved round by round (the bare relay, the epoll loop, the
  // io_uring loop; pgbench -c 8 -j 2, 10 s per run, 44 rounds of select-only
  // -M prepared and tpcb-like): the io_uring loop spent less CPU per
  // transaction than the epoll loop in every round (tpcb-like median 176
  // against 213 us, select-only 28 against 34; its sends go out with the
  // wait, one io_uring_enter per round, where epoll makes a system call per
  // send and per receive) and got 1.026x its TPS (ahead in 27 of 44), with
  // the machine's busy CPU per transaction 0.98x (lower in 12 of 20 rounds
  // measured). Earlier builds measured the opposite (the server and
  // clients behind the io_uring loop spent more); --io epoll stays.
  px.uring = use_uring(opts.io, "capture proxy", true, &detail::uring_unsupported);
  // Two descriptors per session: allow as many as the hard limit does.
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (!opts.listen.empty()) {
    px.listen_addr = resolve("listen", opts.listen, true);
    px.has_tcp = true;
  }

  // Listeners first: a bad address must not leave an empty trace behind.
  if (px.has_tcp) {
    for (int i = 0; i < px.threads; ++i) {
      px.tcp_fds.push_back(listen_socket(px.listen_addr, true, "listen"));
      if (px.listen_addr.port == 0) {
        // Port 0: every thread's socket shares the port the first one got.
        sockaddr_storage ss{};
        socklen_t len = sizeof ss;
        getsockname(px.tcp_fds.back(), reinterpret_cast<sockaddr*>(&ss), &len);
        int port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                            : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
        px.listen_addr.port = port;
        if (px.listen_addr.ss.ss_family == AF_INET6)
          reinterpret_cast<sockaddr_in6*>(&px.listen_addr.ss)->sin6_port = htons(static_cast<uint16_t>(port));
        else
          reinterpret_cast<sockaddr_in*>(&px.listen_addr.ss)->sin_port = htons(static_cast<uint16_t>(port));
        auto colon = px.listen_addr.text.rfind(':');
        px.listen_addr.text = px.listen_addr.text.substr(0, colon + 1) + std::to_string(port);
      }
    }
  }
  if (!opts.listen_unix.empty()) {
    px.unix_listen = unix_addr("listen_unix", opts.listen_unix, px.has_tcp ? px.listen_addr.port : 5432);
    claim_unix_path(px.unix_listen, "listen_unix", opts.listen_unix);
    px.unix_fd = listen_socket(px.unix_listen, false, "listen_unix");
    struct stat st;
    if (::lstat(px.unix_listen.text.c_str(), &st) == 0) {
      px.unix_dev = st.st_dev;
      px.unix_ino = st.st_ino;
    }
    ::chmod(px.unix_listen.text.c_str(), 0777);
  }
  px.stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (px.stop_fd < 0) throw RuntimeError(errno_message("eventfd", errno));

  trace::WriterOptions wo;
  wo.compression_level = opts.compression_level;
  px.recorder = std::make_unique<detail::Recorder>(trace::open_writer(opts.out, wo), px.threads,
                                                   opts.queue_bytes, opts.drop_on_overflow);
  for (int i = 0; i < px.threads; ++i) {
    int tcp_fd = -1;
    if (px.has_tcp) {
      tcp_fd = px.tcp_fds[static_cast<size_t>(i)];
      px.tcp_fds[static_cast<size_t>(i)] = -1;  // the loop owns it now
    }
    RecordSink& sink = px.recorder->producer(static_cast<size_t>(i));
    px.loops.push_back(px.uring ? detail::make_uring_loop(px, tcp_fd, sink)
                                : detail::make_epoll_loop(px, tcp_fd, sink));
  }

  px.recorder->meta("capture", "proxy");
  if (px.has_tcp) px.recorder->meta("listen", px.listen_addr.text);
  if (px.unix_fd >= 0) px.recorder->meta("listen_unix", px.unix_listen.text);
  px.recorder->meta("upstream", px.upstream.text);
  px.recorder->meta("start_time", realtime_iso());
  px.recorder->meta("threads", std::to_string(px.threads));
  px.recorder->meta("io", px.uring ? "io_uring" : "epoll");
  px.recorder->meta("client_tls", opts.client_tls);
  if (px.self_signed) px.recorder->meta("client_tls.fingerprint", px.client_ctx->fingerprint());
  px.recorder->meta("upstream_sslmode", opts.upstream_sslmode);
  for (const auto& [k, v] : opts.meta) px.recorder->meta(k, v);
}

Proxy::~Proxy() {
  try {
    stop();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tierlab: capture proxy: %s\n", e.what());
  }
}

std::string Proxy::listening() const {
  const Impl& px = *impl_;
  std::string s;
  if (px.has_tcp) s = px.listen_addr.text;
  if (px.unix_fd >= 0) s += (s.empty() ? "" : " and ") + px.unix_listen.text;
  return s;
}

std::string Proxy::tls_fingerprint() const { return impl_->self_signed ? impl_->client_ctx->fingerprint() : ""; }

int Proxy::port() const { return impl_->has_tcp ? impl_->listen_addr.port : 0; }

void Proxy::start() {
  Impl& px = *impl_;
  if (px.started) return;
  px.started = true;
  px.t0 = now_ns();
  px.recorder->start();
  for (auto& loop : px.loops) {
    detail::EventLoop* l = loop.get();
    l->thread = std::thread([l] { l->run(); });
  }
}

void Proxy::stop() {
  Impl& px = *impl_;
  if (px.stopped) return;
  px.stopped = true;
  uint64_t one = 1;
  if (px.stop_fd >= 0) (void)::write(px.stop_fd, &one, sizeof one);
  for (auto& loop : px.loops)
    if (loop->thread.joinable()) loop->thread.join();
  px.t1 = now_ns();
  px.recorder->stop();
}

bool Proxy::failed() const { return impl_->recorder->failed(); }

bool Proxy::recording_stopped() const { return impl_->recorder->recording_stopped(); }

ProxySummary Proxy::progress() const {
  const Impl& px = *impl_;
  ProxySummary s;
  for (const auto& l : px.loops) {
    s.connections += l->stats.connections;
    s.sessions += l->stats.sessions;
    s.statements += l->stats.statements;
    s.transactions += l->stats.transactions;
    s.errors += l->stats.errors;
    s.bytes_to_server += l->stats.to_server;
    s.bytes_to_client += l->stats.to_client;
    s.protocol_errors += l->stats.protocol_errors;
    s.upstream_failures += l->stats.upstream_failures;
  }
  s.decoder_refused = px.budget->refused.load(std::memory_order_relaxed);
  s.decoder_refused_bytes = px.budget->refused_bytes.load(std::memory_order_relaxed);
  return s;
}

const BufferBudget& Proxy::decoder_budget() const { return *impl_->budget; }

ProxySummary Proxy::summary() const {
  const Impl& px = *impl_;
  ProxySummary s = progress();
  auto rs = px.recorder->stats();
  s.records = rs.records_written;
  s.dropped = rs.dropped;
  s.queue_waits = rs.waits;
  s.duration_ns = (px.t1 ? px.t1 : now_ns()) - px.t0;
  if (px.recorder->recording_stopped()) {
    s.recording_error = px.recorder->stop_error();
    s.recording_stopped_ns = px.recorder->stopped_at() - px.t0;
    s.lost_records = rs.lost;
  }
  return s;
}

}  // namespace tierlab::capture
