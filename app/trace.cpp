// tierlab trace info|dump|export|merge: look inside a trace file, or join traces.
//
//   tierlab trace info FILE [--json]       counts, time span, bytes per kind
//   tierlab trace dump FILE                one human-readable line per record
//   tierlab trace export FILE --format jsonl|csv|fio-iolog [--out F]
//   tierlab trace merge A B ... --out F     join traces on their wall clocks
//
// The text itself (dump lines, jsonl, csv) is written by trace/text.h; this
// file parses the flags, checks the fio-iolog target and prints.
#include "app/command.h"
#include "capture/import.h"
#include "common/error.h"
#include "common/units.h"
#include "trace/merge.h"
#include "trace/reader.h"
#include "trace/text.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fcntl.h>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <vector>

namespace tierlab::app {
namespace {

using namespace tierlab::trace;

// --- output ------------------------------------------------------------------

// Buffered output to stdout or a file created mode 0600 (exports hold SQL and
// parameter values). A closed pipe (`| head`) ends the output quietly.
class Output {
 public:
  explicit Output(const std::string& path) : path_(path.empty() ? "stdout" : path) {
    if (path.empty()) {
      f_ = stdout;
    } else {
      int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
      if (fd < 0) throw InputError(errno_message(path + ": cannot create", errno));
      // A device or FIFO named as the output keeps its mode.
      struct stat st;
      if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::fchmod(fd, 0600) != 0) {
        int err = errno;
        ::close(fd);
        throw InputError(errno_message(path + ": chmod 0600", err));
      }
      f_ = ::fdopen(fd, "w");
      if (!f_) {
        ::close(fd);
        throw RuntimeError(errno_message(path + ": fdopen", errno));
      }
      owned_ = true;
    }
    std::setvbuf(f_, nullptr, _IOFBF, 1 << 16);
  }
  ~Output() {
    if (owned_) std::fclose(f_);
  }

  void write(const std::string& s) {
    if (std::fwrite(s.data(), 1, s.size(), f_) != s.size()) check();
  }
  // False once the reader of a pipe has gone away.
  bool ok() {
    if (std::ferror(f_)) check();
    return !broken_;
  }
  void finish() {
    if (std::fflush(f_) != 0 || std::ferror(f_)) check();
  }

 private:
  void check() {
    if (errno == EPIPE) {
      broken_ = true;
      return;
    }
    throw RuntimeError(errno_message(path_ + ": write", errno));
  }

