// What the tracefs recorders (capture/block.h, capture/file_io.h) share: the
// tracefs mount, an event's binary layout from its "format" file, a tracing
// instance of their own, and the binary per-CPU ring buffers read from it.
//
// Each recorder works in its own instance, instances/PREFIX-PID ("tierlab-
// block-1234"), so several can run at once and other users of tracefs are
// not disturbed. Creating one removes the instances of the same prefix whose
// process is gone (a capture that was killed), and the instance removes
// itself at the end. Its trace_clock is "mono": event times are
// CLOCK_MONOTONIC, the clock of every other trace record.
#pragma once

#include "common/clock.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tierlab::capture::tracefs {

// The content of a (small) file, "" if it cannot be read.
std::string read_file(const std::string& path);
// Without its trailing newlines and spaces.
std::string trim(std::string s);
// Writes `value` to a tracefs control file. Throws RuntimeError naming it.
void write_file(const std::string& path, const std::string& value);

// The tracefs mount: `given` if it is one, else /sys/kernel/tracing (mounted
// there if need be) or /sys/kernel/debug/tracing. Throws RuntimeError.
std::string find(const std::string& given);

// One field of an event's record.
struct Field {
  int offset = -1;
  int size = 0;
  bool present() const { return offset >= 0; }
};

// The value of a 1, 2, 4 or 8-byte field (0 for other sizes).
uint64_t load(const uint8_t* record, const Field& f);

// An event's id and fields, from events/SYSTEM/NAME/format.
struct EventFormat {
  uint16_t id = 0;
  std::vector<std::pair<std::string, Field>> fields;
  // The named field; not present() when the event has none.
  Field field(const std::string& name) const;
};

// Throws RuntimeError when the file cannot be read or has no ID.
EventFormat read_format(const std::string& path);

// Decodes ring-buffer pages (the binary layout of trace_pipe_raw, described
// by events/header_page) into events.
class PageDecoder {
 public:
  PageDecoder() = default;
  explicit PageDecoder(const std::string& tracefs);  // reads events/header_page
  // Calls on_event(ts, data, len) for every event of the page `p` of `n`
  // bytes, in the page's order; data starts with the event's common_type.
  template <class F>
  void decode(const uint8_t* p, size_t n, F&& on_event) const;

 private:
  size_t commit_size_ = 8, data_off_ = 16;
};

// A tracing instance of the recorder's own (see above). Not copyable.
class Instance {
 public:
  // Creates TRACEFS/instances/PREFIX-PID with trace_clock mono, a per-CPU
  // buffer of `buffer_kb` and no overwriting (a full buffer drops new
  // events, counted by lost()). Throws RuntimeError.
  Instance(const std::string& tracefs, const std::string& prefix, uint32_t buffer_kb);
  // Disables what it enabled, closes its rings, removes the instance.
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  const std::string& path() const { return path_; }
  // Whether the instance has the event "SYSTEM/NAME".
  bool has(const std::string& event) const;
  EventFormat format(const std::string& event) const;
  void filter(const std::string& event, const std::string& expr);
  void enable(const std::string& event);
  // Disables every event enabled so far (what is buffered stays readable).
  void disable_all();

  // Opens every online CPU's trace_pipe_raw and turns tracing on.
  void start();
  // Waits until a ring has data or `ms` have passed.
  void wait(int ms);
  // Reads every page the kernel has ready, calling on_page(data, n) for
  // each; `buf` is the caller's page buffer (page_size() bytes). Returns
  // whether any page was read.
  template <class F>
  bool read_ready(std::vector<uint8_t>& buf, F&& on_page);
  // The size of a ring-buffer page (a sub-buffer where the kernel has them).
  size_t page_size() const { return page_; }
  // Events the kernel dropped or overwrote, from every CPU's stats.
  uint64_t lost() const;
  // A recorder's loop: waits on the rings (at most 100 ms at a time) and
  // calls drain() after each wait until `end` (CLOCK_MONOTONIC) or *stop;
  // then disables the events and drains twice, so that what the last pass
  // carried over (an event whose pair came later) gets its last chance.
  template <class Drain>
  void pump(Nanos end, const std::atomic<bool>* stop, Drain&& drain);

 private:
  std::string path_;
  std::vector<std::string> enabled_;
  std::vector<int> fds_;
  std::vector<int> cpus_;
  size_t page_ = 4096;
};

// Removes the instances named PREFIX-PID whose process is gone; returns how
// many. Instance's constructor calls it.
int remove_stale_instances(const std::string& tracefs, const std::string& prefix);

// Implementation of the templates.

template <class F>
void PageDecoder::decode(const uint8_t* p, size_t n, F&& on_event) const {
  if (n < data_off_) return;
  uint64_t ts;
  __builtin_memcpy(&ts, p, 8);
  uint64_t commit = 0;
  __builtin_memcpy(&commit, p + 8, commit_size_ < 8 ? commit_size_ : 8);
  size_t size = size_t(commit & ((1ull << 27) - 1));
  size_t pos = data_off_, endp = n < data_off_ + size ? n : data_off_ + size;
  while (pos + 4 <= endp) {
    uint32_t h;
    __builtin_memcpy(&h, p + pos, 4);
    uint32_t type_len = h & 31, delta = h >> 5;
    uint32_t arr0 = 0;
    if (pos + 8 <= endp) __builtin_memcpy(&arr0, p + pos + 4, 4);
    const uint8_t* data;
    size_t len;
    if (type_len == 29) {     // padding
      if (delta == 0) break;  // the rest of the page is empty
      pos += 4 + arr0;
      continue;
    } else if (type_len == 30) {  // time extend
      ts += (uint64_t(arr0) << 27) | delta;
      pos += 8;
      continue;
    } else if (type_len == 31) {  // absolute time stamp
      ts = (uint64_t(arr0) << 27) | delta;
      pos += 8;
      continue;
    } else if (type_len == 0) {
      if (arr0 < 4) break;
      len = arr0 - 4;
      data = p + pos + 8;
      pos += 4 + arr0;
    } else {
      len = size_t(type_len) * 4;
      data = p + pos + 4;
      pos += 4 + len;
    }
    ts += delta;
    if (pos > endp || len < 2) break;
    on_event(ts, data, len);
  }
}

int read_ring(int fd, uint8_t* buf, size_t n);  // read(2) of one page; <= 0: none

template <class Drain>
void Instance::pump(Nanos end, const std::atomic<bool>* stop, Drain&& drain) {
  for (;;) {
    const Nanos now = now_ns();
    if (now >= end || (stop && stop->load())) break;
    wait(int(std::min<Nanos>(100, (end - now) / 1'000'000 + 1)));
    drain();
  }
  disable_all();
  drain();
  drain();
}

template <class F>
bool Instance::read_ready(std::vector<uint8_t>& buf, F&& on_page) {
  bool any_read = false;
  for (bool any = true; any;) {
    any = false;
    for (int fd : fds_) {
      int n = read_ring(fd, buf.data(), buf.size());
      if (n > 0) {
        any = any_read = true;
        on_page(buf.data(), size_t(n));
      }
    }
  }
  return any_read;
}

}  // namespace tierlab::capture::tracefs
