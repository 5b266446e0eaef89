#include "app/command.h"

#include "common/error.h"
#include "common/realtime.h"
#include "trace/writer.h"

#include <sys/stat.h>
#include <csignal>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <utility>

namespace tierlab::app {
namespace {

int g_exit_status = 0;

// Temporary files of live PendingFiles, for a signal that ends the process
// before they are renamed or removed (Ctrl-C during an import or a
// projection): the handler removes them, then the signal ends the process
// as it would have. Slots hold the path's own buffer while its PendingFile
// lives; more pending files than slots keep no such cleanup.
constexpr size_t kPendingSlots = 8;
std::atomic<const char*> g_pending[kPendingSlots];

extern "C" void remove_pending_and_die(int sig) {
  // Async-signal-safe: atomics, unlink(2) and raise(3) only. SA_RESETHAND
  // restored the default action, and the signal is blocked until this
  // returns: then it ends the process.
  for (auto& slot : g_pending)
    if (const char* path = slot.load()) ::unlink(path);
  ::raise(sig);
}

// Installs the handler for the signals that end a command from outside,
// once, where their action is still the default: a command that takes them
// itself (replay, iosim run, captures) keeps its own way of stopping, and
// its PendingFiles are removed by their destructors as usual.
void watch_for_ending_signals() {
  static const bool installed = [] {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction old{};
      if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;
      struct sigaction sa{};
      sa.sa_handler = remove_pending_and_die;
      sa.sa_flags = SA_RESETHAND;
      sigemptyset(&sa.sa_mask);
      ::sigaction(sig, &sa, nullptr);
    }
    return true;
  }();
  (void)installed;
}

void add_pending(const char* path) {
  watch_for_ending_signals();
  for (auto& slot : g_pending) {
    const char* none = nullptr;
    if (slot.compare_exchange_strong(none, path)) return;
  }
}

void drop_pending(const char* path) {
  for (auto& slot : g_pending) {
    const char* p = path;
    if (slot.compare_exchange_strong(p, nullptr)) return;
  }
}

}  // namespace

void setup_all(CLI::App& app) {
  // --help lists commands and groups in the order they are added here; a
  // group ("capture") where its first command is added.
  using SetupFn = void (*)(CLI::App&);
  for (SetupFn setup : {setup_capture_run, setup_capture_proxy, setup_capture_sniff, setup_capture_block,
                        setup_capture_import, setup_capture_log, setup_replay, setup_report, setup_iosim_simulate,
                        setup_iosim_run, setup_iosim_emulate, setup_trace, setup_profile, setup_profile_synth,
                        setup_tiers, setup_project, setup_sandbox})
    setup(app);
}

void set_exit_status(int status) { g_exit_status = status; }

std::string io_choice(const std::string& asked, const char* env) {
  const char* value = std::getenv(env);
  if (!value || !*value) return asked;
  const std::string io = value;
  if (io != "auto" && io != "io_uring" && io != "epoll")
    throw InputError(std::string(env) + " " + io + ": expected auto, io_uring or epoll");
  return io;
}

void check_rt(bool rt) {
  if (!rt) return;
  try {
    RealTimeScope probe(true);
  } catch (const RuntimeError& e) {
    throw RuntimeError(std::string("--rt: ") + e.what());
  }
}

int run_cli(const std::vector<std::string>& args) {
  g_exit_status = 0;
  CLI::App app{
      "tierlab: what would this PostgreSQL workload do on another storage tier?\n"
      "Captures traffic and block I/O, replays it, simulates storage tiers and\n"
      "projects throughput and latency per tier.",
      "tierlab"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tierlab 0.1.0");
  setup_all(app);
  // Bare `tierlab`: the help, which lists the subcommands, then one line.
  if (args.empty()) {
    std::cerr << app.help() << "tierlab: a subcommand is required (see the list above)\n";
    return 2;
  }
  // CLI11 reports an unknown subcommand as "A subcommand is required": name it.
  if (!args.empty() && !args[0].empty() && args[0][0] != '-') {
    CLI::App* known = nullptr;
    for (auto* sub : app.get_subcommands({}))
      if (sub->check_name(args[0])) known = sub;
    if (!known) {
      std::cerr << "tierlab: unknown subcommand '" << args[0] << "' (see tierlab --help)\n";
      return 2;
    }
    // A group alone (`tierlab capture`): its help, which lists its
    // subcommands, then one line, as for a bare `tierlab`.
    if (args.size() == 1 && known->get_require_subcommand_min() > 0) {
      std::cerr << known->help("tierlab") << "tierlab: " << args[0] << ": a subcommand is required (see the list above)\n";
      return 2;
    }
  }
  // CLI11 wants argv order reversed for the vector overload.
  std::vector<std::string> rev(args.rbegin(), args.rend());
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, then status 2, for every kind of bad command line.
    std::cerr << "tierlab: " << e.what() << "\n";
    return 2;
  } catch (const InputError& e) {
    std::cerr << "tierlab: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "tierlab: " << e.what() << "\n";
    return 1;
  }
  return g_exit_status;
}

}  // namespace tierlab::app