  std::string path_;
  std::FILE* f_ = nullptr;
  bool owned_ = false;
  bool broken_ = false;
};

std::string wall_clock(Nanos realtime_ns) {
  time_t sec = static_cast<time_t>(realtime_ns / 1'000'000'000);
  long usec = static_cast<long>((realtime_ns % 1'000'000'000) / 1000);
  if (usec < 0) {
    --sec;
    usec += 1'000'000;
  }
  struct tm tm;
  gmtime_r(&sec, &tm);
  char buf[64];
  size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%06ld UTC", usec);
  return buf;
}

// --- info ------------------------------------------------------------------------

// printf into `out`.
[[gnu::format(printf, 2, 3)]] void appendf(std::string& out, const char* fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  if (n > 0) {
    size_t at = out.size();
    out.resize(at + static_cast<size_t>(n) + 1);
    std::vsnprintf(out.data() + at, static_cast<size_t>(n) + 1, fmt, ap2);
    out.resize(at + static_cast<size_t>(n));
  }
  va_end(ap2);
}

std::string info_text(const std::string& path, const Header& h, const Summary& s) {
  std::string out;
  const ReadStats& rs = s.read;
  auto line = [&](const char* k, const std::string& v) { appendf(out, "%-22s %s\n", k, v.c_str()); };
  auto count = [&](const char* k, uint64_t v) { line(k, std::to_string(v)); };
  double secs = static_cast<double>(s.duration_ns) / 1e9;
  char buf[256];
  line("trace:", path);
  line("format version:", std::to_string(h.major) + "." + std::to_string(h.minor));
  line("started:", wall_clock(h.start_mono_ns + h.realtime_offset_ns));
  if (s.records) {
    std::snprintf(buf, sizeof buf, "%.6f s, from %s to %s", secs,
                  wall_clock(s.first_ts + h.realtime_offset_ns).c_str(),
                  wall_clock(s.last_ts + h.realtime_offset_ns).c_str());
    line("time span:", buf);
  } else {
    line("time span:", "no records");
  }
  count("sessions:", s.sessions);
  if (secs > 0) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " (%.1f per second)", s.statements,
                  static_cast<double>(s.statements) / secs);
    line("statements:", buf);
    std::snprintf(buf, sizeof buf, "%" PRIu64 " (%.1f per second)", s.transactions,
                  static_cast<double>(s.transactions) / secs);
    line("transactions:", buf);
  } else {
    count("statements:", s.statements);
    count("transactions:", s.transactions);
  }
  count("errors:", s.errors);
  if (secs > 0 && s.block_ios) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " (%.1f per second)", s.block_ios,
                  static_cast<double>(s.block_ios) / secs);
    line("block I/Os:", buf);
  } else {
    count("block I/Os:", s.block_ios);
  }
  count("file I/Os:", s.file_ios);
  count("samples:", s.samples);
  count("lost:", s.lost);
  count("records:", s.records);
  uint64_t raw = 0;
  for (uint64_t b : rs.kind_bytes) raw += b;
  std::snprintf(buf, sizeof buf, "%" PRIu64 " bytes (%s) in %" PRIu64 " chunks, %.2f bytes per record",
                rs.bytes, format_bytes(rs.bytes).c_str(), rs.chunks,
                s.records ? static_cast<double>(rs.bytes) / static_cast<double>(s.records) : 0.0);
  line("size:", buf);
  if (rs.recovered_tail_bytes) {
    std::snprintf(buf, sizeof buf,
                  "%" PRIu64 " bytes (an incomplete last chunk: the writer stopped mid-write; dropped)",
                  rs.recovered_tail_bytes);
    line("recovered tail:", buf);
  } else {
    line("recovered tail:", "0 bytes");
  }
  line("terminated:", rs.terminated ? "yes" : "no (no end record: the writer did not close the trace)");
  if (!s.records) return out;
  appendf(out, "\n%-15s %12s %14s %10s %7s\n", "kind", "records", "bytes", "bytes/rec", "share");
  for (size_t k = 0; k < rs.kind_records.size(); ++k) {
    if (!rs.kind_records[k]) continue;
    appendf(out, "%-15s %12" PRIu64 " %14" PRIu64 " %10.2f %6.1f%%\n",
                std::string(kind_name(static_cast<Kind>(k))).c_str(), rs.kind_records[k], rs.kind_bytes[k],
                static_cast<double>(rs.kind_bytes[k]) / static_cast<double>(rs.kind_records[k]),
                raw ? 100.0 * static_cast<double>(rs.kind_bytes[k]) / static_cast<double>(raw) : 0.0);
  }
  appendf(out, "(bytes per kind are before compression, the strings each kind introduced included;\n"
              " %" PRIu64 " bytes in all, stored as %" PRIu64 ")\n",
              raw, rs.bytes);
  return out;
}

nlohmann::json info_json(const std::string& path, const Header& h, const Summary& s) {
  const ReadStats& rs = s.read;
  nlohmann::json j;
  j["path"] = path;
  j["version"] = std::to_string(h.major) + "." + std::to_string(h.minor);
  j["start_mono_ns"] = h.start_mono_ns;
  j["realtime_offset_ns"] = h.realtime_offset_ns;
  j["start_realtime_ns"] = h.start_mono_ns + h.realtime_offset_ns;
  j["sessions"] = s.sessions;
  j["statements"] = s.statements;
  j["transactions"] = s.transactions;
  j["errors"] = s.errors;
  j["block_ios"] = s.block_ios;
  j["file_ios"] = s.file_ios;
  j["samples"] = s.samples;
  j["lost"] = s.lost;
  j["records"] = s.records;
  j["first_ts_ns"] = s.first_ts;
  j["last_ts_ns"] = s.last_ts;
  j["duration_ns"] = s.duration_ns;
  j["recovered_tail_bytes"] = rs.recovered_tail_bytes;
  j["terminated"] = rs.terminated;
  j["bytes"] = rs.bytes;
  j["chunks"] = rs.chunks;
  nlohmann::json kinds = nlohmann::json::object();
  for (size_t k = 0; k < rs.kind_records.size(); ++k) {
    if (!rs.kind_records[k]) continue;
    kinds[std::string(kind_name(static_cast<Kind>(k)))] = {{"records", rs.kind_records[k]},
                                                           {"bytes", rs.kind_bytes[k]}};
  }
  j["kinds"] = kinds;
  return j;
}

