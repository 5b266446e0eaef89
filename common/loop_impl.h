// Private to common/: what both Loop backends share (common/loop.h): the
// connection slots, the per-connection send queues (buffers linked through
// one array, no allocation) and the events made between two wait() calls.
#pragma once

#include "common/loop.h"

#include <cassert>
#include <cstdint>
#include <vector>

namespace tierlab::loop_detail {

constexpr int32_t kNone = -1;
constexpr int32_t kExt = -2;  // a connection's send_ext piece

enum class Slot : uint8_t { Free, Open, Closing };

struct Conn {
  int fd = -1;
  Slot state = Slot::Free;
  bool want_recv = false;   // the owner wants Data
  bool armed = false;       // a receive is armed (io_uring) or EPOLLIN registered (epoll)
  bool cancelling = false;  // io_uring: the receive is being cancelled
  bool starved = false;     // a receive waits for a free buffer
  bool eof = false;         // the peer closed: no more receives
  bool connecting = false;  // sends wait for the connection
  bool sending = false;     // io_uring: a send is in flight
  bool blocked = false;     // epoll: the socket's send buffer is full (EPOLLOUT registered)
  bool hup = false;         // epoll: hung up, out of the epoll set
  bool borrowed = false;    // open_borrowed: the descriptor is the owner's, never shut down or closed here
  bool dirty = false;       // epoll: registered events to be brought in step before the next wait
  uint32_t events = 0;      // epoll: registered events
  int32_t head = kNone, tail = kNone;  // queued pieces, oldest first
  uint32_t off = 0;                    // bytes of the head piece already sent
  uint32_t bytes = 0;                  // queued, not yet sent
  const uint8_t* ext = nullptr;        // the send_ext piece
  uint8_t* into = nullptr;             // recv_into: the caller's memory, null when none asked
  uint32_t into_cap = 0;
  uint32_t ext_len = 0;
  int32_t ext_next = kNone;
  uint32_t inflight = 0;  // io_uring operations submitted, not completed
  uint64_t user = 0;
  uint32_t next_free = 0;
};

// A poll_open() watch.
struct Watch {
  int fd = -1;
  Slot state = Slot::Free;
  uint32_t events = 0;  // asked for (POLLIN, POLLOUT)
  uint32_t armed = 0;   // io_uring: the mask of the poll in the kernel, 0 none; epoll: registered
  bool queued = false;  // io_uring: in the list of polls to arm
  bool removing = false;  // io_uring: a poll remove for it is on its way
  uint64_t tag = 0;
  uint32_t next_free = 0;
};

class LoopCommon : public Loop {
 public:
  LoopCommon(const LoopOptions& o) : opts_(o), piece_len_(o.buffers, 0), piece_next_(o.buffers, kNone) {
    conns_.reserve(o.connections);
    for (uint32_t i = 0; i < o.connections; ++i) grow();
    closing_.reserve(o.connections);
    starved_.reserve(o.connections);
    pending_.reserve(1024);
    polls_.reserve(o.connections);
  }

  int fd(uint32_t c) const override { return conns_[c].fd; }
  uint64_t& user(uint32_t c) override { return conns_[c].user; }
  uint32_t queued(uint32_t c) const override { return conns_[c].bytes; }

  void send(uint32_t c, int32_t buf, uint32_t len) final {
    enqueue(conns_[c], buf, len);
    push(c);
  }
  void send_ext(uint32_t c, const uint8_t* p, uint32_t len) final {
    Conn& k = conns_[c];
    k.ext = p;
    k.ext_len = len;
    enqueue(k, kExt, len);
    push(c);
  }

 protected:
  LoopOptions opts_;
  std::vector<Conn> conns_;
  uint32_t free_ = UINT32_MAX;
  std::vector<uint32_t> closing_;  // closed, waiting for the kernel
  std::vector<uint32_t> starved_;  // receives waiting for a buffer
  std::vector<uint32_t> piece_len_;
  std::vector<int32_t> piece_next_;
  // Events made outside a reap (epoll's sends, immediate connects), handed
  // out by the next wait() before it waits.
  std::vector<LoopEvent> pending_;
  size_t pending_head_ = 0;

  std::vector<Watch> polls_;
  uint32_t free_poll_ = UINT32_MAX;

