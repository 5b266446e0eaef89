#include "replay/connector.h"

#include "common/error.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <utility>

namespace tierlab::replay {
namespace {

constexpr uint64_t kWakeTag = ~uint64_t{0};
constexpr int kMaxEvents = 64;

int make_eventfd() {
  int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) throw RuntimeError(errno_message("replay: eventfd", errno));
  return fd;
}

void drain(int fd) {
  uint64_t n;
  while (::read(fd, &n, sizeof n) < 0 && errno == EINTR) {
  }
}

}  // namespace

std::string conninfo_value(const std::string& conninfo, const char* keyword) {
  const bool uri = conninfo.rfind("postgresql://", 0) == 0 || conninfo.rfind("postgres://", 0) == 0;
  if (!uri && conninfo.find('=') == std::string::npos)
    return std::strcmp(keyword, "dbname") == 0 ? conninfo : "";
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(conninfo.c_str(), &err);
  if (err) PQfreemem(err);  // libpq's own connect reports a bad conninfo
  if (!opts) return "";
  std::string value;
  for (PQconninfoOption* o = opts; o->keyword; ++o)
    if (std::strcmp(o->keyword, keyword) == 0 && o->val) value = o->val;
  PQconninfoFree(opts);
  return value;
}

int64_t connect_timeout_ns(const std::string& conninfo) {
  std::string value = conninfo_value(conninfo, "connect_timeout");
  if (value.empty())
    if (const char* env = std::getenv("PGCONNECT_TIMEOUT")) value = env;
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.pop_back();
  if (value.empty()) return 0;
  long long secs = 0;
  auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), secs);
  if (ec != std::errc() || p != value.data() + value.size())
    throw InputError("connect_timeout " + value + ": not a whole number of seconds");
  if (secs <= 0) return 0;
  return std::max<long long>(secs, 2) * 1'000'000'000LL;
}

ConnKeywords::ConnKeywords(const std::string& conninfo, const ConnParams& p) {
  int k = 0;
  auto add = [&](const char* key, const char* value) {
    kw[k] = key;
    val[k++] = value;
  };
  add("dbname", conninfo.c_str());
  if (p.user) add("user", p.user);
  if (p.database) add("dbname", p.database);
  if (p.application_name) add("application_name", p.application_name);
  kw[k] = nullptr;
  val[k] = nullptr;
}