// --- subcommands -----------------------------------------------------------------

struct InfoOptions {
  std::string file;
  bool json = false;
};

void run_info(const InfoOptions& o) {
  auto r = open_reader(o.file);
  Summary s = summarize(*r);
  Output out("");
  if (o.json)
    out.write(info_json(o.file, r->header(), s).dump(2) + "\n");
  else
    out.write(info_text(o.file, r->header(), s));
  out.finish();
}

struct DumpOptions {
  std::string file;
  std::string out;
};

void run_dump(const DumpOptions& o) {
  auto r = open_reader(o.file);
  Output out(o.out);
  std::string line;
  Record rec;
  const Nanos origin = r->header().start_mono_ns;
  uint64_t n = 0;
  while (r->next(rec)) {
    dump_line(line, rec, origin);
    out.write(line);
    if ((++n & 1023) == 0 && !out.ok()) return;
  }
  if (r->stats().recovered_tail_bytes) {
    line = "# recovered tail: " + std::to_string(r->stats().recovered_tail_bytes) +
           " bytes of an incomplete last chunk dropped\n";
    out.write(line);
  }
  if (!r->stats().terminated) out.write("# unterminated: no end record\n");
  out.finish();
}

struct ExportOptions {
  std::string file;
  std::string format;
  std::string out;
  std::string fio_file;  // fio-iolog: name every I/O with this file
  bool allow_device = false;
};

// fio-iolog without --fio-file: every I/O names this file (relative: fio
// creates it in its working directory), never the captured device.
constexpr const char* kFioPlaceholder = "tierlab-replay.img";

std::string read_line(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "re");
  if (!f) return "";
  char buf[256];
  std::string s = std::fgets(buf, sizeof buf, f) ? buf : "";
  std::fclose(f);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// /sys/dev/block/MAJ:MIN of a device number.
std::string sysfs_dev(dev_t d) {
  return "/sys/dev/block/" + std::to_string(major(d)) + ":" + std::to_string(minor(d));
}

std::string dev_name(dev_t d) {
  std::FILE* f = std::fopen((sysfs_dev(d) + "/uevent").c_str(), "re");
  if (f) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, f)) {
      std::string l = buf;
      if (l.rfind("DEVNAME=", 0) == 0) {
        std::fclose(f);
        while (!l.empty() && l.back() == '\n') l.pop_back();
        return "/dev/" + l.substr(8);
      }
    }
    std::fclose(f);
  }
  return std::to_string(major(d)) + ":" + std::to_string(minor(d));
}

// How the block device `d` is in use: "" if it is not mounted (its own
// file system, /proc/self/mountinfo), held (/sys/.../holders: a device
// mapper or md array on it), a swap area (/proc/swaps), or a whole disk with
// a partition that is any of these.
std::string device_use(dev_t d, int depth = 0) {
  const std::string mm = std::to_string(major(d)) + ":" + std::to_string(minor(d));
  if (std::FILE* f = std::fopen("/proc/self/mountinfo", "re")) {
    char buf[4096];
    while (std::fgets(buf, sizeof buf, f)) {
      std::istringstream l(buf);
      std::string id, parent, devno, root, point;
      l >> id >> parent >> devno >> root >> point;
      if (devno == mm) {
        std::fclose(f);
        return dev_name(d) + " is mounted on " + point;
      }
    }
    std::fclose(f);
  }
  if (std::FILE* f = std::fopen("/proc/swaps", "re")) {
    char buf[4096];
    while (std::fgets(buf, sizeof buf, f)) {
      std::istringstream l(buf);
      std::string path;
      l >> path;
      struct stat st{};
      if (::stat(path.c_str(), &st) == 0 && S_ISBLK(st.st_mode) && st.st_rdev == d) {
        std::fclose(f);
        return dev_name(d) + " is a swap area";
      }
    }
    std::fclose(f);
  }
  const std::string sys = sysfs_dev(d);
  std::error_code ec;
  for (const auto& h : std::filesystem::directory_iterator(sys + "/holders", ec))
    return dev_name(d) + " is held by /dev/" + h.path().filename().string();
  if (depth == 0) {
    // A whole disk: each of its partitions (a subdirectory with a "partition" file).
    for (const auto& e : std::filesystem::directory_iterator(sys, ec)) {
      if (!std::filesystem::exists(e.path() / "partition", ec)) continue;
      unsigned maj = 0, min = 0;
      if (std::sscanf(read_line((e.path() / "dev").string()).c_str(), "%u:%u", &maj, &min) != 2) continue;
      std::string why = device_use(makedev(maj, min), 1);
      if (!why.empty()) return dev_name(d) + " holds a partition: " + why;
    }
  }
  return "";
}

