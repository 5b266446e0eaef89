// The one io_uring setup (common/uring.h): kernel features probed once,
// a missing one named exactly, and a provided buffer ring that hands the
// kernel's receives their buffers and takes them back.
#include "common/uring.h"

#include "common/error.h"
#include "support/support.h"

#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <string>

using namespace tierlab;

namespace {
void require_uring() {
  if (!uring_support().setup_error.empty())
    test::skip("io_uring is not available here: " + uring_support().setup_error);
}
}  // namespace

TEST_CASE("uring: features are probed once per process and a missing operation is named", "[uring]") {
  require_uring();
  CHECK(&uring_support() == &uring_support());
  CHECK(uring_missing({.ext_arg = false, .buf_ring = false, .ops = {{IORING_OP_SEND, "send"}}}) == "");
  // No kernel has an operation numbered 250.
  CHECK(uring_missing({.ext_arg = false, .buf_ring = false, .ops = {{IORING_OP_SEND, "send"}, {250, "op250"}}}) ==
        "io_uring operation op250 not supported");
}

TEST_CASE("uring: a provided buffer ring feeds multishot receives and takes its buffers back", "[uring]") {
  require_uring();
  if (!uring_support().buf_ring_error.empty())
    test::skip("provided buffer rings are not available here: " + uring_support().buf_ring_error);
  RingOptions o;
  o.entries = 8;
  o.single_task = true;
  Ring ring(o);
  BufRing br(ring, 3, 2, 64);
  CHECK(br.held() == 0);
  int sv[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
  io_uring_sqe* e = ring.sqe();
  io_uring_prep_recv_multishot(e, sv[0], nullptr, 0, 0);
  e->flags |= IOSQE_BUFFER_SELECT;
  e->buf_group = br.group();
  io_uring_sqe_set_data64(e, 7);
  // Three messages, two buffers: the third waits until one is given back.
  for (int round = 0; round < 3; ++round) {
    std::string msg = "message " + std::to_string(round);
    REQUIRE(::send(sv[1], msg.data(), msg.size(), 0) == static_cast<ssize_t>(msg.size()));
    io_uring_cqe* cqe = nullptr;
    REQUIRE(io_uring_submit_and_wait(ring.get(), 1) >= 0);
    REQUIRE(io_uring_peek_cqe(ring.get(), &cqe) == 0);
    CHECK(cqe->user_data == 7);
    if (round == 2) {
      // Both buffers are held: the receive ends with ENOBUFS.
      CHECK(cqe->res == -ENOBUFS);
      io_uring_cqe_seen(ring.get(), cqe);
      break;
    }
    REQUIRE(cqe->res == static_cast<int>(msg.size()));
    REQUIRE((cqe->flags & IORING_CQE_F_BUFFER) != 0);
    br.taken();
    uint32_t id = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
    CHECK(std::string(reinterpret_cast<char*>(br.data(id)), msg.size()) == msg);
    io_uring_cqe_seen(ring.get(), cqe);
  }
  CHECK(br.held() == 2);
  br.give_back(0);
  br.give_back(1);
  CHECK(br.returns());
  br.publish();
  CHECK(br.held() == 0);
  CHECK(!br.returns());
  ::close(sv[0]);
  ::close(sv[1]);
}

TEST_CASE("uring: a ring the kernel cannot make names the flags it refused", "[uring]") {
  RingOptions o;
  o.entries = 1u << 30;  // beyond IORING_MAX_ENTRIES
  try {
    Ring ring(o);
    FAIL("a ring of 2^30 entries was created");
  } catch (const RuntimeError& e) {
    CHECK(std::string(e.what()).rfind("io_uring_queue_init (plain): ", 0) == 0);
  }
}
