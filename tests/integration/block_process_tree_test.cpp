// Block capture keeps the I/O of one process tree (a server's postmaster and
// its children, also those forked after the start) and counts the rest:
// direct writes to a loop device from a process forked inside the tree
// after the capture began, and from one outside it. Needs root.
#include "capture/block.h"
#include "support/block_capture.h"
#include "support/support.h"

#include "trace/reader.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

using namespace tierlab;

namespace {

// A loop device over an image in /dev/shm, detached at the end. A run killed
// before its destructor leaves its device attached: those of runs whose
// process is gone are detached (and their images removed) first.
struct Loop {
  std::string image, dev;
  Loop() {
    std::system(
        "losetup -nO NAME,BACK-FILE 2>/dev/null | while read -r d f; do "
        "case $f in /dev/shm/tierlab-tree-*.img) p=${f#/dev/shm/tierlab-tree-}; p=${p%.img}; "
        "[ -d /proc/$p ] || { losetup -d $d; rm -f $f; };; esac; done");
    image = "/dev/shm/tierlab-tree-" + std::to_string(::getpid()) + ".img";
    if (std::system(("truncate -s 16M " + image).c_str()) != 0) test::skip("cannot create " + image);
    dev = test::shell_output("losetup -f --show " + image + " 2>&1");
    if (dev.rfind("/dev/loop", 0) != 0) {
      ::unlink(image.c_str());
      test::skip("cannot attach a loop device (losetup: " + dev + ")");
    }
  }
  ~Loop() {
    std::system(("losetup -d " + dev + " 2>/dev/null").c_str());
    ::unlink(image.c_str());
  }
};

// 20 direct 4 KiB writes at `base` + i * 64 KiB; exits the process a second
// later, as a server's backend or a long-running job does not exit right
// away (a process gone before its I/O is looked up is recorded: counted as
// such in the summary).
[[noreturn]] void write_direct(const std::string& dev, off_t base) {
  int fd = ::open(dev.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
  void* buf = nullptr;
  if (fd < 0 || ::posix_memalign(&buf, 4096, 4096) != 0) _exit(1);
  std::memset(buf, 0x5a, 4096);
  for (int i = 0; i < 20; ++i)
    if (::pwrite(fd, buf, 4096, base + off_t(i) * 65536) != 4096) _exit(1);
  ::sleep(1);
  _exit(0);
}

// A "server": waits for a byte on `go`, then forks a child that writes and
// exits, reaps it and exits. Writes the child's pid to `report`.
pid_t start_tree(const std::string& dev, const int go[2], int report) {
  pid_t root = ::fork();
  if (root == 0) {
    ::close(go[1]);  // the test's end: its exit ends the wait
    char c;
    if (::read(go[0], &c, 1) != 1) _exit(1);
    pid_t child = ::fork();
    if (child == 0) write_direct(dev, 0);
    if (::write(report, &child, sizeof child) != sizeof child) _exit(1);
    int st = 0;
    ::waitpid(child, &st, 0);
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 1);
  }
  return root;
}

int wait_status(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

// BlockIo records per pid, writes only.
std::map<int32_t, int> writes_by_pid(const std::string& path) {
  std::map<int32_t, int> n;
  auto r = trace::open_reader(path);
  trace::Record rec;
  while (r->next(rec))
    if (auto* b = std::get_if<trace::BlockIo>(&rec.body))
      if (b->op == trace::IoOp::Write) ++n[b->pid];
  return n;
}

struct Run {
  capture::BlockCaptureStats stats;
  pid_t child = 0, outsider = 0;
  std::map<int32_t, int> writes;
};

Run run(const Loop& loop, const test::TempDir& dir, bool tree_filter) {
  int go[2], report[2];
  REQUIRE(::pipe(go) == 0);
  REQUIRE(::pipe(report) == 0);
  pid_t root = start_tree(loop.dev, go, report[1]);
  REQUIRE(root > 0);
  const std::string path = dir.file(tree_filter ? "tree.tlt" : "all.tlt");
  Run out;
  {
    auto w = trace::open_writer(path);
    capture::BlockCaptureOptions o;
    o.device = loop.dev;
    o.process_tree = tree_filter ? root : 0;
    test::BackgroundBlockCapture cap(o, *w);
    // Both start after the capture: the tree's child is forked now.
    out.outsider = ::fork();
    if (out.outsider == 0) write_direct(loop.dev, 8 << 20);
    REQUIRE(::write(go[1], "x", 1) == 1);
    REQUIRE(::read(report[0], &out.child, sizeof out.child) == sizeof out.child);
    CHECK(wait_status(root) == 0);
    CHECK(wait_status(out.outsider) == 0);
    ::usleep(200 * 1000);
    out.stats = cap.stop();
    w->close();
  }
  for (int fd : {go[0], go[1], report[0], report[1]}) ::close(fd);
  out.writes = writes_by_pid(path);
  return out;
}

}  // namespace

TEST_CASE("block capture of a process tree keeps its new children's I/O and counts others'",
          "[block][process-tree]") {
  test::require_root("block capture (tracefs, loop devices)");
  test::TempDir dir;
  Loop loop;

  Run tree = run(loop, dir, true);
  INFO("child " << tree.child << ", outsider " << tree.outsider << ": " << capture::describe(tree.stats, false));
  CHECK(tree.writes[tree.child] >= 20);  // forked after the capture began
  CHECK(tree.writes.count(tree.outsider) == 0);
  CHECK(tree.stats.others >= 20);
  CHECK(tree.stats.exited_unchecked == 0);
  CHECK(capture::describe(tree.stats, false).find("I/Os of other processes counted, not recorded") !=
        std::string::npos);

  // Without the filter, both are recorded.
  Run all = run(loop, dir, false);
  CHECK(all.writes[all.child] >= 20);
  CHECK(all.writes[all.outsider] >= 20);
  CHECK(all.stats.others == 0);
}