// Why fio must not write to `path` (--fio-file): "" if it may. A block
// device in use (device_use), or a file that backs a loop device in use.
std::string fio_file_in_use(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return "";  // fio creates it
  if (S_ISBLK(st.st_mode)) return device_use(st.st_rdev);
  if (!S_ISREG(st.st_mode)) return "";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/block", ec)) {
    std::string backing = read_line((e.path() / "loop/backing_file").string());
    if (backing.empty()) continue;
    struct stat bs{};
    if (::stat(backing.c_str(), &bs) != 0 || bs.st_dev != st.st_dev || bs.st_ino != st.st_ino) continue;
    unsigned maj = 0, min = 0;
    if (std::sscanf(read_line((e.path() / "dev").string()).c_str(), "%u:%u", &maj, &min) != 2) continue;
    std::string why = device_use(makedev(maj, min));
    if (!why.empty()) return "it backs /dev/" + e.path().filename().string() + ": " + why;
  }
  return "";
}

std::string format_names() {
  std::string names;
  for (const auto& f : export_formats()) names += (names.empty() ? "" : ", ") + std::string(f.name);
  return names + ", fio-iolog";
}

void run_fio_export(const ExportOptions& o) {
  if (!o.fio_file.empty() && !o.allow_device) {
    std::string why = fio_file_in_use(o.fio_file);
    if (!why.empty())
      throw InputError("--fio-file " + o.fio_file + ": " + why +
                       "; fio replaying the iolog would write to it (--allow-device to export anyway)");
  }
  auto r = open_reader(o.file);
  Output out(o.out);
  std::ostringstream text;
  capture::FioExportOptions fo;
  fo.filename = o.fio_file.empty() ? kFioPlaceholder : o.fio_file;
  fo.trims = false;  // fio 3.33 refuses trim lines ("bad ddir: 2")
  if (o.fio_file.empty())
    fo.comment = std::string("tierlab: I/O names the placeholder ") + kFioPlaceholder +
                 ", not the captured device; fio --replay_redirect=PATH replays it on PATH";
  capture::FioExportStats st = capture::write_fio_iolog_v3(*r, text, fo);
  out.write(text.str());
  out.finish();
  std::string from;
  for (const auto& s : st.sources) from += (from.empty() ? "" : ", ") + s;
  if (st.ios == 0)
    std::fprintf(stderr, "tierlab: fio-iolog: the trace has no block I/O to export%s\n",
                 st.trims_dropped ? " but trims" : "");
  else if (o.fio_file.empty())
    std::fprintf(stderr,
                 "tierlab: fio-iolog: %llu I/Os name the placeholder %s, not the trace's %s; replay them on a "
                 "scratch file of at least %llu bytes (%s) with fio --read_iolog=FILE --replay_redirect=PATH, or "
                 "export with --fio-file PATH\n",
                 (unsigned long long)st.ios, kFioPlaceholder, from.c_str(), (unsigned long long)st.end,
                 format_bytes(double(st.end)).c_str());
  else
    std::fprintf(stderr, "tierlab: fio-iolog: %llu I/Os name %s (the trace's %s); it needs at least %llu bytes (%s)\n",
                 (unsigned long long)st.ios, o.fio_file.c_str(), from.c_str(), (unsigned long long)st.end,
                 format_bytes(double(st.end)).c_str());
  if (st.trims_dropped)
    std::fprintf(stderr, "tierlab: fio-iolog: %llu trim%s left out: fio 3.33 refuses trim lines (\"bad ddir: 2\")\n",
                 (unsigned long long)st.trims_dropped, st.trims_dropped == 1 ? "" : "s");
}

void run_export(const ExportOptions& o) {
  if (o.format == "fio-iolog") {  // block I/O as a fio iolog v3 (capture/import.h)
    run_fio_export(o);
    return;
  }
  if (!o.fio_file.empty() || o.allow_device)
    throw InputError(std::string(o.fio_file.empty() ? "--allow-device" : "--fio-file") +
                     ": only used with --format fio-iolog");
  std::unique_ptr<Exporter> ex;
  for (const auto& f : export_formats())
    if (o.format == f.name) ex = f.make();
  if (!ex) throw InputError("--format " + o.format + ": unknown export format (known: " + format_names() + ")");
  auto r = open_reader(o.file);
  Output out(o.out);
  std::string line;
  ex->begin(line, r->header());
  out.write(line);
  Record rec;
  uint64_t n = 0;
  while (r->next(rec)) {
    ex->record(line, rec);
    out.write(line);
    if ((++n & 1023) == 0 && !out.ok()) return;
  }
  ex->end(line);
  out.write(line);
  out.finish();
}

