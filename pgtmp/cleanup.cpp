#include "pgtmp/cleanup.h"

#include "common/error.h"
#include "pgtmp/process.h"

#include <limits.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

namespace tierlab::pgtmp::detail {
namespace {

constexpr int kSlots = 64;
enum : int { kFree = 0, kSettingUp = 1, kLive = 2 };

// Invariant: a slot's dir and owner are written before its state becomes
// kLive, and the handler only reads slots in state kLive.
struct Slot {
  std::atomic<int> state{kFree};
  std::atomic<pid_t> owner{0};
  std::atomic<pid_t> postmaster{0};
  char dir[PATH_MAX];
};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

Slot g_slots[kSlots];
std::mutex g_mu;
const int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
struct sigaction g_prev[NSIG];

void sleep_ms(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// Reaps `pid` if it exited; true when it is gone (or not our child).
bool reaped(pid_t pid) {
  int st;
  pid_t r = waitpid(pid, &st, WNOHANG);
  return r == pid || (r < 0 && errno == ECHILD);
}

void on_signal(int sig, siginfo_t* info, void* ctx) {
  const int saved_errno = errno;
  const pid_t me = getpid();
  pid_t pids[kSlots] = {};
  for (int i = 0; i < kSlots; ++i) {
    Slot& s = g_slots[i];
    if (s.state.load() != kLive || s.owner.load() != me) continue;
    pids[i] = s.postmaster.exchange(0);
    if (pids[i] > 0) kill(pids[i], SIGQUIT);
  }
  // Immediate shutdown takes milliseconds; give it 5 s, then SIGKILL.
  for (int waited = 0;; waited += 10) {
    bool pending = false;
    for (int i = 0; i < kSlots; ++i) {
      if (pids[i] > 0 && reaped(pids[i])) pids[i] = 0;
      if (pids[i] > 0) pending = true;
    }
    if (!pending) break;
    if (waited >= 5000) {
      for (int i = 0; i < kSlots; ++i)
        if (pids[i] > 0) {
          kill(pids[i], SIGKILL);
          int st;
          waitpid(pids[i], &st, 0);
        }
      break;
    }
    sleep_ms(10);
  }
  for (int i = 0; i < kSlots; ++i) {
    Slot& s = g_slots[i];
    if (s.state.load() != kLive || s.owner.load() != me) continue;
    remove_tree_signal_safe(s.dir);
    s.state.store(kFree);
  }
  const struct sigaction& prev = g_prev[sig];
  errno = saved_errno;
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction) prev.sa_sigaction(sig, info, ctx);
    return;
  }
  if (prev.sa_handler == SIG_IGN) return;
  if (prev.sa_handler != SIG_DFL) {
    prev.sa_handler(sig);
    return;
  }
  // Die of the same signal, as if nobody had caught it.
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigaction(sig, &dfl, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
  raise(sig);
}

// (Re)installs the handler where someone else's is in place now: a test
// framework may have restored its own since the last server started.
void install_handlers() {
  for (int sig : kSignals) {
    struct sigaction cur;
    if (sigaction(sig, nullptr, &cur) != 0) continue;
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == &on_signal) continue;
    if (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN) continue;
    g_prev[sig] = cur;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = &on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int s : kSignals) sigaddset(&sa.sa_mask, s);
    sigaction(sig, &sa, nullptr);
  }
}

}  // namespace

int register_server(const std::string& temp_dir) {
  if (temp_dir.size() >= PATH_MAX) throw RuntimeError("pgtmp: temp dir path too long: " + temp_dir);
  std::lock_guard<std::mutex> lock(g_mu);
  for (int i = 0; i < kSlots; ++i) {
    Slot& s = g_slots[i];
    int expected = kFree;
    if (!s.state.compare_exchange_strong(expected, kSettingUp)) continue;
    std::memcpy(s.dir, temp_dir.c_str(), temp_dir.size() + 1);
    s.owner.store(getpid());
    s.postmaster.store(0);
    s.state.store(kLive);
    install_handlers();
    return i;
  }
  throw RuntimeError("pgtmp: more than 64 live servers in one process");
}

void set_postmaster(int slot, pid_t pid) {
  g_slots[slot].postmaster.store(pid);
  if (pid > 0) {
    std::lock_guard<std::mutex> lock(g_mu);
    install_handlers();
  }
}

void unregister_server(int slot) {
  Slot& s = g_slots[slot];
  if (s.owner.load() != getpid()) return;
  s.postmaster.store(0);
  s.state.store(kFree);
}

}  // namespace tierlab::pgtmp::detail