namespace tierlab::app {

CLI::App& group(CLI::App& parent, const std::string& name) {
  static const std::pair<const char*, const char*> kGroups[] = {
      {"capture", "record live traffic and block I/O into a trace"},
      {"iosim", "drive I/O through storage tier models"},
      {"trace", "look inside a trace file: counts, records, export"},
  };
  for (auto* existing : parent.get_subcommands({}))
    if (existing->get_name() == name) return *existing;
  const char* description = nullptr;
  for (const auto& [n, d] : kGroups)
    if (name == n) description = d;
  if (!description) throw std::logic_error("no subcommand group named " + name);
  auto* sub = parent.add_subcommand(name, description);
  sub->require_subcommand(1);
  return *sub;
}

CLI::Option* add_compress_level(CLI::App& cmd, int& level) {
  // The range is the trace writer's (trace::check_compression_level); CLI11
  // puts the flag in front of its message.
  const CLI::Validator in_range(
      [](std::string& v) -> std::string {
        int n = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
        if (ec != std::errc() || end != v.data() + v.size()) return "";  // not a number: the conversion says so
        try {
          trace::check_compression_level(n);
        } catch (const InputError& e) {
          return e.what();
        }
        return "";
      },
      "");
  return cmd
      .add_option("--compress-level", level,
                  "zstd level of the trace (-100 to 22; below 0 are zstd's fast levels, less CPU "
                  "for a larger file); 0 writes it uncompressed: 2-3.5x the file of -3")
      ->check(in_range)
      ->capture_default_str();
}

void print_writer_waits(uint64_t waits) {
  if (waits)
    std::printf("waits for the trace writer: %llu (back-pressure: forwarding paused, nothing lost)\n",
                static_cast<unsigned long long>(waits));
}

void say_settings_skipped(const char* cmd, const std::string& why) {
  std::fprintf(stderr, "tierlab %s: durability settings not recorded: %s\n", cmd, why.c_str());
  std::fflush(stderr);
}

namespace {

CLI::Validator number_check(bool zero_ok) {
  return CLI::Validator(
      [zero_ok](std::string& text) -> std::string {
        const char* b = text.c_str();
        char* end = nullptr;
        errno = 0;
        double v = std::strtod(b, &end);
        bool ok = end != b && *end == 0 && errno == 0 && std::isfinite(v) && (zero_ok ? v >= 0 : v > 0);
        if (ok) return "";
        return text + " is not a number " + (zero_ok ? "of 0 or more" : "greater than 0");
      },
      zero_ok ? "NUMBER>=0" : "NUMBER>0");
}

}  // namespace

CLI::Validator positive_number() { return number_check(false); }
CLI::Validator non_negative_number() { return number_check(true); }

PendingFile::PendingFile(const std::string& path, const std::string& option)
    : option_(option), final_(path), path_(path) {
  struct stat st;
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) throw InputError(option_ + " " + path + ": is a directory");
  if (exists && !S_ISREG(st.st_mode)) return;  // written in place
  if (exists) {
    if (char* real = ::realpath(path.c_str(), nullptr)) {
      final_ = real;
      std::free(real);
    }
    if (::access(final_.c_str(), W_OK) != 0) throw InputError(errno_message(option_ + " " + path, errno));
  }
  const size_t slash = final_.rfind('/');
  path_ = final_.substr(0, slash + 1) + "." + final_.substr(slash + 1) + ".tmp-XXXXXX";
  // Known to the signal handler before the file exists: mkstemp fills in
  // the name where the handler reads it.
  add_pending(path_.c_str());
  int fd = ::mkstemp(path_.data());
  if (fd < 0) {
    int err = errno;
    drop_pending(path_.c_str());
    // A directory's problem is named as the path's: that is what was asked.
    throw InputError(errno_message(option_ + " " + path, err == EEXIST ? EACCES : err));
  }
  // The mode a new file gets from open, or the one the file had.
  mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(fd, exists ? (st.st_mode & 07777) : (0666 & ~mask));
  ::close(fd);
  temp_ = true;
}

PendingFile::~PendingFile() {
  if (!temp_) return;
  drop_pending(path_.c_str());
  ::unlink(path_.c_str());
}

void PendingFile::commit() {
  if (!temp_) return;
  drop_pending(path_.c_str());
  if (::rename(path_.c_str(), final_.c_str()) != 0) {
    int err = errno;
    ::unlink(path_.c_str());
    temp_ = false;
    throw RuntimeError(errno_message(option_ + " " + final_ + ": rename", err));
  }
  temp_ = false;
}

OutputFile::OutputFile(const std::string& path, const char* option) : option_(option), shown_(path) {
  if (path.empty()) return;
  if (path == "-") {
    f_ = stdout;
    return;
  }
  file_.emplace(path, option_);
  f_ = std::fopen(file_->path().c_str(), "w");
  if (!f_) throw InputError(errno_message(option_ + " " + path, errno));
}

OutputFile::~OutputFile() {
  // Never written: the command failed. A temporary file goes with file_.
  if (f_ && f_ != stdout) std::fclose(f_);
}

void OutputFile::write(const std::string& text) {
  if (!f_) return;
  bool ok = std::fwrite(text.data(), 1, text.size(), f_) == text.size();
  int err = errno;
  if ((f_ == stdout ? std::fflush(f_) : std::fclose(f_)) != 0 && ok) {
    ok = false;
    err = errno;
  }
  f_ = nullptr;
  if (!ok) throw RuntimeError(errno_message("writing " + option_ + " " + shown_, err));
  if (file_) file_->commit();
}

}  // namespace tierlab::app