  uint32_t take_watch(int fd, uint64_t tag) {
    if (free_poll_ == UINT32_MAX) {
      polls_.emplace_back();
      polls_.back().next_free = free_poll_;
      free_poll_ = static_cast<uint32_t>(polls_.size() - 1);
    }
    uint32_t w = free_poll_;
    Watch& p = polls_[w];
    free_poll_ = p.next_free;
    p = Watch{};
    p.fd = fd;
    p.tag = tag;
    p.state = Slot::Open;
    return w;
  }

  void free_watch(uint32_t w) {
    Watch& p = polls_[w];
    p.state = Slot::Free;
    p.fd = -1;
    p.next_free = free_poll_;
    free_poll_ = w;
  }

  void grow() {
    conns_.emplace_back();
    conns_.back().next_free = free_;
    free_ = static_cast<uint32_t>(conns_.size() - 1);
  }

  uint32_t take_slot(int fd) {
    if (free_ == UINT32_MAX) grow();
    uint32_t c = free_;
    Conn& k = conns_[c];
    free_ = k.next_free;
    k = Conn{};
    k.fd = fd;
    k.state = Slot::Open;
    return c;
  }

  void free_slot(uint32_t c) {
    Conn& k = conns_[c];
    k.state = Slot::Free;
    k.fd = -1;
    k.next_free = free_;
    free_ = c;
  }

  // --- queues ---------------------------------------------------------------

  uint8_t* bufs_ = nullptr;  // the receive buffers, opts_.buffer_size bytes each (set by the backend)

  const uint8_t* piece_data(const Conn& k, int32_t id) const {
    return id == kExt ? k.ext : bufs_ + static_cast<size_t>(id) * opts_.buffer_size;
  }
  uint32_t piece_size(const Conn& k, int32_t id) const {
    return id == kExt ? k.ext_len : piece_len_[static_cast<size_t>(id)];
  }
  int32_t& piece_next(Conn& k, int32_t id) { return id == kExt ? k.ext_next : piece_next_[static_cast<size_t>(id)]; }

  void enqueue(Conn& k, int32_t id, uint32_t len) {
    if (id >= 0) piece_len_[static_cast<size_t>(id)] = len;
    piece_next(k, id) = kNone;
    if (k.tail == kNone) k.head = id;
    else piece_next(k, k.tail) = id;
    k.tail = id;
    k.bytes += len;
  }

  // n bytes of k's queue went out: pieces sent whole are dropped (buffers
  // released).
  void advance(Conn& k, uint32_t n) {
    assert(n <= k.bytes);
    k.off += n;
    k.bytes -= n;
    while (k.head != kNone && k.off >= piece_size(k, k.head)) {
      int32_t id = k.head;
      k.off -= piece_size(k, id);
      k.head = piece_next(k, id);
      if (id >= 0) release(id);
    }
    if (k.head == kNone) {
      k.tail = kNone;
      k.off = 0;
    }
  }

  void drop_queue(Conn& k) {
    for (int32_t id = k.head; id != kNone;) {
      int32_t next = piece_next(k, id);
      if (id >= 0) release(id);
      id = next;
    }
    k.head = k.tail = kNone;
    k.off = k.bytes = 0;
  }

  // Starts sending c's queue, as far as the backend can now.
  virtual void push(uint32_t c) = 0;

  void post(const LoopEvent& e) { pending_.push_back(e); }

  // Moves pending events to evs (up to max); returns how many.
  int take_pending(LoopEvent* evs, int max) {
    int n = 0;
    while (pending_head_ < pending_.size() && n < max) evs[n++] = pending_[pending_head_++];
    if (pending_head_ == pending_.size()) {
      pending_.clear();
      pending_head_ = 0;
    }
    return n;
  }

  // No event for c is handed out after close(c) (for a watch: after
  // poll_close(c)).
  void forget_pending(uint32_t c, bool watch = false) {
    size_t keep = pending_head_;
    for (size_t i = pending_head_; i < pending_.size(); ++i) {
      const LoopEvent& e = pending_[i];
      const bool conn_event = e.kind != LoopEv::Accept && e.kind != LoopEv::Wake && e.kind != LoopEv::Ready;
      bool of_c = (watch ? e.kind == LoopEv::Ready : conn_event) && e.conn == c;
      if (!of_c) pending_[keep++] = e;
    }
    pending_.resize(keep);
  }
};

std::unique_ptr<Loop> make_uring_backend(const LoopOptions& o);
std::unique_ptr<Loop> make_epoll_backend(const LoopOptions& o);

}  // namespace tierlab::loop_detail