struct MergeOptions {
  std::vector<std::string> files;
  std::string out;
};

std::string wall_text(trace::Nanos ns) {
  const time_t t = static_cast<time_t>(ns / 1'000'000'000);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  return b;
}

void run_merge(const MergeOptions& o) {
  if (o.files.size() < 2) throw InputError("trace merge: give two traces or more to merge");
  PendingFile target(o.out, "--out");
  auto res = trace::merge_on_wall_clock(o.files, target.path());
  target.commit();
  std::printf("trace merge: %zu traces -> %s (%llu records), on the wall clock of %s\n", o.files.size(),
              o.out.c_str(), static_cast<unsigned long long>(res.records), o.files.front().c_str());
  for (const auto& in : res.inputs) {
    std::printf("  %s: %llu records", in.path.c_str(), static_cast<unsigned long long>(in.records));
    if (in.records)
      std::printf(", %s to %s", wall_text(in.first_wall_ns).c_str(), wall_text(in.last_wall_ns).c_str());
    if (&in != &res.inputs.front()) std::printf(", moved %+.3f s", static_cast<double>(in.shift_ns) / 1e9);
    if (in.session_base && in.sessions_top) std::printf(", sessions renumbered from %llu", static_cast<unsigned long long>(in.session_base + 1));
    std::printf("\n");
  }
  if (!res.overlap)
    std::printf("warning: the traces do not all overlap in time: a profile joins only the figures of the same "
                "window (were the metrics exported for the capture's window?)\n");
  std::fflush(stdout);
}

}  // namespace

void setup_trace(CLI::App& parent) {
  auto& tr = group(parent, "trace");

  auto info = std::make_shared<InfoOptions>();
  auto* si = tr.add_subcommand("info", "counts, time span, bytes per record kind, recovered tail");
  si->add_option("FILE", info->file, "trace file (.tlt)")->required();
  si->add_flag("--json", info->json, "print JSON instead of text");
  si->callback([info] { run_info(*info); });

  auto dump = std::make_shared<DumpOptions>();
  auto* sd = tr.add_subcommand("dump", "print every record, one line each (time in seconds from the trace start)");
  sd->add_option("FILE", dump->file, "trace file (.tlt)")->required();
  sd->add_option("--out,-o", dump->out, "write to this file (mode 0600) instead of stdout");
  sd->callback([dump] { run_dump(*dump); });

  auto exp = std::make_shared<ExportOptions>();
  auto* se = tr.add_subcommand("export", "write every record as JSON lines or CSV, or the block I/O as a fio iolog");
  se->add_option("FILE", exp->file, "trace file (.tlt)")->required();
  std::string names;
  for (const auto& f : export_formats()) names += (names.empty() ? "" : "|") + std::string(f.name);
  names += "|fio-iolog";
  se->add_option("--format,-f", exp->format, "output format: " + names)->required();
  se->add_option("--fio-file", exp->fio_file,
                 "fio-iolog: name every I/O with this file or device (default: the placeholder "
                 "tierlab-replay.img, never the captured device); a mounted block device, one holding a "
                 "mounted partition, swap or a device mapper, or a file backing a loop device in use is "
                 "refused");
  se->add_flag("--allow-device", exp->allow_device, "fio-iolog: accept a --fio-file that is in use");
  se->add_option("--out,-o", exp->out, "write to this file (mode 0600) instead of stdout");
  se->footer(kCsvHelp);
  se->callback([exp] { run_export(*exp); });

  auto merge = std::make_shared<MergeOptions>();
  auto* sm = tr.add_subcommand(
      "merge",
      "join traces recorded apart on their wall clocks into one (a proxy capture and the provider's metrics\n"
      "of the same window, from capture import --cloudwatch); the first trace's clock is kept");
  sm->add_option("FILES", merge->files, "traces to merge (.tlt), two or more")->required();
  sm->add_option("--out,-o", merge->out, "trace file to write")->required();
  sm->callback([merge] { run_merge(*merge); });
}

}  // namespace tierlab::app
