// File I/O capture of this process's own preads, pwrites and syncs on a
// temporary file (needs root and the kernel's syscall tracepoints).
#include "capture/file_io.h"
#include "support/support.h"

#include "common/error.h"
#include "trace/reader.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <exception>
#include <future>
#include <string>
#include <thread>
#include <vector>

using namespace tierlab;

namespace {

void require_file_io_tracing() {
  test::require_root("file I/O capture (tracefs syscall tracepoints)");
  try {
    capture::require_file_io_tracing("");
  } catch (const RuntimeError& e) {
    test::skip(e.what());
  }
}

}  // namespace

TEST_CASE("file I/O capture records a process tree's preads, pwrites and syncs with their files",
          "[file_io]") {
  require_file_io_tracing();
  test::TempDir dir;
  std::string data = dir.file("data"), other = dir.file("other");
  std::string trace_path = dir.file("f.tlt");
  auto w = trace::open_writer(trace_path);
  capture::FileIoCaptureOptions o;
  o.process_tree = ::getpid();
  o.data_dir = dir.path();
  std::atomic<bool> stop{false};
  std::promise<void> ready;
  auto started = ready.get_future();
  capture::FileIoCaptureStats st;
  std::exception_ptr err;
  std::thread t([&] {
    try {
      st = capture::capture_file_io(o, *w, &stop, [&] { ready.set_value(); });
    } catch (...) {
      err = std::current_exception();
      ready.set_value();
    }
  });
  started.get();
  REQUIRE_FALSE(err);

  int fd = ::open(data.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0);
  std::vector<char> page(8192, 'x');
  for (int i = 0; i < 16; ++i) REQUIRE(::pwrite(fd, page.data(), page.size(), off_t(i) * 8192) == 8192);
  REQUIRE(::fdatasync(fd) == 0);
  for (int i = 0; i < 16; ++i) REQUIRE(::pread(fd, page.data(), page.size(), off_t(i) * 8192) == 8192);
  iovec iov{page.data(), 4096};
  REQUIRE(::preadv(fd, &iov, 1, 4096) == 4096);
  REQUIRE(::pread(fd, page.data(), 8192, 16 * 8192) == 0);  // at the end: 0 bytes
  REQUIRE(::pread(fd, page.data(), 8192, -5) == -1);         // fails: not recorded
  // Files are named when their calls are read (every 0.1 s): a server
  // keeps its files open longer than that.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::close(fd);
  // The same descriptor number, another file: named after it once closed.
  int fd2 = ::open(other.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd2 == fd);
  REQUIRE(::pwrite(fd2, page.data(), 512, 0) == 512);
  REQUIRE(::fsync(fd2) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::close(fd2);
  stop = true;
  t.join();
  if (err) std::rethrow_exception(err);
  w->close();

  int reads = 0, writes = 0, flushes = 0, zero = 0, fsyncs = 0, other_writes = 0;
  uint64_t read_bytes = 0;
  auto r = trace::open_reader(trace_path);
  for (trace::Record rec; r->next(rec);) {
    auto* f = std::get_if<trace::FileIo>(&rec.body);
    if (!f) continue;
    CHECK(f->pid > 0);
    CHECK(f->latency_ns >= 0);
    if (f->file == "other") {
      if (f->op == trace::IoOp::Write) ++other_writes;
      if (f->op == trace::IoOp::Flush && (f->flags & trace::kIoMeta)) ++fsyncs;
      continue;
    }
    if (f->file != "data") continue;  // relative to data_dir; other calls of the tree (the loader's)
    if (f->op == trace::IoOp::Read) {
      if (f->length == 0) ++zero;
      else {
        ++reads;
        read_bytes += f->length;
        CHECK(f->offset % 4096 == 0);
      }
    } else if (f->op == trace::IoOp::Write) {
      ++writes;
      CHECK(f->length == 8192);
    } else if (f->op == trace::IoOp::Flush) {
      ++flushes;
      CHECK((f->flags & trace::kIoMeta) == 0);  // fdatasync
    }
  }
  CHECK(writes == 16);
  CHECK(reads == 17);
  CHECK(read_bytes == 16 * 8192 + 4096);
  CHECK(zero == 1);
  CHECK(flushes == 1);
  CHECK(other_writes == 1);
  CHECK(fsyncs == 1);
  CHECK(st.failed >= 1);
  CHECK(st.reads >= 18);
  CHECK(st.lost == 0);
  CHECK(capture::describe(st).find(std::to_string(st.reads) + " reads") != std::string::npos);
}
