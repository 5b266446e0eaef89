#include "common/loop.h"

#include "common/loop_impl.h"
#include "common/uring.h"

namespace tierlab {

std::unique_ptr<Loop> make_loop(bool uring, const LoopOptions& o) {
  return uring ? loop_detail::make_uring_backend(o) : loop_detail::make_epoll_backend(o);
}

std::string loop_uring_missing() {
  return uring_missing({.ext_arg = false,
                        .buf_ring = true,
                        .ops = {{IORING_OP_RECV, "recv"},
                                {IORING_OP_SEND, "send"},
                                {IORING_OP_ACCEPT, "accept"},
                                {IORING_OP_CONNECT, "connect"},
                                {IORING_OP_ASYNC_CANCEL, "async cancel"},
                                {IORING_OP_POLL_ADD, "poll"},
                                {IORING_OP_POLL_REMOVE, "poll remove"}}});
}

}  // namespace tierlab