Connector::Connector(const std::string& conninfo, const std::vector<ConnParams>& params,
                     const std::vector<size_t>& sessions_per_worker)
    : conninfo_(conninfo), params_(params), inboxes_(sessions_per_worker.size()),
      timeout_ns_(connect_timeout_ns(conninfo)) {
  const size_t sessions = std::accumulate(sessions_per_worker.begin(), sessions_per_worker.end(), size_t{0});
  try {
    for (size_t w = 0; w < inboxes_.size(); ++w) {
      inboxes_[w].items.reserve(sessions_per_worker[w]);
      inboxes_[w].fd = make_eventfd();
    }
    // Each session opens once and closes once.
    requests_.reserve(2 * sessions);
    work_.reserve(2 * sessions);
    pending_.reserve(sessions);
    wake_fd_ = make_eventfd();
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    if (ep_ < 0) throw RuntimeError(errno_message("replay: epoll_create1", errno));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeTag;
    if (epoll_ctl(ep_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0)
      throw RuntimeError(errno_message("replay: epoll_ctl (connection thread)", errno));
  } catch (...) {
    for (Inbox& b : inboxes_)
      if (b.fd >= 0) ::close(b.fd);
    if (wake_fd_ >= 0) ::close(wake_fd_);
    if (ep_ >= 0) ::close(ep_);
    throw;
  }
}

Connector::~Connector() {
  try {
    stop();
  } catch (...) {
    // A failure of the thread was reported by stop() already, or the
    // replay is failing for another reason.
  }
  for (Inbox& b : inboxes_) ::close(b.fd);
  ::close(wake_fd_);
  ::close(ep_);
}

void Connector::start() {
  thread_ = std::thread([this] {
    try {
      loop();
    } catch (const std::exception& e) {
      // stop() reports it; until then no worker waits for a connection
      // that will not come: every session connecting, or asking to, fails.
      error_ = std::current_exception();
      failure_ = std::string("the connection thread failed: ") + e.what();
      for (Pending& p : pending_) {
        if (!p.conn) continue;
        unarm(p);
        deliver(p.worker, p.slot, std::exchange(p.conn, nullptr), failure_.c_str());
      }
      for (;;) {
        pollfd pf{wake_fd_, POLLIN, 0};
        ::poll(&pf, 1, -1);
        if (!handle_requests()) break;
      }
    }
    cpu_ns_ = clock_ns(CLOCK_THREAD_CPUTIME_ID);
  });
}

void Connector::stop() {
  if (thread_.joinable()) {
    {
      std::lock_guard g(lock_);
      stopping_ = true;
    }
    wake(wake_fd_);
    thread_.join();
  }
  // Whatever is left, whether or not the thread ran to its end.
  for (Pending& p : pending_) {
    if (p.conn) PQfinish(p.conn);
    p.conn = nullptr;
  }
  for (const Request& r : requests_)
    if (r.close) PQfinish(r.close);
  requests_.clear();
  for (Inbox& b : inboxes_) {
    for (const Opened& o : b.items)
      if (o.conn) PQfinish(o.conn);
    b.items.clear();
  }
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void Connector::wake(int fd) {
  const uint64_t one = 1;
  while (::write(fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

void Connector::open(int worker, uint32_t slot, uint32_t session) {
  {
    std::lock_guard g(lock_);
    requests_.push_back(Request{nullptr, worker, slot, session});
  }
  wake(wake_fd_);
}

void Connector::close(PGconn* conn) {
  if (!conn) return;
  {
    std::lock_guard g(lock_);
    requests_.push_back(Request{conn, 0, 0, 0});
  }
  wake(wake_fd_);
}

void Connector::take(int worker, std::vector<Opened>& out) {
  Inbox& b = inboxes_[static_cast<size_t>(worker)];
  out.clear();
  // Read first: a connection handed back after the swap signals again.
  drain(b.fd);
  std::lock_guard g(b.lock);
  std::swap(out, b.items);
}

void Connector::deliver(int worker, uint32_t slot, PGconn* conn, const char* why) {
  Inbox& b = inboxes_[static_cast<size_t>(worker)];
  {
    std::lock_guard g(b.lock);
    b.items.push_back(Opened{slot, conn, why});
  }
  wake(b.fd);
}

void Connector::loop() {
  epoll_event evs[kMaxEvents];
  for (;;) {
    int n = epoll_wait(ep_, evs, kMaxEvents, expire());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw RuntimeError(errno_message("replay: epoll wait (connection thread)", errno));
    }
    bool requests = false;
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.u64 == kWakeTag) requests = true;
      else step(static_cast<uint32_t>(evs[i].data.u64));
    }
    if (requests && !handle_requests()) return;
  }
}

bool Connector::handle_requests() {
  drain(wake_fd_);
  bool stopping;
  {
    std::lock_guard g(lock_);
    std::swap(work_, requests_);
    stopping = stopping_;
  }
  for (const Request& r : work_) {
    if (r.close) PQfinish(r.close);
    else if (!failure_.empty()) deliver(r.worker, r.slot, nullptr, failure_.c_str());
    else if (!stopping) begin(r);
    else deliver(r.worker, r.slot, nullptr, "the replay stopped before the session connected");
  }
  work_.clear();
  return !stopping;
}

void Connector::begin(const Request& r) {
  ConnKeywords k(conninfo_, params_[r.session]);
  PGconn* c = PQconnectStartParams(k.kw, k.val, 1);
  if (!c || PQstatus(c) == CONNECTION_BAD) return deliver(r.worker, r.slot, c, c ? nullptr : "out of memory");
  // Within the capacity reserved: one open per session.
  const auto idx = static_cast<uint32_t>(pending_.size());
  pending_.push_back(Pending{c, timeout_ns_ ? now_ns() + timeout_ns_ : 0, r.worker, r.slot, -1, 0});
  // As if PQconnectPoll had returned PGRES_POLLING_WRITING.
  if (!arm(idx, EPOLLOUT)) {
    pending_[idx].conn = nullptr;
    deliver(r.worker, r.slot, c, "could not watch the connection's socket");
  }
}

bool Connector::arm(uint32_t idx, uint32_t events) {
  Pending& p = pending_[idx];
  const int fd = PQsocket(p.conn);
  if (fd < 0) return false;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = idx;
  if (fd == p.fd) {
    if (events == p.events) return true;
    if (epoll_ctl(ep_, EPOLL_CTL_MOD, fd, &ev) == 0) {
      p.events = events;
      return true;
    }
    // libpq closed the socket and opened another with the same number
    // (a next address or a retry without encryption): the close took the
    // old one out of the set.
    if (errno != ENOENT) return false;
  } else if (p.fd >= 0) {
    epoll_ctl(ep_, EPOLL_CTL_DEL, p.fd, nullptr);  // fails when libpq closed it: no matter
  }
  p.fd = -1;
  if (epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev) != 0) return false;
  p.fd = fd;
  p.events = events;
  return true;
}

void Connector::unarm(Pending& p) {
  if (p.fd >= 0) epoll_ctl(ep_, EPOLL_CTL_DEL, p.fd, nullptr);
  p.fd = -1;
}

int Connector::expire() {
  if (!timeout_ns_) return -1;
  const int64_t now = now_ns();
  for (; oldest_ < pending_.size(); ++oldest_) {
    Pending& p = pending_[oldest_];
    if (!p.conn) continue;
    if (p.deadline > now) return static_cast<int>((p.deadline - now + 999'999) / 1'000'000);
    unarm(p);
    deliver(p.worker, p.slot, std::exchange(p.conn, nullptr), "timeout expired (connect_timeout)");
  }
  return -1;
}

void Connector::step(uint32_t idx) {
  Pending& p = pending_[idx];
  if (!p.conn) return;  // handed back already; a stale event
  const char* why = nullptr;
  switch (PQconnectPoll(p.conn)) {
    case PGRES_POLLING_READING:
      if (arm(idx, EPOLLIN)) return;
      why = "could not watch the connection's socket";
      break;
    case PGRES_POLLING_WRITING:
      if (arm(idx, EPOLLOUT)) return;
      why = "could not watch the connection's socket";
      break;
    default:  // OK, or FAILED with libpq's message
      break;
  }
  // Out of this epoll set before the worker takes the socket into its own.
  unarm(p);
  PGconn* c = std::exchange(p.conn, nullptr);
  deliver(p.worker, p.slot, c, why);
}

}  // namespace tierlab::replay
